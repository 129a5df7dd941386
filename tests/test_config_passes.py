"""The quantsim-config ``supergroup_pass_list`` passes aimet-onnx 2.42 applies (LayerNormalization,
RMSNormalization, MaskedSoftmax; MatmulAdd has its own tests) and ``hw_version``, which has no effect (warned once).

The expected sets are aimet-onnx 2.42's on the same graphs (default per-channel config with the pass added):
with the pass it turns off every quantizer listed in ``AIMET_OFF``; quantsim must leave none of them on."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from models import GraphBuilder, make_model
from onnx import TensorProto, helper

from quantsim import QuantizationSimModel
from quantsim.sim.config import CONFIG_DIR

C = 8


def _layer_norm():
    b = GraphBuilder()
    rng = np.random.default_rng(0)
    b.const("w", rng.standard_normal((C, C)).astype(np.float32))
    b.const("axes", np.array([-1], np.int64))
    b.const("two", np.array(2.0, np.float32))
    b.const("eps", np.array(1e-5, np.float32))
    b.const("gamma", (1 + 0.3 * rng.standard_normal(C)).astype(np.float32))
    b.const("beta", (0.2 * rng.standard_normal(C)).astype(np.float32))
    for op, inputs, out in [("MatMul", ["x", "w"], "h"), ("ReduceMean", ["h", "axes"], "mean"), ("Sub", ["h", "mean"], "d"),
                            ("Pow", ["d", "two"], "sq"), ("ReduceMean", ["sq", "axes"], "var"), ("Add", ["var", "eps"], "ve"),
                            ("Sqrt", ["ve"], "std"), ("Div", ["d", "std"], "norm"), ("Mul", ["norm", "gamma"], "scaled"),
                            ("Add", ["scaled", "beta"], "y")]:
        b.node(op, inputs, out)
    return b


def _rms_norm():
    b = GraphBuilder()
    rng = np.random.default_rng(1)
    b.const("w", rng.standard_normal((C, C)).astype(np.float32))
    b.const("axes", np.array([-1], np.int64))
    b.const("two", np.array(2.0, np.float32))
    b.const("eps", np.array(1e-6, np.float32))
    b.const("gamma", (1 + 0.3 * rng.standard_normal(C)).astype(np.float32))
    for op, inputs, out in [("MatMul", ["x", "w"], "h"), ("Pow", ["h", "two"], "sq"), ("ReduceMean", ["sq", "axes"], "ms"),
                            ("Add", ["ms", "eps"], "mse"), ("Sqrt", ["mse"], "rms"), ("Div", ["h", "rms"], "norm"),
                            ("Mul", ["norm", "gamma"], "y")]:
        b.node(op, inputs, out)
    return b


def _sequence_model(builder: GraphBuilder):
    return make_model(builder.nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, C])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, C])], builder.inits, opset=18)


def _masked_softmax():
    b = GraphBuilder()
    b.const("axes", np.array([-1], np.int64))
    b.const("fill", np.array(-30.0, np.float32))  # AIMET: <= -20; quantsim's own mask rule starts at 87.3
    b.const("bias", np.random.default_rng(2).standard_normal((1, 2, 4, 4)).astype(np.float32))
    b.node("Add", ["x", "bias"], "s")
    b.node("ReduceMin", ["s", "axes"], "smin", keepdims=1)
    b.node("Add", ["smin", "fill"], "masked")
    b.node("Where", ["mask", "s", "masked"], "w")
    b.node("Softmax", ["w"], "y", axis=-1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
              helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 2, 4, 4])]
    return make_model(b.nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], b.inits,
                      opset=18)


AIMET_OFF = {  # aimet-onnx 2.42: quantizers its pass turns off
    "LayerNormalization": {"d", "eps", "mean", "norm", "scaled", "sq", "std", "two", "var", "ve", "beta"},
    "RMSNormalization": {"eps", "ms", "mse", "norm", "rms", "sq", "two"},
    "MaskedSoftmax": {"fill", "masked", "w"},
}
AIMET_ON = {"LayerNormalization": {"gamma", "w", "x", "y"}, "RMSNormalization": {"gamma", "w", "x", "y"},
            "MaskedSoftmax": {"bias", "s", "x", "y"}}
MODELS = {"LayerNormalization": lambda: _sequence_model(_layer_norm()),
          "RMSNormalization": lambda: _sequence_model(_rms_norm()), "MaskedSoftmax": _masked_softmax}


def _config(passes, **defaults):
    config = json.loads((CONFIG_DIR / "default_config_per_channel.json").read_text())
    config["supergroup_pass_list"] = list(passes)
    config["defaults"].update(defaults)
    return config


def _enabled(model, config) -> set[str]:
    sim = QuantizationSimModel(model, config_file=config, progress=False)
    return {name for name, q in sim.qc_quantize_op_dict.items() if q.enabled}


@pytest.mark.parametrize("name", sorted(AIMET_OFF))
def test_pass_turns_off_what_aimet_turns_off(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an applied pass is not warned about
        on = _enabled(MODELS[name](), _config(["MatmulAdd", name]))
    assert not on & AIMET_OFF[name]
    assert on >= AIMET_ON[name] - {"w"}  # the MatMul weight is named after its tensor here too
    without = _enabled(MODELS[name](), _config(["MatmulAdd"]))
    assert without & AIMET_OFF[name]  # the pass is what turned them off


def test_layer_norm_gamma_becomes_symmetric_at_16_bits():
    sim = QuantizationSimModel(_sequence_model(_layer_norm()), config_file=_config(["LayerNormalization"]),
                               activation_type="int16", progress=False)
    assert sim.qc_quantize_op_dict["gamma"].use_symmetric_encodings
    sim8 = QuantizationSimModel(_sequence_model(_layer_norm()), config_file=_config(["LayerNormalization"]),
                                progress=False)
    assert not sim8.qc_quantize_op_dict["gamma"].use_symmetric_encodings


def test_hw_version_has_no_effect_and_is_warned_once():
    config = _config(["MatmulAdd"], hw_version="V73")
    with pytest.warns(UserWarning, match="hw_version 'V73' has no effect"):
        QuantizationSimModel(_sequence_model(_rms_norm()), config_file=config, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        QuantizationSimModel(_sequence_model(_rms_norm()), config_file=config, progress=False)  # once per config
