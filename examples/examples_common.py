"""What the algorithm examples share: loading a model and data, and scoring against FP32."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx


def output_agreement(reference, outputs) -> dict[str, float]:
    """SQNR (dB) of the first output against FP32 and, for 2-D outputs, top-1 agreement."""
    ref = np.concatenate([r[0] for r in reference]).astype(np.float64)
    out = np.concatenate([o[0] for o in outputs]).astype(np.float64)
    sqnr = 10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - out) ** 2), 1e-30))
    result = {"SQNR dB": float(sqnr)}
    if ref.ndim == 2:
        result["top-1 = FP32"] = float(np.mean(ref.argmax(-1) == out.argmax(-1)))
    return result


def npz_batches(path: Path, batch_size: int) -> list[dict]:
    """An ``.npz`` with one array per model input, split along the first axis into feed dicts."""
    arrays = dict(np.load(path))
    count = len(next(iter(arrays.values())))
    return [{k: v[i:i + batch_size] for k, v in arrays.items()} for i in range(0, count, batch_size)]


def load_case(model_path: Path | None, data: Path | None, batch_size: int):
    """``(model, calibration feeds, evaluation feeds)``: the user's, or PP-OCR mobile cls with rendered
    text lines (fetched from the rapidocr-onnxruntime wheel on PyPI; needs the ``bench`` extra)."""
    if model_path is not None:
        if data is None:
            raise SystemExit("--model needs --data (an .npz with one array per model input)")
        batches = npz_batches(data, batch_size)
        split = max(1, len(batches) * 2 // 3)
        return onnx.load(str(model_path)), batches[:split], batches[split:] or batches
    from benchmarks.suite import cases
    from benchmarks.suite.fetch import fetch_ppocr

    case = cases.cls_case(fetch_ppocr(), cases.QUICK)
    return onnx.load(str(case.model_path)), case.calib, case.eval


def parse_case_arguments(doc: str, argv: list[str] | None, *, iterations: int, extra=()) -> argparse.Namespace:
    """The examples' shared options: ``--model``/``--data``/``--batch-size`` (see `load_case`),
    ``--iterations`` and ``--out-dir``; ``extra`` adds ``(flag, kwargs)`` options."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="ONNX model (default: PP-OCR mobile cls)")
    ap.add_argument("--data", type=Path, help=".npz calibration data, one array per model input (with --model)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=iterations, help="AdaRound iterations per layer")
    ap.add_argument("--out-dir", type=Path, default=None)
    for flag, kwargs in extra:
        ap.add_argument(flag, **kwargs)
    return ap.parse_args(argv)
