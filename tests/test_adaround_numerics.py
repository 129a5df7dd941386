"""AdaRound's numerics against independent oracles: scipy's check_grad, hand-worked values, direct sums."""
import math

import numpy as np
import pytest
from scipy.optimize import check_grad

from adaround.activations import SUPPORTED, activation_for
from adaround.layer_data import ColumnSample, SecondMoments, output_columns
from adaround.layer_rounding import WeightGrid, reconstruction_loss
from adaround.linear_form import linear_form
from adaround.rounding import (
    Adam,
    beta_at,
    init_alpha,
    rectified_sigmoid,
    rectified_sigmoid_grad,
    regularizer,
    regularizer_grad,
)


def test_init_alpha_starts_at_the_fractional_part():
    r = np.linspace(0.01, 0.99, 50)
    np.testing.assert_allclose(rectified_sigmoid(init_alpha(r)), r, atol=1e-5)
    assert np.isfinite(init_alpha(np.array([0.0, 1.0]))).all()


def test_rectified_sigmoid_gradient_and_clipping():
    for a in (-3.0, -0.4, 0.0, 0.7, 2.5):
        assert check_grad(lambda x: float(rectified_sigmoid(x)[0]), lambda x: rectified_sigmoid_grad(x),
                          np.array([a]), epsilon=1e-3) < 1e-3  # float32 values: a coarse step
    assert rectified_sigmoid(np.array([50.0]))[0] == 1.0 and rectified_sigmoid_grad(np.array([50.0]))[0] == 0.0
    assert rectified_sigmoid(np.array([-50.0]))[0] == 0.0


@pytest.mark.parametrize("beta", [2.0, 7.5, 20.0])
def test_regularizer_values_and_gradient(beta):
    assert regularizer(np.array([0.0, 1.0]), beta) == 0.0
    assert regularizer(np.array([0.5]), beta) == 1.0
    h = np.array([0.1, 0.45, 0.8])
    assert check_grad(lambda x: regularizer(x, beta), lambda x: regularizer_grad(x, beta), h) < 1e-4 * beta


def test_beta_schedule_by_hand():
    assert beta_at(0, 100) is None and beta_at(19, 100) is None
    assert beta_at(20, 100) == pytest.approx(20.0)
    assert beta_at(60, 100) == pytest.approx(11.0)  # halfway: the mean of 20 and 2
    assert beta_at(100, 100) == pytest.approx(2.0)


def test_adam_first_step_by_hand():
    p = np.array([1.0, -2.0], dtype=np.float32)
    Adam(p, lr=0.1).step(np.array([0.5, -3.0], dtype=np.float32))
    # first step: m_hat = g, v_hat = g^2 -> step = lr * sign(g)
    np.testing.assert_allclose(p, [0.9, -1.9], atol=1e-6)


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_activation_backward_is_the_gradient(name):
    attrs = {"Clip": {"min": -0.5, "max": 1.0}, "PRelu": {"slope": np.array([0.1, 0.2, 0.3])}}.get(name, {})
    act = activation_for(name, attrs, 3, softmax_on_channels=True)
    rng = np.random.default_rng(1)
    z0 = rng.standard_normal((3, 4)) * 2
    weights = rng.standard_normal((3, 4))

    def f(flat):
        return float(np.sum(weights * act.forward(flat.reshape(3, 4))))

    def g(flat):
        z = flat.reshape(3, 4)
        return act.backward(z, act.forward(z), weights).reshape(-1)

    assert check_grad(f, g, z0.reshape(-1)) < 1e-4


def _problem(op="Conv", attrs=None, activation=None):
    rng = np.random.default_rng(3)
    shapes = {"Conv": ((2, 3, 6, 6), (4, 3, 3, 3)), "Gemm": ((6, 5), (4, 5)), "ConvTranspose": ((2, 4, 3, 3), (4, 2, 2, 2))}
    x_shape, w_shape = shapes[op]
    attrs = attrs or ({"transB": 1} if op == "Gemm" else {})
    form = linear_form(op, attrs, w_shape)
    x_q = rng.standard_normal(x_shape).astype(np.float32)
    x_f = x_q + 0.05 * rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    return form, x_q, x_f, w, rng


@pytest.mark.parametrize("op", ["Conv", "Gemm", "ConvTranspose"])
def test_second_moments_equal_the_direct_loss_and_its_gradient(op):
    form, x_q, x_f, w, rng = _problem(op)
    cq, _ = form.columns(x_q)
    cf, _ = form.columns(x_f)
    moments = SecondMoments(np.matmul(cq, cq.transpose(0, 2, 1)).astype(np.float64),
                            np.matmul(cq, cf.transpose(0, 2, 1)).astype(np.float64),
                            np.matmul(cf, cf.transpose(0, 2, 1)).astype(np.float64), cq.shape[2])
    w_soft = (w + 0.1 * rng.standard_normal(w.shape)).astype(np.float32)
    direct = np.matmul(form.to_matrix(w_soft), cq) - np.matmul(form.to_matrix(w), cf)
    bias = form.bias_matrix(None, form.rows)
    loss, grad = reconstruction_loss(form, w_soft, w, moments, bias, None)
    assert loss == pytest.approx(float(np.sum(direct.astype(np.float64) ** 2)) / cq.shape[2], rel=1e-4)

    def f(flat):
        return reconstruction_loss(form, flat.reshape(w.shape), w, moments, bias, None)[0]

    def g(flat):
        return reconstruction_loss(form, flat.reshape(w.shape), w, moments, bias, None)[1].reshape(-1)

    assert check_grad(f, g, w_soft.reshape(-1).astype(np.float64), epsilon=1e-4) < 1e-2 * max(1.0, abs(loss))


@pytest.mark.parametrize("act_name", ["Relu", "Sigmoid", "HardSwish"])
def test_sampled_loss_gradient_through_the_activation(act_name):
    form, x_q, _, w, rng = _problem("Conv")
    act = activation_for(act_name, {}, form.rows, True)
    cols, layout = form.columns(x_q)
    bias = form.bias_matrix(rng.standard_normal(form.rows).astype(np.float32), form.rows)
    target = act.forward(output_columns(form, form.outputs(np.matmul(form.to_matrix(w), cols) + bias, layout)))
    data = ColumnSample(cols, target.astype(np.float32))
    w0 = (w + 0.2 * rng.standard_normal(w.shape)).astype(np.float64)

    def f(flat):
        return reconstruction_loss(form, flat.reshape(w.shape).astype(np.float32), w, data, bias, act)[0]

    def g(flat):
        return reconstruction_loss(form, flat.reshape(w.shape).astype(np.float32), w, data, bias, act)[1].reshape(-1)

    loss = f(w0.reshape(-1))
    assert check_grad(f, g, w0.reshape(-1), epsilon=1e-3) < 2e-2 * max(1.0, loss)
    assert reconstruction_loss(form, w, w, data, bias, act)[0] == pytest.approx(0.0, abs=1e-8)


def test_weight_grid_soft_and_hard_weights():
    scale = np.array([[0.5], [0.25]], np.float32)
    grid = WeightGrid(scale, np.zeros_like(scale), -8, 7)
    w = np.array([[1.2, -0.3, 9.0], [0.1, -2.6, 0.37]], np.float32)
    base, frac = grid.floor_and_fraction(w)
    np.testing.assert_allclose(base + frac, w / scale, rtol=1e-6)
    hard, slope = grid.weight(base, (frac >= 0.5).astype(np.float32))
    np.testing.assert_array_equal(hard, grid.nearest(w))  # h = [fraction >= 0.5] is nearest rounding (no ties here)
    assert hard[0, 2] == 3.5 and slope[0, 2] == 0  # clipped at qmax = 7 steps: no gradient
    codes = hard / scale
    np.testing.assert_array_equal(codes, np.rint(codes))
    assert math.isclose(float(slope[1, 0]), 0.25)


@pytest.mark.parametrize("beta", [None, 3.0, 17.5])
def test_fused_soft_rounding_equals_the_reference_chain(beta):
    from adaround.layer_rounding import _SoftRounding

    rng = np.random.default_rng(6)
    scale = rng.uniform(0.01, 0.1, (4, 1)).astype(np.float32)
    grid = WeightGrid(scale, np.zeros_like(scale), -8, 7)
    weight = (rng.standard_normal((4, 9)) * 0.3).astype(np.float32)
    base, fraction = grid.floor_and_fraction(weight)
    alpha = init_alpha(fraction) + rng.normal(0, 2, weight.shape).astype(np.float32)  # some clipped h too
    upstream = rng.standard_normal(weight.shape).astype(np.float32)
    soft = _SoftRounding(grid, base)
    fused_weight = soft.forward(alpha).copy()
    fused_grad = soft.backward(upstream, beta, 0.01).copy()
    h = rectified_sigmoid(alpha)
    ref_weight, slope = grid.weight(base, h)
    grad_h = upstream * slope + (0.01 * regularizer_grad(h, beta) if beta is not None else 0)
    np.testing.assert_allclose(fused_weight, ref_weight, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fused_grad, grad_h * rectified_sigmoid_grad(alpha), rtol=1e-5, atol=1e-6)
