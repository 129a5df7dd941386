"""A user's model file read with its big weights left in its own external-data files, read through memory maps.

``onnx.load`` copies every external weight into the ModelProto: for a large model that is a full read plus a
copy into protobuf, and every later step (hashing, writing the preparation cache) copies them out again.
`load_mapped` instead leaves the big top-level initializers where they are, as `MappedWeights` over the model's
folder (`quantsim.graph.mapped`): hashing reads the page cache directly, passes read a tensor only when they
use its values (`mapped.reading_from`), and the preparation cache copies the bytes file to file.

A tensor stays mapped only where reading it through a map gives exactly the bytes ``onnx.load`` would put in
its ``raw_data``: a top-level initializer of a fixed-size numeric type (no packed 4-bit, bool or string types)
with at least `MIN_TENSOR_BYTES` of values, whose external data names a relative file in the model's folder
and records an offset and a length equal to the size its dims give, inside the file. Each such tensor is
reduced to what a loaded one keeps when hashed or cached (name, type, dims; the same as
`large_models.skeleton` keeps). Every other external tensor is loaded by onnx's own loader, exactly as
``onnx.load`` loads it; so is everything when the mapped weights would total less than ``min_bytes`` (the
caller's threshold, below which copying them is cheap).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.external_data_helper import load_external_data_for_model

from quantsim.graph.mapped import MappedWeights, external_info, is_mapped

__all__ = ["load_mapped", "map_external", "MIN_TENSOR_BYTES", "MAPPABLE_TYPES"]

MIN_TENSOR_BYTES = 1024
"""Smaller tensors are loaded into the model (`large_models.skeleton` keeps them in the graph too)."""
MAPPABLE_TYPES = frozenset({
    TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT8, TensorProto.UINT8,
    TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64,
    TensorProto.UINT64,
})
_KEYS = frozenset({"location", "offset", "length"})


def load_mapped(path: str | os.PathLike, min_bytes: int = 0) -> tuple[onnx.ModelProto, MappedWeights | None]:
    """``onnx.load(path)``, but with its big weights left in their files (module docstring): the model and the
    `MappedWeights` that reads them (None when nothing stayed mapped, the model then being ``onnx.load``'s)."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    return model, map_external(model, path.parent, min_bytes)


def map_external(model: onnx.ModelProto, folder: str | os.PathLike, min_bytes: int = 0) -> MappedWeights | None:
    """Load ``model``'s external data from ``folder`` in place, except the tensors that can stay mapped (module
    docstring); returns the `MappedWeights` reading those, or None when none stayed mapped."""
    sizes: dict[str, int] = {}
    keep = [tensor for tensor in model.graph.initializer if is_mapped(tensor) and _mappable(tensor, folder, sizes)]
    if sum(_nbytes(tensor) for tensor in keep) < max(min_bytes, 1):
        keep = []
    for tensor in keep:  # hidden from onnx's loader, which loads every other external tensor as onnx.load does
        tensor.data_location = TensorProto.DEFAULT
    try:
        load_external_data_for_model(model, str(folder))
    finally:
        for tensor in keep:
            tensor.data_location = TensorProto.EXTERNAL
    if not keep:
        return None
    for tensor in keep:
        _reduce(tensor)
    return MappedWeights(folder, model)


def _nbytes(tensor: onnx.TensorProto) -> int:
    return np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize * math.prod(tensor.dims)


def _mappable(tensor: onnx.TensorProto, folder: str | os.PathLike, sizes: dict[str, int]) -> bool:
    if tensor.data_type not in MAPPABLE_TYPES or any(d < 0 for d in tensor.dims):
        return False
    info = external_info(tensor)
    location = info.get("location", "")
    if not set(info) <= _KEYS or not location or Path(location).is_absolute() or ".." in Path(location).parts:
        return False
    try:
        offset, length = int(info.get("offset", "0")), int(info["length"])
    except (KeyError, ValueError):
        return False
    nbytes = _nbytes(tensor)
    if nbytes < MIN_TENSOR_BYTES or length != nbytes or offset < 0:
        return False
    if location not in sizes:
        target = Path(folder) / location
        sizes[location] = target.stat().st_size if target.is_file() else -1
    return offset + nbytes <= sizes[location]


def _reduce(tensor: onnx.TensorProto) -> None:
    """Keep only what a loaded big tensor keeps in a skeleton: name, type, dims and its external data."""
    kept = (tensor.name, tensor.data_type, list(tensor.dims), [(e.key, e.value) for e in tensor.external_data])
    tensor.Clear()
    tensor.name, tensor.data_type = kept[0], kept[1]
    tensor.dims.extend(kept[2])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in kept[3]:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
