"""onnxruntime sessions for the sim: exact (no Q/DQ fusion) or fused into integer kernels.

Big weights reach onnxruntime without a copy of its own: ``external_initializers`` of at least
`FILE_BACKED_MIN_BYTES` in all are written once to a temporary external-data file that onnxruntime
memory-maps (page cache, shared, dropped with the session), with weight prepacking off (a prepacked weight
is a second, anonymous copy). ``SessionOptions.add_external_initializers`` copies every array into
onnxruntime's own buffers (measured with onnxruntime 1.32), so it only serves smaller sets.
"""
from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from quantsim.errors import InvalidStateError, SessionError
from quantsim.graph.model_io import IN_MEMORY_LOCATION, session_model_source

__all__ = ["make_session", "DEFAULT_PROVIDERS", "FILE_BACKED_MIN_BYTES"]

FILE_BACKED_MIN_BYTES = 64 << 20
"""External initializers of at least this many bytes in all go to onnxruntime as a memory-mapped file
(module docstring). Read at call time, so tests can lower it."""
_ALIGNMENT = 1 << 16  # onnxruntime maps external data in place only at offsets aligned to this

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
EXACT_SIM_DISABLED_OPTIMIZERS = ("ReluQuantRewrite", "ClipQuantRewrite")


def make_session(
    model: onnx.ModelProto,
    providers=None,
    *,
    fuse_qdq: bool = False,
    session_options_kwargs: dict | None = None,
    external_initializers: Mapping[str, np.ndarray] | None = None,
    file_backed: bool | None = None,
    prepack: bool = False,
) -> ort.InferenceSession:
    """An InferenceSession over ``model``.

    ``external_initializers`` (name -> contiguous array) supply the values of initializers that ``model``
    holds as external-data placeholders (see `build_sim_model`); big sets go to onnxruntime as one
    memory-mapped file (module docstring), others as arrays it copies; ``file_backed`` decides instead of
    their size when given. A memory-mapped set is written and then removed from ``external_initializers``
    (the caller's dict), so the arrays can go before onnxruntime reads the file; with ``prepack`` onnxruntime
    then repacks weights for its kernels (runs as fast as a float session's; the packed copy replaces the
    mapped pages, which onnxruntime releases: for weights nothing else holds). The session keeps what it
    needs alive.

    ``fuse_qdq=False`` (the exact sim) sets ``session.disable_quant_qdq`` so onnxruntime runs every
    QuantizeLinear/DequantizeLinear as written: the outputs are the float fake-quantization the sim
    defines. ``fuse_qdq=True`` lets onnxruntime rewrite Q/DQ groups into integer kernels (QLinearConv,
    QGemm, ...): faster, and a few output steps from the exact sim (rounding inside the kernels).
    """
    options = ort.SessionOptions()
    for key, value in (session_options_kwargs or {}).items():
        if not hasattr(options, key):
            raise AttributeError(f"onnxruntime.SessionOptions has no attribute {key!r}")
        setattr(options, key, value)
    disabled = None
    if not fuse_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        # onnxruntime's Relu/Clip -> QuantizeLinear rewrites are only meant to drop a redundant Relu/Clip, but
        # with 4-bit zero points (ORT 1.32) ReluQuantRewrite drops a Relu that is not redundant (negative
        # values survive) and ClipQuantRewrite throws at session creation; the exact sim never needs them.
        disabled = list(EXACT_SIM_DISABLED_OPTIMIZERS)
    else:
        # DQ(weight) -> MatMul may become MatMulNBits, which at its default accuracy level computes the
        # activation in 8 bits: wrong for 16-bit activations. Level 1 keeps float activations there.
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    external = dict(external_initializers or {})
    values: list = []
    source: bytes | str
    keepalive: tempfile.TemporaryDirectory | None
    if file_backed is None:
        file_backed = sum(array.nbytes for array in external.values()) >= FILE_BACKED_MIN_BYTES
    if file_backed and external and not fuse_qdq:
        source, keepalive = file_backed_source(model, external)
        external.clear()
        if isinstance(external_initializers, dict):
            external_initializers.clear()
        if not prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        # the arena keeps what it took: with it, dequantized weights passing through raise the peak
        # (measured on a 0.8 GB MLP: 1.64 GB instead of 1.43, for runs about 1.5x faster)
        options.enable_cpu_mem_arena = False
        # keep the dequantization of integer weights as written: folding it would make a float copy
        disabled = [*(disabled or ()), "ConstantFolding"]
    else:
        values = [ort.OrtValue.ortvalue_from_numpy(array) for array in external.values()]
        if values:
            options.add_external_initializers(list(external), values)
        source, keepalive = session_model_source(model)
    try:
        session = ort.InferenceSession(
            source, sess_options=options, providers=list(providers or DEFAULT_PROVIDERS),
            disabled_optimizers=disabled,
        )
        # a large model's files and the external initializers' buffers live as long as the session
        session._quantsim_external_data = (keepalive, values)
        return session
    except Exception as error:  # noqa: BLE001 - re-raised with what to do about it
        if not fuse_qdq:
            raise SessionError(f"onnxruntime cannot load the model {model.graph.name or '<unnamed>'!r} "
                               f"({_one_line(str(error))}); check that the float model runs in onnxruntime") from error
        raise InvalidStateError(
            "onnxruntime could not build integer kernels for this sim (its Q/DQ fusion supports 8-bit "
            f"activations with int8/uint8 weights): {error}. Use the exact sim session instead."
        ) from error


def file_backed_source(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray]
                       ) -> tuple[str, tempfile.TemporaryDirectory]:
    """The path of a temporary copy of ``model`` whose `model_io.in_memory_placeholder` initializers point
    into one external-data file holding ``arrays`` (each at an aligned offset), and the folder to keep alive
    as long as the session. ``model`` is not modified; only the small graph is copied."""
    folder = tempfile.TemporaryDirectory(prefix="quantsim-session-")
    path = Path(folder.name) / "model.onnx"
    data_name = "weights.bin"
    light = onnx.ModelProto()
    light.CopyFrom(model)
    with open(Path(folder.name) / data_name, "wb") as data:
        for tensor in light.graph.initializer:
            location = {e.key: e.value for e in tensor.external_data}.get("location")
            if tensor.name not in arrays or location != IN_MEMORY_LOCATION:
                continue
            offset = -(-data.tell() // _ALIGNMENT) * _ALIGNMENT
            data.seek(offset)
            length = data.write(np.ascontiguousarray(arrays[tensor.name]).reshape(-1).view(np.uint8).data)
            del tensor.external_data[:]
            for key, value in (("location", data_name), ("offset", offset), ("length", length)):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
    path.write_bytes(light.SerializeToString())
    return str(path), folder


def _one_line(message: str) -> str:
    return " ".join(message.split())
