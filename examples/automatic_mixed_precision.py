"""Automatic mixed precision: the cheapest mix of W8A8 and W4A8 layers within an accuracy budget.

    .venv/bin/python examples/automatic_mixed_precision.py             # PP-OCR's text-direction classifier
    .venv/bin/python examples/automatic_mixed_precision.py --model m.onnx --data calib.npz [--drop 0.01]

`mixed_precision.choose_mixed_precision` (aimet-onnx's signature) scores each quantizer group at each
candidate precision (phase 1, here the output SQNR on two held-out batches), then walks the Pareto front
of relative bit operations against the task score (phase 2, here top-1 agreement with FP32, or SQNR for
outputs that are not class scores) and leaves the sim in the cheapest configuration within ``--drop`` of
the float model's score. ``--out-dir`` gets ``pareto.json`` and the ``pareto.html`` page. ``--workers N``
runs phase 1 on a process pool (a Dask client's ``get_executor()`` works the same way). A few minutes on
2 cores.
"""
from __future__ import annotations

import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # the repository first: examples/adaround.py shadows `adaround`

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from mixed_precision import choose_mixed_precision  # noqa: E402
from quantsim import QuantizationSimModel  # noqa: E402


class OutputScore:
    """Scores a session's outputs on ``feeds`` against FP32: top-1 agreement for 2-D outputs, else SQNR (dB).
    A class, not a closure, so that a process pool can pickle it."""

    def __init__(self, model: onnx.ModelProto, feeds: list[dict]):
        self.feeds, self.reference = feeds, float_outputs(model, feeds)
        scores = output_agreement(self.reference, self.reference)
        self.metric = "top-1 = FP32" if "top-1 = FP32" in scores else "SQNR dB"

    def __call__(self, session) -> float:
        scores = output_agreement(self.reference, [session.run(None, feed) for feed in self.feeds])
        return min(scores[self.metric], 200.0)  # SQNR of identical outputs is huge, not infinite


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], out_dir: Path, *,
        drop: float = 0.01, workers: int = 0, progress: bool = True):
    """Choose W8A8/W4A8 per group within ``drop`` of the float score; the `AmpResult`."""
    phase1 = OutputScore(model, evaluation[:2])
    phase2 = OutputScore(model, evaluation)
    phase1.metric = "SQNR dB"  # a fine-grained score ranks the groups best
    sim = QuantizationSimModel(model, progress=progress)
    # spawned workers: a forked copy of a process whose onnxruntime sessions hold threads can hang
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=spawn) if workers else nullcontext() as pool:
        result = choose_mixed_precision(sim, ["W8A8", "W4A8"], phase1, phase2, drop, out_dir, True, calibration,
                                        executor=pool)
    print(result.message)
    print(f"{phase2.metric}: {result.score:.4f} (float {result.float_score:.4f}, W4A8 everywhere "
          f"{result.uniform_scores['W4A8']:.4f}, W8A8 everywhere {result.uniform_scores['W8A8']:.4f})")
    print(f"relative bit operations {result.bitops_ratio:.3f}; {100 * result.promoted_share:.1f}% of the "
          f"weight quantizers kept at 8 bits; {result.calibration_passes} calibration passes, "
          f"{result.evaluations} evaluations")
    print(f"Pareto front: {out_dir / 'pareto.html'}")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv, extra=[
        ("--drop", {"type": float, "default": 0.01, "help": "allowed drop of the phase-2 score"}),
        ("--workers", {"type": int, "default": 0, "help": "phase-1 worker processes (0: this process)"})])
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="quantsim-amp-"))
    run(model, calibration, evaluation, out_dir, drop=args.drop, workers=args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
