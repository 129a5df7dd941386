"""QDQ export benchmark on the real-model suite: latency against ``quantize_static``'s QDQ model, and how
closely the exported model follows the sim.

    python -m benchmarks.bench_qdq [--quick] [--models det,rec,...,silero] [--repeats 5] [--weight-codes uint8]
                                   [--linear-ops-in-norm-blocks magika]

Per model (the suite's ten cases, :mod:`benchmarks.suite.cases` and :mod:`benchmarks.suite.wide_cases`):
the W8A8 sim of the suite (``param_type="int8", activation_type="int8", quant_scheme="min_max"``, default
per-channel config) calibrated on the calibration split, its ``to_onnx_qdq()`` export, and
``onnxruntime.quantization.quantize_static`` (QDQ, MinMax, QUInt8/QInt8) on the same split, in the suite's
best setting (:func:`benchmarks.suite.run.best_baseline`: per-channel, per-channel after
``quant_pre_process``, or per-tensor weights).
FP32, our QDQ model and quantize_static's run in default onnxruntime sessions (ORT_ENABLE_ALL, free to fuse
Q/DQ into integer kernels) over the evaluation split, round-robin (`benchmarks.common.interleaved_best`);
latency is the best pass. CPU time: the same three models in sessions with one intra-op thread (no
worker threads spinning), best ``time.process_time`` of the interleaved passes: on a loaded machine the
ratio of CPU times is steadier than the ratio of wall times. ``--linear-ops-in-norm-blocks`` adds a row
per listed model whose sim is built with ``linear_ops_in_norm_blocks=True``; ``--earlier DIR`` (the
``--keep`` folder of a run with an earlier version of the export) times those QDQ models in the same
interleaved passes, for before/after ratios that saw the same load.

Agreement with the sim, over the evaluation split:

* **exact**: ``to_onnx_qdq(int32_bias=False)`` in a session with Q/DQ fusion off
  (``session.disable_quant_qdq``): largest absolute difference from ``sim.session`` (0 = the export is
  the sim);
* **default**: ``to_onnx_qdq()`` in a default session: largest absolute difference, and in output steps
  (the output quantizer's scale) where the output is quantized, with the share of output values within
  one step. The difference comes from onnxruntime's integer kernels (requantization with a float
  multiplier, int32 bias) that differ from fake quantization by at most one step per op; through
  several layers those steps add up and can flip a later rounding.

The Markdown table is printed and written to ``benchmarks/results/qdq.md``.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.common import cpu_session, interleaved_best, print_and_save
from benchmarks.suite import cases as C
from benchmarks.suite.run import BUILDERS, best_baseline, model_fetchers, run_all

RESULTS = Path(__file__).resolve().parent / "results"


def _output_step(sim, name: str) -> float | None:
    q = sim.qc_quantize_op_dict.get(name)
    if q is None or not q.enabled or q.encoding is None or q.spec.is_float:
        return None
    return float(np.max(q.encoding.scale))


def agreement(sim, outs_sim, outs_other) -> dict[str, float]:
    """Largest |difference| over all outputs; steps and share within one step over the quantized outputs."""
    names = [o.name for o in sim.session.get_outputs()]
    max_abs, max_steps, within, total = 0.0, 0.0, 0, 0
    for a_all, b_all in zip(outs_sim, outs_other):
        for name, a, b in zip(names, a_all, b_all):
            if not np.issubdtype(np.asarray(a).dtype, np.floating):
                continue
            diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
            max_abs = max(max_abs, float(diff.max(initial=0.0)))
            step = _output_step(sim, name)
            if step:
                steps = diff / step
                max_steps = max(max_steps, float(steps.max(initial=0.0)))
                within += int(np.count_nonzero(steps <= 1.0001))
                total += steps.size
    return {"max_abs": max_abs, "max_steps": max_steps, "within_1": within / total if total else float("nan")}


def bench_case(key: str, model_dirs: dict[str, Path], size: C.Size, repeats: int, workdir: Path,
               keep: Path | None = None, weight_codes: str = "int8", linear_ops_in_norm_blocks: bool = False,
               earlier: Path | None = None) -> dict:
    import quantsim

    src, build = BUILDERS[key]
    case = build(model_dirs[src], size)
    t0 = time.perf_counter()
    sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), param_type="int8", activation_type="int8",
                                        quant_scheme="min_max", progress=False,
                                        linear_ops_in_norm_blocks=linear_ops_in_norm_blocks)
    sim.compute_encodings(case.calib)
    qdq = sim.to_onnx_qdq(weight_codes=weight_codes)
    export_s = time.perf_counter() - t0
    fp32 = cpu_session(case.model_path)
    ref, _ = run_all(fp32, case.eval)
    label, base, _, base_path = best_baseline(case, ref, workdir, weight_codes)
    if base.error or base_path is None:
        raise RuntimeError(f"quantize_static: {base.error}")
    suffix = ".norm_blocks" if linear_ops_in_norm_blocks else ""
    if keep is not None:  # both QDQ models, for onnxruntime's profiler
        keep.mkdir(parents=True, exist_ok=True)
        onnx.save(qdq, str(keep / f"{key}{suffix}.ours.onnx"))
        shutil.copyfile(base_path, keep / f"{key}.quantize_static.onnx")
    earlier_path = earlier / f"{key}{suffix}.ours.onnx" if earlier is not None else None
    if earlier_path is not None and not earlier_path.exists():
        earlier_path = None
    sessions = {"fp32": fp32, "ours": cpu_session(qdq), "base": cpu_session(base_path)}
    if earlier_path is not None:
        sessions["earlier"] = cpu_session(earlier_path)
    outs = {k: run_all(s, case.eval)[0] for k, s in sessions.items() if k in ("ours", "base")}
    outs_sim, _ = run_all(sim.session, case.eval)
    exact, _ = run_all(cpu_session(sim.to_onnx_qdq(int32_bias=False), fused=False), case.eval)
    best = interleaved_best({k: (lambda s=s: run_all(s, case.eval)) for k, s in sessions.items()},
                            repeats=repeats, warmup=1)
    single = {"fp32": cpu_session(case.model_path, threads=1), "ours": cpu_session(qdq, threads=1),
              "base": cpu_session(base_path, threads=1)}
    if earlier_path is not None:
        single["earlier"] = cpu_session(earlier_path, threads=1)
    cpu = interleaved_best({k: (lambda s=s: run_all(s, case.eval)) for k, s in single.items()},
                           repeats=repeats, warmup=1, clock=time.process_time)
    return {
        "name": case.name + (" (linear_ops_in_norm_blocks)" if linear_ops_in_norm_blocks else ""),
        "cpu_fp32_s": cpu["fp32"], "cpu_ours_s": cpu["ours"], "cpu_base_s": cpu["base"], "primary": case.primary,
        "metric_ours": case.score(ref, outs["ours"])[case.primary],
        "metric_base": case.score(ref, outs["base"])[case.primary],
        "metric_sim": case.score(ref, outs_sim)[case.primary],
        "fp32_s": best["fp32"], "ours_s": best["ours"], "base_s": best["base"],
        "earlier_s": best.get("earlier"), "cpu_earlier_s": cpu.get("earlier"),
        "exact": agreement(sim, outs_sim, exact)["max_abs"],
        "default": agreement(sim, outs_sim, outs["ours"]),
        "export_s": export_s, "baseline": label,
    }


def render(rows: list[dict], mode: str, repeats: int, weight_codes: str = "int8") -> str:
    lines = [
        f"# QDQ export vs quantize_static ({mode})", "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime "
        f"{ort.__version__}; default sessions, best of {repeats} interleaved passes over the evaluation split; "
        f"8-bit weight codes {weight_codes} (quantize_static weight_type "
        f"{'QUInt8' if weight_codes == 'uint8' else 'QInt8'}).", "",
        "| model | metric vs FP32 | quantize_static setting "
        "| sim | our QDQ | quantize_static QDQ | FP32 / our QDQ | FP32 / quantize_static "
        "| our QDQ / quantize_static | same, CPU time (1 thread) | earlier export / quantize_static (wall; CPU) "
        "| exact export vs sim (max \\|Δ\\|) "
        "| default session vs sim: max \\|Δ\\| "
        "| max steps | share ≤ 1 step |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} |" + " |" * 13)
            continue
        d = r["default"]
        earlier = (f"{r['earlier_s'] / r['base_s']:.2f}x; {r['cpu_earlier_s'] / r['cpu_base_s']:.2f}x"
                   if r.get("earlier_s") else "")
        lines.append(
            f"| {r['name']} | {r['primary']} | {r['baseline']} "
            f"| {r['metric_sim']:.4f} | {r['metric_ours']:.4f} | {r['metric_base']:.4f} "
            f"| {r['fp32_s'] / r['ours_s']:.2f}x | {r['fp32_s'] / r['base_s']:.2f}x | {r['ours_s'] / r['base_s']:.2f}x "
            f"| {r['cpu_ours_s'] / r['cpu_base_s']:.2f}x | {earlier} "
            f"| {r['exact']:.3g} | {d['max_abs']:.3g} | {d['max_steps']:.0f} | {100 * d['within_1']:.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small splits")
    ap.add_argument("--models", default=",".join(BUILDERS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--linear-ops-in-norm-blocks", default="",
                    help="comma-separated models to add a row for with linear_ops_in_norm_blocks=True")
    ap.add_argument("--earlier", default="",
                    help="a --keep folder of an earlier export: its QDQ models are timed in the same passes")
    ap.add_argument("--keep", default="", help="folder to save both QDQ models of each case in ('' not to)")
    ap.add_argument("--output", default=str(RESULTS / "qdq.md"), help="Markdown path ('' to skip writing)")
    ap.add_argument("--weight-codes", choices=("int8", "uint8"), default="int8",
                    help="8-bit weight code type of our QDQ export (to_onnx_qdq(weight_codes=...)) and of "
                         "quantize_static's (uint8: weight_type=QUInt8); uint8 runs exactly on x86 CPUs without VNNI")
    args = ap.parse_args(argv)
    ort.set_default_logger_severity(3)
    fetchers = model_fetchers()
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    variants = [(k, False) for k in keys] + [
        (k.strip(), True) for k in args.linear_ops_in_norm_blocks.split(",") if k.strip()]
    model_dirs = {src: fetchers[src](None) for src in sorted({BUILDERS[k][0] for k, _ in variants})}
    rows = []
    with tempfile.TemporaryDirectory(prefix="quantsim-qdq-") as tmp:
        for key, option in variants:
            try:
                rows.append(bench_case(key, model_dirs, C.QUICK if args.quick else C.FULL, args.repeats, Path(tmp),
                                       Path(args.keep) if args.keep else None, args.weight_codes, option,
                                       Path(args.earlier) if args.earlier else None))
            except Exception as e:  # noqa: BLE001 - one model's failure is a row, the others still run
                rows.append({"name": key, "error": f"{type(e).__name__}: {e}"[:200]})
            print(f"[bench_qdq] {rows[-1]}", file=sys.stderr)
    table = render(rows, "quick" if args.quick else "full", args.repeats, args.weight_codes)
    print_and_save(table, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
