"""Shape and index arithmetic never gets a quantizer, even when it is float (DESIGN §4)."""
import numpy as np
import onnx
import onnxruntime as ort
from models import make_model  # tests/models.py
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel


def _anchor_model() -> onnx.ModelProto:
    """A detector-style head: the number of anchors comes from a float Range over the feature width."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["feat"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["feat"], ["act"]),
        helper.make_node("Shape", ["act"], ["shape"]),
        helper.make_node("Gather", ["shape", "three"], ["width"], axis=0),
        helper.make_node("Cast", ["width"], ["width_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["width_f", "stride"], ["limit"]),
        helper.make_node("Range", ["zero_f", "limit", "stride"], ["anchors"]),
        helper.make_node("ReduceMean", ["act", "axes"], ["pooled"], keepdims=0),
        helper.make_node("Unsqueeze", ["pooled", "axes_last"], ["pooled_col"]),
        helper.make_node("Mul", ["pooled_col", "anchors"], ["scores"]),
    ]
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array(3, dtype=np.int64), "three"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "stride"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero_f"),
        numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes_last"),
    ]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, "W"])],
                      [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4, "W"]),
                       helper.make_tensor_value_info("anchors", TensorProto.FLOAT, ["W"])], inits, opset=18)


def test_range_and_shape_tensors_are_never_quantized():
    model = _anchor_model()
    sim = QuantizationSimModel(model, progress=False)
    for name in ("shape", "width", "width_f", "limit", "anchors", "stride", "zero_f", "three"):
        assert name not in sim.qc_quantize_op_dict, name
    assert "act" in sim.qc_quantize_op_dict and sim.qc_quantize_op_dict["act"].enabled


def test_anchor_count_is_exact_after_quantization():
    model = _anchor_model()
    sim = QuantizationSimModel(model, progress=False)
    rng = np.random.default_rng(1)
    sim.compute_encodings([{"x": rng.normal(size=(1, 3, 8, w)).astype(np.float32)} for w in (13, 17, 29)])
    float_session = ort.InferenceSession(model.SerializeToString())
    for width in (13, 31):
        feed = {"x": rng.normal(size=(1, 3, 8, width)).astype(np.float32)}
        expected = float_session.run(["anchors"], feed)[0]
        got = sim.session.run(["anchors"], feed)[0]
        assert got.shape == expected.shape == (width,)
        np.testing.assert_array_equal(got, expected)


def _decomposed_layernorm() -> onnx.ModelProto:
    """LayerNorm as exporters decompose it: var = E[x^2] - E[x]^2, then 1/sqrt(var + eps)."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
        helper.make_node("Mul", ["x", "x"], ["x_sq"]),
        helper.make_node("ReduceMean", ["x_sq", "axes"], ["mean_sq"], keepdims=1),
        helper.make_node("Mul", ["mean", "mean"], ["mean_2"]),
        helper.make_node("Sub", ["mean_sq", "mean_2"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Reciprocal", ["std"], ["inv_std"]),
        helper.make_node("Sub", ["x", "mean"], ["centered"]),
        helper.make_node("Mul", ["centered", "inv_std"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], inits, opset=18)


def test_normalization_statistics_stay_float_and_keep_accuracy():
    model = _decomposed_layernorm()
    sim = QuantizationSimModel(model, progress=False)
    for name in ("mean", "x_sq", "mean_sq", "mean_2", "var", "var_eps", "std", "inv_std"):
        assert name not in sim.qc_quantize_op_dict, name
    for name in ("x", "centered", "y"):
        assert sim.qc_quantize_op_dict[name].enabled, name
    assert any("normalization statistic" in why for _, why in sim.left_in_float)
    rng = np.random.default_rng(3)
    data = [{"x": (rng.normal(size=(8, 16)) * 0.05 + 0.6).astype(np.float32)} for _ in range(4)]
    sim.compute_encodings(data)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, data[0])[0]
    got = sim.session.run(None, data[0])[0]
    # with an 8-bit variance (E[x^2] - E[x]^2 cancels) this error is several units, not a few steps
    assert np.abs(got - expected).max() < 0.1


def _masked_attention() -> onnx.ModelProto:
    """BERT-style extended attention mask: (1 - mask) * -3.4e38 added to the scores before Softmax."""
    nodes = [
        helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mask_f"], ["inverted"]),
        helper.make_node("Mul", ["inverted", "fill"], ["extended"]),
        helper.make_node("Add", ["scores", "extended"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
    ]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "fill")]
    return make_model(nodes, [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["N", 6, 8]),
                              helper.make_tensor_value_info("k_t", TensorProto.FLOAT, ["N", 8, 6]),
                              helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", 1, 6])],
                      [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 6, 6])], inits, opset=18)


def test_attention_mask_fill_arithmetic_is_not_quantized():
    model = _masked_attention()
    sim = QuantizationSimModel(model, progress=False)
    for name in ("fill", "extended", "masked"):
        assert name not in sim.qc_quantize_op_dict, name
    assert sim.qc_quantize_op_dict["scores"].enabled and sim.qc_quantize_op_dict["probs"].enabled
    rng = np.random.default_rng(5)

    def feed():
        mask = np.ones((2, 1, 6), np.int64)
        mask[:, :, 4:] = 0
        return {"q": rng.normal(size=(2, 6, 8)).astype(np.float32),
                "k_t": rng.normal(size=(2, 8, 6)).astype(np.float32), "mask": mask}

    sim.compute_encodings([feed() for _ in range(4)])
    data = feed()
    expected = ort.InferenceSession(model.SerializeToString()).run(None, data)[0]
    got = sim.session.run(None, data)[0]
    assert np.abs(got - expected).max() < 0.15  # one grid over [-3.4e38, x] flattens every row: error 0.73
    assert np.all(got[..., 4:] == 0)  # masked positions stay exactly masked


def test_gathered_embeddings_and_topk_ranked_logits_stay_data():
    """An embedding table gathered by token ids, and logits that TopK ranks, are values, not indices."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Add", ["emb", "pos"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["logits"]),
        helper.make_node("TopK", ["logits", "k"], ["top_values", "top_ids"], axis=-1),
        helper.make_node("Gather", ["table", "top_ids"], ["picked"], axis=0),
    ]
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.normal(size=(10, 4)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "pos"),
             numpy_helper.from_array(rng.normal(size=(4, 10)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([2], np.int64), "k")]
    model = make_model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                       [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [3, 2, 4]),
                        helper.make_tensor_value_info("top_values", TensorProto.FLOAT, [3, 2])], inits)
    sim = QuantizationSimModel(model, progress=False)
    assert "emb" in sim.qc_quantize_op_dict  # data (its quantizer is off only because Gather preserves the grid)
    for name in ("h", "logits"):
        assert sim.qc_quantize_op_dict[name].enabled, name
    assert "top_ids" not in sim.qc_quantize_op_dict and "k" not in sim.qc_quantize_op_dict


def test_bias_add_is_one_float_constant_added_to_the_only_use():
    """`GraphIndex.bias_add`, the one home of "MatMul + bias Add": a second use, a graph output, an Add of two
    activations or an Add whose constant is the tensor itself are not a bias."""
    from quantsim.graph.index import GraphIndex

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["b", "mm"], ["biased"]),  # constant first: still a bias
        helper.make_node("MatMul", ["biased", "w"], ["mm2"]),
        helper.make_node("Add", ["mm2", "x"], ["joined"]),  # two activations
        helper.make_node("MatMul", ["joined", "w"], ["mm3"]),
        helper.make_node("Add", ["mm3", "b"], ["out"]),
        helper.make_node("Relu", ["mm3"], ["side"]),  # a second use of mm3
    ]
    inits = [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
             numpy_helper.from_array(np.ones(4, np.float32), "b")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                       [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4]),
                        helper.make_tensor_value_info("side", TensorProto.FLOAT, [2, 4])], inits)
    index = GraphIndex(model)
    pair = index.bias_add("mm")
    assert pair is not None and pair[0].output == ["biased"] and pair[1] == "b"
    assert index.bias_add("mm2") is None
    assert index.bias_add("mm3") is None
    assert index.bias_add("out") is None


def test_only_a_per_column_constant_after_a_weighted_matmul_is_a_bias():
    """Found on torchvision's Swin (TorchScript export): attention scores ``q @ k^T`` plus a ``[1, heads, 49,
    49]`` relative-position table were taken as a MatMul with a bias, so the scores had no quantizer and the
    integer export ran MatMul + Add in float. As AIMET's MatmulAdd pass: the bias is per column (``[N]`` or
    ``[1, ..., 1, N]``), the MatMul has a constant weight."""
    from quantsim.graph.index import GraphIndex

    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "table"], ["tabled"]),  # [1, 2, 4, 4]: not a bias
        helper.make_node("MatMul", ["tabled", "w"], ["mm2"]),
        helper.make_node("Add", ["mm2", "row"], ["biased"]),  # [1, 1, 4]: a bias
        helper.make_node("Transpose", ["biased"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["biased", "t"], ["scores"]),  # activation x activation
        helper.make_node("Add", ["scores", "b"], ["out"]),
    ]
    inits = [numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(1, 2, 4, 4)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.normal(size=(1, 1, 4)).astype(np.float32), "row"),
             numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                       [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 4, 4])], inits)
    index = GraphIndex(model)
    assert index.bias_add("mm") is None
    assert index.bias_add("mm2") is not None and index.bias_add("mm2")[1] == "row"
    sim = QuantizationSimModel(model, progress=False)
    enabled = {name for name, q in sim.qc_quantize_op_dict.items() if q.enabled}
    assert {"mm", "tabled", "biased", "scores", "out"} <= enabled
    assert "mm2" not in enabled  # the weighted MatMul's output, before its bias
    sim.compute_encodings([{"x": rng.normal(size=(1, 2, 4, 4)).astype(np.float32)} for _ in range(4)])
    export = sim.export_integer(weight_codes="uint8")
    assert not [e for e in export.report if e.op_type in ("MatMul", "Add")], str(export.report)


def test_a_bias_constant_shared_by_two_layers_is_each_ones_bias():
    """torch's dynamo exporter shares equal initializers: on ConvNeXt 36 MatMul + Add pairs read 16 bias
    constants, and only one layer per constant had its quantizer moved after the Add."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b"], ["h1"]),
             helper.make_node("MatMul", ["h1", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b"], ["y"])]
    inits = [numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), n) for n in ("w1", "w2")]
    inits.append(numpy_helper.from_array(np.zeros(4, np.float32), "b"))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    sim = QuantizationSimModel(model, progress=False)
    enabled = {name for name, q in sim.qc_quantize_op_dict.items() if q.enabled}
    assert {"h1", "y"} <= enabled and not {"m1", "m2"} & enabled
