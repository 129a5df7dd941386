"""One call from a float model and an accuracy budget to the cheapest deployable configuration.

    .venv/bin/python examples/auto_quantize.py                 # PP-OCR's text-direction classifier
    .venv/bin/python examples/auto_quantize.py --model m.onnx --data calib.npz [--drop 0.01] [--out-dir DIR]

`mixed_precision.auto_quantize` scores the float model with the callback (here: top-1 agreement with FP32
for class scores, else output SQNR in dB, on held-out batches), then tries W8A8 defaults, other calibration
schemes, cross-layer equalization, Sequential MSE + AdaRound for 4-bit weights and per-layer mixes of the
candidate ladder, cheapest first, and stops at the cheapest configuration within ``--drop`` of the float
score. The chosen sim is exported (AIMET encodings + QDQ model) and the QDQ model is scored again in plain
onnxruntime, so the figure printed last is what the deployed file delivers. ``--out-dir`` also gets the
search report (``auto_quantize.md``, ``.json``, ``.html``). A few minutes on 2 cores.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # the repository first: examples/adaround.py shadows `adaround`

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from mixed_precision import auto_quantize  # noqa: E402


class OutputScore:
    """Top-1 agreement with FP32 for 2-D outputs, else SQNR (dB), on ``feeds`` (higher is better)."""

    def __init__(self, model: onnx.ModelProto, feeds: list[dict]):
        self.feeds, self.reference = feeds, float_outputs(model, feeds)
        self.metric = "top-1 = FP32" if "top-1 = FP32" in output_agreement(self.reference, self.reference) else "SQNR dB"

    def __call__(self, session) -> float:
        scores = output_agreement(self.reference, [session.run(None, feed) for feed in self.feeds])
        return min(scores[self.metric], 200.0)


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], out_dir: Path, *,
        drop: float = 0.01, adaround_iterations: int = 1000, progress: bool = True):
    """The `AutoQuantResult` for ``drop``, its exports in ``out_dir``, and the QDQ export's score."""
    score = OutputScore(model, evaluation)
    result = auto_quantize(model, calibration, score, drop, results_dir=out_dir,
                           adaround_iterations=adaround_iterations, progress=progress)
    print(result.summary())
    result.sim.export(str(out_dir), "model")
    qdq = result.sim.to_onnx_qdq()
    onnx.save(qdq, str(out_dir / "model.qdq.onnx"))
    deployed = score(ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"]))
    print(f"{score.metric}: float {result.reference_score:.4f}, chosen sim {result.score:.4f}, QDQ export in "
          f"onnxruntime {deployed:.4f}; relative bit operations {result.relative_bops:.3f}")
    print(f"files: {', '.join(sorted(p.name for p in out_dir.iterdir() if p.is_file()))}")
    return result, deployed


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv, iterations=1000, extra=[
        ("--drop", {"type": float, "default": 0.01, "help": "allowed drop of the score"})])
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="quantsim-auto-"))
    run(model, calibration, evaluation, out_dir, drop=args.drop, adaround_iterations=args.iterations)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
