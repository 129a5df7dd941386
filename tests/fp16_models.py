"""Float16-compute test models built the way onnxconverter-common's ``convert_float_to_float16`` builds them.

``to_float16(model, block)`` mirrors ``convert_float_to_float16(keep_io_types=True, op_block_list=block)``:
float32 graph inputs and outputs, a ``Cast`` to float16 after each input and one to float32 before each
output, float16 initializers and float tensors everywhere else, and each blocked op computing in float32
between ``Cast`` float16 -> float32 on its float inputs and ``Cast`` float32 -> float16 on its float outputs
(its constant inputs stay float32). onnxconverter-common is not a dependency; this is the same graph shape.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["to_float16", "fp16_cnn", "fp16_mlp"]


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {v.name for v in infos if v.type.tensor_type.elem_type == TensorProto.FLOAT}


def to_float16(model: onnx.ModelProto, block: tuple[str, ...] = ("Resize",)) -> onnx.ModelProto:
    """``model`` (float32) converted to float16 compute with float32 I/O (module docstring)."""
    floats = _float_tensors(model)
    graph = model.graph
    blocked = [n for n in graph.node if n.op_type in block]
    blocked_only = {t.name for t in graph.initializer
                    if all(n in blocked for n in graph.node if t.name in n.input)}
    inits = [t if t.name in blocked_only or t.data_type != TensorProto.FLOAT else
             numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name) for t in graph.initializer]
    nodes, renamed = [], {}
    for value in graph.input:
        if value.name in floats:
            renamed[value.name] = f"{value.name}_fp16"
            nodes.append(helper.make_node("Cast", [value.name], [renamed[value.name]], name=f"graph_input_cast_{value.name}",
                                          to=TensorProto.FLOAT16))
    outputs = {v.name for v in graph.output}
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [renamed.get(n, n) for n in node.input]
        if node in blocked:
            for i, name in enumerate(node.input):
                if name in floats and name not in blocked_only:
                    cast = f"{node.name}_input_cast_{i}"
                    nodes.append(helper.make_node("Cast", [copy.input[i]], [cast], name=cast, to=TensorProto.FLOAT))
                    copy.input[i] = cast
            nodes.append(copy)
            for i, name in enumerate(node.output):
                if name in floats:
                    copy.output[i] = f"{node.name}_output_cast_{i}"
                    target = f"{name}_fp16" if name in outputs else name
                    nodes.append(helper.make_node("Cast", [copy.output[i]], [target], name=copy.output[i],
                                                  to=TensorProto.FLOAT16))
                    renamed[name] = target
            continue
        for i, name in enumerate(node.output):
            if name in outputs and name in floats:
                copy.output[i] = renamed[name] = f"{name}_fp16"
        nodes.append(copy)
    for value in graph.output:
        if value.name in floats:
            nodes.append(helper.make_node("Cast", [renamed[value.name]], [value.name], name=f"graph_output_cast_{value.name}",
                                          to=TensorProto.FLOAT))
    new_graph = helper.make_graph(nodes, graph.name, list(graph.input), list(graph.output), inits)
    converted = helper.make_model(new_graph, opset_imports=list(model.opset_import))
    converted.ir_version = model.ir_version
    onnx.checker.check_model(converted)
    return converted


def _init(rng: np.random.Generator, name: str, *shape: int, scale: float | None = None) -> TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    values = rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan_in))
    return numpy_helper.from_array(values.astype(np.float32), name)


def fp16_cnn() -> onnx.ModelProto:
    """x[N,3,16,16] -> Conv+Relu -> Conv -> Add residual -> Relu -> MaxPool -> Resize (linear, blocked) ->
    Concat with the residual -> Conv head -> y[N,4,16,16], converted to float16 (Resize in float32)."""
    rng = np.random.default_rng(5)
    inits = [_init(rng, "c1.w", 8, 3, 3, 3), _init(rng, "c1.b", 8, scale=0.1), _init(rng, "c2.w", 8, 8, 3, 3),
             _init(rng, "c2.b", 8, scale=0.1), _init(rng, "head.w", 4, 16, 1, 1), _init(rng, "head.b", 4, scale=0.1),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
             helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["c2"], name="c2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["add"], name="add"),
             helper.make_node("Relu", ["add"], ["r2"], name="r2"),
             helper.make_node("MaxPool", ["r2"], ["mp"], name="mp", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["mp", "", "scales"], ["up"], name="up", mode="linear"),
             helper.make_node("Concat", ["up", "r2"], ["cat"], name="cat", axis=1),
             helper.make_node("Conv", ["cat", "head.w", "head.b"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "fp16_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return to_float16(model)


def fp16_mlp() -> onnx.ModelProto:
    """x[N,16] -> MatMul -> Add -> Relu -> MatMul -> Add -> y[N,8], converted to float16."""
    rng = np.random.default_rng(6)
    inits = [_init(rng, "w1", 16, 32), _init(rng, "b1", 32, scale=0.1), _init(rng, "w2", 32, 8),
             _init(rng, "b2", 8, scale=0.1)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="mm2"),
             helper.make_node("Add", ["m2", "b2"], ["y"], name="add2")]
    graph = helper.make_graph(nodes, "fp16_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return to_float16(model)
