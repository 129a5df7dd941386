"""torchvision and timm architectures as ONNX through both of torch's exporters, for `benchmarks.bench_light --torch`.

    <python with torch + torchvision [+ timm]> -m benchmarks.suite.torch_export [--out DIR] [--exporter ts dynamo]
        [--models resnet18 timm_lcnet_050 ...]

Runs in any Python that has torch, torchvision and onnx (plus onnxscript for the dynamo exporter, timm for
the ``timm_*`` models), not in quantsim's environment: quantsim never imports torch. Nothing is downloaded:
every model is built with ``weights=None`` (and ``weights_backbone=None``; timm: ``pretrained=False``, its
default input size) from a fixed seed; BatchNorm running statistics are measured
on four batches of N(0, 1) images (momentum None: their average), as a trained net's BN would hold
statistics of its data, so activations are not degenerate. Files: ``DIR/<model>.<exporter>.onnx``, where
``ts`` is the TorchScript exporter (``dynamo=False``, opset 17) and ``dynamo`` the torch.export-based one
(opset 18), which spell the same model differently (``ReduceMean`` for adaptive pooling, ``Einsum``, ...).
Weights are random: use the files for op coverage, float-op counts and latency, not for accuracy.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks.suite.exporting import torch_exports_main

DEFAULT_OUT = Path.home() / ".cache" / "quantsim" / "models" / "torch"
IMAGE = (1, 3, 224, 224)
SPECS: dict[str, tuple[str, dict, tuple[int, ...]]] = {  # name: (torchvision builder path, kwargs, input shape)
    "resnet18": ("resnet18", {}, IMAGE),
    "resnet50": ("resnet50", {}, IMAGE),
    "mobilenet_v2": ("mobilenet_v2", {}, IMAGE),
    "mobilenet_v3_large": ("mobilenet_v3_large", {}, IMAGE),
    "mobilenet_v3_small": ("mobilenet_v3_small", {}, IMAGE),
    "efficientnet_b0": ("efficientnet_b0", {}, IMAGE),
    "efficientnet_v2_s": ("efficientnet_v2_s", {}, IMAGE),
    "regnet_y_400mf": ("regnet_y_400mf", {}, IMAGE),
    "shufflenet_v2_x1_0": ("shufflenet_v2_x1_0", {}, IMAGE),
    "squeezenet1_1": ("squeezenet1_1", {}, IMAGE),
    "mnasnet1_0": ("mnasnet1_0", {}, IMAGE),
    "googlenet": ("googlenet", {"aux_logits": False, "init_weights": True}, IMAGE),
    "densenet121": ("densenet121", {}, IMAGE),
    "inception_v3": ("inception_v3", {"aux_logits": False, "init_weights": True}, (1, 3, 299, 299)),
    "convnext_tiny": ("convnext_tiny", {}, IMAGE),
    "swin_t": ("swin_t", {}, IMAGE),
    "maxvit_t": ("maxvit_t", {}, IMAGE),
    "vit_b_16": ("vit_b_16", {}, IMAGE),
    "lraspp_mobilenet_v3_large": ("segmentation.lraspp_mobilenet_v3_large", {"weights_backbone": None}, (1, 3, 320, 320)),
    "deeplabv3_mobilenet_v3_large": ("segmentation.deeplabv3_mobilenet_v3_large",
                                     {"weights_backbone": None, "aux_loss": False}, (1, 3, 320, 320)),
    "ssdlite320_mobilenet_v3_large": ("detection.ssdlite320_mobilenet_v3_large", {"weights_backbone": None},
                                      (1, 3, 320, 320)),
    "r3d_18": ("video.r3d_18", {}, (1, 3, 8, 112, 112)),
}
TIMM = ("lcnet_050", "mobilevit_xxs", "mobilevitv2_050", "efficientformer_l1", "levit_128s", "ghostnet_100", "repvgg_a0",
        "rexnet_100", "mobileone_s0", "fastvit_t8", "edgenext_xx_small", "tinynet_e", "mixnet_s", "tf_efficientnet_lite0",
        "mobilenetv4_conv_small", "mobilenetv4_hybrid_medium", "efficientvit_b0", "efficientvit_m0", "poolformer_s12",
        "deit_tiny_patch16_224", "pvt_v2_b0", "coat_lite_tiny", "xcit_nano_12_p16_224", "resnet18d", "regnetx_002",
        "dla34", "hrnet_w18_small", "cspdarknet53", "repghostnet_050")


def _builder(path: str) -> Callable:
    import torchvision

    target = torchvision.models
    for part in path.split("."):
        target = getattr(target, part)
    return target


def _measure_batchnorm(model, shape: tuple[int, ...]) -> None:
    """Running statistics from four batches of N(0, 1) inputs (a detector's backbone alone: its head needs
    targets in training mode)."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    body = getattr(model, "backbone", model)
    body.train()
    with torch.no_grad():
        for _ in range(4):
            body(torch.randn(2, *shape[1:]))
    model.eval()


def _build(name: str):
    """The model ``name`` (``timm_<arch>`` for timm) and its input shape."""
    if name.startswith("timm_"):
        import timm

        model = timm.create_model(name[len("timm_"):], pretrained=False)
        return model, (1, *model.pretrained_cfg.get("input_size", IMAGE[1:]))
    path, kwargs, shape = SPECS[name]
    return _builder(path)(weights=None, **kwargs), shape


def export(name: str, exporter: str, out: Path) -> Path:
    import torch

    torch.manual_seed(0)
    model, shape = _build(name)
    _measure_batchnorm(model, shape)
    model.eval()
    target = out / f"{name}.{exporter}.onnx"
    args = (torch.randn(*shape),)
    with torch.no_grad():
        if exporter == "ts":
            torch.onnx.export(model, args, str(target), opset_version=17, dynamo=False, input_names=["input"])
        else:
            torch.onnx.export(model, args, str(target), opset_version=18, dynamo=True, external_data=False)
    return target


def main(argv: list[str] | None = None) -> int:
    names = [*sorted(SPECS), *(f"timm_{arch}" for arch in TIMM)]
    return torch_exports_main(argv, __doc__.split("\n")[0], DEFAULT_OUT, names, export)


if __name__ == "__main__":
    raise SystemExit(main())
