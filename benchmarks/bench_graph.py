"""Graph networks (scatter/gather message passing) from torch's exporters, through every path of the product.

    python -m benchmarks.bench_graph [--dir ~/.cache/quantsim/models/graph] [--models gcn gat ...]
        [--output results/graph.md]

Takes the ``<model>.<exporter>.onnx`` files and ``<model>.feeds.npz`` input feeds that
`benchmarks.suite.graph_export` wrote (run that first, in a Python with torch). Per file, in one process: the
exported float model against torch's own outputs (the exporter's fidelity), a W8A8 sim (``quant_scheme=
"min_max"``, the default config) calibrated on the first six feeds and evaluated on the rest, its exact QDQ
export (``weight_codes="uint8"``, run with Q/DQ as written), ``export_integer(weight_codes="uint8")``, and
``export`` of the encodings reloaded into a fresh sim with ``load_encodings_to_sim``. Columns: the ops of note
(Scatter*/Gather*/TopK and their reductions), the output's relative error (max |difference| over max |FP32|)
and SQNR for the sim against FP32 (random weights, six calibration graphs: the relative error is mostly
min-max clipping on the evaluation graphs), the worst difference in output steps of the QDQ export, the integer export and the
reloaded sim against the sim, float compute ops left in the integer export, and index tensors a quantizer
touches (an index input of Gather*/Scatter* or TopK's indices reached through Q/DQ: must be none).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.bench_agreement import output_steps
from benchmarks.common import cpu_session, numbered_feeds, print_and_save

RESULTS = Path(__file__).resolve().parent / "results"
GRAPHS = Path.home() / ".cache" / "quantsim" / "models" / "graph"
CALIBRATION = 6
INDEX_SLOTS = {"Gather": 1, "GatherElements": 1, "GatherND": 1, "ScatterElements": 1, "ScatterND": 1, "Scatter": 1}
NOTE = ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "TopK")
SHAPE_OPS = {"Shape", "Constant", "ConstantOfShape", "Reshape", "Unsqueeze", "Squeeze", "Expand", "If", "Slice",
             "Range", "Size", "Cast"}


def load_feeds(path: Path) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
    """The input feeds and torch's outputs of a ``.feeds.npz`` (arrays ``<name>__<k>``, torch's as
    ``torch_output__<k>``)."""
    feeds = numbered_feeds(path)
    return feeds, [feed.pop("torch_output") for feed in feeds if "torch_output" in feed]


def ops_of_note(model: onnx.ModelProto) -> str:
    counts: collections.Counter = collections.Counter()
    for node in model.graph.node:
        if node.op_type in NOTE:
            reduction = next((a.s.decode() for a in node.attribute if a.name == "reduction"), "")
            counts[node.op_type + (f"({reduction})" if reduction and reduction != "none" else "")] += 1
    return ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))


def quantized_indices(model: onnx.ModelProto) -> list[str]:
    """Index inputs of Gather*/Scatter* produced by Q/DQ, and TopK index outputs that reach a Q/DQ."""
    producer = {out: node for node in model.graph.node for out in node.output}
    found = []
    for node in model.graph.node:
        slot = INDEX_SLOTS.get(node.op_type)
        if slot is not None and len(node.input) > slot:
            source = producer.get(node.input[slot])
            if source is not None and source.op_type in ("DequantizeLinear", "QuantizeLinear", "QLinearMul"):
                found.append(f"{node.name}:{slot}")
    topk = {node.output[1] for node in model.graph.node if node.op_type == "TopK" and len(node.output) > 1}
    found += [f"{n.name}<-TopK" for n in model.graph.node if n.op_type in ("QuantizeLinear",) and n.input[0] in topk]
    return found


def _run(session, feeds) -> list[list[np.ndarray]]:
    return [session.run(None, feed) for feed in feeds]


def _rel(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    return max(float(np.abs(g[0] - r[0]).max() / max(float(np.abs(r[0]).max()), 1e-12)) for r, g in zip(ref, got))


def _sqnr(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    """Signal-to-quantization-noise ratio (dB) of the first output over all feeds."""
    signal = sum(float(np.sum(np.square(r[0], dtype=np.float64))) for r in ref)
    noise = sum(float(np.sum(np.square(g[0].astype(np.float64) - r[0]))) for r, g in zip(ref, got))
    return float("inf") if noise == 0 else 10.0 * np.log10(max(signal, 1e-30) / noise)


def bench_file(path: Path, feeds_path: Path) -> dict:
    import quantsim

    feeds, torch_out = load_feeds(feeds_path)
    calib, evaluation = feeds[:CALIBRATION], feeds[CALIBRATION:]
    model = onnx.load(str(path))
    row: dict = {"name": path.name.removesuffix(".onnx"), "ops": ops_of_note(model)}
    fp32 = _run(cpu_session(str(path), threads=1), evaluation)
    row["exporter"] = _rel([[t] for t in torch_out[CALIBRATION:]], fp32)
    start = time.perf_counter()
    stage = "sim"
    try:
        sim = quantsim.QuantizationSimModel(str(path), quant_scheme="min_max", progress=False)
        sim.compute_encodings(calib)
        names = [o.name for o in sim.session.get_outputs()]
        sim_out = _run(sim.session, evaluation)
        row["sim"] = f"{_rel(fp32, sim_out):.3f} / {_sqnr(fp32, sim_out):.1f}"
        stage = "qdq"
        qdq = sim.to_onnx_qdq(weight_codes="uint8")
        row["qdq"] = output_steps(sim, names, sim_out, _run(cpu_session(qdq, fused=False, threads=1), evaluation))
        row["indices"] = quantized_indices(qdq) + [f"sim {x}" for x in quantized_indices(sim.sim_model())]
        stage = "integer"
        integer = sim.export_integer(weight_codes="uint8")
        floats = collections.Counter(e.op_type for e in integer.report
                                     if e.op_type not in SHAPE_OPS and not e.op_type.startswith("graph "))
        row["floats"] = ", ".join(f"{op} {n}" for op, n in sorted(floats.items())) or "0"
        row["integer"] = output_steps(sim, names, sim_out, _run(cpu_session(integer.model, threads=1), evaluation))
        row["indices"] += [f"int {x}" for x in quantized_indices(integer.model)]
        stage = "export/reload"
        with tempfile.TemporaryDirectory(prefix="quantsim-graph-") as folder:
            sim.export(folder, "m")
            fresh = quantsim.QuantizationSimModel(str(path), quant_scheme="min_max", progress=False)
            quantsim.load_encodings_to_sim(fresh, str(Path(folder) / "m.encodings"))
            row["reload"] = output_steps(sim, names, sim_out, _run(fresh.session, evaluation))
    except Exception as error:  # noqa: BLE001 - a failure is the model's row
        row["error"] = f"{stage}: {type(error).__name__}: {str(error)[:160]}"
    row["seconds"] = time.perf_counter() - start
    return row


def render(rows: list[dict]) -> str:
    lines = [
        "# Graph networks through torch's exporters (random weights; `benchmarks.suite.graph_export`)", "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}, onnxruntime {ort.__version__}; W8A8 min-max, uint8 weight codes; "
        f"{CALIBRATION} calibration graphs, the rest evaluated.", "",
        "| model.exporter | ops of note | ONNX vs torch (rel.) | sim vs FP32 (rel. / SQNR dB) | QDQ vs sim (steps) "
        "| float ops in integer export | integer vs sim (steps) | reloaded vs sim (steps) | index quantized | s |",
        "|---|---|--:|--:|--:|---|--:|--:|---|--:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['ops']} | {r['exporter']:.1e} | error: {r['error']} | | | | | | "
                         f"{r['seconds']:.1f} |")
            continue
        lines.append(f"| {r['name']} | {r['ops']} | {r['exporter']:.1e} | {r['sim']} | {r['qdq']} | {r['floats']} "
                     f"| {r['integer']} | {r['reload']} | {', '.join(r['indices']) or 'none'} | {r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=str(GRAPHS))
    parser.add_argument("--models", nargs="+", default=None, help="file-name prefixes to keep")
    parser.add_argument("--output", default=str(RESULTS / "graph.md"), help="Markdown path ('' to skip writing)")
    args = parser.parse_args(argv)
    folder = Path(args.dir)
    files = [f for f in sorted(folder.glob("*.onnx"))
             if not args.models or any(f.name.startswith(m + ".") for m in args.models)]
    rows = []
    for path in files:
        rows.append(bench_file(path, folder / f"{path.name.split('.')[0]}.feeds.npz"))
        print(render(rows[-1:]).splitlines()[-1], flush=True)
    print_and_save(render(rows), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
