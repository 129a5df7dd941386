"""Recurrent text models from torch's exporters through the whole product: sim, QDQ, integer export, encodings.

    python -m benchmarks.bench_recurrent [--dir DIR] [--models lstm_cls_last ...] [--output PATH]

Takes the ``*.onnx`` files and ``*.npz`` feeds that `benchmarks.suite.recurrent_export` wrote (default folder
``~/.cache/quantsim/models/recurrent``; ``--models`` filters by file-name prefix). Per model, in one process:

* the W8A8 sim (``quant_scheme="min_max"``, default config) calibrated and evaluated on its six feeds (random
  weights: the comparison measures quantization noise, not held-out ranges); its outputs against FP32
  (relative error: max |difference| over max |FP32|, and argmax agreement over the last axis, per token where
  the output is per token);
* ``to_onnx_qdq(weight_codes="uint8")`` in onnxruntime, fused (default optimizations) against the sim's
  session, and unfused (``ORT_DISABLE_ALL``) against the sim's model in the same session options (equal bit
  for bit when the export is right);
* ``export_integer(weight_codes="uint8")`` against the sim, and the ops it leaves in float;
* the encodings round trip (``sim.export`` then ``load_encodings_to_sim`` into a fresh sim: its outputs equal
  the first's); W8A16 and W16A16 sims against FP32;
* for a model with a state input and output of one shape (step-by-step decoding), four steps of the integer
  export with integer inputs and outputs, its state codes fed back, against the sim with its float state fed
  back, and whether state input and output share one grid;
* quantizers on tensors that are not float values (token ids, lengths, indices) or that feed index inputs.

Crashes are recorded per column, not fatal. The Markdown table is printed and written to ``benchmarks/results/recurrent.md``.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.common import numbered_feeds, print_and_save

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_DIR = Path.home() / ".cache" / "quantsim" / "models" / "recurrent"
CALIBRATION = 6


def load_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    """The feeds of ``<model>.npz`` (keys ``<input>__<i>``) as a list of feed dicts, in order."""
    return numbered_feeds(path)


def _session(model, optimize: bool = True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _run(session, feeds) -> list[list[np.ndarray]]:
    return [session.run(None, feed) for feed in feeds]


def compare(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> tuple[float, float]:
    """Worst relative error (max |difference| over max |reference|) over outputs and feeds, and the argmax
    agreement over the last axis of the first output (every position of every feed)."""
    rel, agree = 0.0, []
    for r_outs, g_outs in zip(ref, got):
        for r, g in zip(r_outs, g_outs):
            r, g = np.asarray(r, np.float64), np.asarray(g, np.float64)
            rel = max(rel, float(np.abs(g - r).max() / max(float(np.abs(r).max()), 1e-12)))
        agree.append((np.argmax(r_outs[0], -1) == np.argmax(g_outs[0], -1)).ravel())
    return rel, float(np.concatenate(agree).mean())


def suspicious_quantizers(sim) -> list[str]:
    """Quantized tensors that are not float values, or that feed an index/shape input (Gather indices, Range,
    a recurrent op's ``sequence_lens``, Reshape/Expand/Tile/Slice shape operands): none should be quantized."""
    model = sim.prepared_model
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
    index_slots = {"Gather": (1,), "GatherElements": (1,), "GatherND": (1,), "Range": (0, 1, 2), "Reshape": (1,),
                   "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "LSTM": (4,), "GRU": (4,), "RNN": (4,),
                   "ConstantOfShape": (0,), "OneHot": (0, 1), "Unsqueeze": (1,), "Squeeze": (1,)}
    index_inputs = {n.input[i] for n in model.graph.node for i in index_slots.get(n.op_type, ()) if i < len(n.input)}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
    found = []
    for q in sim.quantizers:
        if not q.enabled:
            continue
        for name in getattr(q, "tensor_names", None) or [q.name]:
            if name in types and types[name] not in floats:
                found.append(f"{name} ({onnx.TensorProto.DataType.Name(types[name])})")
            elif name in index_inputs:
                found.append(f"{name} (index input)")
    return found


def state_pairs(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(input, output) pairs of float tensors of one shape: a recurrent state a step-by-step decoder feeds back."""
    def shape(vi):
        return vi.type.tensor_type.elem_type, tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    return [(i.name, o.name) for i in inputs for o in model.graph.output
            if shape(i) == shape(o) and shape(i)[0] == onnx.TensorProto.FLOAT and len(shape(i)[1]) > 1]


def decode_steps(sim, feeds, pairs: list[tuple[str, str]], steps: int = 4) -> str:
    """Step-by-step decoding with the state fed back: the integer export with integer inputs and outputs (state
    codes fed back, moved to the state input's grid where the two grids differ) against the sim (float state
    fed back). Max |difference| of every output over the steps, in dequantized values, and whether the state
    output and input share one grid (the codes can be fed back as they come out)."""
    integer = sim.export_integer(integer_io=True, weight_codes="uint8")
    session = _session(integer.model)
    names = [o.name for o in session.get_outputs()]
    io = integer.io

    def to_codes(name, value):
        if name not in io or "scale" not in io[name]:
            return value
        return np.clip(np.rint(value / io[name]["scale"]) + io[name]["zero_point"], 0, 255).astype(np.uint8)

    def from_codes(name, value):
        if name not in io or "scale" not in io[name]:
            return value
        return (value.astype(np.float32) - io[name]["zero_point"]) * np.float32(io[name]["scale"])
    worst = 0.0
    for feed in feeds[:2]:
        float_feed, code_feed = dict(feed), {k: to_codes(k, v) for k, v in feed.items()}
        for _ in range(steps):
            want = dict(zip(names, sim.session.run(names, float_feed)))
            got = dict(zip(names, session.run(names, code_feed)))
            worst = max(worst, *(float(np.abs(from_codes(n, got[n]) - want[n]).max()) for n in names))
            for state_in, state_out in pairs:  # codes move to the input's grid, as a careful caller does
                float_feed[state_in] = want[state_out]
                code_feed[state_in] = to_codes(state_in, from_codes(state_out, got[state_out]))
    same = all({k: v for k, v in io.get(a, {}).items() if k not in ("role", "shape")}
               == {k: v for k, v in io.get(b, {}).items() if k not in ("role", "shape")} for a, b in pairs)
    return f"{worst:.2g} ({'one grid' if same else 'requantized'})"


def _attempt(row: dict, key: str, fn: Callable[[], object]):
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a crash is a finding, recorded in its column
        row[key] = f"crash: {type(error).__name__}: {str(error)[:160]}"
        row.setdefault("tracebacks", []).append(traceback.format_exc())
        return None


def bench_model(path: Path, workdir: Path) -> dict:
    import quantsim

    feeds = load_feeds(path.with_name(path.name.split(".")[0] + ".npz"))
    calib = feeds[:CALIBRATION]
    row: dict = {"name": path.name.removesuffix(".onnx")}
    fp32 = _run(_session(path), feeds)
    sim = _attempt(row, "sim", lambda: quantsim.QuantizationSimModel(str(path), quant_scheme="min_max",
                                                                     progress=False))
    if sim is None:
        return row
    if _attempt(row, "sim", lambda: sim.compute_encodings(calib)) is None and "sim" in row:
        return row
    sim_out = _run(sim.session, feeds)
    row["sim"] = compare(fp32, sim_out)
    row["suspicious"] = suspicious_quantizers(sim)
    qdq = _attempt(row, "qdq", lambda: sim.to_onnx_qdq(weight_codes="uint8"))
    if qdq is not None:
        row["qdq"] = compare(sim_out, _run(_session(qdq), feeds))
        exact = _run(_session(sim.sim_model(), optimize=False), feeds)  # the same session options on both sides
        row["qdq_exact"] = compare(exact, _run(_session(qdq, optimize=False), feeds))[0]
    integer = _attempt(row, "integer", lambda: sim.export_integer(weight_codes="uint8"))
    if integer is not None:
        _attempt(row, "integer", lambda: row.__setitem__("integer", compare(sim_out, _run(_session(integer.model),
                                                                                            feeds))))
        row["floats"] = collections.Counter(entry.op_type for entry in integer.report)
        row["float_reasons"] = sorted({f"{e.op_type}: {e.reason}" for e in integer.report})

    pairs = state_pairs(onnx.load(str(path)))
    if pairs:
        row["decode"] = _attempt(row, "decode", lambda: decode_steps(sim, feeds, pairs))

    def round_trip():
        sim.export(str(workdir), row["name"])
        fresh = quantsim.QuantizationSimModel(str(path), quant_scheme="min_max", progress=False)
        quantsim.load_encodings_to_sim(fresh, str(workdir / f"{row['name']}.encodings"))
        return max(float(np.abs(a - b).max()) for x, y in zip(sim_out, _run(fresh.session, feeds)) for a, b in zip(x, y))
    row["encodings"] = _attempt(row, "encodings", round_trip)
    for label, param, act in (("w8a16", "int8", "int16"), ("w16a16", "int16", "int16")):
        def wide(param=param, act=act):
            other = quantsim.QuantizationSimModel(str(path), param_type=param, activation_type=act,
                                                  quant_scheme="min_max", progress=False)
            other.compute_encodings(calib)
            return compare(fp32, _run(other.session, feeds))
        result = _attempt(row, label, wide)
        if result is not None:
            row[label] = result
    return row


def _pair(value) -> str:
    if isinstance(value, tuple):
        return f"{value[0]:.3f} / {value[1]:.2f}"
    return "-" if value is None else str(value)


def _number(value) -> str:
    return value if isinstance(value, str) else ("-" if value is None else f"{value:.2g}")


def render(rows: list[dict]) -> str:
    lines = [
        "# Recurrent text models (random weights) from torch's exporters", "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime "
        f"{ort.__version__}; W8A8 min_max, calibrated on {CALIBRATION} feeds, evaluated on 6; weight codes uint8.",
        "",
        "| model | sim vs FP32: rel. err / argmax = | QDQ fused vs sim | QDQ unfused vs sim (max rel.) | integer vs "
        "sim | float ops in integer export | encodings round trip (max abs) | W8A16 vs FP32 | W16A16 vs FP32 | "
        "quantized non-values | state fed back: integer I/O vs sim (max abs, 4 steps; grids) |",
        "|---|---|---|--:|---|---|--:|---|---|---|---|",
    ]
    for r in rows:
        floats = ", ".join(f"{op} {n}" for op, n in sorted(r.get("floats", {}).items())) or "0"
        exact = r.get("qdq_exact")
        enc = r.get("encodings")
        lines.append(" | ".join([
            f"| {r['name']}", _pair(r.get("sim")), _pair(r.get("qdq")), "-" if exact is None else f"{exact:.2g}",
            _pair(r.get("integer")), floats, _number(enc),
            _pair(r.get("w8a16")), _pair(r.get("w16a16")), ", ".join(r.get("suspicious", [])) or "none",
            _number(r.get("decode"))]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=str(DEFAULT_DIR))
    parser.add_argument("--models", nargs="+", default=None, help="file-name prefixes")
    parser.add_argument("--output", default=str(RESULTS / "recurrent.md"), help="Markdown path ('' to skip)")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks and float-op reasons")
    args = parser.parse_args(argv)
    files = sorted(Path(args.dir).glob("*.onnx"))
    files = [f for f in files if not args.models or any(f.name.startswith(m) for m in args.models)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="quantsim-recurrent-") as folder:
        for path in files:
            rows.append(bench_model(path, Path(folder)))
            print(render(rows[-1:]).splitlines()[-1], flush=True)
            if args.verbose:
                for text in rows[-1].get("tracebacks", []) + rows[-1].get("float_reasons", []):
                    print("   ", text.strip().splitlines()[-1] if "Traceback" in text else text, flush=True)
    table = render(rows)
    if args.output:
        print_and_save(table, args.output)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
