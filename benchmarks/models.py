"""Small conv nets built with onnx.helper, random but fixed (seeded) weights.

Used by bench_core; no downloads.  Weights are He-initialised so activations
stay in a sane range through the depth of the net.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        nm = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), nm))
        return nm

    def node(self, op: str, inputs: list[str], prefix: str | None = None, **attrs) -> str:
        out = self.name(prefix or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out + "_node", **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1, bias: bool = True) -> str:
        fan_in = (cin // group) * k * k
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        ins = [x, self.const("W", w)]
        if bias:
            ins.append(self.const("B", (0.05 * self.rng.standard_normal(cout)).astype(np.float32)))
        return self.node("Conv", ins, "conv", kernel_shape=[k, k], strides=[stride, stride],
                         pads=[k // 2] * 4, group=group)

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        scale = r.uniform(0.5, 1.5, c).astype(np.float32)
        bias = (0.1 * r.standard_normal(c)).astype(np.float32)
        mean = (0.1 * r.standard_normal(c)).astype(np.float32)
        var = r.uniform(0.5, 1.5, c).astype(np.float32)
        return self.node("BatchNormalization", [x, self.const("bn_s", scale), self.const("bn_b", bias),
                                                self.const("bn_m", mean), self.const("bn_v", var)],
                         "bn", epsilon=1e-5)

    def relu6(self, x: str) -> str:
        return self.node("Clip", [x, self.const("clip_lo", np.array(0.0, np.float32)),
                                  self.const("clip_hi", np.array(6.0, np.float32))], "relu6")

    def head(self, x: str, c: int, classes: int) -> str:
        g = self.node("GlobalAveragePool", [x], "gap")
        f = self.node("Flatten", [g], "flatten", axis=1)
        w = (self.rng.standard_normal((classes, c)) * np.sqrt(1.0 / c)).astype(np.float32)
        b = (0.05 * self.rng.standard_normal(classes)).astype(np.float32)
        return self.node("Gemm", [f, self.const("fc_W", w), self.const("fc_B", b)], "logits", transB=1)

    def model(self, name: str, in_name: str, in_shape: list, out: str, out_shape: list) -> onnx.ModelProto:
        # rename the last tensor to a stable output name
        self.nodes[-1].output[0] = "logits"
        g = helper.make_graph(self.nodes, name,
                              [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="quantsim-bench")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def resnet_like(seed: int = 0, classes: int = 10, width: int = 16, fold_bn: bool = False) -> onnx.ModelProto:
    """3x64x64 -> Conv/BN/Relu stem, MaxPool, 3 stages of 2 residual basic blocks (Add), GAP, Gemm.

    BatchNormalization nodes are kept (``fold_bn=False``) so the simulator's own
    preparation has to deal with them; with ``fold_bn=True`` convs carry no BN.
    """
    b = _Builder(seed)

    def cbr(x, cin, cout, k, s=1, relu=True):
        y = b.conv(x, cin, cout, k, s, bias=fold_bn)
        if not fold_bn:
            y = b.bn(y, cout)
        return b.node("Relu", [y], "relu") if relu else y

    x = cbr("input", 3, width, 3)
    x = b.node("MaxPool", [x], "maxpool", kernel_shape=[2, 2], strides=[2, 2])  # 32x32
    c = width
    for stage, cout in enumerate([width, 2 * width, 4 * width]):
        for blk in range(2):
            s = 2 if (stage > 0 and blk == 0) else 1
            y = cbr(x, c, cout, 3, s)
            y = cbr(y, cout, cout, 3, 1, relu=False)
            sc = x if (s == 1 and c == cout) else cbr(x, c, cout, 1, s, relu=False)
            x = b.node("Relu", [b.node("Add", [y, sc], "add")], "relu")
            c = cout
    b.head(x, c, classes)
    return b.model("resnet_like", "input", ["N", 3, 64, 64], "logits", ["N", classes])


def mobilenet_like(seed: int = 1, classes: int = 10) -> onnx.ModelProto:
    """3x64x64 -> Conv s2 + Clip(0,6), inverted-residual blocks (1x1 expand, 3x3 depthwise, 1x1 project, Add), GAP, Gemm."""
    b = _Builder(seed)
    x = b.relu6(b.conv("input", 3, 16, 3, 2))  # 32x32
    c = 16
    for cout, s, expand in [(16, 1, 1), (24, 2, 4), (24, 1, 4), (32, 2, 4), (32, 1, 4), (64, 2, 4), (64, 1, 4)]:
        hid = c * expand
        y = x
        if expand != 1:
            y = b.relu6(b.conv(y, c, hid, 1))
        y = b.relu6(b.conv(y, hid, hid, 3, s, group=hid))  # depthwise
        y = b.conv(y, hid, cout, 1)  # linear bottleneck
        x = b.node("Add", [x, y], "add") if (s == 1 and c == cout) else y
        c = cout
    x = b.relu6(b.conv(x, c, 128, 1))
    b.head(x, 128, classes)
    return b.model("mobilenet_like", "input", ["N", 3, 64, 64], "logits", ["N", classes])


def random_feeds(model: onnx.ModelProto, n_batches: int, batch_size: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """N(0,1) float32 feeds for a single-input image model with a symbolic batch dim."""
    rng = np.random.default_rng(seed)
    inp = model.graph.input[0]
    shape = [batch_size] + [d.dim_value for d in inp.type.tensor_type.shape.dim[1:]]
    return [{inp.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(n_batches)]
