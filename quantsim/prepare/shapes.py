"""``infer_shapes``: ONNX shape and type inference, best effort.

Pre: none. Post: ``graph.value_info`` (and graph output types) hold what ONNX could infer.
Rules:
1. non-strict inference with data propagation (``onnx.shape_inference.infer_shapes``); only
   ``value_info`` and output types change, never nodes or weights;
2. inference runs on the model's ``skeleton``: the graph with its big weights as external-data
   references to a file never written (inference needs their shapes, not their values), so no weight
   is copied, serialised or written (serialising a 0.8 GB model twice took 10 of the 16 s of a cold
   preparation); a large model (>= 2 GiB) is inferred by file (``infer_shapes_path``); the inferred
   types are copied back into the model;
3. fallback: when inference raises, the model is kept as it was and a ``PrepareWarning`` says so;
   when it leaves node outputs without a type (custom-domain ops, inconsistent shapes) a
   ``PrepareWarning`` names them. Either way preparation goes on without those shapes: later steps
   observe types by running the model.
``modified`` is True when the inferred types differ from the ones the model had.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from quantsim.errors import PrepareWarning, warn_at_caller
from quantsim.graph.edit import describe
from quantsim.graph.large_models import is_large, skeleton

__all__ = ["infer_shapes"]


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Infer value types and shapes in place of the model's own (rules in the module docstring)."""
    before = _typing(model.graph)
    declared = {o.name: onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in model.graph.output}
    try:
        source = _undeclared(skeleton(model))  # never the weights: serialising them dominated preparation
        if is_large(model):
            _infer_by_file(source, model)
        else:
            inferred = onnx.shape_inference.infer_shapes(source, strict_mode=False, data_prop=True)
            _copy_types(inferred.graph, model.graph)
        _reconcile_outputs(model.graph, declared)
    except Exception as exc:  # noqa: BLE001 - inference is best effort by contract
        warn_at_caller(f"shape inference failed, continuing without inferred shapes: {exc}", PrepareWarning)
        return model, False
    _warn_untyped(model.graph)
    return model, _typing(model.graph) != before


def _infer_by_file(undeclared: onnx.ModelProto, model: onnx.ModelProto) -> None:
    with tempfile.TemporaryDirectory(prefix="quantsim-shapes-") as folder:
        source, target = Path(folder, "model.onnx"), Path(folder, "inferred.onnx")
        source.write_bytes(undeclared.SerializeToString())
        onnx.shape_inference.infer_shapes_path(str(source), str(target), strict_mode=False, data_prop=True)
        inferred = onnx.load(str(target), load_external_data=False)
    _copy_types(inferred.graph, model.graph)


def _undeclared(copy: onnx.ModelProto) -> onnx.ModelProto:
    """``copy`` (modified in place) with shapes to be computed from the inputs, not taken on trust:
    intermediate ``value_info`` dropped and the graph outputs' shapes cleared (their element types kept).
    A wrong declared rank would otherwise reach the statistics graph (reductions over axes the tensor
    lacks) and fail there."""
    del copy.graph.value_info[:]
    for output in copy.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
    return copy


def _reconcile_outputs(graph: onnx.GraphProto, declared: dict[str, onnx.ValueInfoProto]) -> None:
    """Keep a declared output shape where inference computed none; warn where the two ranks differ."""
    for output in graph.output:
        mine, theirs = output.type.tensor_type, declared[output.name].type.tensor_type
        if not theirs.HasField("shape"):
            continue
        if not mine.HasField("shape"):
            mine.shape.CopyFrom(theirs.shape)
        elif len(mine.shape.dim) != len(theirs.shape.dim):
            warn_at_caller(f"graph output {output.name!r} is declared with rank {len(theirs.shape.dim)} but computes "
                           f"rank {len(mine.shape.dim)}; using the computed shape", PrepareWarning)


def _copy_types(source: onnx.GraphProto, target: onnx.GraphProto) -> None:
    del target.value_info[:]
    target.value_info.extend(source.value_info)
    del target.output[:]
    target.output.extend(source.output)


def _typing(graph: onnx.GraphProto) -> tuple[bytes, ...]:
    return tuple(info.SerializeToString(deterministic=True) for info in (*graph.value_info, *graph.output))


def _warn_untyped(graph: onnx.GraphProto) -> None:
    typed = {info.name for info in (*graph.value_info, *graph.output, *graph.input)
             if info.type.WhichOneof("value") is not None}
    typed.update(t.name for t in graph.initializer)
    untyped = [(name, node) for node in graph.node for name in node.output if name and name not in typed]
    if untyped:
        name, node = untyped[0]
        warn_at_caller(f'shape inference left {len(untyped)} value(s) without a type (first: "{name}" from '
                      f"node {describe(node)}); continuing without their shapes", PrepareWarning)
