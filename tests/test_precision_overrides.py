"""Precision presets and overrides: exact name > regex > op type > default, JSON files, tied quantizers."""
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batches, new_sim

import quantsim
from mixed_precision import OverrideConflictError, apply_precision_overrides, load_overrides, preset
from quantsim import QuantizationSimModel


def test_precedence_exact_name_over_regex_over_op_type_over_default():
    sim = new_sim()
    chosen = apply_precision_overrides(sim, {"default": "W8A8", "op_type": {"Gemm": "W8A16", "Conv": "W8A16"},
                                             "regex": {"^co": "W16A16"}, "node": {"conv": "W4A8"}})
    rules = {node: (name, rule) for node, name, rule in chosen}
    assert rules["conv"] == ("W4A8", "node 'conv'") and rules["fc"] == ("W8A16", "op type Gemm")
    assert rules["relu"][0] == "W8A8"
    q = sim.qc_quantize_op_dict
    assert q["W"].bitwidth == 4 and q["W2"].bitwidth == 8 and q["y"].bitwidth == 16
    sim.compute_encodings(batches())
    assert q["W"].encoding.bits == 4


def test_fp16_layers_really_round_to_half_precision():
    sim = new_sim()
    apply_precision_overrides(sim, {"default": "W8A8", "node": {"fc": "FP16"}})
    sim.compute_encodings(batches())
    w2 = sim.get_weight("W2")
    simulated = next(t for t in sim.sim_model().graph.initializer if t.name == "W2")
    np.testing.assert_array_equal(numpy_helper.to_array(simulated), w2.astype(np.float16).astype(np.float32))
    assert sim.qc_quantize_op_dict["y"].precision() == quantsim.float16


def test_json_file_and_bad_rules_name_the_culprit(tmp_path):
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({"default": "w8a8", "node": {"fc": "W8A16"}}))
    assert load_overrides(path).node["fc"] == preset("W8A16")
    for bad, match in (({"nodes": {}}, "unknown key"), ({"node": {"fc": "W3A3"}}, "W3A3"),
                       ({"regex": {"(": "W8A8"}}, "regex|missing"), ({"default": "INT7"}, "INT7")):
        with pytest.raises(quantsim.ConfigError, match=match):
            load_overrides(bad)
    sim = new_sim()
    with pytest.raises(quantsim.ConfigError, match="'nope'"):
        apply_precision_overrides(sim, {"node": {"nope": "W8A8"}})
    with pytest.raises(quantsim.ConfigError, match="Convv"):
        apply_precision_overrides(sim, {"op_type": {"Convv": "W8A8"}})


def test_tied_quantizers_with_two_precisions_conflict_and_nothing_changes():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((2, 3, 1, 1)).astype(np.float32), n) for n in ("w1", "w2")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["a"], name="left"),
         helper.make_node("Conv", ["x", "w2"], ["b"], name="right"),
         helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 4, 4])], inits)
    sim = QuantizationSimModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                               progress=False)
    assert sim.qc_quantize_op_dict["a"] is sim.qc_quantize_op_dict["b"]  # Concat ties its inputs
    before = {n: q.precision() for n, q in sim.qc_quantize_op_dict.items()}
    with pytest.raises(OverrideConflictError, match="'left' and 'right'"):
        apply_precision_overrides(sim, {"default": "W8A8", "node": {"left": "W8A8", "right": "W8A16"}})
    assert {n: q.precision() for n, q in sim.qc_quantize_op_dict.items()} == before
    # one node rule outranks the default the other two nodes sharing the grid fall under
    apply_precision_overrides(sim, {"default": "W8A8", "node": {"right": "W8A16"}})
    assert sim.qc_quantize_op_dict["a"].bitwidth == 16 and sim.qc_quantize_op_dict["w1"].bitwidth == 8


@pytest.mark.parametrize("name, dtype", [("W8A16", quantsim.int16), ("FP16", quantsim.float16)])
def test_an_override_on_a_conv_fused_with_its_relu_sets_the_grid_that_decides_its_output(name, dtype):
    """Conv -> Relu share one output quantizer, on the Relu's output: the Conv's own is disabled. An override
    on the Conv acts on the deciding one (and leaves the disabled one alone)."""
    sim = new_sim()
    q = sim.qc_quantize_op_dict
    assert not q["c"].enabled and q["r"].enabled
    apply_precision_overrides(sim, {"node": {"conv": name}})
    assert q["r"].precision() == dtype and q["x"].precision() == dtype and q["c"].precision() == quantsim.int8
    assert q["g"].precision() == quantsim.int8  # the pool after the Relu has its own grid
    other = new_sim()
    assert quantsim.deciding_quantizer(other, "c") is other.qc_quantize_op_dict["r"]
    assert quantsim.deciding_quantizer(other, "f") is other.qc_quantize_op_dict["g"]  # up through the Flatten
    with pytest.raises(quantsim.InvalidArgumentError, match="no enabled quantizer"):
        other.set_tensor_precision("c", dtype)  # as in aimet-onnx: it only walks up
    sim.compute_encodings(batches())
    if dtype == quantsim.int16:
        assert q["r"].encoding.bits == 16


def test_a_reshape_override_acts_on_the_grid_its_output_carries():
    """A Flatten's output has no quantizer of its own: it carries the pool's grid, which the override sets
    (the Flatten's node rule outranks the pool's default)."""
    sim = new_sim()
    apply_precision_overrides(sim, {"default": "W8A8", "node": {"flatten": "W8A16"}})
    q = sim.qc_quantize_op_dict
    assert q["g"].precision() == quantsim.int16 and q["r"].precision() == quantsim.int8


@pytest.mark.parametrize("text, key", [
    ('{"node": {"fc": "W8A16", "fc": "W8A8"}}', "'fc'"),
    ('{"default": "W8A8", "default": "W8A16"}', "'default'"),
    ('{"regex": {"^c": "W8A16"}, "regex": {"^f": "W8A16"}}', "'regex'"),
])
def test_a_key_given_twice_in_an_overrides_file_is_refused(tmp_path, text, key):
    path = tmp_path / "precision.json"
    path.write_text(text)
    with pytest.raises(quantsim.ConfigError, match=f"duplicate key {key}") as error:
        load_overrides(path)
    assert str(path) in str(error.value)
    sim = new_sim()
    before = {n: q.precision() for n, q in sim.qc_quantize_op_dict.items()}
    with pytest.raises(quantsim.ConfigError, match="duplicate key"):
        apply_precision_overrides(sim, path)
    assert {n: q.precision() for n, q in sim.qc_quantize_op_dict.items()} == before


def test_regex_rules_that_match_nothing_warn_and_bad_ones_name_pattern_and_section(tmp_path):
    sim = new_sim()
    with pytest.warns(quantsim.QuantsimWarning, match=r"\['\^encoder/'\] match no node"):
        chosen = apply_precision_overrides(sim, {"regex": {"^encoder/": "W8A16", "^fc$": "W8A16"}})
    assert [c[0] for c in chosen] == ["fc"]
    with pytest.raises(quantsim.ConfigError, match=r"'regex': pattern 'conv\(\[' is not a valid regular expression"):
        load_overrides({"regex": {"^fc$": "W8A8", "conv([": "W8A8"}})
