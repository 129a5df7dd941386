"""Sequential MSE, alone and before AdaRound, on a real model (W4A8).

    .venv/bin/python examples/seq_mse.py                       # PP-OCR's text-direction classifier
    .venv/bin/python examples/seq_mse.py --model m.onnx --data calib.npz

Same data options as ``examples/adaround.py``. Runs in a few minutes on 2 cores.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # the repository first: examples/adaround.py shadows `adaround`

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from adaround import apply_adaround, apply_seq_mse  # noqa: E402
from quantsim import QuantizationSimModel  # noqa: E402


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], *, param_type: str = "int4",
        iterations: int = 1000, progress: bool = True) -> dict[str, dict[str, float]]:
    """Nearest rounding, Sequential MSE, and Sequential MSE + AdaRound, scored against FP32."""
    reference = float_outputs(model, evaluation)
    results = {}
    for label in ("nearest", "seq_mse", "seq_mse+adaround"):
        start = time.perf_counter()
        sim = QuantizationSimModel(model, param_type=param_type, progress=progress)
        sim.compute_encodings(calibration)
        if label != "nearest":
            apply_seq_mse(sim, calibration, progress=progress)
        if label == "seq_mse+adaround":
            apply_adaround(sim, calibration, num_iterations=iterations, progress=progress)
        results[label] = output_agreement(reference, [sim.session.run(None, feed) for feed in evaluation])
        results[label]["seconds"] = time.perf_counter() - start
        print(f"W{param_type[3:]}A8 {label}: " + ", ".join(f"{k} {v:.3f}" for k, v in results[label].items()))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv, iterations=1000, extra=[("--param-type", {"default": "int4"})])
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    run(model, calibration, evaluation, param_type=args.param_type, iterations=args.iterations)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
