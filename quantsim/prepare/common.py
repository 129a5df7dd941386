"""What the preparation passes share: their error and warning types, the size from which a model is
"large", and small helpers over a ModelProto.

A model is large when protobuf cannot serialise it in one piece (2 GiB): such a model is written to
disk as a small graph file plus one external-data file (``save_model``) and read back with
``onnx.load``, which loads the external data into the tensors once. ``LARGE_MODEL_BYTES`` is read at
call time, so tests can lower it to exercise the large-model paths on small models.
"""
from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import EncodeError

__all__ = [
    "LARGE_MODEL_BYTES",
    "PrepareError",
    "PrepareWarning",
    "is_large",
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
    """True when ``model`` is at least ``LARGE_MODEL_BYTES`` (or too big for protobuf to measure)."""
    try:
        return model.ByteSize() >= LARGE_MODEL_BYTES
    except (EncodeError, ValueError):
        return True


def default_opset(model: onnx.ModelProto) -> int | None:
    """The version of the default (``ai.onnx``) domain the model imports, or None."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return None


def constant_names(graph: onnx.GraphProto) -> set[str]:
    """Initializers whose value is fixed: those not also listed as (overridable) graph inputs."""
    inputs = {i.name for i in graph.input}
    return {t.name for t in graph.initializer if t.name not in inputs}


def referenced_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name the graph reads: node inputs, subgraph outer-scope reads, graph outputs."""
    from ..graph import subgraph_references

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


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> list[Path]:
    """Write ``model`` to ``path`` and return the files written.

    A large model's top-level initializers (raw data of at least 1 KiB) go to ``<path>.data`` beside
    it as ONNX external data. Unlike ``onnx.save(save_as_external_data=True)`` the in-memory model
    keeps its weights: they are detached only while the graph file is written, then put back.
    """
    path = Path(path)
    if not is_large(model):
        path.write_bytes(model.SerializeToString(deterministic=True))
        return [path]
    data_path = path.with_name(path.name + ".data")
    detached: list[tuple[onnx.TensorProto, bytes]] = []
    try:
        with open(data_path, "wb") as data_file:
            for tensor in model.graph.initializer:
                if tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data"):
                    continue
                raw = tensor.raw_data
                if len(raw) < _EXTERNAL_MIN_BYTES:
                    continue
                offset = data_file.tell()
                data_file.write(raw)
                detached.append((tensor, raw))
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", data_path.name), ("offset", offset), ("length", len(raw))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, str(value)
        path.write_bytes(model.SerializeToString(deterministic=True))
    finally:
        for tensor, raw in detached:
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = raw
    return [path, data_path]
