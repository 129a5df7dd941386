"""The speed paths of AdaRound and Sequential MSE compute exactly what the plain formulas compute: the window
steps in cache-sized slices, the soft rounding's fused backward + Adam + forward per weight slice, HardSwish's
buffered squared-error gradient, Sequential MSE's shared candidate product and one-sided moments, and the
capture graph's int32 biases re-put only for the layers that changed. Every comparison is bit for bit."""
import numpy as np
import pytest
from onnx import numpy_helper
from test_adaround import _data, _sim

import adaround.layer_rounding as layer_rounding
import adaround.seq_mse_losses as seq_mse_losses
from adaround.activations import activation_for
from adaround.layer_data import ColumnSample, SecondMoments, output_columns, second_moments
from adaround.layer_rounding import WeightGrid, _WindowSteps
from adaround.linear_form import linear_form
from adaround.rounding import Adam, init_alpha
from adaround.seq_mse_losses import _FIRST, _FORM, _PAIR, _SECOND, _first, _second, row_errors
from adaround.soft_rounding import SoftRounding
from quantsim import encoding_from_range
from quantsim.sim import capture


def _plain_window_step(form, data, bias, act, batch, start, w_soft):
    """The window step as one pass over the whole window (the formula before slicing)."""
    cols = data.cols[:, :, start:start + batch]
    z = np.matmul(form.to_matrix(w_soft), cols)
    z += bias
    flat = z.reshape(data.target.shape[0], batch)
    target = data.target[:, start:start + batch]
    if act is None:
        dz = flat - target
    else:
        y = act.forward(flat)
        dz = act.backward(flat, y, np.subtract(y, target))
    grad = np.matmul(dz.reshape(z.shape), np.swapaxes(cols, 1, 2))
    grad *= 2.0 / batch
    return form.to_weight(grad)


@pytest.mark.parametrize("act_name", ["HardSwish", "LeakyRelu", "Relu", None])
@pytest.mark.parametrize("groups", [1, 6])
@pytest.mark.parametrize("slices", ["tiny", "default"])
def test_sliced_window_steps_equal_the_whole_window_bit_for_bit(act_name, groups, slices, monkeypatch):
    if slices == "tiny":  # one group / one row per slice
        monkeypatch.setattr(layer_rounding, "_GROUP_SLICE_BYTES", 1)
        monkeypatch.setattr(layer_rounding, "_ROW_SLICE_ELEMENTS", 1)
    rng = np.random.default_rng(3)
    shape = (6, 6 // groups, 3, 3)
    form = linear_form("Conv", {"pads": [1, 1, 1, 1], "group": groups}, shape)
    w = rng.standard_normal(shape).astype(np.float32)
    cols, layout = form.columns(rng.standard_normal((3, 6, 7, 7)).astype(np.float32) * 2)
    act = activation_for(act_name, {}, 6, True) if act_name else None
    bias = form.bias_matrix(rng.standard_normal(6).astype(np.float32), 6)
    z = output_columns(form, form.outputs(np.matmul(form.to_matrix(w), cols) + bias, layout))
    data = ColumnSample(cols, (z if act is None else act.forward(z)).astype(np.float32))
    steps = _WindowSteps(form, data, bias, act, 40, np.random.default_rng(5))
    starts = np.random.default_rng(5)
    for _ in range(3):
        w_soft = (w + 0.5 * rng.standard_normal(w.shape)).astype(np.float32)
        start = int(starts.integers(0, cols.shape[2] - 40 + 1))
        expected = _plain_window_step(form, data, bias, act, 40, start, w_soft)
        got = steps(w_soft)
        assert got.dtype == expected.dtype  # LeakyRelu's gradient is float64, as it was
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("beta", [None, 2.5, 0.7])
def test_fused_sliced_update_is_backward_then_adam_then_forward(beta):
    rng = np.random.default_rng(4)
    scale = rng.uniform(0.02, 0.1, (5, 1)).astype(np.float32)
    grid = WeightGrid(scale, np.zeros_like(scale), -8, 7)
    weight = (rng.standard_normal((5, 13)) * 0.3).astype(np.float32)
    weight[0, :4] = [7.4 * scale[0, 0], -7.9 * scale[0, 0], 6.6 * scale[0, 0], -8.0 * scale[0, 0]]  # grid edges
    base, fraction = grid.floor_and_fraction(weight)
    start = init_alpha(fraction) + rng.normal(0, 2, weight.shape).astype(np.float32)
    sliced, whole = SoftRounding(grid, base, slice_elements=7), SoftRounding(grid, base, slice_elements=10 ** 6)
    assert len(sliced.parts) == 10 and len(whole.parts) == 1 and sliced.edge.size
    alpha_a, alpha_b = start.copy(), start.copy()
    adam_a, adam_b = Adam(alpha_a, lr=0.05), Adam(alpha_b, lr=0.05)
    w_a, w_b = sliced.forward(alpha_a), whole.forward(alpha_b)
    for _ in range(4):
        np.testing.assert_array_equal(w_a, w_b)
        upstream = rng.standard_normal(weight.shape).astype(np.float32)
        w_a = sliced.update(upstream, beta, 0.01, adam_a)
        adam_b.step(whole.backward(upstream, beta, 0.01))
        w_b = whole.forward(alpha_b)
        for a, b in ((alpha_a, alpha_b), (adam_a.m, adam_b.m), (adam_a.v, adam_b.v), (w_a, w_b)):
            np.testing.assert_array_equal(a, b)


def test_hard_swish_buffered_gradient_is_its_forward_backward_chain():
    act = activation_for("HardSwish", {}, 4, True)
    rng = np.random.default_rng(5)
    z = (rng.standard_normal((4, 300)) * 4).astype(np.float32)
    z[0, :6] = [3.0, -3.0, np.nextafter(np.float32(3), np.float32(0)), -0.0, 0.0, 2.9999998]
    target = rng.standard_normal(z.shape).astype(np.float32)
    y = act.forward(z)
    diff = np.subtract(y, target)
    expected = act.backward(z, y, diff)
    out = np.empty_like(z)
    for _ in range(2):  # the second call reuses the buffers
        got = act.output_grad(z, target, out)
        assert got is out  # written into the caller's buffer: no copy
        np.testing.assert_array_equal(got, expected)
    generic = activation_for("Tanh", {}, 4, True)  # no buffered gradient: the chain, the difference in ``out``
    y = generic.forward(z)
    np.testing.assert_array_equal(generic.output_grad(z, target, out), generic.backward(z, y, y - target))
    np.testing.assert_array_equal(out, y - target)


@pytest.mark.parametrize("shape", [(1, 16, 27), (8, 1, 9), (1, 40, 30), (2, 6, 5)])
def test_shared_candidate_product_gives_the_three_operand_losses(shape):
    rng = np.random.default_rng(6)
    g, m, k = shape
    x = rng.standard_normal((g, k, 3 * k))
    moment = x @ np.swapaxes(x, 1, 2)
    data = SecondMoments(moment, moment, moment, 3 * k)
    reference = rng.standard_normal(shape).astype(np.float32)
    for factor in (0.5, 0.9):
        candidate = (np.round(reference * 4 * factor) / 4).astype(np.float32)
        c64, r64 = candidate.astype(np.float64), reference.astype(np.float64)
        path = np.einsum_path(_FORM, c64, moment, c64, optimize=True)[0]
        quad = np.einsum(_FORM, c64, moment, c64, optimize=path)
        cross = np.einsum(_FORM, c64, moment, r64, optimize=path)
        const = np.einsum(_FORM, r64, moment, r64, optimize=path)
        expected = np.maximum((quad - 2 * cross + const) / data.columns, 0.0).reshape(-1)
        np.testing.assert_array_equal(row_errors(data, candidate, reference), expected)


@pytest.mark.parametrize("shape", [(1, 1, 9), (1, 1, 300), (1, 64, 576), (128, 1, 9), (4, 8, 9), (32, 2, 27),
                                   (1, 3, 5), (2, 1, 1), (1, 17, 1), (3, 1, 300)])
def test_candidate_contractions_are_numpys_pairwise_einsum_bit_for_bit(shape):
    """`_first` / `_second` skip np.einsum's per-call parsing; where the probe says this numpy's einsum sums
    as they do, they must compute what it computes (else the losses use np.einsum itself)."""
    if not seq_mse_losses._MATMUL_IS_EINSUM:
        pytest.skip(f"numpy {np.__version__}'s einsum sums in another order: the losses use np.einsum")
    rng = np.random.default_rng(8)
    g, m, k = shape
    a = rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    r = rng.standard_normal(shape)
    s = rng.standard_normal((g, k, k))
    s = s + np.swapaxes(s, 1, 2)
    expected = np.einsum(_FIRST, a, s, optimize=_PAIR)
    product = _first(a, s)
    np.testing.assert_array_equal(product, expected)
    assert product.shape == expected.shape
    for other in (a, r):
        got, want = _second(product, other), np.einsum(_SECOND, expected, other, optimize=_PAIR)
        np.testing.assert_array_equal(got, want)
        assert got.shape == want.shape


def test_one_sided_moments_are_one_sum_of_the_same_numbers():
    form = linear_form("Gemm", {"transB": 1}, (4, 6))
    rng = np.random.default_rng(7)
    batches = [{"x": rng.standard_normal((10, 6)).astype(np.float32)} for _ in range(3)]
    one = second_moments(form, iter(batches), None, "x")
    two = second_moments(form, iter(batches), iter(batches), "x")  # the same input on both sides, summed apart
    assert one.s_qf is one.s_qq and one.s_ff is one.s_qq
    for a in (two.s_qq, two.s_qf, two.s_ff):
        np.testing.assert_array_equal(one.s_qq, a)


def _bias_values(graph, sim):
    biases = {layer.bias for layer in sim.weighted_layers() if layer.bias}
    values = {t.name: numpy_helper.to_array(t) for t in graph.model.graph.initializer if t.name in biases}
    values.update({name: np.asarray(v) for name, v in graph.external.items() if name in biases})
    return values


def test_kept_graph_biases_after_a_weight_change_are_those_of_a_fresh_build():
    sim = _sim()
    assert sim.int32_bias
    list(sim.capture([sim.model.graph.output[0].name], _data(1)))  # builds the kept graph
    kept = sim._capture_graph
    for number in (1, 0):
        layer = sim.weighted_layers()[number]
        w = sim.get_weight(layer.weight)
        narrow = encoding_from_range(w.min(axis=(1, 2, 3)) * 0.4, w.max(axis=(1, 2, 3)) * 0.4, 4, axis=0,
                                     symmetric=True)
        sim.qc_quantize_op_dict[layer.weight].set_encoding(narrow)
        list(sim.capture([sim.model.graph.output[0].name], _data(1)))
        assert sim._capture_graph is kept  # patched
        fresh = capture._SimGraph(sim)
        got, expected = _bias_values(kept, sim), _bias_values(fresh, sim)
        assert got.keys() == expected.keys() and len(got) >= 2
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert layer.bias in kept.patches  # the changed layer's bias moved to its new grid


@pytest.mark.parametrize("shape, x_shape, attrs", [
    ((64, 256, 3, 3), (2, 256, 5, 5), {"pads": [1, 1, 1, 1]}),  # deep: 50 positions, K = 2,304 (direct)
    ((16, 1, 3, 3), (1, 16, 6, 6), {"group": 16, "pads": [1, 1, 1, 1]}),  # depthwise, K = 9 (moments)
])
def test_direct_candidate_errors_equal_the_moment_form(shape, x_shape, attrs):
    """Sequential MSE scores layers with fewer positions than their moments would cost by multiplying each
    candidate's error out: the same quantity (to rounding) and the same choice per channel."""
    from adaround.seq_mse_losses import _direct_errors, _direct_is_cheaper, _positions, _scored, candidate_losses
    rng = np.random.default_rng(9)
    form = linear_form("Conv", attrs, shape)
    w = rng.standard_normal(shape).astype(np.float32)
    batches = [{"x": rng.standard_normal(x_shape).astype(np.float32)} for _ in range(2)]
    candidates = [form.to_matrix(np.round(w * 4 / f) * f / 4).astype(np.float32) for f in np.linspace(0.3, 1.5, 20)]
    reference = form.to_matrix(w)
    direct = _direct_errors(form, "x", batches, candidates, reference)
    moments = np.stack(_scored(second_moments(form, iter(batches), None, "x"), candidates, reference))
    np.testing.assert_allclose(direct, moments, rtol=1e-5, atol=1e-7 * np.abs(moments).max())
    np.testing.assert_array_equal(direct.argmin(axis=0), moments.argmin(axis=0))
    m, k = candidates[0].shape[1:]
    chosen = _direct_is_cheaper(k, m, sum(_positions(form, b["x"]) for b in batches), len(candidates))
    assert chosen == (shape[1] > 1)
    table = candidate_losses(form, "x", iter(batches), None, candidates, reference, "mse")
    np.testing.assert_array_equal(table, direct if chosen else moments)
