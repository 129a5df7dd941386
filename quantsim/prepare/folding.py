"""``fold_constants``: nodes computed only from constants are evaluated once and become initializers.

Pre: nodes in topological order (``check_graph``); shapes inferred where possible (used to skip huge
outputs before computing them). Post: no foldable node is left; outputs are unchanged (the value is
computed by ``onnx.reference.ReferenceEvaluator``, the ONNX reference implementation, instead of
onnxruntime: float results can differ from onnxruntime's in the last bits).
Rules. A top-level node is folded when all of these hold:
1. it has at least one input, and every non-empty input is a constant initializer (not a graph input)
   or the output of a node folded before it;
2. it is in the default domain and has no subgraph attribute (If, Loop, Scan: skipped);
3. it is deterministic: RandomNormal/Uniform(Like), Multinomial, Bernoulli and Dropout are skipped;
4. it is not a quantization op (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear): quantized
   weights of an imported QDQ model stay recognisable;
5. none of its outputs is a graph output (a graph output keeps a producing node);
6. no output is bigger than ``max_output_bytes`` (64 MiB by default): judged from the inferred shape
   before evaluating, and from the computed value after;
7. the reference evaluator computes it without error (an error just skips the node).
Each folded output becomes an initializer of the same name; the folded nodes and initializers nothing
reads any more are removed.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.graph.edit import constant_names, describe, drop_unused_initializers
from quantsim.graph.mapped import tensor_values

__all__ = ["MAX_FOLDED_BYTES", "fold_constants"]

MAX_FOLDED_BYTES = 64 * 2**20
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                               "Multinomial", "Bernoulli", "Dropout"})
_QUANTIZATION = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)

_log = logging.getLogger(__name__)


def fold_constants(model: onnx.ModelProto, *, max_output_bytes: int = MAX_FOLDED_BYTES) -> tuple[onnx.ModelProto, bool]:
    """Replace constant-only nodes by initializers holding their outputs (rules in the module docstring)."""
    graph = model.graph
    constants = constant_names(model)
    initializers = {t.name: t for t in graph.initializer}
    graph_outputs = {o.name for o in graph.output}
    declared = _declared_types(graph)
    opsets = {entry.domain or "": entry.version for entry in model.opset_import}
    values: dict[str, np.ndarray] = {}
    folded: set[int] = set()
    touched: set[str] = set()
    for position, node in enumerate(graph.node):
        if not _foldable(node, constants, graph_outputs):
            continue
        if max(declared.get(name, (0, 0))[1] for name in node.output) > max_output_bytes:
            _log.debug("not folding %s: output over %d bytes", describe(node), max_output_bytes)
            continue
        tensors = _evaluate(node, opsets, initializers, values, max_output_bytes)
        if tensors and any(declared.get(t.name, (t.data_type,))[0] not in (0, t.data_type) for t in tensors):
            _log.debug("not folding %s: the reference computed another element type", describe(node))
            continue
        if tensors is None:
            continue
        for tensor in tensors:
            graph.initializer.append(tensor)
            initializers[tensor.name] = graph.initializer[-1]
            constants.add(tensor.name)
        folded.add(position)
        touched.update(name for name in (*node.input, *node.output) if name)
    if not folded:
        return model, False
    keep = [node for position, node in enumerate(graph.node) if position not in folded]
    del graph.node[:]
    graph.node.extend(keep)
    drop_unused_initializers(graph, touched)
    return model, True


def _foldable(node: onnx.NodeProto, constants: set[str], graph_outputs: set[str]) -> bool:
    inputs = [name for name in node.input if name]
    return (
        bool(inputs)
        and all(name in constants for name in inputs)
        and node.domain in ("", "ai.onnx")
        and node.op_type not in _NONDETERMINISTIC
        and node.op_type not in _QUANTIZATION
        and not any(attr.type in _SUBGRAPH for attr in node.attribute)
        and not any(name in graph_outputs for name in node.output)
    )


def _evaluate(node, opsets, initializers, values, max_output_bytes) -> list[onnx.TensorProto] | None:
    from onnx.reference import ReferenceEvaluator

    feeds = {}
    for name in node.input:
        if name and name not in feeds:
            if name not in values:
                values[name] = tensor_values(initializers[name])
            feeds[name] = values[name]
    try:
        results = ReferenceEvaluator(node, opsets=opsets).run(None, feeds)
        outputs = [(name, np.asarray(value)) for name, value in zip(node.output, results) if name]
        if any(value.nbytes > max_output_bytes for _, value in outputs):
            _log.debug("not folding %s: output over %d bytes", describe(node), max_output_bytes)
            return None
        tensors = [numpy_helper.from_array(value, name) for name, value in outputs]
    except Exception as exc:  # noqa: BLE001 - an op the reference cannot run is simply not folded
        _log.debug("not folding %s: %s", describe(node), exc)
        return None
    for name, value in outputs:
        values[name] = value
    return tensors


def _declared_types(graph: onnx.GraphProto) -> dict[str, tuple[int, int]]:
    """``(element type, bytes or 0 if the shape is not fully known)`` of each value with an inferred type."""
    declared = {}
    for info in (*graph.value_info, *graph.output):
        if not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        dims = tensor_type.shape.dim
        size = 0
        if tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            try:
                itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).itemsize
                size = itemsize * int(np.prod([d.dim_value for d in dims]))
            except Exception:  # noqa: BLE001 - unknown element type: size unknown
                pass
        declared[info.name] = (tensor_type.elem_type, size)
    return declared
