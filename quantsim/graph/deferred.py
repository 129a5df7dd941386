"""Initializers whose values are computed only when read: how exports of large models reach the disk.

An export builds its model's graph with each big computed constant (a weight's integer codes, its
fake-quantized or dequantized float values, a mapped weight copied unchanged) as a placeholder: name, type and
dims, external data at `DEFERRED_LOCATION` (never a file). `DeferredWeights` keeps, for each, the function
that computes its values. Writers read them one at a time (`large_models.save_model` with ``weights=``), so
the whole model is never in memory; `materialize` fills them into the model for a caller that wants the
ModelProto itself. Anything that reads values (a `GraphIndex` built with ``weights=``) gets them the same
way, and a rewrite of a deferred constant defers its own result (`derive`). Sessions' weight files defer
the same way without names: a `DeferredArray` is computed while `quantsim.graph.session` writes it.

Only tensors whose ONNX raw bytes are their numpy array's bytes are deferred (float16/32/64 and 8/16/32/64-bit
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
    """Values of ``shape`` and ``dtype`` that ``compute()`` makes only when they are written: the unnamed
    counterpart of a `DeferredWeights` placeholder, which sessions' weight files take
    (`quantsim.graph.session`), in blocks where ``compute`` is a `RowParts`; ``key`` (hashable, or None) names
    them for `session.WeightFiles`: equal keys, equal values."""

    __slots__ = ("shape", "dtype", "compute", "key")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, compute: Callable[[], np.ndarray],
                 key: Hashable | None = None):
        self.shape, self.dtype, self.compute, self.key = tuple(shape), np.dtype(dtype), compute, key

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def array(self) -> np.ndarray:
        """The values, computed now (C-contiguous, ``dtype``), checked against the declared ``shape``."""
        values = np.ascontiguousarray(self.compute(), dtype=self.dtype)
        if values.shape != self.shape:
            raise InvalidStateError(f"deferred values of shape {self.shape} computed as {values.shape}")
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
    """The functions computing a model's deferred initializers (module docstring), by tensor name."""

    def __init__(self) -> None:
        self._compute: dict[str, Callable[[], np.ndarray]] = {}

    @staticmethod
    def accepts(elem_type: int, shape: tuple) -> bool:
        """Whether a tensor of ``elem_type`` and ``shape`` is deferred rather than built in memory."""
        if elem_type not in _DEFERRED_TYPES or any(not isinstance(d, int | np.integer) for d in shape):
            return False
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
        return itemsize * int(np.prod(shape, dtype=np.int64)) >= DEFERRED_MIN_BYTES

    def add(self, name: str, elem_type: int, shape: tuple, compute: Callable[[], np.ndarray]) -> TensorProto:
        """The placeholder of ``name``, whose values ``compute()`` returns when read (any dtype: they are cast
        to ``elem_type``). Call only where `accepts` says so."""
        placeholder = TensorProto(name=name, dims=[int(d) for d in shape], data_type=elem_type,
                                  data_location=TensorProto.EXTERNAL)
        entry = placeholder.external_data.add()
        entry.key, entry.value = "location", DEFERRED_LOCATION
        self._compute[name] = compute
        return placeholder

    def derive(self, source: onnx.TensorProto, name: str, elem_type: int,
               transform: Callable[[np.ndarray], np.ndarray]) -> TensorProto:
        """A placeholder ``name`` (it may be ``source``'s own) for ``transform`` of the values of ``source``, one of
        this object's placeholders, computed when read."""
        compute = self._compute[source.name]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(source.data_type))
        return self.add(name, elem_type, tuple(source.dims),
                        lambda: transform(np.asarray(compute()).astype(dtype, copy=False)))

    def holds(self, tensor: onnx.TensorProto) -> bool:
        """Whether ``tensor`` is one of this object's placeholders."""
        return _is_deferred(tensor) and tensor.name in self._compute

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        """The values of placeholder ``tensor``, computed now (read-only, C-contiguous, its own type)."""
        compute = self._compute.get(tensor.name) if _is_deferred(tensor) else None
        if compute is None:
            raise InvalidStateError(f"initializer {tensor.name!r} is not a deferred value of this export")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
        values = np.ascontiguousarray(np.asarray(compute()).astype(dtype, copy=False))
        if values.shape != tuple(tensor.dims):
            raise InvalidStateError(f"initializer {tensor.name!r}: computed shape {values.shape} is not the "
                                    f"declared {tuple(tensor.dims)}")
        return values

    def materialize(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """Fill every placeholder of ``model`` with its values, one at a time (in place); returns ``model``."""
        for tensor in model.graph.initializer:
            if self.holds(tensor):
                tensor.CopyFrom(numpy_helper.from_array(self.array(tensor), tensor.name))
        return model
