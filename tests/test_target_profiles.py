"""Target profiles (issue 29, items 3-4): shipped profiles, legality rules, target-aware decisions, refused
overrides and exports, and ``quantsim inspect --target``."""
from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import make_model
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batches
from tiny_cnn import make_model as tiny_cnn

from quantsim import (
    ExportLegalityError,
    QuantizationSimModel,
    TargetError,
    TargetProfile,
    int8,
    int16,
    legality_report,
    load_target,
)
from quantsim.export.legality import qdq_report
from quantsim.target import SHIPPED_TARGETS, analyze
from quantsim.target.profile import PROFILE_DIR

ROOT = Path(__file__).resolve().parent.parent
D = 16


def _sim(model=None, **kwargs) -> QuantizationSimModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return QuantizationSimModel(tiny_cnn() if model is None else model, progress=False, **kwargs)


# --- profiles ---------------------------------------------------------------------------------------------
def test_shipped_profiles_validate_against_their_schema_and_load():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "schemas" / "target.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(SHIPPED_TARGETS) >= {"onnxruntime-cpu", "generic-npu", "gpu-qdq"}
    for name in SHIPPED_TARGETS:
        doc = json.loads((PROFILE_DIR / f"{name}.json").read_text())
        jsonschema.validate(doc, schema)
        profile = load_target(name)
        assert isinstance(profile, TargetProfile) and profile.name == name
        jsonschema.validate(profile.to_dict(), schema)  # what a profile says of itself is a valid file too
        assert load_target(profile.to_dict()) == load_target(name).__class__(**{**profile.__dict__, "source": "<mapping>"})


def test_allows_answers_from_the_kernel_tables():
    cpu, npu, gpu = (load_target(n) for n in ("onnxruntime-cpu", "generic-npu", "gpu-qdq"))
    # onnxruntime CPU: QLinear kernels at 8 bits for what the integer export lowers; the rest runs float
    assert cpu.has_kernel("Conv", int8, int8) and cpu.has_kernel("Softmax", None, "int8")
    assert cpu.has_kernel("Conv", "int4", "int4")  # narrow grids ride in 8-bit codes
    assert not cpu.has_kernel("Conv", int8, int16) and cpu.allows("Conv", int8, int16)  # float fallback
    assert not cpu.has_kernel("Einsum", None, int8) and cpu.allows("Einsum", None, int8)
    # the NPU: no float fallback, W16 only with A16, float16 kernels with float16 weights
    assert npu.allows("Conv", int8, int16) and npu.allows("Conv", int16, int16)
    assert not npu.allows("Conv", int16, int8) and not npu.allows("Conv", int8, "float16")
    assert npu.allows("Conv", "float16", "float16") and not npu.allows("Conv", None, "float32")
    # TensorRT-style: no 16-bit integers at all
    assert not gpu.allows("Add", None, int16) and gpu.allows("Add", None, "float16")


def test_bad_profiles_are_refused_naming_the_path(tmp_path):
    good = load_target("generic-npu").to_dict()
    with pytest.raises(TargetError, match="neither a shipped target"):
        load_target("no-such-target")
    with pytest.raises(TargetError, match="kernels.@nope: unknown op group"):
        load_target({**good, "kernels": {"@nope": []}})
    with pytest.raises(TargetError, match=r"activation_types\[1\]: integer types have 2..16 bits, got 'int99'"):
        load_target({**good, "activation_types": ["int8", "int99"]})
    with pytest.raises(TargetError, match="float_fallbak: unknown key"):
        load_target({**good, "float_fallbak": True})
    bad = tmp_path / "t.json"
    bad.write_text("{")
    with pytest.raises(TargetError, match="not valid JSON"):
        load_target(bad)


def test_an_aimet_config_with_supported_kernels_is_a_partial_target(tmp_path):
    config = json.loads((ROOT / "quantsim" / "sim" / "configs" / "default_config.json").read_text())
    with pytest.raises(TargetError, match="no supported_kernels"):
        load_target(config)
    config["defaults"]["supported_kernels"] = [
        {"activation": {"bitwidth": 8, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}},
        {"activation": {"bitwidth": 16, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}}]
    path = tmp_path / "htp_like.json"
    path.write_text(json.dumps(config))
    target = load_target(path)
    assert target.partial and not target.float_fallback
    assert target.allows("Conv", int8, int16) and not target.allows("Conv", int16, int16)
    assert not target.activation_type_allowed("float16")


# --- models -----------------------------------------------------------------------------------------------
def _matmul_of_two_activations():
    """a = Relu(x), b = Tanh(x), y = MatMul(a, b): a MatMul whose both inputs are activations."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Tanh", ["x"], ["b"], name="tanh"),
             helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], [])


def _offset_model(outlier: float):
    offset = np.zeros((1, D), np.float32)
    offset[0, 0] = outlier
    nodes = [helper.make_node("Add", ["x", "c"], ["shifted"], name="add")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
                      [helper.make_tensor_value_info("shifted", TensorProto.FLOAT, ["N", D])],
                      [numpy_helper.from_array(offset, "c")])


def _x_feeds(n: int = 2) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((32, D)).astype(np.float32)} for _ in range(n)]


def _detector_head():
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["feats", "wb"], ["box_raw"], name="mb"),
             helper.make_node("Mul", ["box_raw", "box_scale"], ["boxes"], name="scale"),
             helper.make_node("MatMul", ["feats", "wc"], ["logits"], name="mc"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="sig"),
             helper.make_node("Concat", ["boxes", "scores"], ["detections"], name="cat", axis=-1)]
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4)) * 0.5).astype(np.float32), "wb"),
             numpy_helper.from_array((rng.standard_normal((8, 3)) * 1.5).astype(np.float32), "wc"),
             numpy_helper.from_array(np.float32(100.0), "box_scale")]
    return make_model(nodes, [helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["N", 10, 8])],
                      [helper.make_tensor_value_info("detections", TensorProto.FLOAT, ["N", 10, 7])], inits)


def _head_feeds() -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"feats": rng.standard_normal((2, 10, 8)).astype(np.float32)} for _ in range(3)]


# --- legality rules ---------------------------------------------------------------------------------------
def test_float16_meeting_uint8_in_a_matmul_is_float_on_cpu_and_refused_on_the_npu():
    cpu = _sim(_matmul_of_two_activations(), target="onnxruntime-cpu")
    cpu.qc_quantize_op_dict["b"].set_precision("float16")  # legal: onnxruntime runs the MatMul in float
    verdict = {v.node: v for v in analyze_sim(cpu).verdicts}["mm"]
    assert verdict.runs == "float" and "int8" in verdict.detail and "float16" in verdict.detail
    npu = _sim(_matmul_of_two_activations(), target="generic-npu")
    with pytest.raises(TargetError, match=r"node 'mm' \(MatMul\): rule mixed-precisions.*'b' \(float16\)"):
        npu.qc_quantize_op_dict["b"].set_precision("float16")
    assert npu.qc_quantize_op_dict["b"].spec.dtype == int8  # nothing changed
    with npu.transaction():  # both inputs (and the output's reader) in float16 together: a float16 MatMul
        for name in ("a", "b", "x"):
            npu.qc_quantize_op_dict[name].set_precision("float16")
    assert {v.node: v.runs for v in analyze_sim(npu).verdicts}["mm"] == "float16"


def analyze_sim(sim):
    from quantsim.sim.target_rules import SimView

    return analyze(SimView(sim), sim.target)


def test_weight_overrides_are_judged_with_the_activation_they_meet():
    sim = _sim(target="generic-npu")
    sim.compute_encodings(batches())
    before = sim.qc_quantize_op_dict["W"].spec
    with pytest.raises(TargetError, match=r"quantizer 'W' -> int16.*node 'conv' \(Conv\): rule no-kernel.*A int8 / W int16"):
        sim.qc_quantize_op_dict["W"].set_precision("int16")
    assert sim.qc_quantize_op_dict["W"].spec == before
    with sim.transaction():  # W16A16 on the NPU: legal as a whole
        sim.qc_quantize_op_dict["W"].set_precision("int16")
        sim.qc_quantize_op_dict["x"].set_precision("int16")
    [warning] = legality_report(sim).warnings  # 27 products of 16 x 16 bits can pass an int32 accumulator
    assert warning.rule == "accumulator" and warning.node == "conv" and "2^35.8" in warning.message
    with pytest.raises(TargetError, match=r"changes to 'x' are illegal.*rule no-kernel"):
        sim.set_tensor_precision(["x"], "int8")  # would leave W16 meeting A8: refused, rolled back
    assert sim.qc_quantize_op_dict["x"].spec.dtype == int16
    with pytest.raises(TargetError, match="rule activation-type"):
        sim.qc_quantize_op_dict["y"].set_precision("float8e4m3fn")
    copied = copy.deepcopy(sim)  # a sim with a target pickles, guard included
    with pytest.raises(TargetError):
        copied.qc_quantize_op_dict["W2"].set_precision("int16")


def test_construction_applies_standard_fixes_and_refuses_types_the_target_lacks():
    gpu = _sim(target="gpu-qdq")
    assert gpu.target.name == "gpu-qdq"
    assert all(q.spec.symmetric for q in gpu.quantizers if q.enabled and q.role == "activation")
    assert any(d.rule == "target" and d.action == "made symmetric" for d in gpu.decisions)
    with pytest.raises(TargetError, match="activation_type=int16 is illegal on target gpu-qdq"):
        _sim(target="gpu-qdq", activation_type="int16")
    assert _sim().target is None


# --- automatic decisions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("target, action, bits", [(None, "promoted to int16", 16), ("onnxruntime-cpu", "promoted to int16", 16),
                                                  ("generic-npu", "promoted to int16", 16), ("gpu-qdq", "left float", None)])
def test_range_health_takes_the_next_legal_precision(target, action, bits):
    sim = _sim(_offset_model(5000.0), target=target)
    sim.compute_encodings(_x_feeds())
    q = sim.qc_quantize_op_dict["shifted"]
    [decision] = [d for d in sim.decisions if d.rule == "range health" and d.tensors == ("shifted",)]
    assert decision.action == action
    assert (q.enabled and q.bitwidth == bits) if bits else not q.enabled


def test_range_health_falls_back_to_float16_or_reports_that_nothing_is_legal():
    fp16_only = {**load_target("generic-npu").to_dict(), "name": "int8-fp16", "activation_types": ["int8", "float16"]}
    sim = _sim(_offset_model(5000.0), target=fp16_only)
    sim.compute_encodings(_x_feeds())
    assert sim.qc_quantize_op_dict["shifted"].spec.dtype.bits == 16 and sim.qc_quantize_op_dict["shifted"].spec.is_float
    assert any(d.action == "promoted to float16" for d in sim.decisions)
    sim = _sim(_offset_model(1e9), target="generic-npu")  # 16 bits collapse, float16 overflows, no float32
    with pytest.warns(UserWarning, match="no legal precision above it on target generic-npu"):
        sim.compute_encodings(_x_feeds())
    assert sim.qc_quantize_op_dict["shifted"].bitwidth == 8
    assert any(d.action == "kept int8" for d in sim.decisions)


def test_untied_concat_output_gets_16_bits_where_the_target_cannot_leave_it_float():
    cpu = _sim(_detector_head(), target="onnxruntime-cpu")
    cpu.compute_encodings(_head_feeds())
    assert not cpu.qc_quantize_op_dict["detections"].enabled
    npu = _sim(_detector_head(), target="generic-npu")
    npu.compute_encodings(_head_feeds())
    out = npu.qc_quantize_op_dict["detections"]
    assert out.enabled and out.bitwidth == 16 and out.encoding is not None
    assert npu.qc_quantize_op_dict["boxes"] is not npu.qc_quantize_op_dict["scores"]
    [decision] = [d for d in npu.decisions if d.rule == "untied concat"]
    assert "output on int16" in decision.action and "8-bit grid" in decision.reason
    assert analyze_sim(npu).legal
    npu.to_onnx_qdq()  # exports


# --- exports ----------------------------------------------------------------------------------------------
def test_exports_refuse_what_the_target_cannot_run_naming_node_tensor_and_rule(tmp_path):
    sim = _sim(target="generic-npu")
    sim.compute_encodings(batches())
    sim.to_onnx_qdq()
    sim.qc_quantize_op_dict["y"].enabled = False  # the output left float: the NPU needs quantized outputs
    for export in (sim.to_onnx_qdq, sim.export_integer, lambda **k: sim.export(tmp_path, "m", **k)):
        with pytest.raises(ExportLegalityError) as caught:
            export()
        message = str(caught.value)
        assert "node 'fc' (Gemm): rule float-output" in message and "'y'" in message
        assert "rule quantized-io: model output 'y' is left float32" in message
        assert {f.rule for f in caught.value.findings} == {"float-output", "quantized-io"}
    assert not (tmp_path / "m.encodings").exists()
    assert isinstance(sim.to_onnx_qdq(target="onnxruntime-cpu"), onnx.ModelProto)  # legal there: float Gemm output
    plain = _sim()
    plain.compute_encodings(batches())
    plain.qc_quantize_op_dict["x"].enabled = False
    with pytest.raises(ExportLegalityError, match="model input 'x' is left float32"):
        plain.to_onnx_qdq(target="generic-npu")
    plain.to_onnx_qdq()  # no target: no check


def test_a_qdq_model_on_disk_is_judged_from_its_q_dq_nodes(tmp_path):
    sim = _sim()
    sim.compute_encodings(batches())
    model = sim.to_onnx_qdq()
    assert qdq_report(model, "generic-npu").legal
    gpu = qdq_report(model, "gpu-qdq")  # the default sim's activations are asymmetric uint8
    assert {f.rule for f in gpu.errors} == {"activation-grid"} and "x" in {f.node for f in gpu.errors}
    path = tmp_path / "m.qdq.onnx"
    onnx.save(model, path)
    from quantsim_cli.main import main

    assert main(["inspect", str(path), "--target", "generic-npu"]) == 0
    assert main(["inspect", str(tmp_path), "--target", "gpu-qdq", "--json"]) == 0


def test_inspect_target_column(capsys, tmp_path):
    path = tmp_path / "mm.onnx"
    onnx.save(_matmul_of_two_activations(), path)
    from quantsim_cli.main import main

    assert main(["inspect", str(path), "--target", "generic-npu"]) == 0
    out = capsys.readouterr().out
    assert "on target generic-npu" in out and "mm" in out and "integer" in out


def test_grid_rules_and_float_ops():
    npu = _sim(target="generic-npu")
    w = npu.qc_quantize_op_dict["W"]
    with pytest.raises(TargetError, match="rule weight-grid: weight 'W' has an asymmetric grid"):
        w.set_qspec(w.spec.with_(symmetric=False))
    gpu = _sim(target="gpu-qdq")
    from quantsim import PerBlock

    w = gpu.qc_quantize_op_dict["W"]
    with pytest.raises(TargetError, match="rule weight-grid: weight 'W' is quantized per block"):
        w.set_qspec(w.spec.with_(granularity=PerBlock(0, 1, 3)))
    npu.qc_quantize_op_dict["r"].enabled = False  # Relu and the pool now compute in float32
    npu.qc_quantize_op_dict["g"].enabled = False
    report = legality_report(npu)
    rules = {f.node: f.rule for f in report.errors}
    assert rules["gap"] == "float-op" and rules["conv"] == "float-output"
    assert not legality_report(npu, "onnxruntime-cpu").errors  # the CPU runs them in float


def _matmul_bias_relu():
    """x -> MatMul(W) -> Add(bias) -> Relu -> MatMul(W2): AIMET's MatmulAdd, with the Add and Relu sharing one
    output quantizer (tests/models.py ``matmul``)."""
    from models import matmul
    return matmul()


def test_matmul_bias_relu_is_one_kernel_on_a_target_without_float_fallback():
    """The sim leaves the MatMul's and the bias Add's outputs unquantized (one kernel up to the Relu's output).
    Fusion was followed one op only, so a sim built with target='generic-npu' was reported illegal and
    every export refused it (ExportLegalityError on MatMul, Add and Relu)."""
    model, feeds = _matmul_bias_relu()
    sim = _sim(model, target="generic-npu")
    sim.compute_encodings([feeds(i, 2) for i in range(2)])
    assert not sim.qc_quantize_op_dict["mm1.out"].enabled and not sim.qc_quantize_op_dict["add.out"].enabled
    assert legality_report(sim).legal
    assert qdq_report(sim.to_onnx_qdq(), "generic-npu").legal


def test_an_int32_bias_of_a_matmul_add_is_not_an_activation_of_the_qdq_model():
    """The QDQ export adds a MatMul's bias as DequantizeLinear(int32 codes, s_in * s_w). The report read that as
    an 8-bit activation (int32 was missing from its table): with 16-bit activations it found 'int16 meets
    int8' at the Add and called the exported model illegal where the sim's own report was legal."""
    model, feeds = _matmul_bias_relu()
    sim = _sim(model, target="generic-npu", activation_type=int16)
    sim.compute_encodings([feeds(i, 2) for i in range(2)])
    qdq = sim.to_onnx_qdq()
    assert any(t.data_type == TensorProto.INT32 for t in qdq.graph.initializer)
    assert legality_report(sim).legal and qdq_report(qdq, "generic-npu").legal


def test_an_override_is_judged_at_the_readers_behind_a_disabled_data_movement_quantizer():
    """relu1.out -> MaxPool -> pool.out (its quantizer disabled: it inherits relu1.out's grid) -> Concat / Conv.
    The override check followed grid-preserving ops only where the output had no quantizer at all, so a float16
    relu1.out was accepted in silence on generic-npu (Concat then met int8 and float16, and the Conv had no
    float16 x int8 kernel), and auto_quantize(target='generic-npu') chose a mix no export would take."""
    from models import mixed
    model, feeds = mixed()
    sim = _sim(model, target="generic-npu")
    assert not sim.qc_quantize_op_dict["pool.out"].enabled
    with pytest.raises(TargetError, match="relu1.out"):
        sim.qc_quantize_op_dict["relu1.out"].set_precision("float16")
    assert sim.qc_quantize_op_dict["relu1.out"].precision() == int8
    sim.compute_encodings([feeds(i, 2) for i in range(2)])
    assert legality_report(sim).legal
