"""``from_onnx_qdq`` on the QDQ export of a model computing in float16 (tests/fp16_models.py).

The export quantizes a float16 tensor in float32: ``Cast(float) -> Q -> DQ -> Cast(float16)``. Those Casts are
the quantizer's; the model keeps its own (``Cast(float16)`` after its input, ``Cast(float)`` before its output).
A float16 quantizer is ``Cast(float16) -> Cast(float)`` on a float32 tensor; the export's back Cast to float16
followed by the model's output Cast to float has that shape too, and was once read as one (the import then
removed the node producing graph output ``y``). The oracle for what the file computes is onnxruntime without
graph optimizations on the file, with its weights (``DequantizeLinear -> Cast(float16)`` of constants) folded
into float16 constants by onnxruntime itself. Unfolded, the file differs from the sim by one output step on a
few percent of outputs: onnxruntime's CPU provider has no float16 Conv / MatMul, runs them in float32 between
Casts it inserts (even with ORT_DISABLE_ALL) and removes the weight's ``Cast(float16)`` with its inserted
``Cast(float)``, so the layer reads the dequantized float32 weight unrounded; ONNX (and the sim) rounds it to
float16. With the weights folded they agree bit for bit.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fp16_models import fp16_cnn, fp16_mlp  # tests/fp16_models.py
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel
from quantsim.export.qdq_import import strip_qdq

SHAPES = {"cnn": (2, 3, 16, 16), "mlp": (4, 16)}
BUILDERS = {"cnn": fp16_cnn, "mlp": fp16_mlp}
KINDS = {"int8": {}, "int16": {"activation_type": "int16"},
         "float8": {"param_type": "float8e4m3fn", "activation_type": "float8e4m3fn"},
         "float8w_int8a": {"param_type": "float8e4m3fn", "activation_type": "int8"},
         "int16w": {"param_type": "int16", "activation_type": "int16"},
         "float16": {"param_type": "float16", "activation_type": "float16"}}


def _sim(model: onnx.ModelProto, shape, **kwargs) -> QuantizationSimModel:
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, progress=False, **kwargs)
    sim.compute_encodings([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(2)])
    return sim


def _run_file(model: onnx.ModelProto, feed, optimized: bool = False) -> np.ndarray:
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _fold_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each ``DequantizeLinear(constant) [-> Cast]`` feeding a float16 weight replaced by the
    float16 constant onnxruntime computes for it."""
    producers = {o: n for n in model.graph.node for o in n.output}
    initializers = {t.name for t in model.graph.initializer}
    casts = [n for n in model.graph.node if n.op_type == "Cast" and n.input[0] in producers
             and producers[n.input[0]].op_type == "DequantizeLinear" and producers[n.input[0]].input[0] in initializers]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(c.output[0], TensorProto.FLOAT16, None) for c in casts)
    names = [o.name for o in probe.graph.output]
    feed = {i.name: np.zeros([1 if isinstance(d, str) or d == 0 else d for d in
                              [x.dim_value or x.dim_param for x in i.type.tensor_type.shape.dim]], np.float32)
            for i in model.graph.input}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    values = dict(zip(names, ort.InferenceSession(probe.SerializeToString(), options,
                                                  providers=["CPUExecutionProvider"]).run(names, feed)))
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    drop = {c.name for c in casts} | {producers[c.input[0]].name for c in casts}
    kept = [n for n in folded.graph.node if n.name not in drop]
    del folded.graph.node[:]
    folded.graph.node.extend(kept)
    folded.graph.initializer.extend(numpy_helper.from_array(values[c.output[0]], c.output[0]) for c in casts)
    return folded


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_a_float16_models_qdq_export_reads_back_and_computes_what_the_sim_did(name, kind):
    sim = _sim(BUILDERS[name](), SHAPES[name], **KINDS[kind])
    exported = sim.to_onnx_qdq()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = QuantizationSimModel.from_onnx_qdq(exported, progress=False)
    feed = {"x": np.random.default_rng(9).standard_normal(SHAPES[name]).astype(np.float32)}
    want = sim.session.run(None, feed)[0]
    got = back.session.run(None, feed)[0]
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # every enabled quantizer of the sim comes back with its grid, under the sim's tensor name
    for tensor, quantizer in sim.qc_quantize_op_dict.items():
        if quantizer.enabled and quantizer.encoding is not None:
            read = back.qc_quantize_op_dict[tensor]
            assert read.enabled and read.bitwidth == quantizer.bitwidth, tensor
            assert np.array_equal(np.float32(read.encoding.scale), np.float32(quantizer.encoding.scale)), tensor
    if kind == "float16":  # no Q/DQ: the file is the float16 model, which the sim runs in a default session
        assert np.array_equal(_run_file(exported, feed, optimized=True), got)
    elif kind in ("int8", "int16", "float8w_int8a"):  # the file with constant weights: bit for bit
        assert np.array_equal(_run_file(_fold_weights(exported), feed), got)
    else:  # the export's own differences from the sim (not the import's), measured on the CNN: 16-bit weights
        # and activations finer than float16 arithmetic, 0.3% of outputs by up to 4 output steps (a float16 ulp or
        # three); float8 activations, 6% of outputs by up to one or two float8 steps (near-ties moved upstream)
        file = _run_file(_fold_weights(exported), feed)
        limit = (5 * float(back.qc_quantize_op_dict["y_fp16"].encoding.scale) if kind == "int16w"
                 else 0.1 * float(np.abs(got).max()))
        assert np.abs(file - got).max() <= limit and np.mean(file != got) < (0.01 if kind == "int16w" else 0.1)


@pytest.mark.parametrize("kind", ["int8", "float8", "int16w"])
def test_aimets_form_of_float16_weights_keeps_their_encodings(kind):
    """``prequantize_constants=False`` (AIMET's default): float weight -> Q -> DQ -> Cast(float16)."""
    sim = _sim(fp16_cnn(), SHAPES["cnn"], **KINDS[kind])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = QuantizationSimModel.from_onnx_qdq(sim.to_onnx_qdq(prequantize_constants=False), progress=False)
    for weight in ("c1.w", "c2.w", "head.w"):
        want, got = sim.qc_quantize_op_dict[weight], back.qc_quantize_op_dict[weight]
        assert got.enabled and got.data_type == want.data_type and got.bitwidth == want.bitwidth
        assert np.array_equal(np.float32(got.encoding.scale), np.float32(want.encoding.scale))  # the file holds float32
    feed = {"x": np.random.default_rng(9).standard_normal(SHAPES["cnn"]).astype(np.float32)}
    assert np.array_equal(back.session.run(None, feed)[0], sim.session.run(None, feed)[0])


@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_the_quantizers_casts_go_and_the_models_own_casts_stay(name):
    model = BUILDERS[name]()
    float_model, records = strip_qdq(_sim(model, SHAPES[name]).to_onnx_qdq())
    activations = {r.name for r in records if r.kind == "activation"}
    outputs = {o for n in model.graph.node for o in n.output}
    assert activations <= outputs | {"x"}, activations - outputs  # the sim's names, not the export's Cast outputs

    def casts(m):  # Casts of computed tensors (a weight's DequantizeLinear -> Cast stays as a float32 constant's Cast)
        constants = {t.name for t in m.graph.initializer}
        return sorted((n.input[0], n.output[0]) for n in m.graph.node if n.op_type == "Cast" and n.input[0] not in constants)

    assert casts(float_model) == casts(model)


def test_a_models_cast_to_float16_of_a_float16_tensor_is_no_float16_quantizer():
    """x -> Cast(float16) -> Relu -> Cast(float16) (a no-op the model has) -> Cast(float) -> y: the last two are
    the model's, not a float16 quantizer, and stay (the file read back still produces y)."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], name="in_cast", to=TensorProto.FLOAT16),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["r16"], name="noop_cast", to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["r16"], ["y"], name="out_cast", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    float_model, records = strip_qdq(model)
    assert not records and [n.op_type for n in float_model.graph.node] == ["Cast", "Relu", "Cast", "Cast"]
