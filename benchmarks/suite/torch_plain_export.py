"""Two torch models built from ``torch.nn`` alone, through both of torch's exporters, for `benchmarks.bench_agreement`.

    <python with torch + onnx [+ onnxscript]> -m benchmarks.suite.torch_plain_export [--out DIR]

For environments where torchvision / timm do not import (`benchmarks.suite.torch_export` needs them): a
MobileNetV3-style CNN (HardSwish, depthwise convolutions, squeeze-excite with HardSigmoid, a Linear head) and a
two-layer ``nn.TransformerEncoder`` (GELU, attention, LayerNorm), random weights from a fixed seed, BatchNorm
statistics measured on four batches of N(0, 1) images (momentum None: their average). Files:
``DIR/<model>.ts.onnx`` (TorchScript exporter, opset 17) and ``DIR/<model>.dynamo.onnx`` (opset 18; weights in
``.onnx.data``). Then ``python -m benchmarks.bench_agreement --quick --models file:DIR/<file> ...``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path.home() / ".cache" / "quantsim" / "models" / "torch_plain"


def _models():
    import torch
    from torch import nn

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.pool, self.down, self.up = nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

        def forward(self, x):
            return x * nn.functional.hardsigmoid(self.up(torch.relu(self.down(self.pool(x)))))

    def block(cin: int, cout: int, stride: int, se: bool) -> nn.Sequential:
        hidden = cin * 4
        layers = [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish(),
                  nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish()]
        layers += [SqueezeExcite(hidden)] if se else []
        return nn.Sequential(*layers, nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    class MobileNetV3Like(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
            self.blocks = nn.Sequential(block(16, 24, 2, False), block(24, 40, 2, True), block(40, 48, 1, True),
                                        block(48, 96, 2, True))
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(96, 256), nn.Hardswish(),
                                      nn.Linear(256, 100))

        def forward(self, x):
            return self.head(self.blocks(self.stem(x)))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(32, 128)
            layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True, activation="gelu")
            self.encoder = nn.TransformerEncoder(layer, 2)
            self.out = nn.Linear(128, 10)

        def forward(self, x):
            return self.out(self.encoder(self.embed(x)).mean(1))

    torch.manual_seed(0)
    return [("mbv3_small_like", MobileNetV3Like(), (1, 3, 224, 224)), ("transformer_encoder", Encoder(), (1, 16, 32))]


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch import nn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, model, shape in _models():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.momentum = None
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(8, *shape[1:]))
        model.eval()
        for exporter, opset in (("ts", 17), ("dynamo", 18)):
            path = args.out / f"{name}.{exporter}.onnx"
            try:
                torch.onnx.export(model, torch.randn(*shape), str(path), opset_version=opset, dynamo=exporter == "dynamo")
                print(f"wrote {path}")
            except Exception as error:  # noqa: BLE001 - one exporter's refusal is reported, the other still runs
                print(f"{name} ({exporter}): {type(error).__name__}: {str(error)[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
