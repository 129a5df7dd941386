"""Initializers left in their external-data files and read through memory maps.

A large prepared model loaded from the preparation cache keeps its big initializers as ONNX external-data
references into the cache entry's data file instead of copying gigabytes into the ModelProto.
`MappedWeights` holds that file open (so removing the cache entry meanwhile changes nothing: the open file
keeps its bytes on Linux and macOS) and gives each tensor's values as a read-only array over its own memory
map of the tensor's bytes: pages come from the page cache, shared between processes and sessions, and count
against the process only while that array is alive (the map closes with it). `materialize` copies the values
into the model (what any code that needs a self-contained ModelProto gets, e.g. `QuantizationSimModel.model`).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from quantsim.errors import InvalidArgumentError

__all__ = ["MappedWeights", "external_info", "is_mapped"]


def external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    """``{key: value}`` of ``tensor``'s external-data entries (location, offset, length)."""
    return {entry.key: entry.value for entry in tensor.external_data}


def is_mapped(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor``'s values live in an external-data file (not in the ModelProto)."""
    return tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL


class MappedWeights:
    """The external-data files of one model folder, open for the lifetime of this object."""

    def __init__(self, folder: str | os.PathLike, model: onnx.ModelProto):
        self.folder = Path(folder)
        self._files: dict[str, tuple] = {}  # location -> (open file, size)
        for tensor in model.graph.initializer:
            if is_mapped(tensor):
                location = external_info(tensor).get("location", "")
                if location not in self._files:
                    self._files[location] = self._open(location)

    def _open(self, location: str) -> tuple:
        path = self.folder / location
        if Path(location).is_absolute() or ".." in Path(location).parts or not path.is_file():
            raise InvalidArgumentError(f"external data {location!r} is not a file in {self.folder}")
        file = open(path, "rb")  # noqa: SIM115 - open as long as this object lives
        return file, os.fstat(file.fileno()).st_size

    def __del__(self) -> None:
        for file, _ in getattr(self, "_files", {}).values():
            file.close()  # the maps made from it stay valid

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        """A read-only array of external ``tensor``'s values over the memory map (no copy)."""
        info = external_info(tensor)
        opened = self._files.get(info.get("location", ""))
        if opened is None:
            raise InvalidArgumentError(f"initializer {tensor.name!r}: external data {info.get('location')!r} is not "
                                    f"one of this model's files")
        file, size = opened
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
        count = int(np.prod(tensor.dims, dtype=np.int64))
        offset = int(info.get("offset", 0))
        if offset + count * dtype.itemsize > size:
            raise InvalidArgumentError(f"initializer {tensor.name!r}: external data ends past its file")
        if count == 0:
            return np.zeros(tuple(tensor.dims), dtype=dtype)
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(file.fileno(), offset - start + count * dtype.itemsize, access=mmap.ACCESS_READ,
                           offset=start)
        return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset - start).reshape(tuple(tensor.dims))

    def materialize(self, model: onnx.ModelProto) -> None:
        """Copy every mapped initializer's values into ``model`` (in place): it no longer needs the files."""
        for tensor in model.graph.initializer:
            if is_mapped(tensor):
                data = self.array(tensor).tobytes()
                del tensor.external_data[:]
                tensor.ClearField("data_location")
                tensor.raw_data = data
