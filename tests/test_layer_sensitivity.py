"""AIMET's per-layer tools: ``analyze_per_layer_sensitivity`` and ``flip_layers_to_higher_precision`` attribute
quantizers to nodes as aimet-onnx 2.42 does. The expected tables were recorded by running aimet-onnx 2.42
on the same models (and are re-checked live when ``aimet_onnx`` can be imported)."""
import amp_models
import models
import numpy as np
import onnx
import pytest
import tiny_cnn
from tiny_cnn import snapshot

from mixed_precision import analyze_per_layer_sensitivity, flip_layers_to_higher_precision, node_quantizers
from quantsim import InvalidArgumentError, QuantizationSimModel, int8, int16


def _model(name: str) -> onnx.ModelProto:
    if name == "tiny":
        return tiny_cnn.make_model()
    if name == "mlp":
        return amp_models.mlp()
    built = getattr(models, name)()
    return built[0] if isinstance(built, tuple) else built


#: node -> the tensors whose quantizer aimet-onnx 2.42's flip changes (override (int8, int16)), enabled ones
AIMET_FLIPS = {
    "tiny": {"conv": ["x"], "relu": ["r"], "gap": ["g"], "flatten": [], "fc": ["y"]},
    "mlp": {"fc0": ["x"], "relu0": ["h0"], "fc1": [], "relu1": ["h1"], "fc2": ["y"]},
    "concat": {"conv1": ["x"], "relu1": ["cat.out", "conv2.out", "relu1.out"],
               "conv2": ["cat.out", "conv2.out", "relu1.out", "x"], "pool": [],
               "cat": ["cat.out", "conv2.out", "relu1.out"], "conv3": ["y"]},
    "residual": {"conv1": ["x"], "relu1": ["relu1.out"], "conv2": ["conv2.out"], "add": [], "relu2": ["y"]},
}


def _flipped(model: onnx.ModelProto, node: str) -> list[str]:
    sim = QuantizationSimModel(model, progress=False)
    before = {name: q.precision() for name, q in sim.qc_quantize_op_dict.items() if q.enabled}
    flip_layers_to_higher_precision(sim, {node: 0.0}, 100, (int8, int16))
    return sorted(name for name, dtype in before.items() if sim.qc_quantize_op_dict[name].precision() != dtype)


@pytest.mark.parametrize("name", sorted(AIMET_FLIPS))
def test_flip_changes_the_quantizers_aimet_onnx_changes(name):
    model = _model(name)
    assert {node: _flipped(model, node) for node in AIMET_FLIPS[name]} == AIMET_FLIPS[name]


def test_a_fused_conv_leaves_its_output_grid_to_the_relu_node():
    sim = tiny_cnn.new_sim()
    owned = node_quantizers(sim)
    assert [q.name for q in owned["conv"].all] == ["x", "W"] and [q.name for q in owned["relu"].all] == ["r"]
    assert [q.name for q in owned["fc"].all] == ["y", "W2"]  # the bias quantizer is disabled
    with pytest.raises(InvalidArgumentError, match="not in the prepared model"):
        flip_layers_to_higher_precision(sim, {"nope": 1.0})


def _feeds(model: onnx.ModelProto, count: int = 4) -> list[dict]:
    """The feeds the aimet-onnx reference run used: symbolic batch 2, other symbolic dimensions 8."""
    rng = np.random.default_rng(0)
    graph_input = model.graph.input[0]
    shape = [d.dim_value or (2 if k == 0 else 8) for k, d in enumerate(graph_input.type.tensor_type.shape.dim)]
    return [{graph_input.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


#: aimet-onnx 2.42 analyze_per_layer_sensitivity on the calibrated sims (eval: mean over the feeds of the
#: output's sum)
AIMET_SCORES = {
    "tiny": {"conv": 5.860976219177246, "relu": 5.865694999694824, "gap": 5.865225791931152, "fc": 5.883880615234375},
    "mlp": {"fc0": 16.118968963623047, "relu0": 16.073163986206055, "fc1": 16.058977127075195,
            "relu1": 16.083606719970703, "fc2": 16.409893035888672},
    "concat": {"conv2": 124.09415435791016, "conv1": 124.21685791015625, "relu1": 124.16905975341797,
               "cat": 124.16905975341797, "conv3": 124.60979461669922},
    "residual": {"conv1": 415.5732421875, "relu1": 415.7622375488281, "conv2": 415.759033203125,
                 "relu2": 415.72052001953125},
}


@pytest.mark.parametrize("name", sorted(AIMET_SCORES))
def test_per_layer_sensitivity_matches_aimet_onnx(name, tmp_path):
    model = _model(name)
    data = _feeds(model)
    sim = QuantizationSimModel(model, progress=False, int32_bias=False)  # aimet-onnx adds float biases
    sim.compute_encodings(data)
    before = snapshot(sim)

    def evaluate(session) -> float:
        return float(np.mean([np.sum(session.run(None, f)[0]) for f in data]))

    page = tmp_path / "sensitivity.html"
    scores = analyze_per_layer_sensitivity(sim, evaluate, page)
    assert snapshot(sim) == before
    assert set(scores) == set(AIMET_SCORES[name])
    for node, value in AIMET_SCORES[name].items():
        assert scores[node] == pytest.approx(value, rel=2e-6), node
    first = min(scores, key=scores.get)
    assert first in page.read_text(encoding="utf-8")
    # each score is the sim with only the node's own quantizers enabled, recomputed by hand
    owned = {node: {q.name for q in found.all} for node, found in node_quantizers(sim).items()}
    for node, value in scores.items():
        with sim.temporary_state():
            for q in sim.quantizers:
                q.enabled = q.enabled and q.name in owned[node]
            assert evaluate(sim.session) == value


def test_aimet_onnx_live_parity_when_installed():
    aimet_onnx = pytest.importorskip("aimet_onnx")
    from aimet_onnx.lite_mp import flip_layers_to_higher_precision as aimet_flip

    for name, expected in AIMET_FLIPS.items():
        for node, tensors in expected.items():
            sim = aimet_onnx.QuantizationSimModel(_model(name))
            before = {k: (q.bitwidth, str(q.data_type)) for k, q in sim.qc_quantize_op_dict.items() if q.enabled}
            aimet_flip(sim, {node: 0.0}, 100, (aimet_onnx.int8, aimet_onnx.int16))
            changed = sorted(k for k, v in before.items() if (sim.qc_quantize_op_dict[k].bitwidth,
                                                              str(sim.qc_quantize_op_dict[k].data_type)) != v)
            assert set(tensors) <= set(changed), (name, node)
