"""`mixed_precision.auto_quantize` on the suite's real models, each with its own task metric as the callback.

    python -m benchmarks.bench_auto_quantize [--models all | cls orientation ...] [--quick] [--drop 0.01]
        [--iterations 200] [--time-budget 600] [--timeout 1500] [--candidates W4A8 W8A8 ...]
        [--nncf-python /path/to/venv/bin/python] [--json FILE] [--render FILE] [--batches N]

Each model runs in a child process with a hard ``--timeout`` (the search's own ``--time-budget`` is only
checked between steps, so one long AMP or AdaRound step can run past it); a model that does not finish is
a row saying so. Per model, on the case's calibration split (scores on its held-out evaluation split):

* the metric of the float model, of W8A8 defaults (the search's first step) and of W16A16 everywhere (the
  same sim switches, calibrated on the same data);
* the score auto_quantize reached, its relative bit operations and share of quantizers above 8 bits, its
  wall and CPU time, and its time in float passes over the calibration data besides the AdaRound /
  Sequential MSE steps (the issue's yardstick: at most 30), whether the budget was met;
* what the chosen configuration delivers once exported (issue 30 item 4), each scored in onnxruntime and
  compared with the search's score: the AIMET encodings + float model loaded onto a fresh sim
  (`load_encodings_to_sim`; compared with the chosen sim's own session, which it must reproduce: the search
  scores the QDQ export, ``score_on="export"``), the QDQ model (`to_onnx_qdq`, a default fused session) and the integer model
  (`export_integer`) where the configuration allows it (else the reason), both with the weight codes that
  run exactly on this CPU (``weight_codes="auto"``; where that is uint8, the default int8-coded QDQ file is
  shown beside, "int8 codes": AVX2 without VNNI saturates them), and the sim's own graph in an unoptimized
  session (how far float-kernel rounding flips alone move the metric: the yardstick for the exports' gaps);
* with ``--nncf-python`` (an interpreter that has nncf; never a dependency of this project), NNCF's
  ``quantize_with_accuracy_control`` on the same data, metric and drop (`benchmarks.nncf_accuracy_control`).

Metrics where lower is better (CER) are negated for the callback (higher is better) and printed as they
are. Rows go to ``--json`` as each model finishes (a rerun with the same file skips the models already
there); ``--render FILE`` prints the Markdown table of such a file.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

from benchmarks.suite import cases as C
from benchmarks.suite import run as R

ALL = ("cls", "orientation", "magika", "ddddocr", "silero", "minilm", "rec", "det", "layout", "nudenet")
AGREEMENT = 0.01  # an export counts as delivering the search's score within this (bench_agreement's target)


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


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _float_pass_seconds(case: C.Case, repeats: int = 3) -> tuple[float, float]:
    """Best wall and best CPU seconds of ``repeats`` float passes over the calibration feeds (after a warm-up)."""
    session = ort.InferenceSession(str(case.model_path), providers=["CPUExecutionProvider"])
    session.run(None, case.calib[0])
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for feed in case.calib:
            session.run(None, feed)
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


SIM_SWITCHES: dict[str, Any] = {"fold_batchnorm": True, "range_health": True, "depthwise_supergroups": True}  # auto_quantize's


def _uniform(case: C.Case, score: CaseScore, param: str, activation: str) -> float:
    from quantsim import QuantizationSimModel

    sim = QuantizationSimModel(str(case.model_path), param_type=param, activation_type=activation, progress=False,
                               **SIM_SWITCHES)
    sim.compute_encodings(case.calib)
    return score(sim.session)


def _exports(sim, score: CaseScore) -> dict[str, Any]:
    """Scores of the chosen sim's exports (an error text instead of a score where one fails).

    The QDQ and integer models are scored with the 8-bit weight codes that onnxruntime multiplies exactly on
    this machine (``weight_codes="auto"``: uint8 where its uint8 x int8 kernels saturate, AVX2 without VNNI;
    `quantsim.graph.int8_kernels`), the deployment `auto_quantize` itself scores; where that is uint8, the
    QDQ file as written by default (int8 codes, exact on VNNI CPUs) is scored too (``qdq_int8_codes``: what
    saturation costs here). ``sim_unoptimized`` is the sim's own graph in a session without graph
    optimizations: the same computation with other float kernels, so its distance from ``sim_now`` is how far
    rounding flips alone move the metric (near-tie codes that float summation order sends either way)."""
    from quantsim import QuantizationSimModel, load_encodings_to_sim
    from quantsim.export.weight_codes import resolve_weight_codes

    out: dict[str, Any] = {"sim_now": score(sim.session)}
    codes = resolve_weight_codes("auto", getattr(sim, "providers", None))
    out["weight_codes"] = codes

    def attempt(name: str, run) -> None:
        try:
            out[name] = run()
        except Exception as error:  # noqa: BLE001 - reported in the table (e.g. 16-bit or 4-bit quantizers)
            out[name] = f"{type(error).__name__}: {' '.join(str(error).split())[:120]}"

    def reload() -> float:
        with tempfile.TemporaryDirectory() as folder:
            sim.export(folder, "chosen")
            fresh = QuantizationSimModel(str(Path(folder) / "chosen.onnx"), progress=False, **SIM_SWITCHES)
            load_encodings_to_sim(fresh, str(Path(folder) / "chosen.encodings"), strict=False)
            return score(fresh.session)

    def unoptimized() -> float:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return score(ort.InferenceSession(sim.sim_model().SerializeToString(), options,
                                          providers=["CPUExecutionProvider"]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attempt("sim_unoptimized", unoptimized)
        attempt("encodings", reload)
        attempt("qdq", lambda: score(_session(sim.to_onnx_qdq(weight_codes=codes))))
        if codes != "int8":
            attempt("qdq_int8_codes", lambda: score(_session(sim.to_onnx_qdq(weight_codes="int8"))))
        attempt("integer", lambda: score(_session(sim.export_integer(weight_codes=codes).model)))
    return out


class _Progress(logging.Handler):
    """Keeps the search's log lines (steps scored, AMP's phases) with their times in the partial row file, so
    a search stopped by the timeout still shows where it was."""

    def __init__(self, row: dict[str, Any], out: Path):
        super().__init__(logging.INFO)
        self.row, self.out, self.t0 = row, out, time.perf_counter()
        row["progress"] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.row["progress"].append(f"{time.perf_counter() - self.t0:.0f} s: {record.getMessage()[:200]}")
        self.out.write_text(json.dumps(self.row, indent=1))


def bench(key: str, size: C.Size, drop: float, iterations: int, candidates: list[str] | None,
          time_budget: float | None, out: Path, batches: int | None = None) -> dict[str, Any]:
    """One model's row (see the module docstring), as plain values; the part known before the search starts
    (float, W8A8, W16A16) is written to ``out`` first, so a search that runs out of time still leaves it."""
    from mixed_precision import auto_quantize

    fetch, build = R.BUILDERS[key]
    case = build(R.model_fetchers()[fetch](None), size)
    if batches:  # the first N calibration and evaluation batches: shorter runs on a loaded machine
        case.calib, case.eval = case.calib[:batches], case.eval[:batches]
    score = CaseScore(case)
    pass_wall, pass_cpu = _float_pass_seconds(case)
    fp32 = score(ort.InferenceSession(str(case.model_path), providers=["CPUExecutionProvider"]))
    row: dict[str, Any] = {"key": key, "model": case.name, "metric": case.primary, "sign": score.sign, "float": fp32,
                           "w8a8": _uniform(case, score, "int8", "int8"), "w16a16": _uniform(case, score, "int16", "int16"),
                           "pass_seconds": pass_wall, "pass_cpu_seconds": pass_cpu}
    out.write_text(json.dumps(row, indent=1))
    progress = _Progress(row, out)
    logging.getLogger("mixed_precision").addHandler(progress)
    logging.getLogger("mixed_precision").setLevel(logging.INFO)
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as results:
        warnings.simplefilter("ignore")
        result = auto_quantize(onnx.load(str(case.model_path)), case.calib, score, drop, candidates=candidates,
                               adaround_iterations=iterations, progress=False, time_budget=time_budget,
                               results_dir=results)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    rounding = sum(s.seconds for s in result.steps if s.stage == "seq_mse+adaround")
    # rounding's CPU share is not measured apart: estimated at the search's overall CPU / wall ratio
    rounding_cpu = rounding * cpu / max(seconds, 1e-9)
    row.update({"float": result.reference_score, "w8a8_search": result.steps[0].score, "auto": result.score,
                "bops": result.relative_bops, "share": result.promoted_share, "seconds": seconds, "cpu_seconds": cpu,
                "rounding_seconds": rounding, "passes": (seconds - rounding) / max(pass_wall, 1e-9),
                "cpu_passes": (cpu - rounding_cpu) / max(pass_cpu, 1e-9), "met": result.budget_met,
                "chosen": result.chosen.label, "message": result.message, "counts": dict(result.counts),
                "steps": [[s.stage, s.score, s.relative_bops, s.seconds] for s in result.steps]})
    row.update(_exports(result.sim, score))
    return row


# ---------------------------------------------------------------------------------------------- the driver
def _child(key: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.bench_auto_quantize", "--one", key, "--json", str(out),
               "--drop", str(args.drop), "--iterations", str(args.iterations)]
    command += ["--quick"] if args.quick else []
    command += ["--time-budget", str(args.time_budget)] if args.time_budget else []
    command += ["--candidates", *args.candidates] if args.candidates else []
    command += ["--batches", str(args.batches)] if args.batches else []
    t0 = time.perf_counter()
    try:
        done = subprocess.run(command, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"key": key, "model": key, **_partial(out), "error": f"search did not finish in {args.timeout:.0f} s"}
    if done.returncode or "auto" not in _partial(out):
        tail = " ".join(done.stderr.strip().splitlines()[-1:])[:200]
        return {"key": key, "model": key, **_partial(out),
                "error": f"failed after {time.perf_counter() - t0:.0f} s: {tail}"}
    return _partial(out)


def _partial(out: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(out.read_text()))
    except (OSError, ValueError):
        return {}


def _nncf(key: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [args.nncf_python, "-m", "benchmarks.nncf_accuracy_control", "--models", key, "--json", str(out),
               "--drop", str(args.drop)] + (["--quick"] if args.quick else [])
    try:
        done = subprocess.run(command, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {args.timeout:.0f} s"}
    if done.returncode or not out.exists():
        return {"error": "failed: " + " ".join(done.stderr.strip().splitlines()[-1:])[:200]}
    return json.loads(out.read_text())[0]


def _fmt(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if isinstance(value, (int, float)):
        return f"{row['sign'] * value:.4f}"
    return "n/a" if value is None else f"fails ({value[:60]})"


def _delivers(row: dict[str, Any], name: str, against: str = "auto") -> str:
    """The cell of export ``name``, marked (!) when it is further than `AGREEMENT` from ``row[against]``."""
    value = row.get(name)
    if not isinstance(value, (int, float)):
        return _fmt(row, name)
    reference = row.get(against)
    ok = abs(value - (reference if isinstance(reference, (int, float)) else row["auto"])) <= AGREEMENT
    return f"{_fmt(row, name)}{'' if ok else ' (!)'}"


def _aside(row: dict[str, Any]) -> str:
    """The QDQ cell's notes: the int8-coded file where this CPU saturates it, the sim's unoptimized session."""
    notes = [f"{name} {_fmt(row, key)}" for key, name in (("qdq_int8_codes", "int8 codes"),
                                                          ("sim_unoptimized", "sim unoptimized")) if key in row]
    return f" ({'; '.join(notes)})" if notes else ""


def _nncf_cell(row: dict[str, Any]) -> str:
    n = row.get("nncf")
    if not n:
        return "not run"
    if "skipped" in n or "error" in n:
        return (n.get("skipped") or n["error"])[:80]
    s = n["sign"]
    plain = f"W8A8 {s * n['plain_score']:.4f}; " if "plain_score" in n else ""
    share = f"{n['reverted_ops']} of {n['quantized_ops']} ops reverted to float; " if n.get("quantized_ops") else ""
    return f"{s * n['score']:.4f} ({'met' if n['met'] else 'missed'}; {plain}{share}{n['seconds']:.0f} s)"


def verdict(row: dict[str, Any], drop: float) -> str:
    """Issue 30's target on this row: met wherever W16A16 meets the budget, at most half the quantizers above
    8 bits, at most 30 float passes besides rounding (wall; the CPU-time count beside it)."""
    if "w16a16" not in row:
        return "?"
    w16_meets = row["w16a16"] >= row["float"] - drop
    if "auto" not in row:
        return "no (did not finish)" if w16_meets else "n/a (W16A16 misses too)"
    misses = [] if row["met"] or not w16_meets else ["budget"]
    misses += ["> 8 bits"] if row["share"] > 0.5 else []
    misses += ["time"] if min(row["passes"], row.get("cpu_passes", row["passes"])) > 30 else []
    return "yes" if not misses else f"no ({', '.join(misses)})"


HEADER = ("| model | metric | FP32 | W8A8 | W16A16 | auto_quantize | met | rel. BOPs | > 8 bits | s (CPU s) | float "
          "passes besides rounding: wall / CPU (rounding s) | encodings | QDQ | integer | NNCF accuracy control | "
          "target | chosen |\n|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|---|---|---|")


def render(row: dict[str, Any], drop: float = 0.01) -> str:
    head = f"| {row['model']} | {row.get('metric', '')} | {_fmt(row, 'float')} | {_fmt(row, 'w8a8')} | {_fmt(row, 'w16a16')} "
    if "auto" not in row:
        last = f"; last logged at {row['progress'][-1][:90]}" if row.get("progress") else ""
        return head + f"| {row.get('error', '?')}{last} | | | | | | | | | {_nncf_cell(row)} | {verdict(row, drop)} | |"
    return head + (f"| {_fmt(row, 'auto')} | {'yes' if row['met'] else 'no'} | {row['bops']:.3f} | {100 * row['share']:.0f}% "
                   f"| {row['seconds']:.0f} ({row['cpu_seconds']:.0f}) | {row['passes']:.0f} / "
                   f"{row.get('cpu_passes', float('nan')):.0f} ({row['rounding_seconds']:.0f}) "
                   f"| {_delivers(row, 'encodings', 'sim_now')} | {_delivers(row, 'qdq')}{_aside(row)} "
                   f"| {_delivers(row, 'integer')} "
                   f"| {_nncf_cell(row)} | {verdict(row, drop)} | {row['chosen']} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(ALL), help=f"suite keys (default all: {' '.join(ALL)})")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--drop", type=float, default=0.01)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--time-budget", type=float, help="auto_quantize's time_budget (seconds)")
    parser.add_argument("--timeout", type=float, default=1500.0, help="hard limit per model and per NNCF run")
    parser.add_argument("--candidates", nargs="*")
    parser.add_argument("--nncf-python", help="an interpreter with nncf installed (benchmarks/nncf_accuracy_control)")
    parser.add_argument("--json", type=Path, help="rows, kept as each model finishes; models already there are skipped")
    parser.add_argument("--render", type=Path, help="print the table of this JSON file and stop")
    parser.add_argument("--nncf-json", type=Path, help="with --render: NNCF rows (nncf_accuracy_control --json) to merge")
    parser.add_argument("--batches", type=int, help="keep the first N calibration and evaluation batches")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one model, its row to --json
    args = parser.parse_args(argv)
    if args.one:
        row = bench(args.one, C.QUICK if args.quick else C.FULL, args.drop, args.iterations, args.candidates,
                    args.time_budget, args.json, args.batches)
        args.json.write_text(json.dumps(row, indent=1))
        return 0
    if args.render:
        shown = json.loads(args.render.read_text())
        nncf = {n["key"]: n for n in json.loads(args.nncf_json.read_text())} if args.nncf_json else {}
        for row in shown:
            row.setdefault("nncf", nncf.get(row["key"]))
        print("\n".join([HEADER, *(render(r, args.drop) for r in shown)]))
        return 0
    rows: list[dict[str, Any]] = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n{HEADER}", flush=True)
    for key in args.models:
        if any(r["key"] == key for r in rows):
            continue
        with tempfile.TemporaryDirectory() as scratch:
            row = _child(key, args, Path(scratch) / "row.json")
            if args.nncf_python:
                row["nncf"] = _nncf(key, args, Path(scratch) / "nncf.json")
        row["load"] = os.getloadavg()
        rows.append(row)
        print(render(row, args.drop), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
