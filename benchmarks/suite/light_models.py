"""Real CNN architectures that ship inside the ``onnx`` wheel (``onnx/backend/test/data/light``), made runnable.

The ``light_*.onnx`` files are Caffe2 / early PyTorch exports (opset 9, IR 3: every initializer is also a
graph input) of ResNet-50, DenseNet-121, ShuffleNet, ... whose weights were replaced by ``ConstantOfShape``
nodes to keep the files small. `randomized` turns each of those into a deterministic random initializer
(He-normal for Conv / Gemm weights, the fill value times ``1 +- 20 %`` for the others, so BatchNorm variances
stay positive), giving the real graph structure with plausible activations; `prefix` keeps the part of the
graph a tensor depends on, with a smaller spatial input, so a test covers a few blocks in well under a second.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["LIGHT_DIR", "light_model", "randomized", "prefix", "output_of"]

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_model(name: str) -> onnx.ModelProto | None:
    """``light_<name>.onnx`` from the installed onnx wheel, or None when this onnx does not ship it."""
    path = LIGHT_DIR / f"light_{name}.onnx"
    return onnx.load(str(path)) if path.exists() else None


def randomized(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` with every ``ConstantOfShape`` weight a deterministic random initializer."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, slot))
    kept = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]).reshape(-1))
        fill = float(numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0]) if node.attribute else 0.0
        if any(user.op_type in ("Conv", "Gemm") and slot == 1 for user, slot in uses.get(node.output[0], [])):
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            values = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif fill != 0:
            values = fill * (1 + 0.2 * rng.uniform(-1, 1, shape))
        else:
            values = 0.05 * rng.standard_normal(shape)
        graph.initializer.append(numpy_helper.from_array(values.astype(np.float32), node.output[0]))
        if out.ir_version < 4:  # before IR 4 every initializer is also a graph input
            graph.input.append(helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, list(shape)))
    del graph.node[:]
    graph.node.extend(kept)
    return out


def output_of(model: onnx.ModelProto, op_type: str, count: int, *, then: str | None = None) -> str:
    """The output of the ``count``-th (1-based) ``op_type`` node, or of the ``then`` node right after it."""
    found = [n for n in model.graph.node if n.op_type == op_type]
    node = found[count - 1]
    if then is not None:
        node = next(n for n in model.graph.node if n.op_type == then and node.output[0] in n.input)
    return node.output[0]


def prefix(model: onnx.ModelProto, output: str, size: int) -> onnx.ModelProto:
    """The subgraph computing ``output`` (its only graph output), its data input ``size x size`` pixels."""
    producers = {o: n for n in model.graph.node for o in n.output}
    needed, stack = set(), [output]
    while stack:
        name = stack.pop()
        node = producers.get(name)
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            stack.extend(n for n in node.input if n)
    nodes = [n for n in model.graph.node if id(n) in needed]
    read = {name for n in nodes for name in n.input}
    inits = [t for t in model.graph.initializer if t.name in read]
    init_names = {t.name for t in inits}
    inputs = []
    for info in model.graph.input:
        if info.name not in read:
            continue
        if info.name not in init_names:  # the image: batch and channels kept, smaller spatial dims
            dims = info.type.tensor_type.shape.dim
            info = helper.make_tensor_value_info(info.name, info.type.tensor_type.elem_type,
                                                 ["N", dims[1].dim_value, size, size])
        inputs.append(info)
    outputs = [helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, ["N", "C", "H", "W"])]
    graph = helper.make_graph(nodes, model.graph.name, inputs, outputs, inits)
    result = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name=model.producer_name)
    result.ir_version = model.ir_version
    onnx.checker.check_model(result)
    return result
