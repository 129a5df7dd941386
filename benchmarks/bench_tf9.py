"""Keras models through tf2onnx at opset 9 (and 13), end to end through the sim and every export.

    python -m benchmarks.bench_tf9 [--dir ~/.cache/quantsim/models/tf9] [--models upsample MobileNetV2 ...]
        [--weight-codes uint8|int8] [--output benchmarks/results/tf9.md]

Reads the ``<model>.opset<N>.onnx`` files and their ``.npz`` feeds that `benchmarks.suite.tf_opset9_export`
wrote (its own tensorflow environment). Per file, each step in its own ``try`` so one failure does not hide
the next: ``QuantizationSimModel(path, quant_scheme="min_max")`` calibrated on the first feeds; the sim
against FP32 on the held-out feeds (relative error: max |difference| over max |FP32| of the first output;
top-1: argmax over the last axis agrees, per row or per pixel); ``to_onnx_qdq`` run in onnxruntime with
Q/DQ fusion off (the largest absolute difference from the sim: 0 when the export is the sim), in a default
session (against FP32), and the opset it is written at; ``export_integer`` (the ops its report lists as
left in float, and its outputs against FP32); ``sim.export`` then
``load_encodings_to_sim`` on a fresh sim (largest difference between the two sims' outputs: 0 when the round
trip is exact). A step that raises is shown as ``ErrorType: message``.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.common import cpu_session, print_and_save

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = Path.home() / ".cache" / "quantsim" / "models" / "tf9"
CALIBRATION = 4


def sidecar_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    """The feeds stored beside ``path`` (``<stem>.npz``: per input, feeds stacked on a new first axis)."""
    with np.load(path.with_suffix(".npz")) as stored:
        names = list(stored.files)
        arrays = {name: stored[name] for name in names}
    return [{name: arrays[name][k] for name in names} for k in range(len(arrays[names[0]]))]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def _outputs(session, feeds) -> list[np.ndarray]:
    return [session.run(None, feed)[0] for feed in feeds]


def _quality(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    rel = [float(np.abs(g - r).max() / max(float(np.abs(r).max()), 1e-12)) for r, g in zip(ref, got)]
    top1 = [float(np.mean(np.argmax(g, -1) == np.argmax(r, -1))) for r, g in zip(ref, got)]
    return float(np.mean(rel)), float(np.mean(top1))


def _max_diff(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    return max(float(np.abs(g.astype(np.float64) - r).max()) for r, g in zip(ref, got))


def bench_file(path: Path, weight_codes: str) -> dict:
    """Every step on one file; a step's failure is recorded and the steps that do not need it still run."""
    import quantsim

    row: dict = {"name": path.stem, "opset": onnx.load(str(path), load_external_data=False).opset_import}
    row["opset"] = next((o.version for o in row["opset"] if o.domain in ("", "ai.onnx")), None)
    feeds = sidecar_feeds(path)
    calib, held = feeds[:CALIBRATION], feeds[CALIBRATION:] or feeds
    ref = _outputs(cpu_session(path), held)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sim = quantsim.QuantizationSimModel(str(path), quant_scheme="min_max", progress=False)
            sim.compute_encodings(calib)
        row["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:90]}" for w in caught})
        simulated = _outputs(sim.session, held)
    except Exception as exc:  # noqa: BLE001 - recorded per step
        row["sim"] = _error(exc)
        return row
    row["seconds"] = time.perf_counter() - start
    row["sim"] = _quality(ref, simulated)
    try:
        qdq = sim.to_onnx_qdq(weight_codes=weight_codes)
        row["qdq_opset"] = next(o.version for o in qdq.opset_import if o.domain in ("", "ai.onnx"))
        row["qdq"] = _max_diff(simulated, _outputs(cpu_session(qdq, fused=False), held))
        row["qdq_fused"] = _quality(ref, _outputs(cpu_session(qdq), held))
    except Exception as exc:  # noqa: BLE001
        row["qdq"] = _error(exc)
    try:
        integer = sim.export_integer(weight_codes=weight_codes)
        row["floats"] = collections.Counter(e.op_type for e in integer.report)
        row["integer"] = _quality(ref, _outputs(cpu_session(integer.model), held))
    except Exception as exc:  # noqa: BLE001
        row["integer"] = _error(exc)
    try:
        with tempfile.TemporaryDirectory(prefix="quantsim-tf9-") as folder:
            sim.export(folder, "model")
            fresh = quantsim.QuantizationSimModel(str(path), quant_scheme="min_max", progress=False)
            quantsim.load_encodings_to_sim(fresh, os.path.join(folder, "model.encodings"))
            row["encodings"] = _max_diff(simulated, _outputs(fresh.session, held))
    except Exception as exc:  # noqa: BLE001
        row["encodings"] = _error(exc)
    return row


def _cell(value, fmt: str = "{:.3g}") -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return f"{value[0]:.3f} / {value[1]:.2f}"
    return "-" if value is None else fmt.format(value)


def render(rows: list[dict], weight_codes: str) -> str:
    lines = [
        "# Keras models through tf2onnx at opset 9 and 13 (random weights)", "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime "
        f"{ort.__version__}, load {os.getloadavg()[0]:.1f}; W8A8 min-max, weight codes {weight_codes}.", "",
        "| model | sim vs FP32: rel. error / top-1 | QDQ opset | QDQ exact: max diff from sim | QDQ fused vs FP32 "
        "| integer vs FP32 | float ops in integer export | encodings round trip: max diff | s |",
        "|---|---|--:|---|---|---|---|---|--:|",
    ]
    for r in rows:
        floats = r.get("floats")
        floats_cell = (", ".join(f"{op} {n}" for op, n in sorted(floats.items())) or "0") if floats is not None else "-"
        lines.append(f"| {r['name']} | {_cell(r.get('sim'))} | {_cell(r.get('qdq_opset'), '{}')} | "
                     f"{_cell(r.get('qdq'))} | {_cell(r.get('qdq_fused'))} | {_cell(r.get('integer'))} | "
                     f"{floats_cell} | {_cell(r.get('encodings'))} | {_cell(r.get('seconds'), '{:.1f}')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=str(MODELS))
    parser.add_argument("--models", nargs="*", default=[], help="file-name prefixes (default: every file)")
    parser.add_argument("--weight-codes", choices=("int8", "uint8"), default="uint8")
    parser.add_argument("--output", default=str(RESULTS / "tf9.md"), help="Markdown path ('' not to write)")
    args = parser.parse_args(argv)
    files = [f for f in sorted(Path(args.dir).glob("*.onnx")) if f.with_suffix(".npz").exists()
             and (not args.models or any(f.name.startswith(m) for m in args.models))]
    rows = []
    for path in files:
        rows.append(bench_file(path, args.weight_codes))
        print(render(rows[-1:], args.weight_codes).splitlines()[-1], flush=True)
        for line in rows[-1].get("warnings", []):
            print(f"    {line}", flush=True)
    print_and_save(render(rows, args.weight_codes), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
