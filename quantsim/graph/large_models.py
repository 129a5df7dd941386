"""Models of any size: when a model counts as large, and writing or copying one without a second copy
of its weights.

A model is large when protobuf cannot serialise it in one piece (2 GiB): such a model is written to
disk as a small graph file plus one external-data file (``save_model``) and read back with
``onnx.load``, which loads the external data into the tensors once. ``LARGE_MODEL_BYTES`` is read at
call time, so tests can lower it to exercise the large-model paths on small models. Hashing
(``hash_model``) and pickling (``model_parts``) take a model apart the same way, as its ``skeleton`` plus
each big weight's bytes: no step serialises a whole model.
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from quantsim.graph.deferred import WeightSource
from quantsim.graph.mapped import COPY_BUFFER_BYTES, is_mapped
from quantsim.graph.wrapped import as_model_proto

__all__ = [
    "LARGE_MODEL_BYTES",
    "is_large",
    "estimated_bytes",
    "payload_bytes",
    "value_bytes",
    "skeleton",
    "converted_skeleton",
    "hash_model",
    "model_parts",
    "model_from_parts",
    "copy_without_initializers",
    "as_bytes",
    "is_external_candidate",
    "save_model",
]

LARGE_MODEL_BYTES = onnx.checker.MAXIMUM_PROTOBUF  # protobuf's 2 GiB message limit
_EXTERNAL_MIN_BYTES = 1024  # initializers at least this big go to the external-data file


def is_large(model: onnx.ModelProto) -> bool:
    """True when ``model`` is at least ``LARGE_MODEL_BYTES``, judged from tensor shapes (no serialising)."""
    return estimated_bytes(model) >= LARGE_MODEL_BYTES


def estimated_bytes(model: onnx.ModelProto) -> int:
    """Serialised size of ``model``: initializer payloads from their shapes, everything else measured."""
    graph = model.graph
    total = sum(_payload_bytes(t) + len(t.name) + 16 for t in graph.initializer)
    for part in (graph.node, graph.input, graph.output, graph.value_info, graph.sparse_initializer, model.functions):
        total += sum(item.ByteSize() for item in part)
    return total


def payload_bytes(tensors) -> int:
    """Total payload bytes of ``tensors`` (initializers), from their shapes and types."""
    return sum(_payload_bytes(t) for t in tensors)


def value_bytes(tensors) -> int:
    """Total bytes of the values of ``tensors`` (initializers), from their shapes and types, wherever the values
    are (in the model or in external data, unlike `payload_bytes`)."""
    return sum(_payload_bytes(t, external=True) for t in tensors)


def _payload_bytes(tensor: onnx.TensorProto, external: bool = False) -> int:
    if tensor.data_location == onnx.TensorProto.EXTERNAL and not external:
        return 0
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:  # noqa: BLE001 - strings, undefined types: measure the tensor itself
        return tensor.ByteSize()
    return itemsize * math.prod(tensor.dims)


def skeleton(model: onnx.ModelProto, data_file: Any = None, weights: WeightSource | None = None) -> onnx.ModelProto:
    """A copy of ``model`` without the payload of its big initializers (raw data of 1 KiB or more).

    Their copies become ONNX external-data references. With ``data_file`` (an open binary file) the
    payloads are written to it and the references point into it, so the skeleton plus that file is
    the model; without, they point at ``"unwritten"`` (enough for shape inference and for hashing).
    With ``weights``, the initializers whose values are in mapped files (`quantsim.graph.mapped`) are written
    the same way, read one at a time (copied file to file where ``data_file`` has a ``copy_from(weights,
    tensor)`` method); without ``data_file`` they become the same references as the others, so a model whose
    big weights are mapped has the skeleton of the same model with them loaded (for a mapped tensor holding
    only name, type, dims and its reference). ``model`` is not modified and its weights are never copied as a
    whole.
    """
    model = as_model_proto(model)  # sim.model (a view) too
    result = copy_without_initializers(model)
    location = Path(data_file.name).name if data_file is not None else "unwritten"
    for tensor in model.graph.initializer:
        copy = result.graph.initializer.add()
        if weights is not None and is_mapped(tensor):
            copy.CopyFrom(_without_data(tensor))
            copy.data_location = onnx.TensorProto.EXTERNAL
            offset, length = 0, value_bytes([tensor])
            if data_file is not None:
                offset = data_file.tell()
                copy_from = getattr(data_file, "copy_from", None)
                length = copy_from(weights, tensor) if copy_from else data_file.write(as_bytes(weights.array(tensor)))
            for key, value in (("location", location), ("offset", offset), ("length", length)):
                entry = copy.external_data.add()
                entry.key, entry.value = key, str(value)
            continue
        if not is_external_candidate(tensor):
            copy.CopyFrom(tensor)
            continue
        copy.name, copy.data_type = tensor.name, tensor.data_type
        copy.dims.extend(tensor.dims)
        copy.data_location = onnx.TensorProto.EXTERNAL
        offset, length = 0, _payload_bytes(tensor)
        if data_file is not None:
            offset = data_file.tell()
            length = data_file.write(tensor.raw_data)
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            entry = copy.external_data.add()
            entry.key, entry.value = key, str(value)
    return result


def converted_skeleton(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` converted to ai.onnx ``opset`` by ``onnx.version_converter`` without serialising its big weights
    (the converter serialises its input, which copies every weight and which protobuf refuses over 2 GiB): the
    converted `skeleton`, whose external initializers stand for ``model``'s own tensors of the same names
    (big ones as references to ``"unwritten"``, mapped ones with their references). Errors are the
    converter's."""
    return onnx.version_converter.convert_version(skeleton(model), opset)


def as_bytes(values: np.ndarray) -> memoryview:
    """``values``' bytes in memory order without copying them (a contiguous copy first if they are not)."""
    return np.ascontiguousarray(values).data.cast("B")


def hash_model(digest: Any, model: onnx.ModelProto) -> None:
    """Feed ``model`` into ``digest`` (a ``hashlib`` object, or anything with ``update(bytes)``) without a
    second copy of its weights: first its ``skeleton`` serialised deterministically (graph, attributes, small
    initializers, and each big initializer's name, type and shape), then each big initializer's raw bytes, one
    tensor at a time. Protobuf's whole-model ``SerializeToString`` would copy every weight and refuses models
    over 2 GiB. Equal models give equal digests in any process; a change to a weight's values, a node, an
    attribute or the opsets changes it. Initializers whose data is external and not loaded are hashed by their
    reference (file, offset, length), not by their values."""
    digest.update(skeleton(model).SerializeToString(deterministic=True))
    for tensor in model.graph.initializer:
        if is_external_candidate(tensor):
            digest.update(tensor.raw_data)


def model_parts(model: onnx.ModelProto) -> tuple[bytes, list[tuple[str, bytes]]]:
    """``model`` as plain bytes of any total size, for pickling: its ``skeleton`` serialised and each big
    initializer's ``(name, raw bytes)``. Protobuf pickles a message as one serialisation, which fails over
    2 GiB. `model_from_parts` puts them back together."""
    payloads = [(tensor.name, tensor.raw_data) for tensor in model.graph.initializer if is_external_candidate(tensor)]
    return skeleton(model).SerializeToString(), payloads


def model_from_parts(graph: bytes, payloads: list[tuple[str, bytes]]) -> onnx.ModelProto:
    """The model `model_parts` took apart; ``payloads`` is emptied as the weights go back in."""
    model = onnx.ModelProto.FromString(graph)
    tensors = {tensor.name: tensor for tensor in model.graph.initializer}
    while payloads:
        name, data = payloads.pop()
        tensor = tensors[name]
        del tensor.external_data[:]
        tensor.ClearField("data_location")
        tensor.raw_data = data
    return model


def is_external_candidate(tensor: onnx.TensorProto) -> bool:
    """Initializers that ``skeleton`` moves out: raw data of at least 1 KiB, not already external."""
    return (tensor.data_location != onnx.TensorProto.EXTERNAL and tensor.HasField("raw_data")
            and _payload_bytes(tensor) >= _EXTERNAL_MIN_BYTES)


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with everything but its initializers (the caller adds those it wants)."""
    copy = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(copy, field, value)
    copy.graph.SetInParent()
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(copy.graph, field, value)
    return copy


def _copy_field(target, field, value) -> None:
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
    if repeated:
        getattr(target, field.name).extend(value)
    elif field.message_type is not None:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def _without_data(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor`` without its external-data reference (a mapped tensor's description)."""
    stub = onnx.TensorProto()
    stub.CopyFrom(tensor)
    del stub.external_data[:]
    stub.ClearField("data_location")
    return stub


def save_model(model: onnx.ModelProto, path: str | os.PathLike, digests: dict[str, str] | None = None,
               external: bool | None = None, weights: WeightSource | None = None,
               data_digest: str | None = None) -> list[Path]:
    """Write ``model`` to ``path`` and return the files written.

    A large model's big initializers (any model's with ``external=True``) go to ``<path>.data`` beside it
    as ONNX external data (see ``skeleton``): ``onnx.load`` then reads them one at a time, where a single
    file is read whole and parsed, two copies at once. Unlike ``onnx.save(save_as_external_data=True)``
    the in-memory model keeps its weights. With ``weights`` the initializers it maps (`quantsim.graph.mapped`)
    are read one at a time and written like the others (the model then counts as large by their size too).
    With ``digests`` (a dict), each file's sha256 (hex) is recorded under its name as it is written, so a
    caller that needs them never reads the files back. ``data_digest`` is the sha256 the caller knows the
    data file will have (that of its big weights' bytes in order, hashed already, as `prepare`'s cache does):
    the file is then written without hashing, mapped weights copied from their files (`MappedWeights.copy_into`).
    """
    path = Path(path)
    model = as_model_proto(model)  # sim.model (a view) too
    mapped = [t for t in model.graph.initializer if is_mapped(t)] if weights is not None else []
    if external is None:
        external = estimated_bytes(model) + value_bytes(mapped) >= LARGE_MODEL_BYTES
    if not external:
        with open(path, "wb") as raw_file:
            file = _HashingWriter(raw_file)
            _write_streamed(model, file, weights)
        if digests is not None:
            digests[path.name] = file.digest.hexdigest()
        return [path]
    data_path = path.with_name(path.name + ".data")
    with open(data_path, "wb", buffering=0 if data_digest else -1) as raw_file:
        data_file = _HashingWriter(raw_file) if data_digest is None else _CopyingWriter(raw_file)
        graph_only = skeleton(model, data_file, weights)
    graph = graph_only.SerializeToString(deterministic=True)
    if digests is not None:
        digests[data_path.name] = data_digest or data_file.digest.hexdigest()  # type: ignore[union-attr]
        digests[path.name] = hashlib.sha256(graph).hexdigest()
    path.write_bytes(graph)
    return [path, data_path]


_GRAPH_FIELD, _INITIALIZER_FIELD, _RAW_DATA_FIELD = 7, 5, 9  # ModelProto.graph, GraphProto.initializer, TensorProto.raw_data
_LENGTH_DELIMITED = 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field_header(number: int, length: int) -> bytes:
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(length)


def _write_streamed(model: onnx.ModelProto, file, weights: WeightSource | None = None) -> None:
    """Serialise ``model`` to ``file`` one initializer at a time (never the whole model in memory).

    Protobuf readers accept fields in any order and merge repeated ones, so the model is written as
    everything but its graph, then the graph field: everything but the initializers, then each
    initializer as its own ``GraphProto.initializer`` entry. The bytes parse to the same model. A mapped
    initializer (with ``weights``) is written as its description followed by its ``raw_data`` field, read
    from the map (the same bytes as serialising it with its data, for tensors without fields numbered
    above ``raw_data``'s, such as a doc string).
    """
    shell = copy_without_initializers(model)
    graph_rest = shell.graph.SerializeToString(deterministic=True)
    shell.ClearField("graph")
    parts = []
    for tensor in model.graph.initializer:
        if weights is not None and is_mapped(tensor):
            stub = _without_data(tensor).SerializeToString(deterministic=True)
            length = value_bytes([tensor])
            parts.append((stub, length, len(stub) + len(_field_header(_RAW_DATA_FIELD, length)) + length))
        else:
            parts.append((None, 0, tensor.ByteSize()))
    graph_length = len(graph_rest) + sum(len(_field_header(_INITIALIZER_FIELD, size)) + size for _, _, size in parts)
    file.write(shell.SerializeToString(deterministic=True))
    file.write(_field_header(_GRAPH_FIELD, graph_length))
    file.write(graph_rest)
    for tensor, (stub, length, size) in zip(model.graph.initializer, parts):
        file.write(_field_header(_INITIALIZER_FIELD, size))
        if stub is None:
            file.write(tensor.SerializeToString(deterministic=True))
            continue
        file.write(stub)
        file.write(_field_header(_RAW_DATA_FIELD, length))
        file.write(as_bytes(weights.array(tensor)))  # type: ignore[union-attr]


class _HashingWriter:
    """A binary file wrapper that hashes what is written (``name``, ``tell`` and ``write`` as ``skeleton`` uses)."""

    def __init__(self, file):
        self.file, self.name, self.digest = file, file.name, hashlib.sha256()

    def tell(self) -> int:
        return self.file.tell()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.file.write(data)


class _CopyingWriter:
    """An unbuffered binary file written at its position, without hashing, where mapped weights are copied
    from their files through one reused buffer (``copy_from``, as ``skeleton`` uses it)."""

    def __init__(self, file):
        self.file, self.name = file, file.name
        self._buffer: memoryview | None = None

    def tell(self) -> int:
        return os.lseek(self.file.fileno(), 0, os.SEEK_CUR)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self.file.fileno(), view):]
        return memoryview(data).nbytes

    def copy_from(self, weights: WeightSource, tensor: onnx.TensorProto) -> int:
        copy = getattr(weights, "copy_into", None)
        if copy is None:
            return self.write(as_bytes(weights.array(tensor)))
        if self._buffer is None:
            self._buffer = memoryview(bytearray(COPY_BUFFER_BYTES))
        return copy(tensor, self.file.fileno(), self._buffer)
