"""Automatic mixed precision on the suite's real models where one precision everywhere loses too much.

    python -m benchmarks.bench_amp [--models minilm,cls,rec] [--full] [--threads N] [--phase1 kl|sqnr|task]
                                   [--no-refine | --refine-trials N] [--results DIR [--resume]]
                                   [--saturation on|off|both] [--batches N]

For each model (the suite's quick splits; ``--full`` for its full ones): the candidates everywhere (the cheap
one is "plain"), then `choose_mixed_precision` with a budget on the suite's metric against FP32 (phase 1
scores two held-out batches: minus the mean KL divergence of outputs that are probability distributions
over their last axis, the SQNR of the float outputs otherwise, or with ``--phase1 sqnr`` the SQNR always;
phase 2 the suite's metric on all held-out batches; the refinement pass on unless ``--no-refine``; with
``--phase1 task`` phase 1 scores with the phase-2 callback itself, as `auto_quantize` does).
``--saturation both`` runs each model twice, phase 1's saturation rule on then off (`mixed_precision.amp`),
and says whether both chose the same configuration; ``--batches N`` keeps the first N calibration and
held-out batches (shorter runs). ``rec4`` is `auto_quantize`'s mix for PP-OCRv4 rec (W8A8 misses its budget:
W8A8, W8A16, W16A16, FP16); ``det3``/``layout3`` are the detectors with three candidates.
Printed: plain score, the costly candidate's score, AMP's score, the budget, the share of
quantizers promoted (of those the two candidates set apart), relative bit operations, calibration passes,
evaluations (and the calibrations AIMET's default would run: one per evaluation), wall and CPU time.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.suite import cases as C
from benchmarks.suite.fetch import fetch_all
from benchmarks.suite.run import BUILDERS

PROVIDERS = ["CPUExecutionProvider"]

#: model -> (candidates, costliest first; allowed drop of the primary metric against FP32)
SETUPS = {
    "minilm": (["W8A16", "W8A8"], 0.01),  # cosine mean >= 0.99
    "cls": (["W8A8", "W4A8"], 0.02),  # top-1 agreement >= 98%
    "rec": (["W8A8", "W4A8"], 0.02),  # CER vs FP32 <= 2%
    "rec16": (["W8A16", "W8A8"], 0.02),  # the same budget where W8A8 itself misses it (CER 4%)
    "rec4": (["FP16", "W16A16", "W8A16", "W8A8"], 0.01),  # auto_quantize's costlier mix, its default drop
    "det3": (["W8A16", "W8A8", "W4A8"], 0.02),  # mask IoU mean >= 0.98
    "layout3": (["W8A16", "W8A8", "W4A8"], 0.02),  # detection F1 against FP32 >= 0.98
}
#: setups that run another setup's model
MODEL_OF = {"rec16": "rec", "rec4": "rec", "det3": "det", "layout3": "layout"}


def _outputs(session, feeds):
    return [session.run(None, f) for f in feeds]


def _sqnr(reference, outputs) -> float:
    """SQNR (dB) over every float output (MiniLM's first output is its integer input ids)."""
    floats = [k for k, r in enumerate(reference[0]) if np.issubdtype(np.asarray(r).dtype, np.floating)]
    ref = np.concatenate([r[k].reshape(-1) for r in reference for k in floats]).astype(np.float64)
    out = np.concatenate([o[k].reshape(-1) for o in outputs for k in floats]).astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - out) ** 2), 1e-30)))


def _is_distribution(array: np.ndarray) -> bool:
    """Probabilities over the last axis (a softmax output): non-negative, each row summing to 1."""
    a = np.asarray(array)
    if not np.issubdtype(a.dtype, np.floating) or a.ndim < 1 or a.shape[-1] < 2 or a.min() < 0:
        return False
    return bool(np.allclose(a.sum(axis=-1), 1.0, atol=1e-3))


def _kl(reference, outputs, k: int) -> float:
    """Mean KL(FP32 || quantized) over the rows of output ``k`` (natural log, clamped at 1e-12)."""
    ref = np.concatenate([r[k].reshape(-1, r[k].shape[-1]) for r in reference]).astype(np.float64)
    out = np.concatenate([o[k].reshape(-1, o[k].shape[-1]) for o in outputs]).astype(np.float64)
    ref, out = np.maximum(ref, 1e-12), np.maximum(out, 1e-12)
    return float(np.mean(np.sum(ref * (np.log(ref) - np.log(out)), axis=-1)))


def phase1_score(reference, outputs, proxy: str = "kl") -> float:
    """Phase 1's proxy, higher is better: with ``proxy="kl"``, minus the mean KL divergence of every output
    that is a probability distribution over its last axis (a softmax: the task reads its argmax, and SQNR
    of probabilities is dominated by the few near-tied rows that swap), else the SQNR of the float outputs."""
    dists = [k for k, r in enumerate(reference[0]) if proxy == "kl" and _is_distribution(r)]
    if dists:
        return -float(np.mean([_kl(reference, outputs, k) for k in dists]))
    return _sqnr(reference, outputs)


def run_model(key: str, model_dirs, size, threads: int, results_root: str | None = None, proxy: str = "kl",
              refine: bool | int = True, resume: bool = False, saturation: bool = True,
              batches: int | None = None) -> dict:
    import quantsim
    from mixed_precision import choose_mixed_precision

    src, build = BUILDERS[MODEL_OF.get(key, key)]
    case = build(model_dirs[src], size)
    if batches:
        case.calib, case.eval = case.calib[:batches], case.eval[:batches]
    candidates, drop = SETUPS[key]
    float_session = ort.InferenceSession(str(case.model_path), providers=PROVIDERS)
    reference = _outputs(float_session, case.eval)
    sign = 1.0 if case.higher_is_better else -1.0
    probe = case.eval[:2]
    probe_reference = reference[:2]

    def phase1(session) -> float:
        return phase1_score(probe_reference, _outputs(session, probe), proxy)

    def phase2(session) -> float:
        return sign * case.score(reference, _outputs(session, case.eval))[case.primary]

    if proxy == "task":
        phase1 = phase2  # type: ignore[assignment]  # one callback for both phases, as auto_quantize

    sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), progress=False)
    start, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(threads) if threads > 1 else nullcontext() as pool:
        results = f"{results_root}/{key}" if results_root else scratch
        result = choose_mixed_precision(sim, candidates, phase1, phase2, drop, results, not resume, case.calib,
                                        executor=pool, progress=False, refine=refine, phase1_saturation=saturation)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    row = {
        "model": case.name, "metric": case.primary, "candidates": "/".join(result.candidates),
        "float": sign * result.float_score,
        "plain": sign * result.uniform_scores[result.cheapest], "costly": sign * result.uniform_scores[result.baseline],
        "amp": sign * result.score, "budget": sign * result.target if result.target is not None else float("nan"),
        "met": result.budget_met, "promoted": result.promoted_share, "groups": len(result.groups),
        "promoted_groups": result.promoted_group_share, "bops": result.bitops_ratio,
        "bops_plain": result.uniform_bitops[result.cheapest], "passes": result.calibration_passes,
        "evaluations": result.evaluations, "phase1": result.phase1_evaluations,
        "refine_trials": result.refinement_trials, "cached": result.cached_scores,
        "inferred": result.phase1_inferred, "saturation": saturation, "configuration": result.chosen.precisions,
        "aimet_passes": result.phase1_evaluations + result.phase2_evaluations, "seconds": wall, "cpu": cpu,
        "message": result.message,
    }
    print(f"[amp] {row}", file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="minilm,cls,rec,rec16")
    ap.add_argument("--full", action="store_true", help="the suite's full splits (default: its quick ones)")
    ap.add_argument("--threads", type=int, default=1, help="phase-1 worker threads (ThreadPoolExecutor)")
    ap.add_argument("--phase1", choices=("kl", "sqnr", "task"), default="kl",
                    help="phase-1 proxy: KL divergence of softmax outputs (SQNR otherwise), SQNR of all outputs, "
                         "or the phase-2 metric itself")
    ap.add_argument("--saturation", choices=("on", "off", "both"), default="on",
                    help="phase 1's saturation rule (both: on, then off, and compare the choices)")
    ap.add_argument("--batches", type=int, default=None, help="keep the first N calibration and held-out batches")
    ap.add_argument("--no-refine", action="store_true", help="AIMET's prefix search alone (refine=False)")
    ap.add_argument("--refine-trials", type=int, default=None, help="cap the refinement's trials (refine=N)")
    ap.add_argument("--resume", action="store_true", help="reuse the score cache under --results (clean_start=False)")
    ap.add_argument("--results", default=None, help="keep each model's pareto.json and score cache under this folder")
    args = ap.parse_args(argv)
    size = C.FULL if args.full else C.QUICK
    dirs = fetch_all()
    refine = False if args.no_refine else True if args.refine_trials is None else args.refine_trials
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.saturation]
    rows = [run_model(key, dirs, size, args.threads, args.results, args.phase1, refine,
                      args.resume and args.results is not None, mode, args.batches)
            for key in args.models.split(",") for mode in modes]
    print("| model | candidates | metric | FP32 | plain (cheap everywhere) | costly everywhere | AMP | budget | met "
          "| quantizers promoted | groups promoted | relative BOPs (plain) | calibration passes (AIMET phase 1) "
          "| evaluations (refinement trials, saturated) | wall s (CPU s) |")
    print("|" + "---|" * 15)
    for r in rows:
        print(f"| {r['model']} | {r['candidates']} | {r['metric']} | {r['float']:.4f} | {r['plain']:.4f} "
              f"| {r['costly']:.4f} | {r['amp']:.4f} | {r['budget']:.4f} | {'yes' if r['met'] else 'no'} "
              f"| {100 * r['promoted']:.1f}% | {100 * r['promoted_groups']:.1f}% ({r['groups']} groups in all) "
              f"| {r['bops']:.3f} ({r['bops_plain']:.3f}) | {r['passes']} ({r['aimet_passes']}) "
              f"| {r['evaluations']} ({r['refine_trials']}, {r['inferred']}) | {r['seconds']:.0f} ({r['cpu']:.0f}) |")
    if args.saturation == "both":
        for on, off in zip(rows[::2], rows[1::2]):
            same = off["configuration"] == on["configuration"] and off["amp"] == on["amp"]
            print(f"{on['model']}: saturation rule {'chose the same configuration' if same else 'CHOSE ANOTHER'}"
                  f" ({on['amp']:.4f} at {on['bops']:.3f} against {off['amp']:.4f} at {off['bops']:.3f}); "
                  f"evaluations {off['evaluations']} -> {on['evaluations']}, wall {off['seconds']:.0f} -> "
                  f"{on['seconds']:.0f} s, CPU {off['cpu']:.0f} -> {on['cpu']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
