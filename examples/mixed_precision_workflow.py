"""AIMET's freeze-then-FP16 mixed-precision recipe, end to end on a real model.

    .venv/bin/python examples/mixed_precision_workflow.py          # PP-OCR's classifier (35 BatchNorms)
    .venv/bin/python examples/mixed_precision_workflow.py --model m.onnx --data calib.npz

1. a W4A8 sim that keeps BatchNormalization unfolded; AdaRound rounds the Conv/Gemm weights;
2. its parameter encodings and rounded model are exported;
3. a new sim of the rounded model: `set_and_freeze_param_encodings`, BatchNormalization in FP16 and the
   rest W8A8 through `mixed_precision.apply_precision_overrides` (frozen 4-bit weights stay), calibration;
4. exported as encodings 0.6.1 / 1.0.0 / 2.0.0; each is loaded into a fresh sim and compared with the
   exported one (2.0.0 cannot hold FP16, as in aimet-onnx: those tensors come back in float32);
5. the loss against FP32 of every step is printed.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # the repository first: examples/adaround.py shadows `adaround`

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from adaround import apply_adaround  # noqa: E402
from mixed_precision import apply_precision_overrides  # noqa: E402
from quantsim import QuantizationSimModel, load_encodings_to_sim  # noqa: E402


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], out_dir: Path, *,
        iterations: int = 1000, progress: bool = True) -> dict[str, dict[str, float]]:
    """The recipe above; returns the agreement with FP32 of each stage and of each reloaded export."""
    reference = float_outputs(model, evaluation)

    def score(sim) -> dict[str, float]:
        return output_agreement(reference, [sim.session.run(None, feed) for feed in evaluation])

    results = {}
    first = QuantizationSimModel(model, param_type="int4", activation_type="int8", fold_batchnorm=False,
                                 progress=progress)
    first.compute_encodings(calibration)
    results["W4A8 nearest"] = score(first)
    apply_adaround(first, calibration, num_iterations=iterations, progress=progress)
    results["W4A8 AdaRound"] = score(first)
    first.export(out_dir, "adaround")  # adaround.onnx: rounded weights; adaround.encodings: their grids

    sim = QuantizationSimModel(str(out_dir / "adaround.onnx"), param_type="int8", activation_type="int8",
                               fold_batchnorm=False, progress=progress)
    sim.set_and_freeze_param_encodings(str(out_dir / "adaround.encodings"))
    apply_precision_overrides(sim, {"default": "W8A8", "op_type": {"BatchNormalization": "FP16"}})
    sim.compute_encodings(calibration)
    results["frozen W4 weights, BN FP16, A8"] = score(sim)
    feed = evaluation[0]
    expected = sim.session.run(None, feed)[0]
    for version in ("0.6.1", "1.0.0", "2.0.0"):
        prefix = f"mixed_{version.replace('.', '_')}"
        sim.export(out_dir, prefix, encoding_version=version)
        reloaded = QuantizationSimModel(str(out_dir / f"{prefix}.onnx"), fold_batchnorm=False, progress=progress)
        load_encodings_to_sim(reloaded, str(out_dir / f"{prefix}.encodings"), strict=False)
        got = reloaded.session.run(None, feed)[0]
        results[f"reloaded {version}"] = {"max |reloaded - exported|": float(np.abs(got - expected).max())}
    for label, values in results.items():
        print(f"{label}: " + ", ".join(f"{k} {v:.4g}" for k, v in values.items()))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv, iterations=1000)
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="quantsim-mixed-"))
    run(model, calibration, evaluation, out_dir, iterations=args.iterations)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
