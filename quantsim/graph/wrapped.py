"""`as_model_proto`: the ModelProto inside a wrapper (``sim.model``, AIMET's ``ONNXModel``), for functions that
take a ModelProto and should take those too."""
from __future__ import annotations

import os
from typing import Any

import onnx

__all__ = ["as_model_proto"]


def as_model_proto(model: Any) -> Any:
    """``model``'s ModelProto when it wraps one (``sim.model``, a `quantsim.sim.model_view.ModelView`, or AIMET's
    ``ONNXModel``: anything whose ``.model`` is a ModelProto); anything else unchanged (a ModelProto, a path)."""
    if isinstance(model, (onnx.ModelProto, str, os.PathLike)):
        return model
    inner = getattr(model, "model", None)
    return inner if isinstance(inner, onnx.ModelProto) else model
