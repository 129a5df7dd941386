"""Core quantsim benchmark: calibration cost and simulated-inference latency vs plain onnxruntime.

    python -m benchmarks.bench_core [--batches 16] [--batch-size 16] [--repeats 3]
                                    [--models magika,det,rec,cls,minilm,resnet,mobilenet]

Models: magika (real model, real files from this machine as calibration data; fetched
via benchmarks.fetch_models); the real-model suite's PP-OCRv4 det / rec / cls convolutional
nets and paraphrase-MiniLM-L3-v2 with their suite calibration splits (rendered documents, text
lines, stdlib sentences; benchmarks.suite); and two small conv nets built here with onnx.helper
with seeded random weights and N(0,1) 64x64 calibration data (benchmarks.models), whose whole
FP32 pass takes a few tens of milliseconds, so fixed costs (session creation) weigh most there.

Per model, measured side by side in one process (best of ``--repeats``):
  * FP32 pass: a warm plain onnxruntime InferenceSession over the N calibration batches;
  * FP32 one-shot: serialise the model, create the session and run the batches once (cold), which is
    what compute_encodings itself has to do (fixed costs included on both sides);
  * compute_encodings time for min_max and tf_enhanced (a fresh sim each time), and its ratio to both;
  * sim.session latency over the same batches, ratio to FP32;
  * if the SDK offers fused integer kernels (``sim.fused_session()`` or
    ``QuantizationSimModel(..., use_integer_kernels=True)``): that session's latency
    ratio and its max deviation from the exact sim, in output quantization steps.
The Markdown table is printed and written to benchmarks/results/core.md.
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.common import (
    SETTLE_SECONDS,
    activation_scales,
    best_of,
    interleaved_best,
    quiet_kwargs,
    ratio_cell,
    settle,
    top1_agreement,
)

TARGETS = {"min_max": 1.5, "tf_enhanced": 3.0, "sim": 1.5}
RESULTS = Path(__file__).resolve().parent / "results"
SUITE_CASES = {"det": "det_case", "rec": "rec_case", "cls": "cls_case", "minilm": "minilm_case"}
NOT_CLASSIFIERS = {"det", "rec", "minilm"}  # their top-1 column would be meaningless: the suite scores them


def load_models(names: list[str], n_batches: int, batch_size: int):
    from benchmarks import models

    out = []
    for name in names:
        if name == "magika":
            from benchmarks import magika_inputs as mi
            from benchmarks.fetch_models import fetch_magika

            d = fetch_magika()
            feats = mi.features(mi.find_real_files(n_batches * batch_size, seed=1), d)
            out.append(("magika", onnx.load(str(d / "model.onnx")),
                        mi.batches(feats, batch_size, mi.input_name(d)), f"{len(feats)} real files", True))
        elif name in SUITE_CASES:
            from benchmarks.suite import cases as suite_cases
            from benchmarks.suite.fetch import fetch_minilm, fetch_ppocr

            directory = fetch_minilm() if name == "minilm" else fetch_ppocr()
            case = getattr(suite_cases, SUITE_CASES[name])(directory, suite_cases.FULL)
            out.append((case.name, onnx.load(str(case.model_path)), case.calib, case.data, name not in NOT_CLASSIFIERS))
        elif name == "resnet":
            m = models.resnet_like(seed=0)
            out.append(("resnet_like (BN unfolded)", m, models.random_feeds(m, n_batches, batch_size, seed=10), "N(0,1)", True))
        elif name == "mobilenet":
            m = models.mobilenet_like(seed=1)
            feeds = models.random_feeds(m, n_batches, batch_size, seed=11)
            out.append(("mobilenet_like (dw, Clip 0-6)", m, feeds, "N(0,1)", True))
        else:
            raise SystemExit(f"unknown model {name!r}")
    return out


def _output_step(sim, out_name: str, sim_out: np.ndarray) -> tuple[float, str]:
    """Output quantization step: from the exported encodings, else estimated from the sim output grid."""
    try:
        with tempfile.TemporaryDirectory() as d:
            sim.export(d, "m")
            enc = next(Path(d).glob("*.encodings"))
            scales = activation_scales(enc)
        if out_name in scales:
            return scales[out_name], "encodings"
    except Exception:
        pass
    u = np.unique(sim_out.astype(np.float64))
    diffs = np.diff(u)
    diffs = diffs[diffs > 1e-12 * max(1.0, float(np.abs(u).max()))]
    return (float(diffs.min()) if diffs.size else float("nan")), "estimated"


def _fused(QSM, model, feeds, kwargs, exact_sim):
    """(session, how) for fused integer kernels, or (None, reason)."""
    if hasattr(exact_sim, "fused_session"):
        return exact_sim.fused_session(), "sim.fused_session()"
    try:
        params = inspect.signature(QSM).parameters
    except (TypeError, ValueError):
        params = {}
    if "use_integer_kernels" in params:
        s = QSM(model, use_integer_kernels=True, **kwargs)
        s.compute_encodings(feeds)
        return s.session, "use_integer_kernels=True"
    return None, "SDK has no fused integer kernels (no sim.fused_session / use_integer_kernels)"


def _first_outputs(session, feeds) -> list[np.ndarray]:
    """Output 0 of every feed (batches may differ in shape, so they are not concatenated)."""
    return [session.run(None, dict(f))[0] for f in feeds]


def _pass(session, feeds):
    """One timed inference pass: every feed, all outputs, nothing else."""
    return lambda: [session.run(None, f) for f in feeds]


def _fp32_one_shot(model, feeds) -> float:
    """Seconds for plain onnxruntime to run the data once from the ModelProto: serialise, create, first pass.

    compute_encodings is such a one-shot job (it too serialises a model, creates a session and runs the
    data through it cold), so this is its like-for-like FP32 counterpart.
    """
    settle()
    t0 = time.perf_counter()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _pass(session, feeds)()
    return time.perf_counter() - t0


def bench_model(QSM, name, model, feeds, data_desc, repeats, classifier=True):
    row = {"model": name, "data": data_desc, "batches": len(feeds),
           "batch": next(iter(feeds[0].values())).shape[0], "notes": []}
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out_name = fp32.get_outputs()[0].name
    ref = _first_outputs(fp32, feeds)
    fp32_pass = _pass(fp32, feeds)
    fp32_pass()  # warm-up
    # Calibration: each repeat times an FP32 pass, then a fresh sim's compute_encodings, so the
    # best-of FP32 and best-of calibration come from the same stretch of machine load.
    t_fp32, t_oneshot = [], []
    sims = {}
    for scheme in ("min_max", "tf_enhanced"):
        kwargs = dict(param_type="int8", activation_type="int8", quant_scheme=scheme, **quiet_kwargs(QSM))
        best, build = float("inf"), float("inf")
        for _ in range(repeats):
            t_fp32.append(best_of(fp32_pass, repeats=1, warmup=0))
            t_oneshot.append(_fp32_one_shot(model, feeds))
            settle()
            t0 = time.perf_counter()
            sim = QSM(model, **kwargs)
            t1 = time.perf_counter()
            sim.compute_encodings(feeds)
            t2 = time.perf_counter()
            build, best = min(build, t1 - t0), min(best, t2 - t1)
        row[scheme], row[f"{scheme}_build"] = best, build
        sims[scheme] = sim
    row["fp32"], row["fp32_oneshot"] = min(t_fp32), min(t_oneshot)
    sim = sims["min_max"]
    sim_out = _first_outputs(sim.session, feeds)
    if classifier:
        row["agree"] = top1_agreement(np.concatenate(ref), np.concatenate(sim_out))
    fns = {"fp32": fp32_pass, "sim": _pass(sim.session, feeds)}
    try:
        sess, how = _fused(QSM, model, feeds, dict(param_type="int8", activation_type="int8", quant_scheme="min_max",
                                                   **quiet_kwargs(QSM)), sim)
    except Exception as e:
        sess, how = None, f"fused kernels failed: {type(e).__name__}: {e}"
    if sess is None:
        row["notes"].append(how)
    else:
        fns["fused"] = _pass(sess, feeds)
        fused_out = _first_outputs(sess, feeds)
        step, src = _output_step(sim, out_name, np.concatenate([o.ravel() for o in sim_out]))
        steps = np.concatenate([(np.abs(f.astype(np.float64) - o) / step).ravel() for f, o in zip(fused_out, sim_out)])
        row["fused_dev"] = float(steps.max())
        row["fused_within_1"] = float(np.mean(steps <= 1.0 + 1e-6))
        row["notes"].append(f"fused via {how}; deviation in output steps ({src} scale {step:.3g})")
    lat = interleaved_best(fns, repeats=max(repeats, 5))
    row["lat_fp32"] = lat["fp32"]
    row["sim"] = lat["sim"] / lat["fp32"]
    if "fused" in lat:
        row["fused"] = lat["fused"] / lat["fp32"]
    return row


def to_markdown(rows, header: str) -> str:
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    lines = [header, "",
             "| model | calib data | FP32 pass (ms) | FP32 one-shot (ms) | min_max (ms) | min_max / FP32 pass "
             "| min_max / FP32 one-shot | tf_enhanced (ms) | tf_enhanced / FP32 pass | tf_enhanced / FP32 one-shot "
             "| sim / FP32 latency | fused / FP32 latency | fused vs sim: max steps (share ≤1 step) "
             "| top-1 agree (min_max) |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r.get('data', '')} | error: {r['error']} |" + " |" * 11)
            continue
        fused = ratio_cell(r["fused"]) if "fused" in r else "n/a"
        dev = (f"{r['fused_dev']:.0f} ({100 * r['fused_within_1']:.2f}% ≤1)" if "fused_dev" in r else "n/a")
        agree = f"{100 * r['agree']:.1f}%" if "agree" in r else "n/a (see suite)"
        calib = " | ".join(
            f"{ms(r[k])} | {ratio_cell(r[k] / r['fp32'], TARGETS[k])} | {ratio_cell(r[k] / r['fp32_oneshot'], TARGETS[k])}"
            for k in ("min_max", "tf_enhanced"))
        lines.append(
            f"| {r['model']} | {r['data']}, {r['batches']}x{r['batch']} | {ms(r['fp32'])} | {ms(r['fp32_oneshot'])} "
            f"| {calib} | {ratio_cell(r['sim'], TARGETS['sim'])} | {fused} | {dev} | {agree} |")
    short = lambda n: n if len(n) <= 400 else n[:400] + " ..."  # noqa: E731
    notes = [f"- {r['model']}: {short(n)}" for r in rows for n in r.get("notes", [])]
    builds = [f"{r['model']} {r['min_max_build'] * 1e3:.0f} ms" for r in rows if "min_max_build" in r]
    if builds:
        notes.append("- sim construction (not included above): " + ", ".join(builds))
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=16, help="calibration batches (N)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="repeats for compute_encodings (best of); latencies use max(5, this)")
    ap.add_argument("--models", default="magika,det,rec,cls,minilm,resnet,mobilenet")
    ap.add_argument("--out", default=str(RESULTS / "core.md"))
    args = ap.parse_args(argv)

    try:
        from quantsim import QuantizationSimModel as QSM
    except ImportError as e:
        print(f"quantsim.QuantizationSimModel is not available yet ({e})", file=sys.stderr)
        return 2

    rows = []
    for name, model, feeds, desc, classifier in load_models(args.models.split(","), args.batches, args.batch_size):
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(bench_model(QSM, name, model, feeds, desc, args.repeats, classifier))
        except Exception as e:
            rows.append({"model": name, "data": desc, "error": f"{type(e).__name__}: {e}"})
    load = ", load average at end {:.1f}/{:.1f}/{:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    header = (f"## quantsim core benchmark ({datetime.date.today().isoformat()})\n\n"
              f"{platform.machine()}, {os.cpu_count()} CPUs{load}, Python {platform.python_version()}, "
              f"onnxruntime {ort.__version__} (CPUExecutionProvider, default threads); W8A8 int8, default "
              f"config (per-channel weights). Times are for all N calibration batches, best of repeats; FP32 runs "
              f"are interleaved with the measured runs so ratios see the same machine load, and every timed call "
              f"starts after a {SETTLE_SECONDS * 1000:.0f} ms pause so no other session's worker threads are still "
              f"spinning; targets in parentheses. "
              f"compute_encodings is a one-shot job (build the calibration graph and its session, run the data "
              f"once): 'FP32 one-shot' is plain onnxruntime doing the same (create a session from the ModelProto, "
              f"run the data once, cold); 'FP32 pass' leaves out the session creation and runs warm.")
    md = to_markdown(rows, header)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(md)
    print(f"(written to {out})")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
