"""onnxruntime sessions for the sim: exact (no Q/DQ fusion) or fused into integer kernels."""
from __future__ import annotations

import onnx
import onnxruntime as ort

__all__ = ["make_session", "DEFAULT_PROVIDERS"]

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)


def make_session(
    model: onnx.ModelProto,
    providers=None,
    *,
    fuse_qdq: bool = False,
    session_options_kwargs: dict | None = None,
) -> ort.InferenceSession:
    """An InferenceSession over ``model``.

    ``fuse_qdq=False`` (the exact sim) sets ``session.disable_quant_qdq`` so onnxruntime runs every
    QuantizeLinear/DequantizeLinear as written: the outputs are the float fake-quantization the sim
    defines. ``fuse_qdq=True`` lets onnxruntime rewrite Q/DQ groups into integer kernels (QLinearConv,
    QGemm, ...): faster, and within about one output step of the exact sim.
    """
    options = ort.SessionOptions()
    for key, value in (session_options_kwargs or {}).items():
        if not hasattr(options, key):
            raise AttributeError(f"onnxruntime.SessionOptions has no attribute {key!r}")
        setattr(options, key, value)
    if not fuse_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=list(providers or DEFAULT_PROVIDERS)
    )
