"""Every weighted layer as ``W_mat @ cols + b`` agrees with onnxruntime, and the weight maps both ways."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from adaround.linear_form import UnsupportedLayer, linear_form

CASES = [
    ("Conv", (2, 3, 9, 9), (4, 3, 3, 3), {}),
    ("Conv", (1, 4, 10, 8), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ("Conv", (2, 4, 7, 7), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),  # depthwise
    ("Conv", (2, 3, 11), (5, 3, 4), {"strides": [3], "pads": [2, 1], "dilations": [2]}),  # 1-D
    ("Conv", (1, 3, 7, 6), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("ConvTranspose", (2, 4, 5, 5), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ("ConvTranspose", (1, 4, 6, 5), (4, 2, 2, 3), {"group": 2, "strides": [2, 1], "dilations": [1, 2]}),
    ("ConvTranspose", (2, 3, 8), (3, 5, 4), {"strides": [2], "pads": [1, 2]}),
    ("Gemm", (5, 6), (4, 6), {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    ("Gemm", (6, 5), (6, 4), {"transA": 1}),
    ("MatMul", (2, 3, 6), (6, 4), {}),
]


def _run(op, x, w, b, attrs):
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("op,x_shape,w_shape,attrs", CASES, ids=lambda c: str(c))
def test_linear_form_reproduces_the_layer(op, x_shape, w_shape, attrs):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    form = linear_form(op, attrs, w_shape)
    rows = w_shape[0] * (1 if op in ("Conv", "MatMul") else 1)
    if op == "ConvTranspose":
        rows = w_shape[1] * form.groups
    elif op == "Gemm":
        rows = w_shape[0] if attrs.get("transB") else w_shape[1]
    elif op == "MatMul":
        rows = w_shape[1]
    b = rng.standard_normal(rows).astype(np.float32) if op != "MatMul" else None
    cols, layout = form.columns(x)
    product = np.matmul(form.to_matrix(w), cols) + form.bias_matrix(b, rows)
    np.testing.assert_allclose(form.outputs(product, layout), _run(op, x, w, b, attrs), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(form.to_weight(form.to_matrix(w)), w)


def test_unsupported_layers_say_why():
    with pytest.raises(UnsupportedLayer, match="rank 5"):
        linear_form("Conv", {}, (2, 2, 1, 1, 1)).columns(np.zeros((1, 2, 2, 2, 2), np.float32))
    with pytest.raises(UnsupportedLayer, match="output_shape"):
        linear_form("ConvTranspose", {"output_shape": [4, 4]}, (2, 2, 3, 3)).columns(np.zeros((1, 2, 2, 2), np.float32))
