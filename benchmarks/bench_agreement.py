"""Agreement benchmark: does the deployed model score what the sim promised?

    python -m benchmarks.bench_agreement [--quick] [--models cls layout light:resnet50 file:model.onnx ...]
        [--codes int8 uint8] [--reference-feeds 1] [--reference-rounding single double] [--exact yes|no|both]
        [--sim-option int32_bias=False ...]

Per suite model (`benchmarks.suite.cases.BUILDERS` + `benchmarks.suite.wide_cases.BUILDERS`, models cached
by `benchmarks.suite.fetch` in ~/.cache/quantsim/models; W8A8 defaults, min-max, the case's calibration split)
and per 8-bit weight code type (int8, uint8), on the case's evaluation split. ``light:<name>`` is one of the
``onnx`` wheel's light models (`benchmarks.suite.light_models`, random weights; ``light`` alone: all of
`benchmarks.bench_light.MODELS`) and ``file:<path>`` any ONNX file (a torch / tf2onnx export), both on seeded
N(0, 1) inputs (4 calibration / 8 evaluation feeds, QUICK: 2 / 4), scored by top-1 agreement of the first
output with FP32:

* the task metric (the case's primary score against FP32) and the output SQNR to FP32 (all float outputs
  together: ``10 log10(sum fp32^2 / sum (q - fp32)^2)``) of the sim (``sim.session``), of the QDQ export
  (``sim.to_onnx_qdq``) in onnxruntime's default fused session (ORT_ENABLE_ALL: Q/DQ groups fused into
  integer kernels), and of the integer export (``sim.export_integer``) in onnxruntime;
* the worst output difference between the sim and each export, in steps of the output's grid (the output
  quantizer's scale; outputs without one are reported as absolute floats, marked ``f``), and between the sim
  and the integer model run by the integer reference executor (`quantsim.export.reference.run_integer_model`,
  numpy: int32 accumulation, fixed-point requantization) on the first ``--reference-feeds`` evaluation feeds,
  with each ``--reference-rounding``: ``single`` (one rounding of the fixed-point product, as onnxruntime's
  float multiplier up to ties) and ``double`` (gemmlowp's SRDHM + rounding shift, TFLite's reference kernels).

Target (issue 29): metric within 0.01 and SQNR within 0.5 dB of the sim for both exports on every model, at
most one output step between the sim and the reference executor. The table is printed and written to
benchmarks/results/agreement.md. ``--sim-option name=value`` passes a constructor keyword to the sim (repeatable;
values parsed as Python literals) to compare sim variants.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import logging
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.bench_light import MODELS as LIGHT_MODELS
from benchmarks.common import cpu_session

RESULTS = Path(__file__).resolve().parent / "results"
ALL_MODELS = ("cls", "rec", "det", "minilm", "magika", "nudenet", "layout", "orientation", "ddddocr", "silero")


def random_input_case(name: str, model: onnx.ModelProto, quick: bool):
    """A case over ``model`` (saved to a temporary folder) on seeded N(0, 1) inputs, scored by top-1 agreement."""
    import tempfile

    from benchmarks.common import top1_agreement
    from benchmarks.suite.cases import Case

    folder = Path(tempfile.mkdtemp(prefix="agreement-"))
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    constants = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in constants]
    rng = np.random.default_rng(0)
    n_cal, n_eval = (2, 4) if quick else (4, 8)
    feeds = [{i.name: rng.standard_normal([d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32)
              for i in inputs} for _ in range(n_cal + n_eval)]

    def score(ref, q) -> dict[str, float]:
        return {"top-1": float(np.mean([top1_agreement(a[0], b[0]) for a, b in zip(ref, q)]))}
    return Case(name, path, feeds[:n_cal], feeds[n_cal:], score, "top-1", True, "N(0, 1) inputs")


def load_case(name: str, quick: bool):
    from benchmarks.suite import cases, wide_cases
    from benchmarks.suite.fetch import cache_dir

    if name.startswith("light:"):
        from benchmarks.suite.light_models import light_model, randomized

        base = light_model(name.split(":", 1)[1])
        if base is None:
            raise SystemExit(f"{name}: not in this onnx wheel")
        return random_input_case(name, randomized(base), quick)
    if name.startswith("file:"):
        return random_input_case(name, onnx.load(name.split(":", 1)[1]), quick)

    builders = {**cases.BUILDERS, **wide_cases.BUILDERS}
    if name not in builders:
        raise SystemExit(f"unknown model {name!r}; choose from {sorted(builders)}")
    folder, build = builders[name]
    return build(cache_dir() / "models" / folder, cases.QUICK if quick else cases.FULL)


def sqnr_db(ref: list[list[np.ndarray]], out: list[list[np.ndarray]]) -> float:
    """SQNR (dB) of ``out`` to ``ref`` over every float output of every feed."""
    signal = noise = 0.0
    for a_feed, b_feed in zip(ref, out):
        for a, b in zip(a_feed, b_feed):
            if not np.issubdtype(np.asarray(a).dtype, np.floating):
                continue
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            signal += float(np.sum(a64 * a64))
            noise += float(np.sum((a64 - b64) ** 2))
    return float("inf") if noise == 0 else 10.0 * np.log10(max(signal, 1e-30) / noise)


def output_steps(sim, names: list[str], ref: list[list[np.ndarray]], out: list[list[np.ndarray]]) -> str:
    """Worst |out - ref| over outputs in steps of each output's grid (``f``: absolute, float output)."""
    worst_steps, worst_float = 0.0, 0.0
    for k, name in enumerate(names):
        q = sim.qc_quantize_op_dict.get(name)
        enc = q.encoding if q is not None and q.enabled else None
        scale = float(enc.scale) if enc is not None and enc.is_per_tensor and enc.fp8 is None else None
        for a_feed, b_feed in zip(ref, out):
            a, b = np.asarray(a_feed[k]), np.asarray(b_feed[k])
            if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
                continue
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            if scale is not None:
                worst_steps = max(worst_steps, diff / scale)
            else:
                worst_float = max(worst_float, diff)
    text = f"{worst_steps:.0f}"
    return text + (f" / {worst_float:.3g} f" if worst_float else "")


def _run(session, feeds) -> list[list[np.ndarray]]:
    return [session.run(None, f) for f in feeds]


def _best_ms(session, feed, repeats: int = 3) -> float:
    session.run(None, feed)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, feed)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def bench_model(name: str, quick: bool, codes: list[str], reference_feeds: int, sim_options: dict,
                exact: tuple[bool, ...] = (True,), roundings: tuple[str, ...] = ("single", "double")) -> list[dict]:
    import quantsim

    case = load_case(name, quick)
    model = onnx.load(str(case.model_path))
    names = [o.name for o in model.graph.output]
    fp32 = _run(cpu_session(model), case.eval)

    def score(outs) -> float:
        return float(case.score(fp32, outs)[case.primary])

    t0 = time.perf_counter()
    sim = quantsim.QuantizationSimModel(model, progress=False, **sim_options)
    sim.compute_encodings(case.calib)
    sim_outs = _run(sim.session, case.eval)
    rows = [{"model": name, "variant": "sim", "metric": score(sim_outs), "sqnr": sqnr_db(fp32, sim_outs),
             "steps": "", "ref_steps": "", "note": f"{case.primary}; sim {time.perf_counter() - t0:.0f} s"}]
    for code in codes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the int8-saturation warning is this benchmark's subject
            qdq = sim.to_onnx_qdq(weight_codes=code)
        qdq_session = cpu_session(qdq)
        qdq_outs = _run(qdq_session, case.eval)
        rows.append({"model": name, "variant": f"QDQ fused, {code}", "metric": score(qdq_outs),
                     "sqnr": sqnr_db(fp32, qdq_outs), "steps": output_steps(sim, names, sim_outs, qdq_outs),
                     "ref_steps": "", "note": f"{_best_ms(qdq_session, case.eval[0]):.1f} ms"})
        for exact_mode in exact:
            rows += _integer_rows(sim, name, code, exact_mode, case, names, fp32, sim_outs, score,
                                  reference_feeds if code == codes[0] and exact_mode == exact[0] else 0, roundings)
    base = rows[0]
    for row in rows[1:]:
        if np.isfinite(row["metric"]):
            row["d_metric"] = row["metric"] - base["metric"]
            row["d_sqnr"] = row["sqnr"] - base["sqnr"]
    return rows


def _integer_rows(sim, name, code, exact_mode, case, names, fp32, sim_outs, score, reference_feeds,
                  roundings=("single", "double")) -> list[dict]:
    from quantsim.export.reference import run_integer_model

    variant = f"integer, {code}" + ("" if exact_mode else ", exact=False")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = sim.export_integer(weight_codes=code, exact=exact_mode)
    float_nodes = sum(e.op_type not in ("graph input", "graph output") for e in exported.report)
    try:
        session = cpu_session(exported.model)
        int_outs = _run(session, case.eval)
    except Exception as error:  # noqa: BLE001 - a model onnxruntime refuses is a result to report
        return [{"model": name, "variant": variant, "metric": float("nan"), "sqnr": float("nan"),
                 "steps": "", "ref_steps": "", "note": f"onnxruntime failed: {str(error)[:80]}"}]
    texts = []
    for rounding in roundings if reference_feeds else ():
        t1 = time.perf_counter()
        try:
            ref = [list(run_integer_model(exported.model, f, float_fallback=True, rounding=rounding).values())
                   for f in case.eval[:reference_feeds]]
            texts.append(f"{rounding} {output_steps(sim, names, sim_outs[:reference_feeds], ref)}"
                         f" ({time.perf_counter() - t1:.0f} s)")
        except Exception as error:  # noqa: BLE001
            texts.append(f"{rounding} failed: {type(error).__name__}: {str(error)[:60]}")
    ref_text = "; ".join(texts)
    return [{"model": name, "variant": variant, "metric": score(int_outs), "sqnr": sqnr_db(fp32, int_outs),
             "steps": output_steps(sim, names, sim_outs, int_outs), "ref_steps": ref_text,
             "note": f"{float_nodes} float nodes; {_best_ms(session, case.eval[0]):.1f} ms"}]


def render(rows: list[dict], args, load: str) -> str:
    lines = [
        "# Sim vs deployed models (agreement)", "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, onnxruntime {ort.__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load}; "
        f"{'QUICK' if args.quick else 'FULL'} splits; sim options {args.sim_option or 'default'}.", "",
        "| model | variant | metric vs FP32 | Δ metric vs sim | SQNR to FP32 (dB) | Δ SQNR vs sim | max \\|Δ\\| vs sim "
        "(out steps) | reference executor vs sim (out steps) | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        dm = f"{r['d_metric']:+.3f}" if "d_metric" in r else ""
        ds = f"{r['d_sqnr']:+.1f}" if "d_sqnr" in r else ""
        lines.append(f"| {r['model']} | {r['variant']} | {r['metric']:.3f} | {dm} | {r['sqnr']:.1f} | {ds} | "
                     f"{r['steps']} | {r['ref_steps']} | {r['note']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the suite's QUICK splits")
    parser.add_argument("--models", nargs="+", default=list(ALL_MODELS))
    parser.add_argument("--codes", nargs="+", choices=("int8", "uint8"), default=["int8", "uint8"])
    parser.add_argument("--reference-feeds", type=int, default=1,
                        help="evaluation feeds run by the integer reference executor (0: skip; it is numpy, slow)")
    parser.add_argument("--reference-rounding", nargs="+", choices=("single", "double"), default=["single", "double"],
                        help="the reference executor's fixed-point rounding(s)")
    parser.add_argument("--sim-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--exact", choices=("no", "yes", "both"), default="yes",
                        help="the integer export's exact= (yes, the default: HardSwish/HardSigmoid as exact tables; "
                             "no: their faster kernel chains within one step); both: side by side")
    args = parser.parse_args(argv)
    options = {}
    for item in args.sim_option:
        key, _, value = item.partition("=")
        options[key] = ast.literal_eval(value)
    logging.getLogger().setLevel(logging.ERROR)
    ort.set_default_logger_severity(3)
    rows: list[dict] = []
    models = [m for name in args.models for m in
              ([f"light:{n}" for n in LIGHT_MODELS] if name == "light" else [name])]
    for name in models:
        try:
            new = bench_model(name, args.quick, args.codes, args.reference_feeds, options,
                              {"no": (False,), "yes": (True,), "both": (True, False)}[args.exact],
                              tuple(args.reference_rounding))
        except Exception as error:  # noqa: BLE001 - one model's failure is a row, not the end of the run
            new = [{"model": name, "variant": "sim", "metric": float("nan"), "sqnr": float("nan"), "steps": "",
                    "ref_steps": "", "note": f"failed: {type(error).__name__}: {str(error)[:100]}"}]
        rows += new
        print(render(new, args, "").split("\n", 4)[-1], flush=True)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    table = render(rows, args, load)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "agreement.md").write_text(table)


if __name__ == "__main__":
    main()
