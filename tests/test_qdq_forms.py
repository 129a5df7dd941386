"""``to_onnx_qdq`` / ``encodings_to_onnx_qdq`` with AIMET's keywords: ``export_int32_bias``,
``prequantize_constants``, ``force_activation_as``. Expected graph forms are those aimet-onnx 2.42 writes for the
tiny CNN (its ``to_onnx_qdq()``: float weights behind QuantizeLinear -> DequantizeLinear, float biases, uint8
activation zero points; ``prequantize_constants=True``: integer weights behind DequantizeLinear only;
``export_int32_bias=True``: int32 bias codes behind DequantizeLinear; ``force_activation_as="signed"``: int8
activation zero points); every form computes the same values, checked on onnxruntime without graph rewrites."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import layernorm
from onnx import TensorProto, numpy_helper
from tiny_cnn import batch, batches, calibrated_sim, make_model, new_sim

import quantsim
from quantsim import InvalidArgumentError, QuantizationSimModel, encodings_to_onnx_qdq
from quantsim.sim.config import CONFIG_DIR

SIGNED = {TensorProto.INT8, TensorProto.INT16}
UNSIGNED = {TensorProto.UINT8, TensorProto.UINT16}


def _run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # every Q/DQ as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _inits(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _constant_q_inputs(model: onnx.ModelProto) -> list[str]:
    inits = _inits(model)
    return [n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in inits]


def _activation_zero_point_types(model: onnx.ModelProto) -> set[int]:
    inits = _inits(model)
    return {inits[n.input[2]].data_type for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in inits and len(n.input) > 2}


def _symmetric_activation_sim():
    config = __import__("json").loads((CONFIG_DIR / "default_config_per_channel.json").read_text())
    config["defaults"]["ops"]["is_symmetric"] = "True"
    sim = new_sim(config_file=config)
    sim.compute_encodings(batches())
    return sim


def test_default_form_is_integer_weights_int32_biases_unsigned_activations():
    model = calibrated_sim().to_onnx_qdq()
    inits = _inits(model)
    assert _constant_q_inputs(model) == []  # weights are codes behind DequantizeLinear only
    assert {inits[n.input[0]].data_type for n in model.graph.node if n.op_type == "DequantizeLinear"
            and n.input[0] in inits} == {TensorProto.INT8, TensorProto.INT32}
    assert _activation_zero_point_types(model) == {TensorProto.UINT8}


def test_prequantize_constants_false_stores_fake_quantized_floats_behind_q_dq():
    sim = calibrated_sim()
    codes_form = sim.to_onnx_qdq(export_int32_bias=False)
    float_form = sim.to_onnx_qdq(export_int32_bias=False, prequantize_constants=False)
    inits = _inits(float_form)
    weights = _constant_q_inputs(float_form)
    assert len(weights) == 2 and all(inits[w].data_type == TensorProto.FLOAT for w in weights)  # W and W2, as AIMET
    for q in (n for n in float_form.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in weights):
        values = numpy_helper.to_array(inits[q.input[0]])
        codes = numpy_helper.to_array(_inits(codes_form)[q.output[0]])  # the codes the other form stores
        scale = numpy_helper.to_array(inits[q.input[1]]).reshape(-1, *[1] * (values.ndim - 1))
        np.testing.assert_array_equal(values, (codes.astype(np.float32) * scale).astype(np.float32))
        assert values.dtype == np.float32
    for seed in range(3):
        feed = batch(seed)
        np.testing.assert_array_equal(_run(float_form, feed), _run(codes_form, feed))
    assert not any(t.data_type == TensorProto.INT32 for t in float_form.graph.initializer)


def test_prequantize_constants_false_at_opset_21_names_the_code_type_of_zero_point_free_weights():
    model, feeds = layernorm()  # opset 21: all-zero zero points are left out, QuantizeLinear takes output_dtype
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([feeds(i, 2) for i in range(3)])
    float_form = sim.to_onnx_qdq(prequantize_constants=False)
    q_nodes = [n for n in float_form.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in _inits(float_form)]
    # symmetric weights are int8 codes; LayerNorm's scale is asymmetric at 8 bits (AIMET's norm rule) and, all
    # positive, has zero point 0 on a uint8 grid
    code_type = {n.output[0]: next((a.i for a in n.attribute if a.name == "output_dtype"), None) for n in q_nodes
                 if len(n.input) < 3}
    assert code_type and all(t == (TensorProto.UINT8 if name.startswith("ln.") else TensorProto.INT8)
                             for name, t in code_type.items()), code_type
    onnx.checker.check_model(float_form, full_check=True)
    feed = feeds(9, 2)
    np.testing.assert_array_equal(_run(float_form, feed), _run(sim.to_onnx_qdq(), feed))


def test_export_int32_bias_and_its_alias():
    sim = calibrated_sim()
    with_bias = sim.to_onnx_qdq(export_int32_bias=True)
    without = sim.to_onnx_qdq(export_int32_bias=False)
    assert sum(t.data_type == TensorProto.INT32 for t in with_bias.graph.initializer) == 2  # B and B2
    assert {t.name for t in without.graph.initializer if t.data_type == TensorProto.FLOAT} >= {"B", "B2"}
    alias = sim.to_onnx_qdq(int32_bias=False)  # quantsim's earlier name
    assert alias.SerializeToString(deterministic=True) == without.SerializeToString(deterministic=True)
    with pytest.raises(InvalidArgumentError, match="int32_bias"):
        sim.to_onnx_qdq(export_int32_bias=True, int32_bias=False)


@pytest.mark.parametrize("force, expected", [("unsigned", UNSIGNED), ("signed", SIGNED), (None, SIGNED)])
def test_force_activation_as_chooses_the_storage_of_the_same_grid(force, expected):
    sim = _symmetric_activation_sim()  # symmetric activations: int8 grids of their own
    model = sim.to_onnx_qdq(force_activation_as=force)
    found = _activation_zero_point_types(model)
    assert found and found <= expected
    feed = batch(4)
    np.testing.assert_array_equal(_run(model, feed), _run(sim.to_onnx_qdq(force_activation_as="signed"), feed))
    weights = [t for t in model.graph.initializer if t.name.endswith("zero_point") and t.dims]
    assert weights and all(t.data_type == TensorProto.INT8 for t in weights)  # weights keep their own grid


def test_force_activation_as_signed_on_asymmetric_activations_shifts_zero_points_by_128():
    sim = calibrated_sim()
    unsigned, signed = sim.to_onnx_qdq(), sim.to_onnx_qdq(force_activation_as="signed")
    assert _activation_zero_point_types(signed) == {TensorProto.INT8}
    u, s = _inits(unsigned), _inits(signed)
    shifted = [name for name in u if name.endswith("zero_point") and u[name].data_type == TensorProto.UINT8]
    assert shifted
    for name in shifted:
        assert int(numpy_helper.to_array(s[name])) == int(numpy_helper.to_array(u[name])) - 128
    for seed in range(3):
        np.testing.assert_array_equal(_run(signed, batch(seed)), _run(unsigned, batch(seed)))
    with pytest.raises(InvalidArgumentError, match="force_activation_as"):
        sim.to_onnx_qdq(force_activation_as="both")


def test_export_qdq_file_takes_force_activation_as(tmp_path):
    sim = calibrated_sim()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.export(tmp_path, "m", qdq=True, force_activation_as="signed")
    assert _activation_zero_point_types(onnx.load(str(tmp_path / "m.qdq.onnx"))) == {TensorProto.INT8}


def test_encodings_to_onnx_qdq_writes_aimets_forms(tmp_path):
    sim = calibrated_sim()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.export(tmp_path, "v1", export_model=False, encoding_version="1.0.0")
        sim.export(tmp_path, "v2", export_model=False, encoding_version="2.0.0")
    from_v1 = encodings_to_onnx_qdq(make_model(), tmp_path / "v1.encodings")
    assert len(_constant_q_inputs(from_v1)) == 2  # AIMET's default prequantize_constants=False
    assert not any(t.data_type == TensorProto.INT32 for t in from_v1.graph.initializer)  # 1.0.0: float biases
    from_v2 = encodings_to_onnx_qdq(make_model(), tmp_path / "v2.encodings", prequantize_constants=True,
                                    force_activation_as="signed")
    assert sum(t.data_type == TensorProto.INT32 for t in from_v2.graph.initializer) == 2  # 2.0.0 int32 entries
    assert _constant_q_inputs(from_v2) == [] and _activation_zero_point_types(from_v2) == {TensorProto.INT8}
    feed = batch(6)
    np.testing.assert_array_equal(_run(from_v1, feed), _run(sim.to_onnx_qdq(export_int32_bias=False), feed))
    np.testing.assert_array_equal(_run(from_v2, feed), _run(sim.to_onnx_qdq(), feed))


@pytest.mark.parametrize("kwargs", [{"activation_type": "int16"}, {"param_type": "int4"},
                                    {"activation_type": quantsim.qtype.int(6)}], ids=["a16", "w4", "a6"])
def test_every_form_computes_the_same_at_other_precisions(kwargs):
    sim = new_sim(**kwargs)  # 16-bit codes, int4 weights at opset 21, an n-bit grid in an 8-bit container (Clip)
    sim.compute_encodings(batches())
    feed = batch(3)
    want = _run(sim.to_onnx_qdq(), feed)
    for form in ({"force_activation_as": "signed"}, {"force_activation_as": None},
                 {"prequantize_constants": False, "weight_codes": "uint8"},
                 {"prequantize_constants": False, "force_activation_as": "signed", "export_int32_bias": True}):
        np.testing.assert_array_equal(_run(sim.to_onnx_qdq(**form), feed), want, err_msg=str(form))


def test_export_2_0_0_with_force_activation_as_none_keeps_each_grids_own_type(tmp_path):
    import json

    def activation_dtypes(sim, prefix):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sim.export(tmp_path, prefix, export_model=False, encoding_version="2.0.0", force_activation_as=None)
        entries = json.loads((tmp_path / f"{prefix}.encodings").read_text())["encodings"]
        return {e["name"]: e["output_dtype"] for e in entries if e["name"] in sim.activation_names}

    # aimet-onnx 2.42 on the tiny CNN: x uint8 (zero point 136), r uint8 (no zero point)
    assert set(activation_dtypes(calibrated_sim(), "asym").values()) == {"uint8"}
    assert set(activation_dtypes(_symmetric_activation_sim(), "sym").values()) == {"int8"}
