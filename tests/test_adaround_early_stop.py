"""AdaRound stops a layer once no later step can change its rounding (`adaround.layer_rounding.settled`):
the rounded weight is then exactly the full run's."""
import numpy as np
import pytest

import adaround.layer_rounding as LR
from adaround.activations import activation_for
from adaround.layer_data import ColumnSample, second_moments
from adaround.layer_rounding import WeightGrid, optimize_rounding
from adaround.linear_form import linear_form
from adaround.params import AdaroundSettings


def _problem(activation: bool, seed=0, k=24, m=12, n=512):
    rng = np.random.default_rng(seed)
    form = linear_form("Gemm", {"transB": 1}, (m, k))
    w = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
    x_f = rng.standard_normal((n, k)).astype(np.float32)
    x_q = (np.round(x_f * 4) / 4).astype(np.float32)
    scale = (np.abs(w).max(axis=1, keepdims=True) / 7).astype(np.float32)
    grid = WeightGrid(scale, np.zeros_like(scale), -8, 7)
    bias = form.bias_matrix(None, form.rows)
    if activation:
        act = activation_for("Relu", {}, m, False)
        data = ColumnSample(form.columns(x_q)[0], np.maximum(w @ x_f.T, 0))
    else:
        act = None
        data = second_moments(form, iter([{"x": x_q}]), iter([{"x": x_f}]), "x")
    return form, w, grid, data, bias, act


@pytest.mark.parametrize("activation", [False, True])
def test_a_settled_layer_stops_with_the_full_runs_rounding(activation, monkeypatch):
    settings = AdaroundSettings(num_iterations=1500, reg_param=0.5, learning_rate=0.05, columns_per_iteration=128)
    problem = _problem(activation)
    early = optimize_rounding(*problem, settings, np.random.default_rng(3))
    assert early.iterations < settings.num_iterations  # the strong regulariser clips every h well before the end
    with monkeypatch.context() as patch:
        patch.setattr(LR, "settled", lambda *args: False)
        full = optimize_rounding(*problem, settings, np.random.default_rng(3))
    assert full.iterations == settings.num_iterations
    np.testing.assert_array_equal(early.weight, full.weight)
    assert (early.loss_before, early.loss_after, early.flipped) == (full.loss_before, full.loss_after, full.flipped)
    assert early.flipped > 0


def test_a_layer_with_unclipped_soft_roundings_runs_every_step():
    settings = AdaroundSettings(num_iterations=200)  # the default regulariser: most h still inside (0, 1) at 200
    assert optimize_rounding(*_problem(False), settings, np.random.default_rng(0)).iterations == 200
