"""Shape arithmetic for the integer export: fold it into constants once the input shapes are known.

A detector's anchor grid and strides (YOLOv8: ``Shape -> Gather -> Cast -> Range -> Add 0.5 -> Expand ->
Concat``, then ``anchors - dist``, ``(c, wh) * strides``) are float values computed from tensor *shapes*,
never from activation values. The sim leaves them unquantized (shape arithmetic, `DESIGN.md` §4); in the
integer model they would be float compute ops. When every graph input has a known static shape (declared
in the model, or given as ``input_shapes``) those values are constants:

1. the graph inputs get the static dims (``input_shapes`` must agree with the declared static ones and
   have the declared rank, else `InvalidArgumentError` naming the input);
2. ONNX shape inference (with data propagation) runs on the copy;
3. every ``Shape`` / ``Size`` node whose input now has a fully static shape becomes an initializer (a
   ``Shape`` node's ``start`` / ``end`` attributes honoured);
4. `quantsim.prepare.folding.fold_constants` folds what now reads only constants (``Range``, ``Add``,
   ``Expand``, ``Concat``, ...), so the activation-side ops read plain constants, which the lowering puts
   on exact grids (`context.exact_grid`).

The exported model then declares those static input shapes: onnxruntime refuses a differently shaped input
with an error naming the input and its dims, instead of computing anchors for the wrong size.

Without static shapes nothing is folded; `shape_derived` names the tensors computed from shapes so that
the report can say why an op stayed float and that ``input_shapes`` would fold it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.errors import InvalidArgumentError
from quantsim.graph.deferred import WeightSource
from quantsim.graph.index import GraphIndex
from quantsim.graph.large_models import copy_without_initializers, value_bytes
from quantsim.graph.mapped import is_mapped
from quantsim.prepare.folding import fold_constants

__all__ = ["static_input_shapes", "fold_shape_arithmetic", "shape_derived"]

_SHAPE_OPS = ("Shape", "Size")
_STAND_IN_MIN_BYTES = 1024  # initializers this big that the fold cannot read stay out of its copy


def _declared(info: onnx.ValueInfoProto) -> list[int | None] | None:
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim]


def static_input_shapes(model: onnx.ModelProto,
                        input_shapes: Mapping[str, Sequence[int]] | None) -> dict[str, list[int]] | None:
    """The static shape of every graph input (``input_shapes`` over the declared dims), or None when one
    stays dynamic. Raises `InvalidArgumentError` for an unknown input name, a wrong rank, a non-positive
    dim or a dim that contradicts a declared static one."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    given = dict(input_shapes or {})
    unknown = sorted(set(given) - set(inputs))
    if unknown:
        raise InvalidArgumentError(f"input_shapes names {', '.join(map(repr, unknown))}, not a graph input of the "
                                   f"model (inputs: {', '.join(map(repr, inputs))})")
    shapes: dict[str, list[int]] = {}
    for name, info in inputs.items():
        declared = _declared(info)
        if name not in given:
            if declared is None or None in declared:
                return None
            shapes[name] = [int(d) for d in declared if d is not None]
            continue
        dims = [int(d) for d in given[name]]
        if any(d <= 0 for d in dims):
            raise InvalidArgumentError(f"input_shapes[{name!r}] = {dims}: dims must be positive")
        if declared is not None and len(declared) != len(dims):
            raise InvalidArgumentError(f"input_shapes[{name!r}] = {dims} has rank {len(dims)}; the input has rank "
                                       f"{len(declared)}")
        clash = [(axis, d, want) for axis, (d, want) in enumerate(zip(declared or [], dims)) if d is not None and d != want]
        if clash:
            axis, d, want = clash[0]
            raise InvalidArgumentError(f"input_shapes[{name!r}] = {dims}: dim {axis} is declared {d}, not {want}")
        shapes[name] = dims
    return shapes


def fold_shape_arithmetic(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                          weights: WeightSource | None = None) -> tuple[onnx.ModelProto, list[onnx.TensorProto], int]:
    """A copy of ``model`` with static input ``shapes`` and its shape arithmetic folded (module docstring), the
    initializers of ``model`` the copy reads without holding them, and the number of nodes folded away.

    The copy holds only the initializers the fold may evaluate (those read by nodes whose inputs are all
    constants or computed from shapes) and those under 1 KiB; each other one (a weight) is a typed graph
    input while folding, then left out of the copy and returned instead, so that the weights are never copied
    (``GraphIndex(copy, initializers=[*copy.graph.initializer, *returned])`` sees the whole model). ``weights``
    reads the initializers of ``model`` held outside it (`quantsim.graph.mapped`) that the fold needs."""
    index = GraphIndex(model, weights=weights)
    usable = set(index.initializers) | shape_derived(index)
    needed = {n for node in index.nodes if all(i in usable for i in node.input if i) for n in node.input if n}
    work = copy_without_initializers(model)
    kept_out: list[onnx.TensorProto] = []
    for tensor in model.graph.initializer:
        if tensor.name in needed or value_bytes([tensor]) < _STAND_IN_MIN_BYTES:
            work.graph.initializer.append(numpy_helper.from_array(index.constant_value(tensor.name), tensor.name)
                                          if is_mapped(tensor) else tensor)
        else:
            kept_out.append(tensor)
            work.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for info in work.graph.input:
        if info.name in shapes:
            shape = info.type.tensor_type.shape
            del shape.dim[:]
            for d in shapes[info.name]:
                shape.dim.add().dim_value = int(d)
    before = len(work.graph.node)
    outputs = {o.name for o in work.graph.output}
    while True:  # a shape known only once earlier shape arithmetic is folded (a Pad's computed pads) needs a round more
        del work.graph.value_info[:]
        inferred = onnx.shape_inference.infer_shapes(work, strict_mode=False, data_prop=True)
        work.graph.value_info.extend(inferred.graph.value_info)
        known = {v.name: _declared(v) for v in (*inferred.graph.value_info, *inferred.graph.input)}
        keep, folded = [], 0
        for node in work.graph.node:
            static = node.input and not outputs.intersection(node.output)
            value = _static_shape_value(node, known.get(node.input[0])) if static else None
            if value is None:
                keep.append(node)
            else:
                work.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
                folded += 1
        if not folded:
            break
        del work.graph.node[:]
        work.graph.node.extend(keep)
        work, _ = fold_constants(work)
    stand_ins = {t.name for t in kept_out}
    real_inputs = [i for i in work.graph.input if i.name not in stand_ins]
    del work.graph.input[:]
    work.graph.input.extend(real_inputs)
    return work, kept_out, before - len(work.graph.node)


def _static_shape_value(node: onnx.NodeProto, dims: list[int | None] | None) -> np.ndarray | None:
    if node.op_type not in _SHAPE_OPS or node.domain not in ("", "ai.onnx") or dims is None or None in dims:
        return None
    static = [int(d or 0) for d in dims]
    if node.op_type == "Size":
        return np.asarray(int(np.prod(static, dtype=np.int64)), np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return np.asarray(static[start:end], np.int64)


def shape_derived(index: GraphIndex) -> set[str]:
    """Tensors computed from tensor shapes (``Shape`` / ``Size`` outputs and what is computed from them and
    constants only): functions of the input shapes, not of activation values."""
    derived: set[str] = set()
    for node in index.nodes:
        inputs = [n for n in node.input if n]
        if node.op_type in _SHAPE_OPS or (inputs and any(n in derived for n in inputs)
                                          and all(n in derived or index.is_constant(n) for n in inputs)):
            derived.update(n for n in node.output if n)
    return derived
