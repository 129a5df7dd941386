"""Initializers left in their external-data files and read through memory maps.

A large prepared model loaded from the preparation cache keeps its big initializers as ONNX external-data
references into the cache entry's data file instead of copying gigabytes into the ModelProto.
`MappedWeights` holds that file open (so removing the cache entry meanwhile changes nothing: the open file
keeps its bytes on Linux and macOS) and gives each tensor's values as a read-only array over its own memory
map of the tensor's bytes: pages come from the page cache, shared between processes and sessions, and count
against the process only while that array is alive (the map closes with it). `materialize` copies the values
into the model (what any code that needs a self-contained ModelProto gets, e.g. `QuantizationSimModel.model`).

A model read from a user's file can keep its weights in the user's external-data files the same way while it
is prepared (`quantsim.graph.source_weights`): preparation passes then read values through `reading_from`, which
makes `tensor_values` and a `GraphIndex` built without weights read mapped tensors from those files.
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.errors import InvalidArgumentError

__all__ = ["MappedWeights", "COPY_BUFFER_BYTES", "external_info", "is_mapped", "reading_from", "active_weights",
           "tensor_values"]

COPY_BUFFER_BYTES = 16 << 20
"""Size of the buffer `MappedWeights.copy_into` reads through."""
_ACTIVE: ContextVar[MappedWeights | None] = ContextVar("quantsim_active_weights", default=None)


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

    def _range(self, tensor: onnx.TensorProto) -> tuple:
        """``(open file, offset, dtype, count)`` of external ``tensor``'s values."""
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
        return file, offset, dtype, count

    def copy_into(self, tensor: onnx.TensorProto, fd: int, buffer: memoryview | None = None) -> int:
        """Write external ``tensor``'s bytes to the file open as ``fd``, at its position, read into ``buffer`` (a
        writable byte view, reused across calls; one of `COPY_BUFFER_BYTES` if not given) a piece at a time and
        written from there (through the map where ``os.preadv`` is missing). Returns the bytes written.

        Not ``os.copy_file_range``: the kernel's copy costs less CPU, but it fills the page cache with small
        folios that every later memory map of the copy faults in about 40% slower than those of a plain write
        (measured on Linux 6.18/ext4: warm sim creation 0.65 s CPU against 0.50 s for 2.4 GB of weights), and
        the copy is made once while the maps are made on every warm creation."""
        file, offset, dtype, count = self._range(tensor)
        nbytes, done = count * dtype.itemsize, 0
        if hasattr(os, "preadv"):
            buffer = buffer if buffer is not None else memoryview(bytearray(min(nbytes, COPY_BUFFER_BYTES)))
            while done < nbytes:
                step = os.preadv(file.fileno(), [buffer[:min(len(buffer), nbytes - done)]], offset + done)
                if step <= 0:
                    break  # the file ended early: the map raises below
                chunk = buffer[:step]
                while chunk:
                    chunk = chunk[os.write(fd, chunk):]
                done += step
        if done < nbytes:
            view = self.array(tensor).reshape(-1).data.cast("B")[done:]
            while view:
                view = view[os.write(fd, view):]
        return nbytes

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        """A read-only array of external ``tensor``'s values over the memory map (no copy)."""
        file, offset, dtype, count = self._range(tensor)
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


@contextmanager
def reading_from(weights: MappedWeights | None) -> Iterator[None]:
    """Within this block, mapped tensors read by `tensor_values` (and by a `GraphIndex` built without
    ``weights``) come from ``weights``: how preparation passes read a model whose weights stay in its files."""
    token = _ACTIVE.set(weights)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_weights() -> MappedWeights | None:
    """The weights `reading_from` made current (None outside such a block)."""
    return _ACTIVE.get()


def tensor_values(tensor: onnx.TensorProto) -> np.ndarray:
    """``numpy_helper.to_array(tensor)``, a writable array of its own, also for a tensor mapped by the weights
    `reading_from` made current."""
    weights = _ACTIVE.get()
    if weights is not None and is_mapped(tensor):
        return np.array(weights.array(tensor))
    return numpy_helper.to_array(tensor)
