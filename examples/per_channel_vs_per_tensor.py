"""Per-channel or per-tensor weights, min_max or tf_enhanced ranges: which W8A8 setting suits your model.

    .venv/bin/python examples/per_channel_vs_per_tensor.py             # PP-OCR's text-direction classifier
    .venv/bin/python examples/per_channel_vs_per_tensor.py --model m.onnx --data calib.npz

Quantizes the model four ways (the shipped ``per_channel`` and ``per_tensor`` configs, each calibrated
with ``min_max`` and ``tf_enhanced``) and prints the agreement with FP32 of each. Per-channel weights
usually matter most on depthwise convolutions, whose channels' ranges differ the most. A few minutes
on 2 cores.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from quantsim import QuantizationSimModel  # noqa: E402

SETTINGS = [(config, scheme) for config in ("per_channel", "per_tensor") for scheme in ("min_max", "tf_enhanced")]


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], *,
        progress: bool = True) -> dict[str, dict[str, float]]:
    """``{"<config> <scheme>": agreement with FP32}`` for every setting in `SETTINGS`."""
    reference = float_outputs(model, evaluation)
    results = {}
    for config, scheme in SETTINGS:
        start = time.perf_counter()
        sim = QuantizationSimModel(model, quant_scheme=scheme, config_file=config, progress=progress)
        sim.compute_encodings(calibration)
        label = f"{config} {scheme}"
        results[label] = output_agreement(reference, [sim.session.run(None, feed) for feed in evaluation])
        results[label]["seconds"] = time.perf_counter() - start
        print(f"W8A8 {label:24s} " + ", ".join(f"{k} {v:.3f}" for k, v in results[label].items()))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv)
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    run(model, calibration, evaluation)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
