"""The freeze-then-FP16 workflow end to end on a small model with BatchNormalization (the example's run)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _model():
    rng = np.random.default_rng(2)

    def t(name, *shape, scale=1.0, shift=0.0):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale + shift).astype(np.float32), name)

    inits = [t("w1", 6, 3, 3, 3, scale=0.3), t("w2", 5, 6 * 4 * 4, scale=0.1), t("b2", 5),
             t("g", 6, scale=0.1, shift=1.0), t("beta", 6, scale=0.1), t("mean", 6, scale=0.1),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 6).astype(np.float32), "var")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# reloading into a default sim reports every tensor the file sets differently (4-bit, FP16): expected here
@pytest.mark.filterwarnings("ignore::quantsim.QuantsimWarning")
def test_freeze_then_fp16_workflow(tmp_path):
    spec = importlib.util.spec_from_file_location("example_mixed_precision_workflow",
                                                  EXAMPLES / "mixed_precision_workflow.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((4, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    results = module.run(_model(), feeds[:3], feeds[3:], tmp_path, iterations=200, progress=False)
    assert results["W4A8 AdaRound"]["SQNR dB"] > 0
    assert results["frozen W4 weights, BN FP16, A8"]["SQNR dB"] > results["W4A8 nearest"]["SQNR dB"]
    # 0.6.1 and 1.0.0 record the FP16 tensors and the frozen 4-bit grids: a reload is the same sim
    assert results["reloaded 0.6.1"]["max |reloaded - exported|"] == 0
    assert results["reloaded 1.0.0"]["max |reloaded - exported|"] == 0
    encodings = (tmp_path / "mixed_1_0_0.encodings").read_text()
    assert '"FLOAT"' in encodings
