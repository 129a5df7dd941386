"""Integer export of a small YOLOv8-like detector (issue 13: residual Adds and detection-head elementwise ops).

The built net has the op patterns of a YOLOv8 backbone / neck / head at toy size: Conv + SiLU
(``x * Sigmoid(x)``), a C2f block (Split, two bottleneck convs, residual Add, Concat), MaxPool down and
nearest Resize up with a Concat, and a head whose box branch decodes ``x2y2 - x1y1`` (Sub of two
activations) and ``(x1y1 + x2y2) / 2``, a DFL-like Softmax and a Sigmoid class branch. Everything must run on
integer kernels (no float compute op, nothing in the report); each kernel is within one output step of the
sim, end to end one-step differences may grow to two through the stack; onnxruntime agrees with the
fixed-point reference executor (exactly within one LSB on the new Sub lowering).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from test_export_integer import (
    _assert_integer_only,
    _export_checked,
    _feeds,
    _model,
    _named,
    _sim,
    _steps,
    _vi,
    _w,
)

from quantsim.export.reference import compare_with_onnxruntime


class _Head:
    """Seeded Conv + SiLU builder (names numbered in order)."""

    def __init__(self, seed: int):
        self.rng, self.nodes, self.inits, self.count = np.random.default_rng(seed), [], [], 0

    def node(self, op: str, inputs, n_out: int = 1, **attrs):
        self.count += 1
        outs = [f"{op.lower()}{self.count}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=f"{op.lower()}{self.count}", **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, name: str) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def conv_silu(self, x: str, cin: int, cout: int, k: int = 3, silu: bool = True) -> str:
        w = self.const(numpy_helper.to_array(_w(self.rng, cout, cin, k, k)), f"w{self.count}")
        b = self.const((0.1 * self.rng.standard_normal(cout)).astype(np.float32), f"b{self.count}")
        y = self.node("Conv", [x, w, b], kernel_shape=[k, k], pads=[k // 2] * 4)
        return self.node("Mul", [y, self.node("Sigmoid", [y])]) if silu else y


def _yolo_like() -> onnx.ModelProto:
    h = _Head(5)
    stem = h.conv_silu("x", 3, 8)
    c2f_in = h.conv_silu(stem, 8, 8, k=1)
    left, right = h.node("Split", [c2f_in, h.const(np.array([4, 4], np.int64), "halves")], n_out=2, axis=1)
    residual = h.node("Add", [right, h.conv_silu(h.conv_silu(right, 4, 4), 4, 4)])  # C2f bottleneck shortcut
    c2f = h.conv_silu(h.node("Concat", [left, right, residual], axis=1), 12, 8, k=1)
    down = h.conv_silu(h.node("MaxPool", [c2f], kernel_shape=[2, 2], strides=[2, 2]), 8, 8)
    up = h.node("Resize", [down, "", h.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="nearest")
    neck = h.conv_silu(h.node("Concat", [up, c2f], axis=1), 16, 8)
    box = h.conv_silu(neck, 8, 4, k=1, silu=False)
    x1y1, x2y2 = h.node("Split", [box, h.const(np.array([2, 2], np.int64), "corners")], n_out=2, axis=1)
    wh = h.node("Sub", [x2y2, x1y1])
    centre = h.node("Div", [h.node("Add", [x1y1, x2y2]), h.const(np.float32(2.0), "two")])
    cls = h.node("Sigmoid", [h.conv_silu(neck, 8, 3, k=1, silu=False)])
    h.nodes.append(helper.make_node("Concat", [centre, wh, cls], ["y"], name="detections", axis=1))
    h.nodes.append(helper.make_node("Softmax", [box], ["dfl"], name="dfl", axis=1))
    outputs = [_vi("y", "N", 7, 16, 16), _vi("dfl", "N", 4, 16, 16)]
    return _model(h.nodes, [_vi("x", "N", 3, 16, 16)], outputs, h.inits)


def test_yolo_like_head_runs_on_integer_kernels_within_one_step():
    sim = _sim(_yolo_like(), (4, 3, 16, 16))
    exported = _export_checked(sim)
    assert exported.report == [], str(exported.report)
    _assert_integer_only(exported.model)
    ops = [n.op_type for n in exported.model.graph.node]
    assert ops.count("QLinearAdd") == 3  # residual Add, box-decode Add, Sub as QLinearAdd of negated codes
    assert ops.count("QLinearSigmoid") == 8  # seven SiLUs (Sigmoid + QLinearMul), one class sigmoid
    assert ops.count("QLinearMul") >= 7
    assert {"QLinearSoftmax", "Resize", "Split", "MaxPool"} <= set(ops)
    steps = _steps(sim, exported, _feeds((16, 3, 16, 16), 21))
    # one-step differences (bias rounding, fp32 requant ties) may grow by a step through the 8-conv stack
    for output, s in steps.items():
        assert s.max() <= 2 and np.mean(s > 1) <= 0.002, (output, s.max(), np.mean(s > 1))
    assert np.mean(steps["y"] > 0) <= 0.05  # measured 3.1%
    assert np.mean(steps["dfl"] > 0) <= 0.25  # QLinearSoftmax's exp table: measured 16% one-step on 4 channels
    # fixed-point reference vs onnxruntime's fp32 requant: per kernel <= 1 LSB near ties, compounding in depth
    for name, result in compare_with_onnxruntime(exported.model, _feeds((2, 3, 16, 16), 4)).items():
        assert result["max_lsb_diff"] <= 3 and result["frac_within_1_lsb"] >= 0.99, (name, result)


def test_activation_difference_is_qlinear_add_of_negated_codes():
    """``a - b`` of two quantized activations equals the sim's float difference requantized (<= 1 step)."""
    h = _Head(9)
    a, b = h.conv_silu("x", 3, 4, silu=False), h.conv_silu("x", 3, 4, silu=False)
    h.nodes.append(helper.make_node("Sub", [a, b], ["y"], name="difference"))
    sim = _sim(_model(h.nodes, [_vi("x", "N", 3, 8, 8)], [_vi("y", "N", 4, 8, 8)], h.inits), (4, 3, 8, 8))
    exported = _export_checked(sim)
    assert exported.report == []
    negate = next(n for n in exported.model.graph.node if n.op_type == "Sub")
    assert negate.name == "difference/negate"
    feed = _feeds((8, 3, 8, 8), 2)
    assert _steps(sim, exported, feed)["y"].max() <= 1
    result = compare_with_onnxruntime(exported.model, feed)["y"]
    assert result["max_lsb_diff"] <= 1 and result["frac_within_1_lsb"] == 1.0, result


@pytest.mark.parametrize("kernel, stride, pads, output_padding, bias", [
    (2, 2, [0, 0, 0, 0], [0, 0], True),  # PP-OCR det's DB head upsampling: sub-pixel 1x1 conv + DepthToSpace
    (2, 2, [0, 0, 0, 0], [0, 0], False),
    (3, 2, [1, 1, 1, 1], [1, 1], True),
    (3, 1, [1, 0, 1, 0], [0, 0], False),
])
def test_conv_transpose_is_zero_insertion_and_qlinear_conv(kernel, stride, pads, output_padding, bias):
    """ConvTranspose -> QLinearConv (sub-pixel + DepthToSpace, or zero insertion): equal to the sim bit for bit without a bias
    (the same sums), within one step with one, and equal to the reference executor within one LSB."""
    rng = np.random.default_rng(kernel + stride)
    inits = [_named(_w(rng, 4, 3, 3, 3), "c.w"), _named(_w(rng, 4, 5, kernel, kernel), "t.w")]
    inputs, conv_inputs = ["c", "t.w"], ["x", "c.w"]
    if bias:
        inits += [_named(_w(rng, 4, scale=0.1), "c.b"), _named(_w(rng, 5, scale=0.1), "t.b")]
        inputs.append("t.b")
        conv_inputs.append("c.b")
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], name="c", pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", inputs, ["y"], name="up", kernel_shape=[kernel, kernel],
                              strides=[stride, stride], pads=pads, output_padding=output_padding)]
    size = (6 - 1) * stride + kernel - pads[0] - pads[2] + output_padding[0]
    width = (6 - 1) * stride + kernel - pads[1] - pads[3] + output_padding[1]
    sim = _sim(_model(nodes, [_vi("x", "N", 3, 6, 6)], [_vi("y", "N", 5, size, width)], inits), (4, 3, 6, 6))
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    ops = [n.op_type for n in exported.model.graph.node]
    assert ops.count("QLinearConv") == 2
    assert ("Pad" in ops) == (kernel != stride and stride > 1)  # zero insertion only when not sub-pixel
    feed = _feeds((8, 3, 6, 6), 5)
    steps = _steps(sim, exported, feed)["y"]
    assert steps.max() <= (1 if bias else 0) and np.mean(steps > 0) <= 0.02, (steps.max(), np.mean(steps > 0))
    result = compare_with_onnxruntime(exported.model, feed)["y"]
    assert result["max_lsb_diff"] <= 1 and result["frac_within_1_lsb"] == 1.0, result
