"""AdaRound's cheaper per-step gradients against the exact ones: the anchored (control-variate) steps of
quadratic layers, the buffered window steps of sampled layers, the choice between exact and sampled
steps, and the end quality of the anchored steps against the exact path on a small layer."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from adaround import apply_adaround
from adaround.activations import activation_for
from adaround.layer_data import ColumnSample, SecondMoments, output_columns, second_moments
from adaround.layer_rounding import (
    WeightGrid,
    _AnchoredSteps,
    _WindowSteps,
    optimize_rounding,
    reconstruction_loss,
)
from adaround.linear_form import linear_form
from adaround.params import AdaroundSettings
from quantsim import InvalidArgumentError, QuantizationSimModel


def _gemm_problem(k=48, m=24, n=384, seed=0):
    rng = np.random.default_rng(seed)
    form = linear_form("Gemm", {"transB": 1}, (m, k))
    w = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
    x_f = rng.standard_normal((n, k)).astype(np.float32)
    x_q = (np.round(x_f * 4) / 4).astype(np.float32)  # the sim's (quantized) input
    return form, w, x_q, x_f, rng


def _moments(form, x_q, x_f, **kwargs):
    return second_moments(form, iter([{"x": x_q}]), iter([{"x": x_f}]), "x", **kwargs)


def _grid(w, bits=4):
    scale = (np.abs(w).max(axis=1, keepdims=True) / (2 ** (bits - 1) - 1)).astype(np.float32)
    return WeightGrid(scale, np.zeros_like(scale), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def test_anchored_step_equals_the_exact_gradient_when_the_window_holds_every_column():
    form, w, x_q, x_f, rng = _gemm_problem()
    data = _moments(form, x_q, x_f, sample_bytes=1 << 30, rng=rng)
    assert data.sample is not None and data.sample.shape == (1, 48, 384)  # every column, shuffled
    settings = AdaroundSettings(quadratic_columns_per_iteration=384, anchor_interval=3)
    steps = _AnchoredSteps(form, data, form.to_matrix(w), settings, rng)
    bias = form.bias_matrix(None, form.rows)
    for i in range(5):  # anchors at steps 0 and 3; in between the correction carries the gradient exactly
        w_soft = (w + 0.05 * (i + 1) * rng.standard_normal(w.shape)).astype(np.float32)
        exact = reconstruction_loss(form, w_soft, w, data, bias, None)[1]
        np.testing.assert_allclose(steps(w_soft), exact, rtol=2e-4, atol=2e-5 * np.abs(exact).max())


def test_anchored_step_is_unbiased_over_windows():
    form, w, x_q, x_f, rng = _gemm_problem()
    data = _moments(form, x_q, x_f, sample_bytes=1 << 30, rng=rng)
    steps = _AnchoredSteps(form, data, form.to_matrix(w), AdaroundSettings(quadratic_columns_per_iteration=8,
                                                                           anchor_interval=10 ** 6), rng)
    steps(w)  # anchor at the float weight
    w_soft = (w + 0.1 * rng.standard_normal(w.shape)).astype(np.float32)
    exact = reconstruction_loss(form, w_soft, w, data, form.bias_matrix(None, form.rows), None)[1]
    steps.rng = np.random.default_rng(1)
    mean = np.mean([steps(w_soft) for _ in range(3000)], axis=0)
    single = steps(w_soft)
    assert np.linalg.norm(mean - exact) < 0.1 * np.linalg.norm(single - exact)


@pytest.mark.parametrize("act_name", [None, "Relu", "Sigmoid"])
def test_window_step_equals_the_reference_gradient_of_its_window(act_name):
    rng = np.random.default_rng(2)
    form = linear_form("Conv", {"pads": [1, 1, 1, 1]}, (4, 3, 3, 3))
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    cols, layout = form.columns(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    act = activation_for(act_name, {}, 4, True) if act_name else None
    bias = form.bias_matrix(rng.standard_normal(4).astype(np.float32), 4)
    z = output_columns(form, form.outputs(np.matmul(form.to_matrix(w), cols) + bias, layout))
    data = ColumnSample(cols, (z if act is None else act.forward(z)).astype(np.float32))
    steps = _WindowSteps(form, data, bias, act, 20, np.random.default_rng(5))
    start = int(np.random.default_rng(5).integers(0, cols.shape[2] - 20 + 1))
    window = ColumnSample(cols[:, :, start:start + 20], data.target[:, start:start + 20])
    w_soft = (w + 0.3 * rng.standard_normal(w.shape)).astype(np.float32)
    reference = reconstruction_loss(form, w_soft, w, window, bias, act)[1]
    np.testing.assert_allclose(steps(w_soft), reference, rtol=1e-5, atol=1e-6 * np.abs(reference).max())


def test_auto_picks_sampled_steps_only_where_they_are_at_least_twice_cheaper():
    auto = AdaroundSettings()  # B = 64, anchors every 10 steps: 2 B / K + 1/10 <= 1/2 from K = 320
    assert auto.sampled_quadratic(768) and auto.sampled_quadratic(320)
    assert not auto.sampled_quadratic(319) and not auto.sampled_quadratic(128)
    assert AdaroundSettings(quadratic_form="sampled").sampled_quadratic(8)
    assert not AdaroundSettings(quadratic_form="exact").sampled_quadratic(4096)
    with pytest.raises(InvalidArgumentError, match="quadratic_form"):
        AdaroundSettings(quadratic_form="fast")
    with pytest.raises(InvalidArgumentError, match="anchor_interval"):
        AdaroundSettings(anchor_interval=0)


def test_anchored_steps_end_near_the_exact_path_and_plain_minibatches_do_not():
    form, w, x_q, x_f, rng = _gemm_problem(k=96, m=48, n=512)
    exact_data = _moments(form, x_q, x_f)
    anchored_data = _moments(form, x_q, x_f, sample_bytes=1 << 30, rng=np.random.default_rng(1))
    bias, grid = form.bias_matrix(None, form.rows), _grid(w)
    settings = AdaroundSettings(num_iterations=600, quadratic_columns_per_iteration=8, columns_per_iteration=8,
                                learning_rate=1e-2)

    def final_loss(data):
        result = optimize_rounding(form, w, grid, data, bias, None, settings, np.random.default_rng(3))
        return reconstruction_loss(form, result.weight, w, exact_data, bias, None)[0]

    nearest = reconstruction_loss(form, grid.nearest(w), w, exact_data, bias, None)[0]
    exact, anchored = final_loss(exact_data), final_loss(anchored_data)
    order = np.random.default_rng(1).permutation(x_q.shape[0])  # plain mini-batches of 8 shuffled rows
    target = np.matmul(form.to_matrix(w), form.columns(x_f)[0])[0]
    plain = final_loss(ColumnSample(np.ascontiguousarray(form.columns(x_q)[0][:, :, order]), target[:, order]))
    assert exact < 0.9 * nearest
    assert anchored < 1.05 * exact
    assert plain > anchored


def _gemm_model(k=320, m=16):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", m])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = [{"x": rng.standard_normal((64, k)).astype(np.float32)} for _ in range(3)]
    return model, feeds


@pytest.mark.parametrize("quadratic_form, mode", [("auto", "moments+sampled"), ("exact", "moments")])
def test_apply_adaround_reports_the_quadratic_mode_and_beats_nearest(quadratic_form, mode):
    model, feeds = _gemm_model()
    sim = QuantizationSimModel(model, param_type="int4", progress=False)
    sim.compute_encodings(feeds)
    (report,) = apply_adaround(sim, feeds, num_iterations=200, quadratic_form=quadratic_form, learning_rate=1e-2)
    assert report.mode == mode
    assert report.loss_after < report.loss_before


def test_second_moments_sample_respects_its_budget():
    form, w, x_q, x_f, rng = _gemm_problem()
    data = _moments(form, x_q, x_f, sample_bytes=4 * 48 * 100, rng=rng)
    assert isinstance(data, SecondMoments) and data.sample is not None and data.sample.shape == (1, 48, 100)
    assert data.columns == 384  # the moments still see every column
    rows = {tuple(c) for c in form.columns(x_q)[0][0].T}
    assert all(tuple(c) in rows for c in data.sample[0].T)
