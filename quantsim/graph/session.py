"""onnxruntime sessions for the sim: exact (no Q/DQ fusion) or fused into integer kernels."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from quantsim.errors import InvalidStateError, SessionError
from quantsim.graph.model_io import session_model_source

__all__ = ["make_session", "DEFAULT_PROVIDERS"]

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
EXACT_SIM_DISABLED_OPTIMIZERS = ("ReluQuantRewrite", "ClipQuantRewrite")


def make_session(
    model: onnx.ModelProto,
    providers=None,
    *,
    fuse_qdq: bool = False,
    session_options_kwargs: dict | None = None,
    external_initializers: Mapping[str, np.ndarray] | None = None,
) -> ort.InferenceSession:
    """An InferenceSession over ``model``.

    ``external_initializers`` (name -> contiguous array) supply the values of initializers that ``model``
    holds as external-data placeholders (see `simulate.build_sim_model`); onnxruntime reads the arrays in
    place, and the session keeps them alive.

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


def _one_line(message: str) -> str:
    return " ".join(message.split())
