"""mixed_precision.QuantAnalyzer: AIMET's files and numbers, checked against independent computations."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantsim
from mixed_precision import CallbackFunc, QuantAnalyzer
from mixed_precision.quant_analyzer import HISTOGRAM_BINS, QUANT_ANALYZER_PAGE
from quantsim import InvalidArgumentError, InvalidTypeError, QuantScheme


def small_model() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm, one layer with a huge-range channel."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    w1[2] *= 20
    inits = [numpy_helper.from_array(w1, "w1"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((8, 6, 3, 3)).astype(np.float32) * 0.3, "w2"),
             numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b3")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv/2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CALIB = [{"x": np.random.default_rng(k).standard_normal((4, 3, 8, 8)).astype(np.float32)} for k in range(3)]
EVAL = [{"x": np.random.default_rng(10 + k).standard_normal((5, 3, 8, 8)).astype(np.float32)} for k in range(2)]


def _float_outputs(model, feeds, names=("y",)):
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names
                              if n not in {o.name for o in model.graph.output})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [dict(zip(names, session.run(list(names), f))) for f in feeds]


REFERENCE = np.concatenate([o["y"] for o in _float_outputs(small_model(), EVAL)])


def evaluate(session) -> float:
    """Higher is better: minus the MSE against the float model on held-out data."""
    got = np.concatenate([session.run(None, f)[0] for f in EVAL])
    return -float(np.mean((got - REFERENCE) ** 2))


def calibrate(session, feeds):
    for feed in feeds:
        session.run(None, feed)


@pytest.fixture
def analyzer():
    return QuantAnalyzer(small_model(), CALIB[0], CallbackFunc(calibrate, CALIB), evaluate)


def _read(path):
    return json.loads(path.read_text())


def _sim_like_the_analyzer(scheme=QuantScheme.post_training_tf_enhanced):
    from mixed_precision.quant_analyzer import AIMET_ANALYZER_SIM  # aimet-onnx's QuantAnalyzer placement
    sim = quantsim.QuantizationSimModel(small_model(), quant_scheme=scheme, progress=False, **AIMET_ANALYZER_SIM)
    sim.compute_encodings(CALIB)
    return sim


def test_analyze_writes_aimets_files_and_one_page(analyzer, tmp_path):
    analyzer.enable_per_layer_mse_loss([f["x"] for f in EVAL], 2)
    report = analyzer.analyze(results_dir=tmp_path)
    for name in ("per_layer_quant_enabled.json", "per_layer_quant_disabled.json", "min_max_ranges/weights.json",
                 "min_max_ranges/activations.json", "per_layer_mse_loss.json", QUANT_ANALYZER_PAGE):
        assert (tmp_path / name).is_file(), name
    # per channel (the default config quantizes Conv weights per output channel); the bias is not quantized
    assert sorted(p.name for p in (tmp_path / "weights_pdf" / "conv1").iterdir()) == [
        f"conv1_weight_{k}.json" for k in range(6)]
    assert (tmp_path / "activations_pdf" / "conv1_input_q0_0.json").is_file()  # the model input conv1 reads
    assert (tmp_path / "activations_pdf" / "relu1_output_q0_0.json").is_file()
    assert (tmp_path / "weights_pdf" / "conv_2" / "conv_2_weight_0.json").is_file()  # names lose non-word chars
    enabled = _read(tmp_path / "per_layer_quant_enabled.json")
    assert list(enabled) == ["conv1", "relu1", "conv/2", "pool", "fc"]  # graph order, nodes with quantizers
    assert report["per_layer_quant_enabled"] == enabled
    page = (tmp_path / QUANT_ANALYZER_PAGE).read_text()
    assert page.count("<svg") >= 5 and "conv/2" in page and "<script" not in page
    # scores: float model exact, quantization costs something
    assert report["float_score"] == pytest.approx(0.0, abs=1e-9)
    assert report["quantized_score"] < report["weight_quantized_score"] <= 0.0


def test_per_layer_scores_match_an_independent_enable_and_disable(analyzer, tmp_path):
    sim = analyzer.create_quantsim_and_encodings(QuantScheme.post_training_tf_enhanced, 8, 8, None)
    before = {q.name: q.enabled for q in sim.quantizers}
    enabled = analyzer.perform_per_layer_analysis_by_enabling_quantizers(sim, tmp_path)
    disabled = analyzer.perform_per_layer_analysis_by_disabling_quantizers(sim, tmp_path, "off")
    assert {q.name: q.enabled for q in sim.quantizers} == before  # the sim is left as it was
    assert _read(tmp_path / "per_layer_quant_enabled.json") == enabled and _read(tmp_path / "off.json") == disabled
    # by hand: conv1's quantizers are its weight (w1; the bias is not quantized by default), its input (the model
    # input x) and its output's, which the Relu after it holds (c1's is disabled: Conv + Relu supergroup)
    table = sim.qc_quantize_op_dict
    conv1 = {table["w1"].name, table["x"].name}
    assert not table["c1"].enabled
    independent = _sim_like_the_analyzer()
    active = [q for q in independent.quantizers if q.enabled]
    for q in active:
        q.enabled = q.name in conv1
    assert enabled["conv1"] == pytest.approx(evaluate(independent.session), rel=1e-6)
    for q in active:
        q.enabled = q.name not in conv1
    assert disabled["conv1"] == pytest.approx(evaluate(independent.session), rel=1e-6)
    # the Relu's output quantizer belongs to relu1 alone
    for q in active:
        q.enabled = q.name == table["r1"].name
    assert enabled["relu1"] == pytest.approx(evaluate(independent.session), rel=1e-6)


def test_sensitivity_to_weights_and_activations(analyzer):
    sim = analyzer.create_quantsim_and_encodings("tf", 4, 8, None)
    float_score, weights, activations = analyzer.check_model_sensitivity_to_quantization(sim)
    session = ort.InferenceSession(small_model().SerializeToString(), providers=["CPUExecutionProvider"])
    assert float_score == pytest.approx(evaluate(session), abs=1e-9)
    assert weights < activations  # 4-bit weights, 8-bit activations
    for q in sim.quantizers:
        q.enabled = q.enabled and q.role == "param"
    assert weights == pytest.approx(evaluate(sim.session), rel=1e-6)


def test_min_max_ranges_against_the_weights_and_activations(analyzer, tmp_path):
    sim = analyzer.create_quantsim_and_encodings(QuantScheme.min_max, 8, 8, None)
    weights, activations = analyzer.export_per_layer_encoding_min_max_range(sim, tmp_path)
    assert _read(tmp_path / "min_max_ranges" / "weights.json") == weights
    w1 = numpy_helper.to_array(small_model().graph.initializer[0])
    per_channel = isinstance(weights["conv1_weight"], dict)
    # symmetric int8 (DESIGN.md section 4): scale = max(max / 127, -min / 128), encoding [-128, 127] * scale
    rows = w1.reshape(6, -1).astype(np.float64) if per_channel else w1.reshape(1, -1).astype(np.float64)
    scale = np.maximum(rows.max(axis=1) / 127, -rows.min(axis=1) / 128)
    if per_channel:  # the default config quantizes Conv weights per channel: one range per output channel
        assert sorted(weights["conv1_weight"]) == [f"conv1_weight_{k}" for k in range(6)]
        got = np.array([weights["conv1_weight"][f"conv1_weight_{k}"] for k in range(6)])
    else:
        got = np.array([weights["conv1_weight"]])
    np.testing.assert_allclose(got, np.stack([-128 * scale, 127 * scale], axis=1), rtol=1e-6)
    # min-max activations: the Relu output's range is [0, its largest value on the calibration data]
    relu = np.concatenate([o["r1"].ravel() for o in _float_outputs(small_model(), CALIB, ("r1",))])
    low, high = activations["relu1_output_0"]
    assert low == 0.0 and high == pytest.approx(float(relu.max()), rel=1e-2)
    assert activations["conv1_input_0"][1] == pytest.approx(max(float(f["x"].max()) for f in CALIB), rel=1e-2)


def test_histograms_against_numpy(analyzer, tmp_path):
    sim = analyzer.create_quantsim_and_encodings(QuantScheme.post_training_tf_enhanced, 8, 8, None)
    analyzer.export_per_layer_stats_histogram(sim, tmp_path)
    data = _read(tmp_path / "activations_pdf" / "relu1_output_q0_0.json")
    relu = np.concatenate([o["r1"].ravel() for o in _float_outputs(small_model(), CALIB, ("r1",))])
    counts, edges = np.histogram(relu, bins=HISTOGRAM_BINS, range=(float(relu.min()), float(relu.max())))
    lefts, shares = np.array(data["histogram"]).T
    np.testing.assert_allclose(lefts, edges[:-1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(shares, counts / counts.sum(), atol=2 / relu.size)  # a value on a bin edge may move
    encoding = sim.qc_quantize_op_dict["r1"].get_encodings()[0]
    assert data["encoding"] == {"min": encoding.min, "max": encoding.max}
    w2 = numpy_helper.to_array(small_model().graph.initializer[2]).astype(np.float64)
    files = sorted((tmp_path / "weights_pdf" / "conv_2").iterdir())
    rows = w2.reshape(8, -1) if len(files) == 8 else [w2.ravel()]
    for path, row in zip(sorted(files, key=lambda p: int(p.stem.rsplit("_", 1)[1])), rows):
        counts, _ = np.histogram(row, bins=HISTOGRAM_BINS, range=(row.min(), row.max()))
        np.testing.assert_allclose(np.array(_read(path)["histogram"])[:, 1], counts / counts.sum(), atol=1e-12)


def test_per_layer_mse_is_aimets_figure(analyzer, tmp_path):
    batches = [f["x"] for f in EVAL] + [EVAL[0]["x"]]
    analyzer.enable_per_layer_mse_loss(batches, 2)
    sim = analyzer.create_quantsim_and_encodings(QuantScheme.min_max, 8, 8, None)
    mse = analyzer.export_per_layer_mse_loss(sim, tmp_path)
    assert _read(tmp_path / "per_layer_mse_loss.json") == mse
    assert set(mse) == {"conv1", "relu1", "conv/2", "pool", "flatten", "fc"}  # outputs with a quantizer site
    # the last layer by hand: sum over the first two batches of each batch's mean squared error, / samples
    sim_out = [sim.session.run(None, {"x": b})[0] for b in batches[:2]]
    expected = sum(float(np.mean((r - s) ** 2)) for r, s in zip(np.split(REFERENCE, [5]), sim_out)) / 10
    assert mse["fc"] == pytest.approx(expected, rel=1e-5)
    assert mse["conv1"] > 0  # its output quantizer is disabled (Conv + Relu), but its weights and input are not
    assert mse["relu1"] > 0


def test_bad_arguments(tmp_path):
    with pytest.raises(InvalidTypeError, match="forward_pass_callback"):
        QuantAnalyzer(small_model(), None, None, evaluate)
    with pytest.raises(InvalidTypeError, match="eval_callback"):
        QuantAnalyzer(small_model(), None, lambda s: None, 3.0)
    with pytest.raises(InvalidTypeError, match="ModelProto"):
        QuantAnalyzer("model.onnx", None, lambda s: None, evaluate)
    analyzer = QuantAnalyzer(small_model(), None, lambda s: calibrate(s, CALIB), evaluate)
    with pytest.raises(InvalidArgumentError, match="can not fetch 3 batches"):
        analyzer.enable_per_layer_mse_loss([EVAL[0]["x"]], 3)
    with pytest.raises(InvalidArgumentError, match="enable_per_layer_mse_loss"):
        analyzer.export_per_layer_mse_loss(_sim_like_the_analyzer(), tmp_path / "unused")
    sim = _sim_like_the_analyzer()  # a sim the analyzer did not calibrate: no recorded feeds for histograms
    with pytest.raises(InvalidArgumentError, match="calibration feeds"):
        analyzer.export_per_layer_stats_histogram(sim, tmp_path / "unused")
    assert not (tmp_path / "unused").exists()  # refused before writing anything
