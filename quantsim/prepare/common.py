"""What the preparation passes share: their error and warning types, the size from which a model is
"large", and small helpers over a ModelProto.

A model is large when protobuf cannot serialise it in one piece (2 GiB): such a model is written to
disk as a small graph file plus one external-data file (``save_model``) and read back with
``onnx.load``, which loads the external data into the tensors once. ``LARGE_MODEL_BYTES`` is read at
call time, so tests can lower it to exercise the large-model paths on small models.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

__all__ = [
    "LARGE_MODEL_BYTES",
    "PrepareError",
    "PrepareWarning",
    "is_large",
    "estimated_bytes",
    "skeleton",
    "copy_without_initializers",
    "is_external_candidate",
    "default_opset",
    "constant_names",
    "referenced_names",
    "drop_unused_initializers",
    "drop_value_info",
    "describe",
    "save_model",
]

LARGE_MODEL_BYTES = onnx.checker.MAXIMUM_PROTOBUF  # protobuf's 2 GiB message limit
_EXTERNAL_MIN_BYTES = 1024  # initializers at least this big go to the external-data file


class PrepareError(ValueError):
    """The model cannot be prepared; the message names the offending nodes, values or versions."""


class PrepareWarning(UserWarning):
    """Preparation went on with less than it wanted (no shapes, a refused fold, a cache entry dropped)."""


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


def _payload_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:  # noqa: BLE001 - strings, undefined types: measure the tensor itself
        return tensor.ByteSize()
    return itemsize * math.prod(tensor.dims)


def default_opset(model: onnx.ModelProto) -> int | None:
    """The version of the default (``ai.onnx``) domain the model imports, or None."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return None


def constant_names(model: onnx.ModelProto) -> set[str]:
    """Initializers whose value is fixed: from IR version 4 on, those not also listed as (overridable)
    graph inputs; before it every initializer had to be listed as an input and all are constant."""
    graph = model.graph
    inputs = {i.name for i in graph.input} if model.ir_version >= 4 else set()
    return {t.name for t in graph.initializer if t.name not in inputs}


def referenced_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name the graph reads: node inputs, subgraph outer-scope reads, graph outputs."""
    from quantsim.graph.index import subgraph_references

    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(name for name in node.input if name)
        names.update(subgraph_references(node))
    return names


def drop_unused_initializers(graph: onnx.GraphProto, candidates: set[str]) -> set[str]:
    """Remove the initializers among ``candidates`` that nothing reads any more; returns their names."""
    used = referenced_names(graph) | {i.name for i in graph.input}
    dead = {name for name in candidates if name not in used}
    if dead:
        keep = [t for t in graph.initializer if t.name not in dead]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        drop_value_info(graph, dead)
    return dead


def drop_value_info(graph: onnx.GraphProto, names: set[str]) -> None:
    """Forget inferred types of values that no longer exist (stale entries confuse shape inference)."""
    if any(info.name in names for info in graph.value_info):
        keep = [info for info in graph.value_info if info.name not in names]
        del graph.value_info[:]
        graph.value_info.extend(keep)


def describe(node: onnx.NodeProto) -> str:
    """``'"name" (OpType)'`` for error messages."""
    return f'"{node.name}" ({node.op_type})' if node.name else f"an unnamed {node.op_type} node"


def skeleton(model: onnx.ModelProto, data_file=None) -> onnx.ModelProto:
    """A copy of ``model`` without the payload of its big initializers (raw data of 1 KiB or more).

    Their copies become ONNX external-data references. With ``data_file`` (an open binary file) the
    payloads are written to it and the references point into it, so the skeleton plus that file is
    the model; without, they point at ``"unwritten"`` (enough for shape inference and for hashing).
    ``model`` is not modified and its weights are never copied as a whole.
    """
    result = copy_without_initializers(model)
    location = Path(data_file.name).name if data_file is not None else "unwritten"
    for tensor in model.graph.initializer:
        copy = result.graph.initializer.add()
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


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> list[Path]:
    """Write ``model`` to ``path`` and return the files written.

    A large model's big initializers go to ``<path>.data`` beside it as ONNX external data (see
    ``skeleton``). Unlike ``onnx.save(save_as_external_data=True)`` the in-memory model keeps its weights.
    """
    path = Path(path)
    if not is_large(model):
        path.write_bytes(model.SerializeToString(deterministic=True))
        return [path]
    data_path = path.with_name(path.name + ".data")
    with open(data_path, "wb") as data_file:
        graph_only = skeleton(model, data_file)
    path.write_bytes(graph_only.SerializeToString(deterministic=True))
    return [path, data_path]
