"""torchvision architectures as ONNX, through both of torch's exporters, for `benchmarks.bench_light --torchvision`.

    <python with torch + torchvision> -m benchmarks.suite.torchvision_export [--out DIR] [--exporter ts dynamo]
        [--models resnet18 ...]

Runs in any Python that has torch, torchvision and onnx (plus onnxscript for the dynamo exporter), not in
quantsim's environment: quantsim never imports torch. Nothing is downloaded: every model is built with
``weights=None`` (and ``weights_backbone=None``) from a fixed seed; BatchNorm running statistics are measured
on four batches of N(0, 1) images (momentum None: their average), as a trained net's BN would hold
statistics of its data, so activations are not degenerate. Files: ``DIR/<model>.<exporter>.onnx``, where
``ts`` is the TorchScript exporter (``dynamo=False``, opset 17) and ``dynamo`` the torch.export-based one
(opset 18), which spell the same model differently (``ReduceMean`` for adaptive pooling, ``Einsum``, ...).
Weights are random: use the files for op coverage, float-op counts and latency, not for accuracy.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_OUT = Path.home() / ".cache" / "quantsim" / "models" / "torchvision"
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


def export(name: str, exporter: str, out: Path) -> Path:
    import torch

    path, kwargs, shape = SPECS[name]
    torch.manual_seed(0)
    model = _builder(path)(weights=None, **kwargs)
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--exporter", nargs="+", choices=("ts", "dynamo"), default=["ts", "dynamo"])
    parser.add_argument("--models", nargs="+", choices=sorted(SPECS), default=sorted(SPECS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for exporter in args.exporter:
        for name in args.models:
            start = time.perf_counter()
            try:
                target = export(name, exporter, out)
                print(f"{target.name}: {time.perf_counter() - start:.1f} s", flush=True)
            except Exception as error:  # noqa: BLE001 - an architecture the exporter refuses is reported, not fatal
                print(f"{name} ({exporter}): not exported: {type(error).__name__}: {str(error)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
