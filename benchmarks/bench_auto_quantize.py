"""`mixed_precision.auto_quantize` on the suite's real models, each with its own task metric as the callback.

    python -m benchmarks.bench_auto_quantize [--models cls orientation ...] [--quick] [--drop 0.01]
        [--iterations 200] [--candidates W4A8 W8A8 W8A16 W16A16 FP16] [--batches N]

Per model: the metric of the float model, of W8A8 defaults and of W16A16 everywhere (each calibrated on the
same data), the score auto_quantize reached, its relative bit operations and share of quantizers above 8
bits, its wall time (also in float passes over the calibration data, the issue's yardstick: at most 30 plus
the AdaRound / Sequential MSE time it chose to spend), whether the budget was met, and the score of the
chosen configuration's QDQ export in a default onnxruntime session (what is deployed). Metrics where lower
is better (CER) are negated for the callback (higher is better) and printed as they are. ``--batches N``
keeps the first N calibration and evaluation batches (shorter runs on a loaded machine).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import onnx
import onnxruntime as ort

from benchmarks.suite import cases as C
from benchmarks.suite import run as R
from mixed_precision import auto_quantize
from quantsim import QuantizationSimModel


class CaseScore:
    """The case's primary metric of a session's outputs on the evaluation feeds (higher is better)."""

    def __init__(self, case: C.Case):
        self.case = case
        fp32 = ort.InferenceSession(str(case.model_path), providers=["CPUExecutionProvider"])
        self.reference = [fp32.run(None, feed) for feed in case.eval]
        self.sign = 1.0 if case.higher_is_better else -1.0

    def __call__(self, session) -> float:
        outputs = [session.run(None, feed) for feed in self.case.eval]
        return self.sign * float(self.case.score(self.reference, outputs)[self.case.primary])


def _float_pass_seconds(case: C.Case) -> float:
    session = ort.InferenceSession(str(case.model_path), providers=["CPUExecutionProvider"])
    session.run(None, case.calib[0])
    t0 = time.perf_counter()
    for feed in case.calib:
        session.run(None, feed)
    return time.perf_counter() - t0


def _uniform(case: C.Case, score: CaseScore, param: str, activation: str) -> float:
    sim = QuantizationSimModel(str(case.model_path), param_type=param, activation_type=activation, progress=False,
                               fold_batchnorm=True, range_health=True, depthwise_supergroups=True)
    sim.compute_encodings(case.calib)
    return score(sim.session)


def bench(key: str, size: C.Size, drop: float, iterations: int, candidates: list[str] | None,
          batches: int | None = None) -> dict:
    fetch, build = R.BUILDERS[key]
    case = build(R.model_fetchers()[fetch](None), size)
    if batches:
        case.calib, case.eval = case.calib[:batches], case.eval[:batches]
    score = CaseScore(case)
    one_pass = _float_pass_seconds(case)
    w16 = _uniform(case, score, "int16", "int16")
    t0, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = auto_quantize(onnx.load(str(case.model_path)), case.calib, score, drop, candidates=candidates,
                               adaround_iterations=iterations, progress=False)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu
    qdq = result.sim.to_onnx_qdq()
    deployed = score(ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"]))
    rounding = sum(s.seconds for s in result.steps if s.stage == "seq_mse+adaround")
    return {"model": case.name, "metric": case.primary, "sign": score.sign, "float": result.reference_score,
            "w8a8": result.steps[0].score, "w16a16": w16, "auto": result.score, "bops": result.relative_bops,
            "share": result.promoted_share, "seconds": seconds, "cpu": cpu, "passes": (seconds - rounding) / max(one_pass, 1e-9),
            "met": result.budget_met, "deployed": deployed, "chosen": result.chosen.label,
            "steps": len(result.steps)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["cls", "orientation"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--drop", type=float, default=0.01)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--candidates", nargs="*")
    parser.add_argument("--batches", type=int, default=None, help="keep the first N calibration and evaluation batches")
    args = parser.parse_args(argv)
    rows = ["| model | metric | FP32 | W8A8 | W16A16 | auto_quantize | relative BOPs | > 8 bits | time s (float passes "
            "besides rounding) | budget met | QDQ export | chosen |", "|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|---|"]
    for key in args.models:
        r = bench(key, C.QUICK if args.quick else C.FULL, args.drop, args.iterations, args.candidates, args.batches)
        s = r["sign"]
        rows.append(f"| {r['model']} | {r['metric']} | {s * r['float']:.4f} | {s * r['w8a8']:.4f} | {s * r['w16a16']:.4f} "
                    f"| {s * r['auto']:.4f} | {r['bops']:.3f} | {100 * r['share']:.0f}% | {r['seconds']:.0f} "
                    f"({r['passes']:.0f}) | {'yes' if r['met'] else 'no'} | {s * r['deployed']:.4f} | {r['chosen']} |")
        print(rows[-1], flush=True)
        print(f"[auto_quantize] {r} (CPU {r['cpu']:.0f} s)", file=sys.stderr, flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
