"""Writing models to disk and handing them to onnxruntime, 2 GB models included.

Small models are serialised in one piece. Models past protobuf's 2 GiB limit (judged from tensor shapes,
see `quantsim.graph.large_models.is_large`) are written as a graph file plus one ONNX external-data file
``<name>.data``; onnxruntime then loads them from that path. Files are staged under temporary names in
the target folder and renamed into place only when everything is written, so a failure never leaves a
half-written or mismatched model behind.

A model handed to onnxruntime in memory may hold `in_memory_placeholder` initializers whose values go to
the session as arrays (`quantsim.graph.session.make_session`'s ``external_initializers``): big weights are then
neither copied into the model, nor serialised, nor parsed.
"""
from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper

from quantsim.graph.file_set import FileSet
from quantsim.graph.large_models import is_large, save_model

if TYPE_CHECKING:
    from quantsim.graph.deferred import DeferredArray

__all__ = ["save_model_atomic", "session_model_source",
           "in_memory_placeholder", "IN_MEMORY_LOCATION", "IN_MEMORY_MIN_BYTES", "IN_MEMORY_ELEM_TYPES"]

IN_MEMORY_LOCATION = "quantsim-in-memory"  # external-data location of the placeholders (never a file)
IN_MEMORY_MIN_BYTES = 1024  # smaller values stay in the model
IN_MEMORY_ELEM_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE})
_IN_MEMORY_DTYPES = frozenset(np.dtype(helper.tensor_dtype_to_np_dtype(t))
                              for t in (*IN_MEMORY_ELEM_TYPES, TensorProto.INT8, TensorProto.UINT8))


def in_memory_placeholder(name: str, values: np.ndarray | DeferredArray) -> TensorProto | None:
    """An initializer standing in for ``values``, which onnxruntime gets separately: name, type and dims,
    external data at `IN_MEMORY_LOCATION` (never read). None for values that stay in the model: smaller
    than `IN_MEMORY_MIN_BYTES`, not float32/16/64 (or int8/uint8 weight codes), or not a native-order contiguous
    array."""
    contiguous = values.flags.c_contiguous if isinstance(values, np.ndarray) else True  # or a `DeferredArray`
    if (values.nbytes < IN_MEMORY_MIN_BYTES or values.dtype not in _IN_MEMORY_DTYPES or not values.dtype.isnative
            or not contiguous):
        return None
    placeholder = TensorProto(name=name, dims=values.shape, data_location=TensorProto.EXTERNAL,
                              data_type=helper.np_dtype_to_tensor_dtype(values.dtype))
    entry = placeholder.external_data.add()
    entry.key, entry.value = "location", IN_MEMORY_LOCATION
    return placeholder


def save_model_atomic(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` to ``path`` (plus ``<path>.data`` for large models) atomically."""
    path = Path(path)
    with FileSet(path.parent, path.name) as files:
        files.add_model(model, path.name)
        files.commit()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a staged file in the same folder renamed into place: a failure
    (raised as is) leaves no partial file and an existing ``path`` as it was."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        staging.write_text(text)
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def session_model_source(model: onnx.ModelProto) -> tuple[bytes | str, tempfile.TemporaryDirectory | None]:
    """What to pass to ``onnxruntime.InferenceSession``: the serialised model, or for large models the
    path of a temporary copy with external data (keep the returned folder alive as long as the session)."""
    if not is_large(model):
        return model.SerializeToString(), None
    folder = tempfile.TemporaryDirectory(prefix="quantsim-session-")
    path = Path(folder.name) / "model.onnx"
    save_model(model, path)
    return str(path), folder
