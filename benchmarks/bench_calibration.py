"""Calibration cost on the real models, side by side: FP32 one-shot, quantsim, aimet-onnx.

    python -m benchmarks.bench_calibration [--models silero,cls,orientation,det,rec] [--repeats 3] [--full]
                                           [--baseline DIR]
    OMP_NUM_THREADS=1 /work/aimet-venv/bin/python -m benchmarks.bench_calibration    # adds aimet-onnx

Per model (`benchmarks.suite` cases, models cached by `benchmarks.suite.fetch`; QUICK calibration splits
unless ``--full``), each repeat runs, one after the other, with a pause and a garbage collection between:

* FP32 one-shot: plain onnxruntime creates a session from the float model and runs every calibration feed
  once, which is the work any calibration has to do at least;
* quantsim: ``QuantizationSimModel(model, quant_scheme="min_max")`` (library defaults, W8A8), then
  ``sim.compute_encodings(feeds)``; both steps timed apart;
* aimet-onnx (only where ``import aimet_onnx`` works, e.g. under its own venv): the same two steps with
  its ``QuantizationSimModel(model, param_type="int8", activation_type="int8", quant_scheme=min_max)``;
* with ``--baseline DIR`` (another checkout of quantsim, e.g. before a change): the quantsim side run from
  that checkout, in a child process that warms up on one feed and then times one run, interleaved with the
  others (its process start and imports are not timed).

aimet-onnx creates its session in the constructor and calibrates on it; quantsim creates its calibration
session inside ``compute_encodings`` (its sim session comes later, when used). So ``compute_encodings``
alone favours aimet-onnx; the like-for-like figure is construction + ``compute_encodings`` ("total"),
shown next to it. Times are wall and process CPU seconds (all threads: the fair measure on a shared
machine); each cell is the range over the repeats, ratios are of the medians. The load average is
printed with each model. The Markdown table goes to benchmarks/results/calibration.md.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import onnx
import onnxruntime as ort

from benchmarks.common import print_and_save, settle

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_MODELS = "silero,cls,orientation,det,rec"


def _load_case(name: str, full: bool):
    from benchmarks.suite import cases, wide_cases
    from benchmarks.suite.fetch import cache_dir

    builders = {**cases.BUILDERS, **wide_cases.BUILDERS}
    if name not in builders:
        raise SystemExit(f"unknown model {name!r}; choose from {sorted(builders)}")
    folder, build = builders[name]
    return build(cache_dir() / "models" / folder, cases.FULL if full else cases.QUICK)


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return wall - start[0], cpu - start[1]


def fp32_one_shot(model: onnx.ModelProto, feeds) -> dict[str, tuple[float, float]]:
    start = _clock()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        session.run(None, feed)
    return {"one-shot": _since(start)}


def quantsim_calibration(model: onnx.ModelProto, feeds) -> dict[str, tuple[float, float]]:
    from quantsim import QuantizationSimModel

    start = _clock()
    sim = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
    built = _since(start)
    start = _clock()
    sim.compute_encodings(feeds)
    calibrated = _since(start)
    return {"quantsim build": built, "quantsim calibrate": calibrated}


def aimet_available() -> bool:
    try:
        import aimet_onnx  # noqa: F401
    except ImportError:
        return False
    return True


def aimet_calibration(model: onnx.ModelProto, feeds) -> dict[str, tuple[float, float]]:
    from aimet_onnx.common.defs import QuantScheme
    from aimet_onnx.quantsim import QuantizationSimModel

    start = _clock()
    sim = QuantizationSimModel(model, param_type="int8", activation_type="int8", quant_scheme=QuantScheme.min_max,
                               providers=["CPUExecutionProvider"])
    built = _since(start)
    start = _clock()
    sim.compute_encodings(feeds)
    calibrated = _since(start)
    return {"aimet build": built, "aimet calibrate": calibrated}


def baseline_calibration(directory: str, name: str, full: bool) -> Callable:
    """The quantsim side from the checkout in ``directory``, timed in a child process (module docstring)."""
    def run(model: onnx.ModelProto, feeds) -> dict[str, tuple[float, float]]:
        command = [sys.executable, "-m", "benchmarks.bench_calibration", "--side", name] + (["--full"] if full else [])
        env = dict(os.environ, PYTHONPATH=directory)
        done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, check=True)
        times = json.loads(done.stdout.strip().splitlines()[-1])
        return {"baseline build": tuple(times["quantsim build"]), "baseline calibrate": tuple(times["quantsim calibrate"])}
    run.warms_itself = True  # type: ignore[attr-defined]
    return run


def bench_model(name: str, full: bool, repeats: int, with_aimet: bool, baseline: str | None = None) -> dict:
    case = _load_case(name, full)
    model = onnx.load(str(case.model_path))
    feeds = case.calib
    sides: list[Callable] = [fp32_one_shot, quantsim_calibration] + ([aimet_calibration] if with_aimet else [])
    if baseline:
        sides.append(baseline_calibration(baseline, name, full))
    samples: dict[str, list[tuple[float, float]]] = {}
    loads = [os.getloadavg()[0]]
    for side in sides:  # warm-up: imports, first-use costs of each library
        if not getattr(side, "warms_itself", False):
            side(model, feeds[:1])
        gc.collect()
    for _ in range(repeats):
        for side in sides:
            gc.collect()
            settle()
            for key, value in side(model, feeds).items():
                samples.setdefault(key, []).append(value)
        loads.append(os.getloadavg()[0])
    return {"model": name, "batches": len(feeds), "samples": samples, "load": (min(loads), max(loads))}


def _median(values: list[tuple[float, float]], which: int) -> float:
    return statistics.median(v[which] for v in values)


def _range(values: list[tuple[float, float]], which: int) -> str:
    lo, hi = min(v[which] for v in values), max(v[which] for v in values)
    return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}-{hi:.3f}"


def _total(samples: dict, side: str) -> list[tuple[float, float]]:
    return [(b[0] + c[0], b[1] + c[1]) for b, c in zip(samples[f"{side} build"], samples[f"{side} calibrate"])]


def to_markdown(rows: list[dict], with_aimet: bool, full: bool) -> str:
    header = (f"## Calibration vs FP32 one-shot{' and aimet-onnx' if with_aimet else ''} "
              f"({datetime.date.today().isoformat()})\n\n{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime "
              f"{ort.__version__}, {'FULL' if full else 'QUICK'} calibration splits, min-max, W8A8 library defaults. "
              "Seconds as min-max over the repeats (CPU = process time, all threads); ratios of the medians; "
              "'total' = construction + compute_encodings (aimet-onnx makes its session in the constructor).\n")
    baseline = any("baseline calibrate" in r.get("samples", {}) for r in rows)
    cols = ["model (batches)", "load avg", "clock", "FP32 one-shot", "quantsim calibrate", "quantsim total",
            "quantsim calibrate / one-shot"]
    if baseline:
        cols += ["baseline calibrate", "baseline total", "baseline calibrate / one-shot"]
    if with_aimet:
        cols += ["aimet calibrate", "aimet total", "aimet calibrate / one-shot", "quantsim / aimet calibrate",
                 "quantsim / aimet total"]
    lines = [header, "| " + " | ".join(cols) + " |", "|" + "---|" * 3 + "--:|" * (len(cols) - 3)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} |" + " |" * (len(cols) - 2))
            continue
        s = r["samples"]
        ours = _total(s, "quantsim")
        for which, clock in ((1, "CPU"), (0, "wall")):
            one = _median(s["one-shot"], which)
            cells = [f"{r['model']} ({r['batches']})", f"{r['load'][0]:.1f}-{r['load'][1]:.1f}", clock,
                     _range(s["one-shot"], which), _range(s["quantsim calibrate"], which), _range(ours, which),
                     f"{_median(s['quantsim calibrate'], which) / one:.2f}x"]
            if baseline:
                cells += [_range(s["baseline calibrate"], which), _range(_total(s, "baseline"), which),
                          f"{_median(s['baseline calibrate'], which) / one:.2f}x"]
            if with_aimet:
                theirs = _total(s, "aimet")
                cells += [_range(s["aimet calibrate"], which), _range(theirs, which),
                          f"{_median(s['aimet calibrate'], which) / one:.2f}x",
                          f"{_median(s['quantsim calibrate'], which) / _median(s['aimet calibrate'], which):.2f}x",
                          f"{_median(ours, which) / _median(theirs, which):.2f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="the suite's FULL calibration splits (default QUICK)")
    ap.add_argument("--no-aimet", action="store_true", help="leave aimet-onnx out even where it imports")
    ap.add_argument("--baseline", help="another quantsim checkout whose calibration runs alongside (module docstring)")
    ap.add_argument("--side", help=argparse.SUPPRESS)  # internal: time the quantsim side of one model, print JSON
    ap.add_argument("--out", default=str(RESULTS / "calibration.md"))
    args = ap.parse_args(argv)
    if args.side:
        warnings.simplefilter("ignore")
        case = _load_case(args.side, args.full)
        model = onnx.load(str(case.model_path))
        quantsim_calibration(model, case.calib[:1])
        gc.collect()
        settle()
        print(json.dumps(quantsim_calibration(model, case.calib)))
        return 0
    with_aimet = not args.no_aimet and aimet_available()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)  # aimet-onnx logs every bias adjustment at INFO
    rows = []
    for name in args.models.split(","):
        print(f"[bench_calibration] {name} ...", flush=True)
        try:
            rows.append(bench_model(name, args.full, args.repeats, with_aimet, args.baseline))
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the run
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
    print_and_save(to_markdown(rows, with_aimet, args.full), args.out)
    print(f"(written to {args.out})")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
