"""What the examples share: the model and data (yours, or `real_model`'s), options, scoring against FP32.

Self-contained: the examples import only quantsim, adaround, mixed_precision and this folder."""
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
    """``(model, calibration feeds, evaluation feeds)``: the user's (``data`` split 2:1), or PP-OCR mobile cls
    with rendered text lines (`real_model`: 96 lines to calibrate, 64 others to evaluate)."""
    if model_path is not None:
        if data is None:
            raise SystemExit("--model needs --data (an .npz with one array per model input)")
        batches = npz_batches(data, batch_size)
        split = max(1, len(batches) * 2 // 3)
        return onnx.load(str(model_path)), batches[:split], batches[split:] or batches
    import real_model

    calibration, _ = real_model.text_line_batches(96, batch_size, seed=1)
    evaluation, _ = real_model.text_line_batches(64, batch_size, seed=2)
    return onnx.load(str(real_model.classifier_path())), calibration, evaluation


def float_outputs(model: onnx.ModelProto, feeds: list[dict]) -> list[list[np.ndarray]]:
    """Every output of plain onnxruntime FP32 for each feed: the reference the examples score against."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in feeds]


def parse_case_arguments(doc: str, argv: list[str] | None, *, iterations: int | None = None,
                         extra=()) -> argparse.Namespace:
    """The examples' shared options: ``--model``/``--data``/``--batch-size`` (see `load_case`),
    ``--out-dir`` and, given a default ``iterations``, ``--iterations``; ``extra`` adds ``(flag, kwargs)`` options."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="ONNX model (default: PP-OCR mobile cls)")
    ap.add_argument("--data", type=Path, help=".npz calibration data, one array per model input (with --model)")
    ap.add_argument("--batch-size", type=int, default=8)
    if iterations is not None:
        ap.add_argument("--iterations", type=int, default=iterations, help="AdaRound iterations per layer")
    ap.add_argument("--out-dir", type=Path, default=None)
    for flag, kwargs in extra:
        ap.add_argument(flag, **kwargs)
    return ap.parse_args(argv)
