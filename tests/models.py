"""Small ONNX models shared by the tests, each with a seeded feed generator.

Every builder returns ``(model, feeds)`` where ``model`` is a checked ``onnx.ModelProto`` (opset 17 with
IR 8, or opset 21 with IR 10, both set explicitly: onnxruntime refuses newer IR versions) and
``feeds(seed, batch) -> {input name: float32 array}`` draws a deterministic batch. Weights come from
``numpy.random.default_rng`` with a fixed seed per builder, so two calls build identical models.
Tensor and node names are explicit and stable, so tests can refer to them.

Builders (``BUILDERS`` maps names to them):

* ``conv_relu``        Conv(+bias) -> Relu -> Conv(+bias)
* ``conv_bn_relu``     Conv (no bias) -> BatchNormalization (not folded) -> Relu
* ``conv_relu6``       Conv -> Clip(0, 6) -> depthwise Conv (group = C) -> Clip(0, 6)
* ``residual``         Conv -> Relu -> Conv -> Add(skip) -> Relu
* ``sum_residual``     ``residual`` with the skip written as ``Sum`` (Caffe2 / early PyTorch exports)
* ``concat``           Concat(Relu(Conv(x)), MaxPool(Conv(x))) -> Conv
* ``concat_bn``        Concat(Conv(x), MaxPool(x)) -> BatchNormalization (no layer to fold into) -> Relu -> Conv
                       (DenseNet's pre-activation BN)
* ``gemm``             Gemm(transB=1) -> Relu -> Gemm(transB=0)
* ``matmul``           MatMul(W) -> Add(b) -> Relu -> MatMul(W2)              (opset 21)
* ``pool``             Conv -> Relu -> AveragePool(3x3) -> Conv -> GlobalAveragePool -> Flatten -> Gemm
* ``layernorm``        MatMul -> LayerNormalization                            (opset 21)
* ``softmax``          MatMul -> Softmax
* ``resize``           Conv -> Relu -> Resize(nearest, scales) -> Conv
* ``mixed``            several of the above, two graph outputs (``probs``, ``embedding``), the second
                       also consumed inside the graph; a Reshape on the way
* ``avgpool_ties``     Relu -> AveragePool(2x2) with exact rounding ties (not in ``BUILDERS``)
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["BUILDERS", "IR_FOR_OPSET", "make_model", "image_feeds", "avgpool_ties"]

IR_FOR_OPSET = {17: 8, 18: 8, 21: 10}

Feeds = Callable[[int, int], dict]


# helpers -------------------------------------------------------------------------------------------
def make_model(nodes, inputs, outputs, initializers, opset: int = 17, name: str = "model") -> onnx.ModelProto:
    """A checked model with an explicit opset and IR version."""
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="quantsim-tests")
    model.ir_version = IR_FOR_OPSET[opset]
    onnx.checker.check_model(model, full_check=True)
    return model


class GraphBuilder:
    """A test graph's initializers and nodes, added one at a time; each node is named after its output."""

    def __init__(self) -> None:
        self.inits: list[TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _weights(rng: np.random.Generator, *shape: int, scale: float | None = None) -> np.ndarray:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    std = scale if scale is not None else 1.0 / np.sqrt(fan_in)
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _input(name: str, *dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def _output(name: str, *dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims) if dims else None)


def image_feeds(name: str, channels: int, size: int, spread: float = 1.0) -> Feeds:
    """Feeds of shape ``(batch, channels, size, size)``, normal with a per-batch seed."""

    def feeds(seed: int, batch: int) -> dict:
        rng = np.random.default_rng(seed)
        return {name: (rng.standard_normal((batch, channels, size, size)) * spread).astype(np.float32)}

    return feeds


def _seq_feeds(name: str, *shape: int) -> Feeds:
    def feeds(seed: int, batch: int) -> dict:
        rng = np.random.default_rng(seed)
        return {name: rng.standard_normal((batch, *shape)).astype(np.float32)}

    return feeds


def _conv(name, x, w, b, out, **attrs):
    inputs = [x, w] + ([b] if b else [])
    return helper.make_node("Conv", inputs, [out], name=name, **attrs)


def _clip(name, x, out, lo="clip_lo", hi="clip_hi"):
    return helper.make_node("Clip", [x, lo, hi], [out], name=name)


def _clip_bounds():
    return [_init("clip_lo", np.array(0.0, np.float32)), _init("clip_hi", np.array(6.0, np.float32))]


# builders ------------------------------------------------------------------------------------------
def conv_relu():
    rng = np.random.default_rng(1)
    inits = [_init("conv1.w", _weights(rng, 8, 3, 3, 3)), _init("conv1.b", _weights(rng, 8, scale=0.1)),
             _init("conv2.w", _weights(rng, 4, 8, 3, 3)), _init("conv2.b", _weights(rng, 4, scale=0.1))]
    nodes = [
        _conv("conv1", "x", "conv1.w", "conv1.b", "conv1.out", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1.out"], ["relu1.out"], name="relu1"),
        _conv("conv2", "relu1.out", "conv2.w", "conv2.b", "y", pads=[1, 1, 1, 1]),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 8, 8)], [_output("y", "N", 4, 8, 8)], inits)
    return model, image_feeds("x", 3, 8)


def conv_bn_relu():
    rng = np.random.default_rng(2)
    c = 6
    inits = [
        _init("conv.w", _weights(rng, c, 3, 3, 3)),
        _init("bn.scale", (1.0 + 0.2 * rng.standard_normal(c)).astype(np.float32)),
        _init("bn.bias", (0.1 * rng.standard_normal(c)).astype(np.float32)),
        _init("bn.mean", (0.1 * rng.standard_normal(c)).astype(np.float32)),
        _init("bn.var", (0.5 + rng.random(c)).astype(np.float32)),
    ]
    nodes = [
        _conv("conv", "x", "conv.w", None, "conv.out", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv.out", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
                         ["bn.out"], name="bn", epsilon=1e-5),
        helper.make_node("Relu", ["bn.out"], ["y"], name="relu"),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 8, 8)], [_output("y", "N", c, 8, 8)], inits)
    return model, image_feeds("x", 3, 8)


def conv_relu6():
    rng = np.random.default_rng(3)
    c = 8
    inits = [
        _init("conv.w", _weights(rng, c, 3, 3, 3, scale=0.5)), _init("conv.b", _weights(rng, c, scale=0.2)),
        _init("dw.w", _weights(rng, c, 1, 3, 3, scale=0.6)), _init("dw.b", _weights(rng, c, scale=0.2)),
        *_clip_bounds(),
    ]
    nodes = [
        _conv("conv", "x", "conv.w", "conv.b", "conv.out", pads=[1, 1, 1, 1]),
        _clip("clip1", "conv.out", "clip1.out"),
        _conv("dw", "clip1.out", "dw.w", "dw.b", "dw.out", pads=[1, 1, 1, 1], group=c),
        _clip("clip2", "dw.out", "y"),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 8, 8)], [_output("y", "N", c, 8, 8)], inits)
    return model, image_feeds("x", 3, 8, spread=2.0)


def residual():
    rng = np.random.default_rng(4)
    c = 4
    inits = [_init("conv1.w", _weights(rng, c, c, 3, 3)), _init("conv1.b", _weights(rng, c, scale=0.1)),
             _init("conv2.w", _weights(rng, c, c, 3, 3)), _init("conv2.b", _weights(rng, c, scale=0.1))]
    nodes = [
        _conv("conv1", "x", "conv1.w", "conv1.b", "conv1.out", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1.out"], ["relu1.out"], name="relu1"),
        _conv("conv2", "relu1.out", "conv2.w", "conv2.b", "conv2.out", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["conv2.out", "relu1.out"], ["add.out"], name="add"),
        helper.make_node("Relu", ["add.out"], ["y"], name="relu2"),
    ]
    model = make_model(nodes, [_input("x", "N", c, 8, 8)], [_output("y", "N", c, 8, 8)], inits)
    return model, image_feeds("x", c, 8)


def sum_residual():
    model, feeds = residual()
    for node in model.graph.node:
        if node.op_type == "Add":
            node.op_type = "Sum"
    onnx.checker.check_model(model, full_check=True)
    return model, feeds


def concat_bn():
    rng = np.random.default_rng(13)
    c = 8
    inits = [_init("conv1.w", _weights(rng, 5, 3, 3, 3)), _init("conv1.b", _weights(rng, 5, scale=0.1)),
             _init("bn.scale", (1.0 + 0.3 * rng.standard_normal(c)).astype(np.float32)),
             _init("bn.bias", (0.3 * rng.standard_normal(c)).astype(np.float32)),
             _init("bn.mean", (0.3 * rng.standard_normal(c)).astype(np.float32)),
             _init("bn.var", (0.5 + rng.random(c)).astype(np.float32)),
             _init("conv2.w", _weights(rng, 4, c, 1, 1)), _init("conv2.b", _weights(rng, 4, scale=0.1))]
    nodes = [
        _conv("conv1", "x", "conv1.w", "conv1.b", "conv1.out", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["x"], ["pool.out"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["conv1.out", "pool.out"], ["cat.out"], name="cat", axis=1),
        helper.make_node("BatchNormalization", ["cat.out", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
                         ["bn.out"], name="bn", epsilon=1e-5),
        helper.make_node("Relu", ["bn.out"], ["relu.out"], name="relu"),
        _conv("conv2", "relu.out", "conv2.w", "conv2.b", "y"),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 8, 8)], [_output("y", "N", 4, 8, 8)], inits)
    return model, image_feeds("x", 3, 8)


def concat():
    rng = np.random.default_rng(5)
    inits = [_init("conv1.w", _weights(rng, 4, 3, 3, 3)), _init("conv1.b", _weights(rng, 4, scale=0.1)),
             _init("conv2.w", _weights(rng, 4, 3, 1, 1)), _init("conv2.b", _weights(rng, 4, scale=0.1)),
             _init("conv3.w", _weights(rng, 5, 8, 1, 1)), _init("conv3.b", _weights(rng, 5, scale=0.1))]
    nodes = [
        _conv("conv1", "x", "conv1.w", "conv1.b", "conv1.out", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1.out"], ["relu1.out"], name="relu1"),
        _conv("conv2", "x", "conv2.w", "conv2.b", "conv2.out"),
        helper.make_node("MaxPool", ["conv2.out"], ["pool.out"], name="pool", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Concat", ["relu1.out", "pool.out"], ["cat.out"], name="cat", axis=1),
        _conv("conv3", "cat.out", "conv3.w", "conv3.b", "y"),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 8, 8)], [_output("y", "N", 5, 8, 8)], inits)
    return model, image_feeds("x", 3, 8)


def gemm():
    rng = np.random.default_rng(6)
    inits = [_init("fc1.w", _weights(rng, 12, 16)), _init("fc1.b", _weights(rng, 12, scale=0.1)),
             _init("fc2.w", _weights(rng, 12, 5)), _init("fc2.b", _weights(rng, 5, scale=0.1))]
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.w", "fc1.b"], ["fc1.out"], name="fc1", transB=1),
        helper.make_node("Relu", ["fc1.out"], ["relu.out"], name="relu"),
        helper.make_node("Gemm", ["relu.out", "fc2.w", "fc2.b"], ["y"], name="fc2", transB=0),
    ]
    model = make_model(nodes, [_input("x", "N", 16)], [_output("y", "N", 5)], inits)
    return model, _seq_feeds("x", 16)


def matmul():
    rng = np.random.default_rng(7)
    inits = [_init("mm1.w", _weights(rng, 16, 12)), _init("mm1.b", _weights(rng, 12, scale=0.1)),
             _init("mm2.w", _weights(rng, 12, 6))]
    nodes = [
        helper.make_node("MatMul", ["x", "mm1.w"], ["mm1.out"], name="mm1"),
        helper.make_node("Add", ["mm1.out", "mm1.b"], ["add.out"], name="add"),
        helper.make_node("Relu", ["add.out"], ["relu.out"], name="relu"),
        helper.make_node("MatMul", ["relu.out", "mm2.w"], ["y"], name="mm2"),
    ]
    model = make_model(nodes, [_input("x", "N", 5, 16)], [_output("y", "N", 5, 6)], inits, opset=21)
    return model, _seq_feeds("x", 5, 16)


def pool():
    rng = np.random.default_rng(8)
    inits = [_init("conv1.w", _weights(rng, 6, 3, 3, 3)), _init("conv1.b", _weights(rng, 6, scale=0.1)),
             _init("conv2.w", _weights(rng, 8, 6, 3, 3)), _init("conv2.b", _weights(rng, 8, scale=0.1)),
             _init("fc.w", _weights(rng, 4, 8)), _init("fc.b", _weights(rng, 4, scale=0.1))]
    nodes = [
        _conv("conv1", "x", "conv1.w", "conv1.b", "conv1.out", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1.out"], ["relu1.out"], name="relu1"),
        # 3x3 (divisor 9): an average of grid values is never an exact rounding tie (see avgpool_ties)
        helper.make_node("AveragePool", ["relu1.out"], ["avg.out"], name="avg", kernel_shape=[3, 3],
                         strides=[1, 1]),
        _conv("conv2", "avg.out", "conv2.w", "conv2.b", "conv2.out", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["conv2.out"], ["gap.out"], name="gap"),
        helper.make_node("Flatten", ["gap.out"], ["flat.out"], name="flat", axis=1),
        helper.make_node("Gemm", ["flat.out", "fc.w", "fc.b"], ["y"], name="fc", transB=1),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 8, 8)], [_output("y", "N", 4)], inits)
    return model, image_feeds("x", 3, 8)


def avgpool_ties():
    """Relu -> AveragePool 2x2, both tied to the input quantizer: averages of 4 grid values are exact
    rounding ties whenever their code sum is 2 mod 4 (not in `BUILDERS`: it is about ties, not fidelity)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["relu.out"], name="relu"),
        helper.make_node("AveragePool", ["relu.out"], ["y"], name="avg", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    model = make_model(nodes, [_input("x", "N", 4, 8, 8)], [_output("y", "N", 4, 4, 4)], [])
    return model, image_feeds("x", 4, 8)


def layernorm():
    rng = np.random.default_rng(9)
    inits = [_init("mm.w", _weights(rng, 16, 16)),
             _init("ln.scale", (1.0 + 0.3 * rng.standard_normal(16)).astype(np.float32)),
             _init("ln.bias", (0.2 * rng.standard_normal(16)).astype(np.float32))]
    nodes = [
        helper.make_node("MatMul", ["x", "mm.w"], ["mm.out"], name="mm"),
        helper.make_node("LayerNormalization", ["mm.out", "ln.scale", "ln.bias"], ["y"], name="ln", axis=-1,
                         epsilon=1e-5),
    ]
    model = make_model(nodes, [_input("x", "N", 6, 16)], [_output("y", "N", 6, 16)], inits, opset=21)
    return model, _seq_feeds("x", 6, 16)


def softmax():
    rng = np.random.default_rng(10)
    inits = [_init("mm.w", _weights(rng, 10, 10, scale=0.8))]
    nodes = [
        helper.make_node("MatMul", ["x", "mm.w"], ["mm.out"], name="mm"),
        helper.make_node("Softmax", ["mm.out"], ["y"], name="softmax", axis=-1),
    ]
    model = make_model(nodes, [_input("x", "N", 4, 10)], [_output("y", "N", 4, 10)], inits)
    return model, _seq_feeds("x", 4, 10)


def resize():
    rng = np.random.default_rng(11)
    inits = [_init("conv1.w", _weights(rng, 4, 3, 3, 3)), _init("conv1.b", _weights(rng, 4, scale=0.1)),
             _init("conv2.w", _weights(rng, 3, 4, 3, 3)), _init("conv2.b", _weights(rng, 3, scale=0.1)),
             _init("resize.scales", np.array([1.0, 1.0, 2.0, 2.0], np.float32))]
    nodes = [
        _conv("conv1", "x", "conv1.w", "conv1.b", "conv1.out", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1.out"], ["relu1.out"], name="relu1"),
        helper.make_node("Resize", ["relu1.out", "", "resize.scales"], ["up.out"], name="up", mode="nearest"),
        _conv("conv2", "up.out", "conv2.w", "conv2.b", "y", pads=[1, 1, 1, 1]),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 4, 4)], [_output("y", "N", 3, 8, 8)], inits)
    return model, image_feeds("x", 3, 4)


def mixed():
    """Conv+Relu, MaxPool, Conv+Clip, depthwise Conv+Clip, Add+Relu, Concat, GAP, Reshape, Gemm, MatMul+Add,
    Softmax. Outputs in the order (``probs``, ``embedding``); ``embedding`` also feeds the MatMul."""
    rng = np.random.default_rng(12)
    inits = [
        _init("conv1.w", _weights(rng, 8, 3, 3, 3)), _init("conv1.b", _weights(rng, 8, scale=0.1)),
        _init("conv2.w", _weights(rng, 8, 8, 3, 3, scale=0.3)), _init("conv2.b", _weights(rng, 8, scale=0.1)),
        _init("dw.w", _weights(rng, 8, 1, 3, 3, scale=0.5)), _init("dw.b", _weights(rng, 8, scale=0.1)),
        _init("fc.w", _weights(rng, 10, 16)), _init("fc.b", _weights(rng, 10, scale=0.1)),
        _init("head.w", _weights(rng, 10, 6, scale=0.8)), _init("head.b", _weights(rng, 6, scale=0.1)),
        _init("flat.shape", np.array([0, -1], np.int64)),
        *_clip_bounds(),
    ]
    nodes = [
        _conv("conv1", "x", "conv1.w", "conv1.b", "conv1.out", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1.out"], ["relu1.out"], name="relu1"),
        helper.make_node("MaxPool", ["relu1.out"], ["pool.out"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        _conv("conv2", "pool.out", "conv2.w", "conv2.b", "conv2.out", pads=[1, 1, 1, 1]),
        _clip("clip2", "conv2.out", "clip2.out"),
        _conv("dw", "clip2.out", "dw.w", "dw.b", "dw.out", pads=[1, 1, 1, 1], group=8),
        _clip("clip3", "dw.out", "clip3.out"),
        helper.make_node("Add", ["clip3.out", "clip2.out"], ["add.out"], name="add"),
        helper.make_node("Relu", ["add.out"], ["relu2.out"], name="relu2"),
        helper.make_node("Concat", ["relu2.out", "pool.out"], ["cat.out"], name="cat", axis=1),
        helper.make_node("GlobalAveragePool", ["cat.out"], ["gap.out"], name="gap"),
        helper.make_node("Reshape", ["gap.out", "flat.shape"], ["flat.out"], name="flat"),
        helper.make_node("Gemm", ["flat.out", "fc.w", "fc.b"], ["embedding"], name="fc", transB=1),
        helper.make_node("MatMul", ["embedding", "head.w"], ["head.out"], name="head"),
        helper.make_node("Add", ["head.out", "head.b"], ["logits"], name="head_bias"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    model = make_model(nodes, [_input("x", "N", 3, 8, 8)], [_output("probs", "N", 6), _output("embedding", "N", 10)],
                       inits)
    return model, image_feeds("x", 3, 8)


BUILDERS: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    "conv_relu": conv_relu,
    "conv_bn_relu": conv_bn_relu,
    "conv_relu6": conv_relu6,
    "residual": residual,
    "sum_residual": sum_residual,
    "concat": concat,
    "concat_bn": concat_bn,
    "gemm": gemm,
    "matmul": matmul,
    "pool": pool,
    "layernorm": layernorm,
    "softmax": softmax,
    "resize": resize,
    "mixed": mixed,
}
