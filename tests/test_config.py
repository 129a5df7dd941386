"""Tests for quantsim.sim.config: AIMET quantsim-config JSON -> typed rules."""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from quantsim.sim.config import (
    CONFIG_ALIASES,
    CONFIG_DIR,
    ConfigError,
    OpTypeRule,
    QuantFlags,
    QuantsimConfig,
    load_config,
)

PER_CHANNEL_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "PRelu"}


def minimal() -> dict:
    """Smallest valid config, used as the base for rejection tests."""
    return {
        "defaults": {"ops": {"is_output_quantized": "True"}, "params": {"is_quantized": "True"}},
        "params": {},
        "op_type": {},
        "supergroups": [],
        "model_input": {},
        "model_output": {},
    }


def with_(path: str, value) -> dict:
    """`minimal()` with `value` set at the dotted `path`."""
    cfg = minimal()
    node = cfg
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return cfg


def reject(cfg, *fragments: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# ------------------------------------------------------------------------------------- shipped defaults
def test_default_is_per_channel_file():
    assert CONFIG_ALIASES["default"] == "default_config_per_channel.json"
    assert CONFIG_ALIASES["per_channel"] == "default_config_per_channel.json"
    assert CONFIG_ALIASES["per_tensor"] == "default_config.json"
    for name in set(CONFIG_ALIASES.values()):
        assert (CONFIG_DIR / name).is_file()
    assert load_config() == load_config("default")
    assert dataclasses.replace(load_config("per_channel"), source="default") == load_config()


def test_default_values():
    cfg = load_config()
    assert isinstance(cfg, QuantsimConfig)
    assert cfg.source == "default"
    assert cfg.output_quantized is True
    assert cfg.activation_symmetric is False
    assert cfg.param_quantized is True and cfg.param_symmetric is True
    assert cfg.strict_symmetric is False and cfg.unsigned_symmetric is False
    assert cfg.per_channel_quantization is False
    assert cfg.hw_version is None and cfg.supported_kernels == ()
    assert dict(cfg.params) == {"bias": QuantFlags(is_quantized=False)}
    assert cfg.op_rule("Cast").is_output_quantized is False
    bn = cfg.op_rule("BatchNormalization").params
    assert bn["running_mean"] == QuantFlags(is_quantized=False)
    assert bn["running_var"] == QuantFlags(is_quantized=False)
    assert set(cfg.supergroups) == {("Conv", "Relu"), ("ConvTranspose", "Relu"), ("Conv", "Clip"),
                                    ("Add", "Relu"), ("Gemm", "Relu")}
    assert cfg.supergroup_pass_list == ("MatmulAdd",)
    assert cfg.model_input_quantized is True and cfg.model_output_quantized is False
    for op in PER_CHANNEL_OPS:
        assert cfg.op_rule(op).per_channel_quantization is True
        assert cfg.per_channel_for(op) is True
    assert cfg.per_channel_for("Add") is False
    assert cfg.to_quantizer_args_flags() == {"is_symmetric": True, "per_channel_quantization": True}


def test_default_resolved_param_flags():
    cfg = load_config()
    assert cfg.param_flags("Conv", "weight") == QuantFlags(True, True)
    assert cfg.param_flags("Conv", "bias") == QuantFlags(False, True)
    assert cfg.param_flags("BatchNormalization", "running_mean") == QuantFlags(False, True)
    assert cfg.param_flags("BatchNormalization", "weight") == QuantFlags(True, True)


def test_per_tensor_differs_only_in_per_channel():
    pc, pt = load_config("per_channel"), load_config("per_tensor")
    assert pt.source == "per_tensor"
    assert pt.to_quantizer_args_flags() == {"is_symmetric": True, "per_channel_quantization": False}
    assert all(pt.per_channel_for(op) is False for op in PER_CHANNEL_OPS)
    stripped = {op: dataclasses.replace(rule, per_channel_quantization=None) for op, rule in pc.op_types.items()}
    stripped = {op: rule for op, rule in stripped.items() if rule != OpTypeRule()}
    assert stripped == dict(pt.op_types)
    same = {f.name for f in dataclasses.fields(QuantsimConfig)} - {"op_types", "source", "supergroups"}
    assert all(getattr(pc, name) == getattr(pt, name) for name in same)
    assert set(pc.supergroups) == set(pt.supergroups)


def test_shipped_files_use_string_booleans():
    def walk(node):
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        else:
            assert not isinstance(node, bool)
    for name in set(CONFIG_ALIASES.values()):
        walk(json.loads((CONFIG_DIR / name).read_text()))


def test_loaded_config_is_frozen():
    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.output_quantized = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.op_types["Relu"] = OpTypeRule()  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.params["weight"] = QuantFlags()  # type: ignore[index]
    assert cfg.op_rule("NotListed") == OpTypeRule()
    assert dict(OpTypeRule().params) == {}


# ---------------------------------------------------------------------------------------- loading paths
def test_load_from_path_and_pathlike(tmp_path: Path):
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps(minimal()))
    assert load_config(str(f)).source == str(f)
    assert load_config(f).param_quantized is True
    assert load_config(minimal()).source == "<mapping>"


def test_unknown_alias_lists_shipped_aliases():
    message = reject("htp_v73", "htp_v73", "default", "per_channel", "per_tensor")
    assert "alias" in message


def test_missing_file(tmp_path: Path):
    missing = tmp_path / "nope.json"
    reject(str(missing), str(missing), "not found")
    reject(missing, str(missing))


def test_not_json(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    reject(bad, str(bad), "JSON")


def test_duplicate_key(tmp_path: Path):
    dup = tmp_path / "dup.json"
    dup.write_text('{"defaults": {}, "defaults": {}}')
    reject(dup, str(dup), "duplicate", "defaults")


def test_bad_argument_type():
    with pytest.raises(ConfigError):
        load_config(42)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ booleans
@pytest.mark.parametrize("true, false", [("True", "False"), (True, False)])
def test_string_and_json_booleans(true, false):
    cfg = minimal()
    cfg["defaults"]["params"] = {"is_quantized": true, "is_symmetric": false}
    cfg["defaults"]["strict_symmetric"] = true
    cfg["op_type"] = {"Conv": {"is_output_quantized": false, "per_channel_quantization": true}}
    loaded = load_config(cfg)
    assert loaded.param_quantized is True and loaded.param_symmetric is False
    assert loaded.strict_symmetric is True
    assert loaded.op_rule("Conv").is_output_quantized is False
    assert loaded.per_channel_for("Conv") is True


@pytest.mark.parametrize("bad", ["yes", "true", "TRUE", 1, 0, None, "1"])
def test_bad_boolean_names_path(bad):
    reject(with_("op_type.Conv", {"is_output_quantized": bad}),
           "op_type.Conv.is_output_quantized", "expected 'True' or 'False'", repr(bad))


def test_absent_settings_default_to_false():
    cfg = minimal()
    cfg["defaults"] = {"ops": {}, "params": {}}
    loaded = load_config(cfg)
    assert loaded.output_quantized is False and loaded.activation_symmetric is False
    assert loaded.param_quantized is False and loaded.param_symmetric is False
    assert loaded.model_input_quantized is False and loaded.model_output_quantized is False
    assert loaded.supergroup_pass_list == ()


# ------------------------------------------------------------------------------------------ rejections
@pytest.mark.parametrize("key", ["defaults", "params", "op_type", "supergroups", "model_input", "model_output"])
def test_missing_required_top_level_key(key):
    cfg = minimal()
    del cfg[key]
    reject(cfg, key, "missing")


def test_unknown_top_level_key():
    cfg = minimal()
    cfg["layers"] = {}
    reject(cfg, "layers", "unknown key")


@pytest.mark.parametrize("path, value, where", [
    ("defaults.ops.is_quantized", "True", "defaults.ops.is_quantized"),
    ("defaults.bitwidth", 8, "defaults.bitwidth"),
    ("params.weight", {"is_quantised": "True"}, "params.weight.is_quantised"),
    ("op_type.Conv", {"is_quantized": "True"}, "op_type.Conv.is_quantized"),
    ("op_type.Conv", {"params": {"weight": {"bitwidth": 8}}}, "op_type.Conv.params.weight.bitwidth"),
    ("op_type.Relu", {"encoding_constraints": {"min": 0, "mean": 1}}, "op_type.Relu.encoding_constraints.mean"),
    ("model_input", {"is_output_quantized": "True"}, "model_input.is_output_quantized"),
    ("model_output", {"is_input_quantized": "True"}, "model_output.is_input_quantized"),
])
def test_unknown_nested_key(path, value, where):
    reject(with_(path, value), where, "unknown key")


def test_unknown_key_in_supergroup():
    reject(with_("supergroups", [{"op_list": ["Conv", "Relu"], "name": "x"}]), "supergroups[0].name")


def test_defaults_ops_input_quantized_rejected():
    reject(with_("defaults.ops.is_input_quantized", "True"), "defaults.ops.is_input_quantized",
           "NotImplementedError")


def test_defaults_ops_output_false_rejected():
    reject(with_("defaults.ops.is_output_quantized", "False"), "defaults.ops.is_output_quantized")


def test_defaults_missing_ops_or_params():
    cfg = minimal()
    del cfg["defaults"]["ops"]
    reject(cfg, "defaults.ops", "missing")
    cfg = minimal()
    del cfg["defaults"]["params"]
    reject(cfg, "defaults.params", "missing")


def test_op_type_input_quantized_only_true():
    assert load_config(with_("op_type.Add", {"is_input_quantized": "True"})).op_rule("Add").is_input_quantized
    reject(with_("op_type.Add", {"is_input_quantized": "False"}), "op_type.Add.is_input_quantized", "only 'True'")


def test_model_input_output_only_true():
    reject(with_("model_input", {"is_input_quantized": "False"}), "model_input.is_input_quantized")
    reject(with_("model_output", {"is_output_quantized": "False"}), "model_output.is_output_quantized")
    loaded = load_config(with_("model_output", {"is_output_quantized": "True"}))
    assert loaded.model_output_quantized is True


@pytest.mark.parametrize("op_list", [[], ["Conv"]])
def test_supergroup_needs_two_ops(op_list):
    reject(with_("supergroups", [{"op_list": ["Conv", "Relu"]}, {"op_list": op_list}]),
           "supergroups[1].op_list", "at least 2")


def test_supergroup_shape_errors():
    reject(with_("supergroups", {"op_list": ["Conv", "Relu"]}), "supergroups", "array")
    reject(with_("supergroups", [{}]), "supergroups[0].op_list", "missing")
    reject(with_("supergroups", [{"op_list": ["Conv", 3]}]), "supergroups[0].op_list[1]")


def test_supergroup_pass_list():
    assert load_config(with_("supergroup_pass_list", ["LayerNormalization", "MatmulAdd"])).supergroup_pass_list \
        == ("LayerNormalization", "MatmulAdd")
    reject(with_("supergroup_pass_list", ["FuseEverything"]), "supergroup_pass_list[0]", "MatmulAdd")
    reject(with_("supergroup_pass_list", "MatmulAdd"), "supergroup_pass_list", "array")


KERNEL = {"activation": {"bitwidth": 16, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}}


def test_supported_kernels_valid():
    loaded = load_config(with_("defaults.supported_kernels", [KERNEL]))
    assert loaded.supported_kernels[0]["activation"] == {"bitwidth": 16, "dtype": "int"}
    op_level = load_config(with_("op_type.Softmax", {"supported_kernels": [{"activation": KERNEL["activation"]}]}))
    assert op_level.op_rule("Softmax").supported_kernels[0]["activation"]["bitwidth"] == 16


@pytest.mark.parametrize("kernel, where", [
    ({"activation": {"bitwidth": 8, "dtype": "int"}}, "defaults.supported_kernels[0].param"),
    ({"activation": {"bitwidth": 12, "dtype": "int"}, "param": KERNEL["param"]},
     "defaults.supported_kernels[0].activation.bitwidth"),
    ({"activation": {"bitwidth": True, "dtype": "int"}, "param": KERNEL["param"]},
     "defaults.supported_kernels[0].activation.bitwidth"),
    ({"activation": {"bitwidth": 8, "dtype": "uint"}, "param": KERNEL["param"]},
     "defaults.supported_kernels[0].activation.dtype"),
    ({"activation": {"bitwidth": 8}, "param": KERNEL["param"]},
     "defaults.supported_kernels[0].activation.dtype"),
    ({**KERNEL, "output": KERNEL["param"]}, "defaults.supported_kernels[0].output"),
])
def test_supported_kernels_rejected(kernel, where):
    reject(with_("defaults.supported_kernels", [kernel]), where)


def test_op_level_kernels_still_need_activation():
    reject(with_("op_type.Conv", {"supported_kernels": [{"param": KERNEL["param"]}]}),
           "op_type.Conv.supported_kernels[0].activation", "missing")


def test_encoding_constraints():
    reject(with_("op_type.Relu", {"encoding_constraints": {"max": 1.0}}),
           "op_type.Relu.encoding_constraints.min", "missing")
    reject(with_("op_type.Relu", {"encoding_constraints": {"min": "0"}}), "op_type.Relu.encoding_constraints.min")
    reject(with_("op_type.Relu", {"encoding_constraints": {"min": 1, "max": 0}}),
           "op_type.Relu.encoding_constraints")


def test_hw_version_must_be_string():
    reject(with_("defaults.hw_version", 73), "defaults.hw_version", "string")
    assert load_config(with_("defaults.hw_version", "V73")).hw_version == "V73"


def test_wrong_container_types(tmp_path: Path):
    reject(with_("op_type", []), "op_type", "object")
    reject(with_("op_type.Conv", "True"), "op_type.Conv", "object")
    reject(with_("params", {"weight": "True"}), "params.weight", "object")
    top_list = tmp_path / "list.json"
    top_list.write_text(json.dumps([minimal()]))
    reject(top_list, str(top_list), "expected an object, got list")
    reject([minimal()], "config_file")


def test_error_names_file(tmp_path: Path):
    f = tmp_path / "bad_cfg.json"
    f.write_text(json.dumps(with_("op_type.Conv", {"is_output_quantized": "yes"})))
    message = reject(f, str(f), "op_type.Conv.is_output_quantized: expected 'True' or 'False', got 'yes'")
    assert isinstance(ConfigError(message), ValueError)


# ------------------------------------------------------------------------------------------ resolution
def test_param_flags_precedence():
    cfg = minimal()
    cfg["defaults"]["params"] = {"is_quantized": "True", "is_symmetric": "True"}
    cfg["params"] = {"bias": {"is_quantized": "False"}, "weight": {"is_symmetric": "False"}}
    cfg["op_type"] = {
        "Conv": {"params": {"bias": {"is_quantized": "True"}}},
        "Gemm": {"params": {"weight": {"is_symmetric": "True", "is_quantized": "False"}}},
    }
    loaded = load_config(cfg)
    assert loaded.param_flags("Conv", "bias") == QuantFlags(True, True)      # op_type beats params
    assert loaded.param_flags("Add", "bias") == QuantFlags(False, True)      # params beats defaults
    assert loaded.param_flags("Conv", "weight") == QuantFlags(True, False)   # per-field fall-through
    assert loaded.param_flags("Gemm", "weight") == QuantFlags(False, True)
    assert loaded.param_flags("Conv", "other") == QuantFlags(True, True)     # only defaults


def test_per_channel_resolution():
    cfg = minimal()
    cfg["defaults"]["per_channel_quantization"] = "True"
    cfg["op_type"] = {"Gemm": {"per_channel_quantization": "False"}}
    loaded = load_config(cfg)
    assert loaded.per_channel_for("Conv") is True and loaded.per_channel_for("Gemm") is False
    assert loaded.to_quantizer_args_flags()["per_channel_quantization"] is True
    assert load_config(minimal()).to_quantizer_args_flags() == {"is_symmetric": False,
                                                                "per_channel_quantization": False}


def test_realistic_custom_config(tmp_path: Path):
    cfg = json.loads((CONFIG_DIR / "default_config_per_channel.json").read_text())
    cfg = copy.deepcopy(cfg)
    cfg["defaults"]["ops"]["is_symmetric"] = "False"
    cfg["defaults"]["params"]["is_symmetric"] = "False"
    cfg["defaults"]["strict_symmetric"] = "False"
    cfg["defaults"]["unsigned_symmetric"] = "True"
    cfg["defaults"]["hw_version"] = "V73"
    cfg["defaults"]["supported_kernels"] = [KERNEL, {"activation": {"bitwidth": 16, "dtype": "float"},
                                                     "param": {"bitwidth": 16, "dtype": "float"}}]
    cfg["params"]["bias"] = {"is_quantized": "True"}
    cfg["op_type"].update({
        "Relu": {"encoding_constraints": {"min": 0.0}},
        "Sigmoid": {"encoding_constraints": {"min": 0.0, "max": 1.0}},
        "Tanh": {"encoding_constraints": {"min": -1, "max": 1}},
        "LayerNormalization": {"params": {"weight": {"is_symmetric": "False"}}},
        "Gather": {"is_output_quantized": "False"},
    })
    cfg["supergroup_pass_list"] = ["LayerNormalization", "RMSNormalization", "MatmulAdd"]
    cfg["model_output"] = {"is_output_quantized": "True"}
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(cfg, indent=2))

    loaded = load_config(path)
    assert loaded.param_symmetric is False and loaded.unsigned_symmetric is True
    assert loaded.hw_version == "V73" and len(loaded.supported_kernels) == 2
    assert loaded.param_flags("Conv", "weight") == QuantFlags(True, False)
    assert loaded.param_flags("Conv", "bias") == QuantFlags(True, False)
    assert loaded.op_rule("Relu").encoding_constraints == (0.0, None)
    assert loaded.op_rule("Sigmoid").encoding_constraints == (0.0, 1.0)
    assert loaded.op_rule("Tanh").encoding_constraints == (-1.0, 1.0)
    assert loaded.op_rule("Gather").is_output_quantized is False
    assert loaded.model_output_quantized is True
    assert loaded.supergroup_pass_list == ("LayerNormalization", "RMSNormalization", "MatmulAdd")
    assert loaded.to_quantizer_args_flags() == {"is_symmetric": False, "per_channel_quantization": True}
