"""Small shared helpers for the demo and benchmarks (timing, agreement, encodings lookup)."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

SETTLE_SECONDS = 0.1
"""Pause before every timed call. After a run, onnxruntime's intra-op worker threads keep spin-waiting for
a while; on this 2-core machine a session run right after another session's run shares the cores with
those spinning threads and took up to 2x longer (MobileNet-like: 35 ms alone, 70 ms when alternating with
a second session). A pause of 50 ms removed the effect; 100 ms leaves a margin."""


def settle() -> None:
    """Let the worker threads of the previously run session stop spinning (`SETTLE_SECONDS`)."""
    time.sleep(SETTLE_SECONDS)


def best_of(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
    """Minimum wall time (seconds) of ``fn()`` over ``repeats`` runs after ``warmup`` untimed runs, each
    timed run after `settle`."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(max(1, repeats)):
        settle()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved_best(fns: Mapping[str, Callable[[], object]], repeats: int = 3, warmup: int = 1,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Best-of wall times (or ``clock``, e.g. ``time.process_time``) for several functions run round-robin
    (A B C A B C ...).

    Interleaving makes every candidate see the same background load, so ratios between
    them stay meaningful on a busy machine; `settle` before each call keeps one candidate's spinning
    worker threads from slowing the next.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    best = {k: float("inf") for k in fns}
    for _ in range(max(1, repeats)):
        for k, fn in fns.items():
            settle()
            t0 = clock()
            fn()
            best[k] = min(best[k], clock() - t0)
    return best


def numbered_feeds(path: str | os.PathLike) -> list[dict[str, np.ndarray]]:
    """The feeds of an ``.npz`` whose arrays are named ``<input>__<k>`` (the sidecars `suite.graph_export` and
    `suite.recurrent_export` write), as a list of feed dicts in order of ``k``."""
    feeds: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            name, index = key.rsplit("__", 1)
            feeds.setdefault(int(index), {})[name] = data[key]
    return [feeds[i] for i in sorted(feeds)]


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def run_feeds(session, feeds: Sequence[Mapping[str, np.ndarray]], output_index: int | None = 0):
    """Run an onnxruntime-like session over feeds; concatenate output ``output_index`` (or all outputs)."""
    outs = [session.run(None, dict(f)) for f in feeds]
    if output_index is None:
        return [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]
    return np.concatenate([o[output_index] for o in outs])


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of rows whose argmax over the last axis agrees."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    return float(np.mean(a.reshape(-1, a.shape[-1]).argmax(-1) == b.reshape(-1, b.shape[-1]).argmax(-1)))


def ratio_cell(ratio: float | None, target: float | None = None) -> str:
    """'1.23x' or '1.23x ✓ (≤1.5x)' / '4.00x ✗ (≤1.5x)'."""
    if ratio is None or not np.isfinite(ratio):
        return "n/a"
    s = f"{ratio:.2f}x"
    if target is not None:
        s += f" {'✓' if ratio <= target else '✗'} (≤{target:g}x)"
    return s


def _scalar_scale(entry) -> float | None:
    """Scale of one activation-encoding entry in either AIMET layout (per-tensor only)."""
    if isinstance(entry, list):  # legacy: name -> [ {bitwidth, scale, offset, ...} ]
        entry = entry[0] if len(entry) == 1 else None
    if not isinstance(entry, Mapping):
        return None
    s = entry.get("scale")
    if isinstance(s, list):
        s = s[0] if len(s) == 1 else None
    if s is None and "max" in entry and "min" in entry and "bitwidth" in entry:
        s = (float(entry["max"]) - float(entry["min"])) / (2 ** int(entry["bitwidth"]) - 1)
    return float(s) if s is not None else None


def activation_scales(encodings: str | os.PathLike | Mapping) -> dict[str, float]:
    """tensor name -> per-tensor scale from an AIMET ``.encodings`` file (0.6.1 dict or 1.0.0 list layout)."""
    if not isinstance(encodings, Mapping):
        encodings = json.loads(Path(encodings).read_text())
    act = encodings.get("activation_encodings", {})
    out: dict[str, float] = {}
    if isinstance(act, Mapping):
        items: Iterable = act.items()
    else:
        items = ((e.get("name"), e) for e in act if isinstance(e, Mapping))
    for name, entry in items:
        s = _scalar_scale(entry)
        if name is not None and s is not None and s > 0:
            out[name] = s
    return out


def quiet_kwargs(qsm_cls) -> dict:
    """``{'progress': False}`` if the QuantizationSimModel accepts it (keeps timings free of tqdm bars)."""
    import inspect

    try:
        params = inspect.signature(qsm_cls).parameters
    except (TypeError, ValueError):
        return {}
    return {"progress": False} if "progress" in params else {}


def print_and_save(table: str, output: str) -> None:
    """Print a Markdown ``table`` and write it to ``output`` (a path; '' not to write)."""
    print(table)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(table)


def ort_quantize_static(model, calibration: list[dict], fmt, weight_codes: str = "int8"):
    """``onnxruntime.quantization.quantize_static`` of ``model`` (a ModelProto) in format ``fmt`` (QDQ or
    QOperator): per-channel MinMax, QUInt8 activations, QInt8 weights (QUInt8 with ``weight_codes="uint8"``);
    the quantized ModelProto. A model below opset 13 is converted first (per-channel DequantizeLinear needs
    it); below IR 4 (every initializer also a graph input, which the converter rejects) its initializers leave
    the inputs first. Falls back to ``quant_pre_process`` where the plain call fails (PP-OCR rec)."""
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantType, quant_pre_process, quantize_static

    class Reader:
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self):
            return next(self.items, None)

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:  # per-channel DequantizeLinear (its axis attribute) needs opset 13 (ddddocr is opset 12)
        if model.ir_version < 4:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            constants = {t.name for t in copy.graph.initializer}
            inputs = [i for i in copy.graph.input if i.name not in constants]
            del copy.graph.input[:]
            copy.graph.input.extend(inputs)
            copy.ir_version = 7
            model = copy
        model = onnx.version_converter.convert_version(model, 13)
    with tempfile.TemporaryDirectory() as tmp:
        source, target = os.path.join(tmp, "fp32.onnx"), os.path.join(tmp, "quant.onnx")
        onnx.save(model, source)
        weight_type = QuantType.QUInt8 if weight_codes == "uint8" else QuantType.QInt8
        options = dict(quant_format=fmt, per_channel=True, activation_type=QuantType.QUInt8,
                       weight_type=weight_type, calibrate_method=CalibrationMethod.MinMax)
        try:
            quantize_static(source, target, Reader(), **options)
        except Exception:  # noqa: BLE001 - some exports (PP-OCR rec) need ORT's pre-processing first
            pre = os.path.join(tmp, "pre.onnx")
            quant_pre_process(source, pre, skip_symbolic_shape=True)
            quantize_static(pre, target, Reader(), **options)
        return onnx.load(target)


def cpu_session(model, fused: bool = True, threads: int = 0):
    """A default onnxruntime CPU session over ``model`` (a ModelProto or a path) with ``threads`` intra-op
    threads (0: onnxruntime's default); ``fused=False`` keeps Q/DQ as written (``session.disable_quant_qdq``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not fused:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    source = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
