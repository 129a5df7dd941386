"""NNCF's `quantize_with_accuracy_control` (ONNX backend) on the suite's real models, for `bench_auto_quantize`.

    <python with nncf> -m benchmarks.nncf_accuracy_control [--models cls ...] [--quick] [--drop 0.01] [--json FILE]

NNCF is not a dependency of this project: run this with an interpreter that has it (a separate venv, e.g.
``python3 -m venv /work/nncf-venv && /work/nncf-venv/bin/pip install nncf onnx onnxruntime Pillow
matplotlib scipy``, from the repository root so that ``benchmarks`` imports). Where ``nncf`` does not import,
every model is reported as skipped and the exit status is 0.

Per model, with the same calibration feeds, the same held-out evaluation feeds and the same metric as
`bench_auto_quantize` (the case's primary score against FP32, negated when lower is better: NNCF wants
higher = better) and ``max_drop`` as an absolute drop:

* NNCF's plain W8A8 model (``quantize_with_accuracy_control``'s first step, saved through
  ``intermediate_model_dir``) and its score;
* the accuracy-controlled model's score in onnxruntime, its wall time (CPU time beside it) and how many of
  the quantized operations it reverted to float (NNCF's own count, from its log), also as the share of the
  plain model's DequantizeLinear nodes it removed;
* or the error that stopped NNCF on this model.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

from benchmarks.suite import cases as C
from benchmarks.suite import run as R


class _Scorer:
    """The case's primary metric for a model on (index, feed) items, as NNCF's ``validation_fn`` wants it:
    ``(metric, [metric with only that item's outputs changed])``, higher is better (`metric`, plus 1 when
    the case's metric is negated). One onnxruntime session per model object."""

    def __init__(self, case: C.Case):
        self.case = case
        fp32 = ort.InferenceSession(str(case.model_path), providers=["CPUExecutionProvider"])
        self.reference = [fp32.run(None, feed) for feed in case.eval]
        self.sign = 1.0 if case.higher_is_better else -1.0
        # NNCF computes the relative drop even for DropType.ABSOLUTE (nncf 3.4 calculate_accuracy_drop), which
        # divides by the float model's metric: a negated CER of 0 raises ZeroDivisionError. An offset leaves
        # every absolute drop as it is.
        self.offset = 0.0 if case.higher_is_better else 1.0
        self._held: tuple[Any, ort.InferenceSession] | None = None

    def _session(self, model: onnx.ModelProto) -> ort.InferenceSession:
        if self._held is None or self._held[0] is not model:
            self._held = (model, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]))
        return self._held[1]

    def metric(self, outputs: dict[int, list]) -> float:
        """The metric over every evaluation feed, ``outputs`` standing in for the FP32 outputs of the feeds it
        holds (the case's scores need every feed: some also count ground-truth labels per feed), so a subset
        scores what the full split would if only those feeds changed."""
        merged = [outputs.get(i, ref) for i, ref in enumerate(self.reference)]
        return self.sign * float(self.case.score(self.reference, merged)[self.case.primary])

    def __call__(self, model: onnx.ModelProto, items) -> tuple[float, list[float]]:
        session = self._session(model)
        outputs = {i: session.run(None, feed) for i, feed in items}
        return self.offset + self.metric(outputs), [self.offset + self.metric({i: o}) for i, o in outputs.items()]

    def session_score(self, model: onnx.ModelProto) -> float:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return self.metric({i: session.run(None, feed) for i, feed in enumerate(self.case.eval)})


class _Reverted(logging.Handler):
    """Catches NNCF's "<k> out of <n> were reverted back to the floating-point precision" log line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: tuple[int, int] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"(\d+) out of (\d+) were reverted", record.getMessage())
        if found:
            self.counts = (int(found.group(1)), int(found.group(2)))


def _quantize_nodes(model: onnx.ModelProto) -> int:
    """DequantizeLinear nodes: NNCF's final model stores weights as codes (no weight QuantizeLinear), the
    plain one it saves does not, so QuantizeLinear counts would not compare."""
    return sum(n.op_type == "DequantizeLinear" for n in model.graph.node)


def run_model(key: str, size: C.Size, drop: float) -> dict[str, Any]:
    """NNCF's accuracy-controlled quantization of one suite model; a dict of plain values (see module doc)."""
    fetch, build = R.BUILDERS[key]
    case = build(R.model_fetchers()[fetch](None), size)
    row: dict[str, Any] = {"key": key, "model": case.name, "metric": case.primary}
    try:
        import nncf
    except Exception as error:  # noqa: BLE001 - not installed here: skipped, said so
        row["skipped"] = f"nncf does not import: {type(error).__name__}: {error}"
        return row
    row["nncf"] = nncf.__version__
    scorer = _Scorer(case)
    model = onnx.load(str(case.model_path))
    calibration = nncf.Dataset(case.calib)
    validation = nncf.Dataset(list(enumerate(case.eval)))
    with tempfile.TemporaryDirectory() as scratch:
        params = nncf.AdvancedAccuracyRestorerParameters(intermediate_model_dir=scratch)
        reverted = _Reverted()
        logging.getLogger("nncf").addHandler(reverted)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            quantized = nncf.quantize_with_accuracy_control(
                model, calibration, validation, scorer, max_drop=drop, drop_type=nncf.DropType.ABSOLUTE,
                subset_size=max(len(case.calib), 1), advanced_accuracy_restorer_parameters=params)
        except Exception as error:  # noqa: BLE001 - a model NNCF cannot take is a result to report
            row["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
            row["trace"] = traceback.format_exc()[-1500:]
            row["seconds"] = time.perf_counter() - t0
            logging.getLogger("nncf").removeHandler(reverted)
            return row
        row["seconds"], row["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
        plain_path = Path(scratch) / "intermediate_model.onnx"
        plain = onnx.load(str(plain_path)) if plain_path.exists() else None
    logging.getLogger("nncf").removeHandler(reverted)
    # NNCF logs the count when its restorer ran; without that line the plain model met the drop as it was
    row["reverted_ops"], row["quantized_ops"] = reverted.counts if reverted.counts is not None else (0, None)
    row["sign"] = scorer.sign
    row["float"] = scorer.session_score(model)
    row["score"] = scorer.session_score(quantized)
    row["met"] = row["score"] >= row["float"] - drop
    row["quantize_nodes"] = _quantize_nodes(quantized)
    if plain is not None:
        row["plain_score"] = scorer.session_score(plain)
        row["plain_quantize_nodes"] = _quantize_nodes(plain)
        row["reverted_share"] = 1.0 - row["quantize_nodes"] / max(row["plain_quantize_nodes"], 1)
    return row


def _reverted_text(row: dict[str, Any]) -> str:
    if row.get("quantized_ops") is None:
        return "none (W8A8 met the drop)"
    return f"{row['reverted_ops']} of {row['quantized_ops']} ops to float"


def render(row: dict[str, Any]) -> str:
    """One Markdown table row: model, NNCF W8A8, accuracy-controlled score, reverted share, seconds."""
    if "skipped" in row:
        return f"| {row['model']} | skipped: {row['skipped']} | | | |"
    if "error" in row:
        return f"| {row['model']} | failed after {row['seconds']:.0f} s: {row['error'][:160]} | | | |"
    s = row["sign"]
    plain = f"{s * row['plain_score']:.4f}" if "plain_score" in row else "?"
    share = _reverted_text(row)
    return (f"| {row['model']} | {plain} | {s * row['score']:.4f} ({'met' if row['met'] else 'missed'}) | {share} | "
            f"{row['seconds']:.0f} (CPU {row['cpu_seconds']:.0f}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["cls", "orientation"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--drop", type=float, default=0.01)
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    logging.getLogger("nncf").setLevel(logging.WARNING)
    rows = []
    print("| model | NNCF W8A8 | accuracy control | reverted | seconds |\n|---|--:|--:|--:|--:|")
    for key in args.models:
        rows.append(run_model(key, C.QUICK if args.quick else C.FULL, args.drop))
        print(render(rows[-1]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
