"""Sequential MSE: per-channel ranges that minimise each layer's output error, checked by brute force."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_adaround import _cnn, _data, _float_sim, _output_mse, _sim

import quantsim
from adaround import SeqMseParams, SequentialMse, apply_adaround, apply_seq_mse
from quantsim import QuantizationSimModel, encoding_from_range, fake_quantize


def _gemm_model():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    w[:, 0] *= 8  # outliers: the full range wastes the grid on most channels
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), w


def test_choice_equals_a_brute_force_search_over_the_outputs():
    model, w = _gemm_model()
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((16, 6)).astype(np.float32)} for _ in range(3)]
    sim = QuantizationSimModel(model, param_type="int4", progress=False)
    sim.compute_encodings(feeds)
    x = np.concatenate([next(iter(sim.capture(["x"], [f]))) ["x"] for f in feeds])
    reports = apply_seq_mse(sim, feeds, num_candidates=10)
    q = sim.qc_quantize_op_dict["w"]
    assert reports[0].status == "optimized" and q.is_encoding_frozen()
    assert reports[0].loss_after <= reports[0].loss_before
    lo, hi = np.minimum(w.min(axis=0), 0), np.maximum(w.max(axis=0), 0)
    for channel in range(w.shape[1]):
        errors = []
        for i in range(10):
            f = (i + 1) / 10
            enc = encoding_from_range(lo[channel] * f, hi[channel] * f, 4, symmetric=True)
            errors.append(np.sum((x @ (fake_quantize(w[:, channel], enc) - w[:, channel])) ** 2))
        best = (np.argmin(errors) + 1) / 10
        assert q.encoding.max[channel] == pytest.approx(hi[channel] * best, rel=1e-5) or q.encoding.min[channel] == \
            pytest.approx(lo[channel] * best, rel=1e-5)
    np.testing.assert_array_equal(sim.get_weight("w"), w)  # weights untouched, only the ranges change


def test_seq_mse_then_adaround_improves_the_output():
    reference, held_out = _float_sim(_cnn()), _data(4, seed=9)
    sim = _sim()
    nearest = _output_mse(sim, reference, held_out)
    reports = apply_seq_mse(sim, _data())
    assert all(r.loss_after <= r.loss_before for r in reports)
    after_seq = _output_mse(sim, reference, held_out)
    assert after_seq < nearest
    rounded = apply_adaround(sim, _data(), num_iterations=300)
    assert all(r.status == "rounded" for r in rounded)  # frozen Seq MSE ranges are kept, the weights rounded
    for layer in sim.weighted_layers():
        w = sim.get_weight(layer.weight)
        np.testing.assert_array_equal(fake_quantize(w, layer.weight_quantizer.encoding), w)


@pytest.mark.parametrize("symmetry", ["asym", "symfp"])
def test_other_input_symmetries_run(symmetry):
    reports = apply_seq_mse(_sim(), _data(2), num_candidates=5, inp_symmetry=symmetry)
    assert {r.status for r in reports} == {"optimized"}


def test_bad_arguments():
    sim = _sim()
    with pytest.raises(quantsim.InvalidArgumentError, match="num_candidates"):
        apply_seq_mse(sim, _data(1), num_candidates=0)
    with pytest.raises(quantsim.InvalidArgumentError, match="inp_symmetry"):
        apply_seq_mse(sim, _data(1), inp_symmetry="both")
    with pytest.raises(quantsim.InvalidArgumentError, match="nodes_to_exclude"):
        apply_seq_mse(sim, _data(1), nodes_to_exclude=["relu1"])
    reports = {r.node: r for r in apply_seq_mse(sim, _data(1), nodes_to_exclude=["fc"])}
    assert "fc" not in reports or reports["fc"].status == "skipped"
    again = {r.node: r for r in apply_seq_mse(sim, _data(1))}
    assert again["conv1"].status == "skipped" and "frozen" in again["conv1"].reason


# --- loss functions and call forms -----------------------------------------------------------------

def _gemm_layer(k=48, m=8, seed=1):
    """A Gemm whose channels each pick a different range under "mse", "l1" and "sqnr" on `_scaled_batches`
    (checked against aimet-onnx 2.42 by `test_matches_aimet_onnx`)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, m)).astype(np.float32)
    w[rng.integers(0, k, 3), rng.integers(0, m, 3)] *= 5  # a few outliers
    b = (rng.standard_normal(m) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, m])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), w


def _scaled_batches(count=3, k=48, seed=2):
    """Batches of different loudness (the second is 10x quieter): SQNR per batch weighs it up."""
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((32, k)) * rng.uniform(0.2, 3, (1, k))).astype(np.float32)
             * (0.1 if i == 1 else 1)} for i in range(count)]


def _oracle(w, batches, loss_fn, num_candidates=20, bits=4):
    """Per channel, the scale of the range a brute-force search over the outputs picks (AIMET's losses)."""
    picks = []
    for channel in range(w.shape[1]):
        losses = []
        for i in range(num_candidates):
            f = (i + 1) / num_candidates
            lo, hi = min(w[:, channel].min(), 0) * f, max(w[:, channel].max(), 0) * f
            wq = fake_quantize(w[:, channel], encoding_from_range(lo, hi, bits, symmetric=True))
            total = 0.0
            for feed in batches:
                x = feed["x"].astype(np.float64)
                err, y = x @ (wq - w[:, channel]), x @ w[:, channel]
                if loss_fn == "mse":
                    total += np.sum(err ** 2)
                elif loss_fn == "l1":
                    total += np.sum(np.abs(err))
                else:
                    total -= 10 * np.log10(np.mean(y ** 2) / (np.mean(err ** 2) + 1e-10))
            losses.append((total, float(np.asarray(encoding_from_range(lo, hi, bits, symmetric=True).scale))))
        picks.append(min(losses)[1])
    return np.asarray(picks)


@pytest.mark.parametrize("loss_fn", ["mse", "l1", "sqnr"])
def test_each_loss_function_picks_what_a_brute_force_search_picks(loss_fn):
    model, w = _gemm_layer()
    sim = QuantizationSimModel(model, param_type="int4", progress=False)  # inputs uncalibrated: float x
    (report,) = apply_seq_mse(sim, _scaled_batches(), SeqMseParams(num_candidates=20, loss_fn=loss_fn))
    assert report.status == "optimized" and report.loss_after <= report.loss_before
    q = sim.qc_quantize_op_dict["w"]
    scale = np.asarray(q.encoding.scale)
    np.testing.assert_allclose(scale, _oracle(w, _scaled_batches(), loss_fn), rtol=1e-5)


def test_loss_functions_change_the_chosen_ranges_sensibly():
    model, _ = _gemm_layer()
    scales = {}
    for loss_fn in ("mse", "l1", "sqnr"):
        sim = QuantizationSimModel(model, param_type="int4", progress=False)
        apply_seq_mse(sim, _scaled_batches(), loss_fn=loss_fn)
        scales[loss_fn] = np.asarray(sim.qc_quantize_op_dict["w"].encoding.scale)
    assert not np.array_equal(scales["mse"], scales["l1"]) and not np.array_equal(scales["mse"], scales["sqnr"])
    # with one batch SQNR is a monotone function of the squared error: it picks what "mse" picks
    one = {}
    for loss_fn in ("mse", "sqnr"):
        sim = QuantizationSimModel(model, param_type="int4", progress=False)
        apply_seq_mse(sim, _scaled_batches(), SeqMseParams(num_batches=1, loss_fn=loss_fn))
        one[loss_fn] = np.asarray(sim.qc_quantize_op_dict["w"].encoding.scale)
    np.testing.assert_array_equal(one["mse"], one["sqnr"])


def test_every_call_form_gives_the_same_ranges():
    model, _ = _gemm_layer()
    params = SeqMseParams(num_batches=2, num_candidates=12, loss_fn="l1")
    results = []
    forms = [
        lambda sim: apply_seq_mse(sim, _scaled_batches(), params),
        lambda sim: apply_seq_mse(sim, _scaled_batches(), params=params),
        lambda sim: apply_seq_mse(sim, _scaled_batches()[:2], num_candidates=12, loss_fn="l1"),
        lambda sim: apply_seq_mse(sim=sim, inputs=[f["x"] for f in _scaled_batches()], num_candidates=params),
        lambda sim: SequentialMse(model, sim, params, _scaled_batches()).apply_seq_mse_algo(),
    ]
    for form in forms:
        sim = QuantizationSimModel(model, param_type="int4", progress=False)
        form(sim)
        results.append(np.asarray(sim.qc_quantize_op_dict["w"].encoding.scale))
    for old_order in ((params, _scaled_batches()), (_scaled_batches(), params)):  # aimet-onnx's / aimet-torch's
        sim = QuantizationSimModel(model, param_type="int4", progress=False)
        with pytest.warns(DeprecationWarning, match="model argument is not read") as caught:
            apply_seq_mse(model, sim, *old_order)
        assert len([w for w in caught if w.category is DeprecationWarning]) == 1
        results.append(np.asarray(sim.qc_quantize_op_dict["w"].encoding.scale))
    sim = QuantizationSimModel(model, param_type="int4", progress=False)
    with pytest.warns(DeprecationWarning, match="deprecated form") as caught:
        SequentialMse.apply_seq_mse(model, sim, params, _scaled_batches())
    assert len([w for w in caught if w.category is DeprecationWarning]) == 1 and caught[0].filename == __file__
    results.append(np.asarray(sim.qc_quantize_op_dict["w"].encoding.scale))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
    every = QuantizationSimModel(model, param_type="int4", progress=False)
    apply_seq_mse(every, _scaled_batches(), SeqMseParams(num_candidates=12, loss_fn="l1"))
    assert not np.array_equal(results[0], every.qc_quantize_op_dict["w"].encoding.scale)  # num_batches was used


def test_bad_parameter_objects_and_clashes_are_named():
    model, _ = _gemm_layer()
    sim = QuantizationSimModel(model, param_type="int4", progress=False)
    with pytest.raises(quantsim.InvalidArgumentError, match="loss_fn must be one of"):
        SeqMseParams(num_batches=1, loss_fn="huber")
    with pytest.raises(quantsim.InvalidArgumentError, match="num_batches must be a positive integer"):
        SeqMseParams(num_batches=0)
    with pytest.raises(quantsim.InvalidArgumentError, match="num_candidates must be a positive integer"):
        apply_seq_mse(sim, _scaled_batches(), num_candidates=2.5)
    with pytest.raises(quantsim.InvalidArgumentError, match=r"\['loss_fn'\] given both"):
        apply_seq_mse(sim, _scaled_batches(), SeqMseParams(), loss_fn="l1")
    with pytest.raises(quantsim.InvalidArgumentError, match="params given twice"):
        apply_seq_mse(sim, _scaled_batches(), SeqMseParams(), params=SeqMseParams())
    with pytest.raises(quantsim.InvalidTypeError, match="one SeqMseParams"):
        apply_seq_mse(model, sim, _scaled_batches(), 20)
    with pytest.raises(quantsim.InvalidTypeError, match="sim must be a QuantizationSimModel"):
        apply_seq_mse(model, _scaled_batches())
    assert not sim.qc_quantize_op_dict["w"].is_encoding_frozen()  # nothing changed by the failed calls


@pytest.mark.parametrize("loss_fn", ["mse", "l1", "sqnr"])
def test_matches_aimet_onnx(loss_fn):
    aimet_onnx = pytest.importorskip("aimet_onnx")
    from aimet_onnx.common.defs import QuantScheme
    from aimet_onnx.sequential_mse.seq_mse import SeqMseParams as AimetParams
    from aimet_onnx.sequential_mse.seq_mse import SequentialMse

    model, _ = _gemm_layer()
    theirs = aimet_onnx.QuantizationSimModel(model, quant_scheme=QuantScheme.post_training_tf,
                                             param_type=aimet_onnx.int4)
    SequentialMse(None, theirs, AimetParams(num_batches=None, num_candidates=20, loss_fn=loss_fn),
                  _scaled_batches()).apply_seq_mse_algo()
    expected = np.array([e.max for e in theirs.qc_quantize_op_dict["w"].get_encodings()]) / 7
    ours = QuantizationSimModel(model, param_type="int4", progress=False)
    apply_seq_mse(ours, _scaled_batches(), SeqMseParams(num_candidates=20, loss_fn=loss_fn))
    np.testing.assert_allclose(ours.qc_quantize_op_dict["w"].encoding.scale, expected, rtol=1e-4)
