"""Weights whose values are computed only when written or read: how big computed weights reach the disk.

One value type, `DeferredArray`: shape, dtype, the function computing the values, and optionally a key naming
what they depend on (equal keys, equal values). A model holding one has a placeholder initializer in its place
(name, type and dims, external data at a location that is never a file); whoever writes or reads the model
computes each value then, one at a time, so the whole model is never in memory. The sim builder defers its
weights through `quantsim.sim.deferral`, to one of two holders:

* exports: `DeferredWeights`, the export's deferred values by tensor name, placeholders at
  `DEFERRED_LOCATION`. Writers read them one at a time (`large_models.save_model` with ``weights=``);
  `materialize` fills them into the model for a caller that wants the ModelProto itself. Anything that reads
  values (a `GraphIndex` built with ``weights=``) gets them the same way, and a rewrite of a deferred constant
  defers its own result (`derive`).
* sessions: the arrays `quantsim.graph.session.make_session` takes beside a model of
  `model_io.in_memory_placeholder` initializers; the session computes each `DeferredArray` while writing its
  weight files, and reuses a file whose value's key is unchanged (`session.WeightFiles`).

Exports only defer tensors whose ONNX raw bytes are their numpy array's bytes (float16/32/64 and 8/16/32/64-bit
integers, not packed 4-bit types) and only from `large_models`' external-data size up, so a file written from
the placeholders has the same layout and bytes as one written from the materialized model.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.errors import InvalidStateError
from quantsim.graph.mapped import external_info, is_mapped

__all__ = ["DeferredArray", "RowParts", "DeferredWeights", "WeightSource", "DEFERRED_LOCATION", "DEFERRED_MIN_BYTES"]

DEFERRED_LOCATION = "quantsim-deferred"  # external-data location of the placeholders (never a file)
DEFERRED_MIN_BYTES = 1024  # smaller values stay in the model (`large_models` writes them inline too)
_DEFERRED_TYPES = frozenset({
    TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT8, TensorProto.UINT8,
    TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64,
    TensorProto.UINT64,
})


class WeightSource(Protocol):
    """Reads the values of initializers held outside the model (`MappedWeights`, `DeferredWeights`)."""

    def array(self, tensor: onnx.TensorProto) -> np.ndarray: ...


def _is_deferred(tensor: onnx.TensorProto) -> bool:
    return is_mapped(tensor) and external_info(tensor).get("location") == DEFERRED_LOCATION


class DeferredArray:
    """Values of ``shape`` and ``dtype`` that ``compute()`` makes only when they are written or read (module
    docstring), in blocks where ``compute`` is a `RowParts`; ``key`` (hashable, or None) names them for
    `session.WeightFiles`: equal keys, equal values."""

    __slots__ = ("shape", "dtype", "compute", "key")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, compute: Callable[[], np.ndarray],
                 key: Hashable | None = None):
        self.shape, self.dtype, self.compute, self.key = tuple(shape), np.dtype(dtype), compute, key

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def array(self, what: str = "deferred values") -> np.ndarray:
        """The values, computed now (C-contiguous, ``dtype``: cast from whatever ``compute`` returns), checked
        against the declared ``shape`` (``what`` names them in the error)."""
        values = np.asarray(self.compute(), dtype=self.dtype)
        if values.ndim:  # np.ascontiguousarray makes a 0-d value 1-d
            values = np.ascontiguousarray(values)
        if values.shape != self.shape:
            raise InvalidStateError(f"{what}: computed shape {values.shape} is not the declared {self.shape}")
        return values

    def parts(self) -> Iterator[np.ndarray]:
        """The values, computed now, as consecutive C-contiguous ``dtype`` blocks of whole rows (their bytes in
        order are `array`'s): ``compute.parts()`` where the compute function offers it (`RowParts`), else
        `array` in one piece; checked against the declared ``shape`` (on the last block)."""
        split = getattr(self.compute, "parts", None)
        if split is None:
            yield self.array()
            return
        rows = 0
        for part in split():
            part = np.ascontiguousarray(part, dtype=self.dtype)
            if part.shape[1:] != self.shape[1:] or not part.ndim:
                raise InvalidStateError(f"deferred values of shape {self.shape} computed in a block of {part.shape}")
            rows += part.shape[0]
            yield part
        if (rows,) != self.shape[:1]:
            raise InvalidStateError(f"deferred values of shape {self.shape} computed as {rows} rows")


class RowParts(Protocol):
    """A compute function of a `DeferredArray` that can also make its values in blocks of whole rows (what
    `DeferredArray.parts` asks for): a writer then stores each block while it is in the CPU's cache."""

    def __call__(self) -> np.ndarray: ...

    def parts(self) -> Iterator[np.ndarray]: ...


class DeferredWeights:
    """An export's deferred initializers (module docstring): a `DeferredArray` for each placeholder, by name."""

    def __init__(self) -> None:
        self._values: dict[str, DeferredArray] = {}

    @staticmethod
    def accepts(elem_type: int, shape: tuple) -> bool:
        """Whether a tensor of ``elem_type`` and ``shape`` is deferred rather than built in memory."""
        if elem_type not in _DEFERRED_TYPES or any(not isinstance(d, int | np.integer) for d in shape):
            return False
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
        return itemsize * int(np.prod(shape, dtype=np.int64)) >= DEFERRED_MIN_BYTES

    def put(self, name: str, values: DeferredArray) -> TensorProto:
        """The placeholder of ``name`` for ``values``, of their dtype and shape. Call only where `accepts` says so."""
        placeholder = TensorProto(name=name, dims=[int(d) for d in values.shape],
                                  data_type=helper.np_dtype_to_tensor_dtype(values.dtype),
                                  data_location=TensorProto.EXTERNAL)
        entry = placeholder.external_data.add()
        entry.key, entry.value = "location", DEFERRED_LOCATION
        self._values[name] = values
        return placeholder

    def add(self, name: str, elem_type: int, shape: tuple, compute: Callable[[], np.ndarray]) -> TensorProto:
        """The placeholder of ``name``, whose values ``compute()`` returns when read (any dtype: they are cast
        to ``elem_type``). Call only where `accepts` says so."""
        return self.put(name, DeferredArray(shape, helper.tensor_dtype_to_np_dtype(elem_type), compute))

    def derive(self, source: onnx.TensorProto, name: str, elem_type: int,
               transform: Callable[[np.ndarray], np.ndarray]) -> TensorProto:
        """A placeholder ``name`` (it may be ``source``'s own) for ``transform`` of the values of ``source``, one of
        this object's placeholders, computed when read."""
        base = self._values[source.name]
        return self.add(name, elem_type, tuple(source.dims), lambda: transform(base.array()))

    def holds(self, tensor: onnx.TensorProto) -> bool:
        """Whether ``tensor`` is one of this object's placeholders."""
        return _is_deferred(tensor) and tensor.name in self._values

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        """The values of placeholder ``tensor``, computed now (C-contiguous, its own type)."""
        values = self._values.get(tensor.name) if _is_deferred(tensor) else None
        if values is None:
            raise InvalidStateError(f"initializer {tensor.name!r} is not a deferred value of this export")
        return values.array(f"initializer {tensor.name!r}")

    def materialize(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """Fill every placeholder of ``model`` with its values, one at a time (in place); returns ``model``."""
        for tensor in model.graph.initializer:
            if self.holds(tensor):
                tensor.CopyFrom(numpy_helper.from_array(self.array(tensor), tensor.name))
        return model
