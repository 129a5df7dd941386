"""Fixed-point requantization against exact rational arithmetic (Python ``fractions``)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from quantsim.core import fixed_point as fp
from quantsim.errors import InvalidArgumentError

INT32_MIN, INT32_MAX = fp.INT32_MIN, fp.INT32_MAX


def _round_half_away(value: Fraction) -> int:
    magnitude = math.floor(abs(value) + Fraction(1, 2))
    return magnitude if value >= 0 else -magnitude


def _round_half_up(value: Fraction) -> int:
    return math.floor(value + Fraction(1, 2))


def _random_multipliers(rng, n):
    return np.exp2(rng.uniform(-31.5, 29.5, n)) * rng.uniform(1.0, 2.0, n) / 2


def test_quantize_multiplier_matches_exact_rounding():
    rng = np.random.default_rng(0)
    reals = np.concatenate([_random_multipliers(rng, 3000), [1.0, 0.5, 0.25, 2.0, 1 - 2**-40, 2**-31, 8.5271e-4]])
    mantissa, shift = fp.quantize_multiplier(reals)
    for m, q, s in zip(reals.tolist(), mantissa.tolist(), shift.tolist()):
        exact = Fraction(m)
        if q == 0:
            assert exact < Fraction(1, 2**32)
            continue
        assert (1 << 30) <= q < (1 << 31)
        stored = Fraction(q) * Fraction(2) ** (s - 31)
        assert abs(stored - exact) <= exact * Fraction(1, 2**31)
        # the mantissa is the round-half-away of the exact scaled value (or 2^30 after a carry)
        scaled = exact * Fraction(2) ** (31 - s)
        assert q == _round_half_away(scaled) or (q == 1 << 30 and _round_half_away(scaled * 2) == 1 << 31)
    assert (fp.quantize_multiplier(0.0)[0], fp.quantize_multiplier(0.0)[1]) == (0, 0)
    assert fp.quantize_multiplier(8.5271e-4)[1] == -10  # reference §5 example
    assert fp.quantize_multiplier(1.0) == (1 << 30, 1)
    assert fp.quantize_multiplier(3.0)[1] == 2  # left shift for M >= 1


def test_quantize_multiplier_edge_cases():
    # a fraction that rounds up to 2^31 carries into the shift
    mantissa, shift = fp.quantize_multiplier(1 - 2.0**-40)
    assert (int(mantissa), int(shift)) == (1 << 30, 1)
    assert fp.quantize_multiplier(2.0**-40) == (0, 0)  # flushed like TFLite (shift < -31)
    with pytest.raises(ValueError):
        fp.quantize_multiplier(-0.5)
    with pytest.raises(ValueError):
        fp.quantize_multiplier(float("nan"))
    with pytest.raises(ValueError):
        fp.quantize_multiplier(2.0**31)
    np.testing.assert_array_equal(fp.dequantize_multiplier(*fp.quantize_multiplier(0.375)), 0.375)


def test_srdhm_exact():
    rng = np.random.default_rng(1)
    edge = np.array([INT32_MIN, INT32_MIN + 1, -1, 0, 1, 1 << 30, INT32_MAX], dtype=np.int64)
    a = np.concatenate([rng.integers(INT32_MIN, INT32_MAX, 4000, endpoint=True), np.repeat(edge, len(edge))])
    b = np.concatenate([rng.integers(INT32_MIN, INT32_MAX, 4000, endpoint=True), np.tile(edge, len(edge))])
    # products with exact ties: a * b = (2k + 1) * 2^30
    ties_a = rng.integers(-(1 << 20), 1 << 20, 500) * 2 + 1
    a = np.concatenate([a, ties_a])
    b = np.concatenate([b, np.full(500, 1 << 30)])
    got = fp.saturating_rounding_doubling_high_mul(a, b)
    for x, y, r in zip(a.tolist(), b.tolist(), got.tolist()):
        expected = INT32_MAX if x == y == INT32_MIN else _round_half_up(Fraction(x * y, 1 << 31))
        assert r == expected, (x, y)
    # ties round toward +infinity: +0.5 -> 1, -0.5 -> 0, -1.5 -> -1
    np.testing.assert_array_equal(fp.saturating_rounding_doubling_high_mul([1, -1, -3], [1 << 30] * 3), [1, 0, -1])


def test_rounding_right_shift_exact():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.integers(INT32_MIN, INT32_MAX, 5000, endpoint=True), [-5, -4, -3, -2, -1, 0, 1, 2, 3]])
    e = np.concatenate([rng.integers(0, 32, 5000), [1, 1, 1, 1, 1, 1, 1, 1, 1]])
    got = fp.rounding_right_shift(x, e)
    for value, exponent, r in zip(x.tolist(), e.tolist(), got.tolist()):
        assert r == _round_half_away(Fraction(value, 1 << exponent)), (value, exponent)
    np.testing.assert_array_equal(fp.rounding_right_shift([-5, -3, -1, 1, 3, 5], 1), [-3, -2, -1, 1, 2, 3])
    with pytest.raises(ValueError):
        fp.rounding_right_shift(1, -1)


def test_multiply_by_quantized_multiplier_against_rationals():
    rng = np.random.default_rng(3)
    reals = np.exp2(rng.uniform(-16, 4, 400))
    mantissa, shift = fp.quantize_multiplier(reals)
    x = rng.integers(-(1 << 20), 1 << 20, (400, 25))
    got = fp.multiply_by_quantized_multiplier(x, mantissa[:, None], shift[:, None])
    exact_equal = 0
    for i in range(400):
        stored = Fraction(int(mantissa[i])) * Fraction(2) ** (int(shift[i]) - 31)
        left, right = max(int(shift[i]), 0), max(-int(shift[i]), 0)
        for j in range(25):
            value = int(x[i, j])
            # oracle: the same two roundings, done exactly
            high = _round_half_up(Fraction(value * (1 << left) * int(mantissa[i]), 1 << 31))
            assert got[i, j] == _round_half_away(Fraction(high, 1 << right))
            # and within one step of the exactly rounded product with the real multiplier
            ideal = _round_half_away(value * Fraction(float(reals[i])))
            assert abs(int(got[i, j]) - ideal) <= 1
            exact_equal += int(got[i, j]) == _round_half_away(value * stored)
    assert exact_equal / x.size > 0.95  # the rest are double-rounding cases, off by exactly one


def test_requantize_clamps_and_adds_zero_point():
    mantissa, shift = fp.quantize_multiplier(0.01)
    acc = np.array([-100000, -5000, 0, 1234, 5000, 100000])
    got = fp.requantize(acc, mantissa, shift, 10, 0, 255)
    expected = np.clip(10 + np.round(acc * 0.01), 0, 255)
    np.testing.assert_array_equal(got, expected)


def test_left_shift_saturates():
    mantissa, shift = fp.quantize_multiplier(4.0)
    assert int(shift) == 3
    assert fp.multiply_by_quantized_multiplier(INT32_MAX, mantissa, shift) == INT32_MAX // 2 + 1  # saturated x'
    assert fp.multiply_by_quantized_multiplier(1000, mantissa, shift) == 4000


def test_multiplier_record_is_json_ready():
    import json

    record = fp.multiplier_record(np.array([0.001, 0.5, 3.0]))
    assert json.loads(json.dumps(record)) == record
    assert all((1 << 30) <= m < (1 << 31) for m in record["mantissa"])
    scalar = fp.multiplier_record(0.25)
    assert scalar == {"multiplier": 0.25, "mantissa": 1 << 30, "shift": -1}


def test_single_rounding_rounds_the_exact_product_once():
    """TFLite's TFLITE_SINGLE_ROUNDING: ``floor(x * stored + 1/2)`` exactly (rationals), so it never shows the
    double-rounding misses `multiply_by_quantized_multiplier` has near midpoints with small right shifts."""
    rng = np.random.default_rng(5)
    reals = np.concatenate([np.exp2(rng.uniform(-16, 4, 200)), rng.uniform(0.25, 0.5, 100)])  # right shift 1 too
    mantissa, shift = fp.quantize_multiplier(reals)
    x = rng.integers(-(1 << 20), 1 << 20, (reals.size, 25))
    single = fp.single_rounding_multiply(x, mantissa[:, None], shift[:, None])
    double = fp.multiply_by_quantized_multiplier(x, mantissa[:, None], shift[:, None])
    misses = 0
    for i in range(reals.size):
        stored = Fraction(int(mantissa[i])) * Fraction(2) ** (int(shift[i]) - 31)
        for j in range(25):
            exact = math.floor(int(x[i, j]) * stored + Fraction(1, 2))
            assert single[i, j] == exact, (reals[i], int(x[i, j]))
            misses += int(double[i, j]) != exact
    assert misses > 0  # the double rounding's misses exist on this data (measured: 761 of 7500)
    assert fp.single_rounding_multiply(1000, *fp.quantize_multiplier(4.0)) == 4000
    np.testing.assert_array_equal(fp.requantize([-7, 7], *fp.quantize_multiplier(0.5), 3, rounding="single"),
                                  [0, 7])  # -3.5 -> -3 (ties up), 3.5 -> 4; + zero point 3
    with pytest.raises(InvalidArgumentError, match="rounding"):
        fp.requantize([1], *fp.quantize_multiplier(0.5), 0, rounding="nearest")
