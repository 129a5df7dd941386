"""AdaRound on a real model: W4A8 with nearest rounding vs W4A8 with AdaRound, and the parameter
encodings exported for a deployment sim.

    .venv/bin/python examples/adaround.py                      # PP-OCR's text-direction classifier
    .venv/bin/python examples/adaround.py --model m.onnx --data calib.npz [--iterations 2000]

Without ``--model`` it fetches PP-OCR mobile cls (from the rapidocr-onnxruntime wheel on PyPI, cached)
and renders text lines as data with Pillow (examples/real_model.py). ``--data`` is an
``.npz`` with one array per model input; its first axis is split into batches of ``--batch-size``.
Runs in a few minutes on 2 cores.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # the repository first: this file's name shadows `adaround`

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from adaround import apply_adaround  # noqa: E402
from quantsim import QuantizationSimModel  # noqa: E402


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], *, param_type: str = "int4",
        iterations: int = 2000, out_dir: Path | None = None, progress: bool = True) -> dict[str, dict[str, float]]:
    """Quantize ``model`` twice (nearest, AdaRound), score both on ``evaluation``, export the AdaRound one."""
    reference = float_outputs(model, evaluation)
    results = {}
    for label in ("nearest", "adaround"):
        start = time.perf_counter()
        sim = QuantizationSimModel(model, param_type=param_type, activation_type="int8", progress=progress)
        sim.compute_encodings(calibration)
        if label == "adaround":
            reports = apply_adaround(sim, calibration, num_iterations=iterations, progress=progress)
            rounded = [r for r in reports if r.status == "rounded"]
            print(f"AdaRound: {len(rounded)} layers rounded, {len(reports) - len(rounded)} skipped")
        results[label] = output_agreement(reference, [sim.session.run(None, feed) for feed in evaluation])
        results[label]["seconds"] = time.perf_counter() - start
        print(f"W{param_type[3:]}A8 {label}: " + ", ".join(f"{k} {v:.3f}" for k, v in results[label].items()))
    if out_dir is not None:
        sim.export(out_dir, "adaround")  # adaround.onnx holds the rounded weights, adaround.encodings the grids
        print(f"exported {out_dir / 'adaround.onnx'} and {out_dir / 'adaround.encodings'}")
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv, iterations=2000, extra=[("--param-type", {"default": "int4"})])
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="quantsim-adaround-"))
    run(model, calibration, evaluation, param_type=args.param_type, iterations=args.iterations, out_dir=out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
