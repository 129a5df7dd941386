"""Tests of `quantsim.core.numerics`.

1. ONNX oracles: `quantize` / `dequantize` / `fake_quantize` against QuantizeLinear / DequantizeLinear
   models (opset 21) run by ``onnx.reference.ReferenceEvaluator`` and by onnxruntime (CPU), per tensor,
   per axis and blocked, for every native storage type, with exact ties and saturation.
2. Hand-worked AIMET 2.42 min-max tables (reference/aimet_onnx_api.md §6.1) for `encoding_from_range`,
   `aimet_offset`, ``Encoding.min`` / ``.max`` and the inverse `encoding_from_aimet`.
3. Seeded numpy property tests over random ranges and bitwidths 2..16, plus `reduce_min_max` and
   `broadcast_param` against loop / index implementations.
4. `fp16_round_trip` against numpy and onnxruntime float16 casts.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantsim.core.numerics import (
    SCALE_FLOOR_EPS,
    Encoding,
    aimet_offset,
    broadcast_param,
    dequantize,
    encoding_from_aimet,
    encoding_from_range,
    fake_quantize,
    fp16_round_trip,
    grid_bounds,
    quantize,
    reduce_min_max,
    round_half_away,
)

# =================================================================================================
# helpers
# =================================================================================================
OPSET = 21
IR_VERSION = 10
F32_EPS = float(np.finfo(np.float32).eps)

# storage name -> (bits, signed, ONNX element type)
STORAGE = {
    "uint8": (8, False, TensorProto.UINT8),
    "int8": (8, True, TensorProto.INT8),
    "uint16": (16, False, TensorProto.UINT16),
    "int16": (16, True, TensorProto.INT16),
    "uint4": (4, False, TensorProto.UINT4),
    "int4": (4, True, TensorProto.INT4),
}
ORT_NUMPY_STORAGE = ["uint8", "int8", "uint16", "int16"]  # onnxruntime can hand these to numpy

# layout name -> (input shape, axis, block_axis, block_size)
LAYOUTS = {
    "per_tensor": ((4, 3, 8), None, None, None),
    "per_axis_0": ((4, 3, 8), 0, None, None),
    "per_axis_last": ((4, 3, 8), -1, None, None),
    "blocked_weight_2d": ((6, 16), 0, 1, 8),
    "blocked_axis_lt_block_axis": ((4, 3, 8), 0, -1, 4),
    "blocked_axis_gt_block_axis": ((4, 3, 8), -1, 0, 2),
}

# min-max modes -> encoding_from_range keyword arguments
MODES = {
    "asym": dict(symmetric=False),
    "sym": dict(symmetric=True),
    "strict": dict(symmetric=True, strict=True),
    "unsigned_sym": dict(symmetric=True, unsigned_symmetric=True),
}


def _seed(*parts) -> int:
    """A stable per-test seed (independent of hash randomisation)."""
    return zlib.crc32(repr(parts).encode())


def _param_shape(shape, axis, block_axis, block_size) -> tuple[int, ...]:
    if axis is None:
        return ()
    if block_size is None:
        return (shape[axis],)
    return (shape[axis], -(-shape[block_axis] // block_size))


def expand_param(values, shape, axis=None, block_axis=None, block_size=None) -> np.ndarray:
    """Element-wise parameter lookup by index arithmetic (independent of `broadcast_param`)."""
    values = np.asarray(values)
    if axis is None:
        return np.broadcast_to(values, shape)
    idx = np.indices(shape)
    channel = idx[axis % len(shape)]
    if block_size is None:
        return values[channel]
    return values[channel, idx[block_axis % len(shape)] // block_size]


def _onnx_qparams(enc: Encoding, shape) -> tuple[np.ndarray, np.ndarray, dict]:
    """(scale, zero_point, attributes) of the equivalent ONNX opset-21 Q/DQ node."""
    scale = enc.scale.astype(np.float32)
    zp = enc.zero_point
    if enc.axis is None:
        return scale, zp, {}
    if enc.block_size is None:
        return scale, zp, {"axis": enc.axis}
    # ONNX blocked: scale has the input's rank, the blocked dimension divided by the block size,
    # and one value per index of every other dimension.
    rank = len(shape)
    onnx_shape = list(shape)
    onnx_shape[enc.block_axis % rank] = -(-shape[enc.block_axis % rank] // enc.block_size)
    args = (tuple(onnx_shape), enc.axis, enc.block_axis, 1)
    attrs = {"axis": enc.block_axis, "block_size": enc.block_size}
    return np.ascontiguousarray(expand_param(scale, *args)), np.ascontiguousarray(expand_param(zp, *args)), attrs


def _qdq_model(ops: str, elem_type: int, shape, scale, zero_point, attrs) -> onnx.ModelProto:
    """``ops``: "Q" (float -> int), "DQ" (int -> float) or "QDQ" (float -> float)."""
    scale_init = numpy_helper.from_array(np.asarray(scale, np.float32), "scale")
    zp = np.asarray(zero_point)
    zp_init = helper.make_tensor("zp", elem_type, zp.shape, [int(v) for v in zp.ravel()])
    in_type = elem_type if ops == "DQ" else TensorProto.FLOAT
    out_type = elem_type if ops == "Q" else TensorProto.FLOAT
    if ops == "Q":
        nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"], **attrs)]
    elif ops == "DQ":
        nodes = [helper.make_node("DequantizeLinear", ["x", "scale", "zp"], ["y"], **attrs)]
    else:
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], **attrs),
            helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], **attrs),
        ]
    graph = helper.make_graph(
        nodes,
        f"{ops.lower()}_graph",
        [helper.make_tensor_value_info("x", in_type, list(shape))],
        [helper.make_tensor_value_info("y", out_type, list(shape))],
        [scale_init, zp_init],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def _run_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def _run_ort(model: onnx.ModelProto, x: np.ndarray, optimize: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _random_storage_case(rng, storage: str, layout: str, pow2: bool):
    """A random full-storage encoding and float32 inputs that hit every code, saturation and ties.

    With power-of-two scales half the inputs sit exactly on a .5 tie of ``x / scale``.
    """
    bits, signed, _ = STORAGE[storage]
    qmin, qmax = grid_bounds(bits, signed)
    shape, axis, block_axis, block_size = LAYOUTS[layout]
    pshape = _param_shape(shape, axis, block_axis, block_size)
    if pow2:
        scale = 2.0 ** rng.integers(-6, 3, pshape)
    else:
        scale = 10.0 ** rng.uniform(-3, 0.5, pshape)
    zp = rng.integers(qmin, qmax + 1, pshape)
    enc = Encoding(scale, zp, bits, signed, qmin, qmax, axis=axis, block_axis=block_axis, block_size=block_size)
    s = expand_param(enc.scale.astype(np.float32), shape, axis, block_axis, block_size).astype(np.float64)
    z = expand_param(enc.zero_point, shape, axis, block_axis, block_size)
    span = qmax - qmin
    codes = rng.uniform(qmin - 0.1 * span - 3, qmax + 0.1 * span + 3, shape)  # beyond both ends
    if pow2:
        ties = rng.random(shape) < 0.5
        codes[ties] = np.floor(codes[ties]) + 0.5
    x = ((codes - z) * s).astype(np.float32)
    x.flat[0] = 0.0
    x.flat[1] = -0.0
    return enc, x


def _container(bits: int, signed: bool) -> str:
    width = 4 if bits <= 4 else 8 if bits <= 8 else 16
    return ("int" if signed else "uint") + str(width)


def _random_ranges(rng, n: int, nonnegative: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random (min, max) pairs: mixed sign, one-sided, degenerate, tiny and zero ranges."""
    mag = 10.0 ** rng.uniform(-4, 3, (n, 2))
    lo, hi = -mag[:, 0], mag[:, 1]
    kind = rng.integers(0, 6, n)
    pos = kind == 1
    lo[pos], hi[pos] = np.sort(mag[pos], axis=1).T
    neg = kind == 2
    lo[neg], hi[neg] = np.sort(-mag[neg], axis=1).T
    single = kind == 3  # min == max
    lo[single] = hi[single] = rng.choice([-1.0, 1.0], single.sum()) * mag[single, 0]
    tiny = kind == 4
    lo[tiny], hi[tiny] = -1e-9 * mag[tiny, 0], 1e-9 * mag[tiny, 1]
    zero = kind == 5
    lo[zero] = hi[zero] = 0.0
    if nonnegative:
        lo, hi = np.sort(np.abs(np.stack([lo, hi])), axis=0)
    return lo, hi


def _c_round(v: float) -> float:
    """C ``round``: ties away from zero."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def _aimet_minmax_reference(mn, mx, bits, symmetric, strict=False, unsigned_symmetric=False):
    """Scalar transcription of reference §6.1 in AIMET's convention -> (delta, offset, min, max)."""
    mn, mx = min(float(mn), 0.0), max(float(mx), 0.0)
    n = 2**bits - 1 - (1 if (symmetric and strict) else 0)
    floor = min(F32_EPS, 0.01 / n)
    if symmetric and not (unsigned_symmetric and mn >= 0):
        p = n // 2
        n_neg = n - p
        divisor = p + 1 if n == 3 else p
        delta = max(max(mx / divisor, -mn / n_neg), floor)
        offset = -n_neg
    else:
        delta = max((mx - mn) / n, floor)
        offset = int(min(max(_c_round(mn / delta), -n), 0))
    return delta, offset, delta * offset, delta * (offset + n)


# =================================================================================================
# 1. ONNX oracles
# =================================================================================================
@pytest.mark.parametrize("pow2", [False, True], ids=["random_scale", "pow2_scale_ties"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("storage", list(STORAGE))
def test_quantize_matches_reference_evaluator(storage, layout, pow2):
    rng = np.random.default_rng(_seed("q_ref", storage, layout, pow2))
    enc, x = _random_storage_case(rng, storage, layout, pow2)
    scale, zp, attrs = _onnx_qparams(enc, x.shape)
    expected = _run_reference(_qdq_model("Q", STORAGE[storage][2], x.shape, scale, zp, attrs), x)
    assert expected.dtype == helper.tensor_dtype_to_np_dtype(STORAGE[storage][2])
    ours = quantize(x, enc)
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, expected.astype(np.int64))
    # the case really exercises saturation at both ends (and ties when requested)
    assert (ours == enc.qmin).any() and (ours == enc.qmax).any()
    if pow2:
        s = expand_param(enc.scale.astype(np.float32), x.shape, enc.axis, enc.block_axis, enc.block_size)
        t = x / s
        assert (np.abs(t - np.floor(t) - 0.5) == 0).sum() > x.size // 4


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("storage", list(STORAGE))
def test_dequantize_matches_reference_evaluator(storage, layout):
    rng = np.random.default_rng(_seed("dq_ref", storage, layout))
    enc, x = _random_storage_case(rng, storage, layout, pow2=False)
    elem = STORAGE[storage][2]
    q = rng.integers(enc.qmin, enc.qmax + 1, x.shape)
    q.flat[0], q.flat[1] = enc.qmin, enc.qmax
    scale, zp, attrs = _onnx_qparams(enc, x.shape)
    model = _qdq_model("DQ", elem, x.shape, scale, zp, attrs)
    expected = _run_reference(model, q.astype(helper.tensor_dtype_to_np_dtype(elem)))
    ours = dequantize(q, enc)
    assert ours.dtype == np.float32 and expected.dtype == np.float32
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("storage", list(STORAGE))
def test_fake_quantize_matches_reference_evaluator_qdq(storage, layout):
    rng = np.random.default_rng(_seed("qdq_ref", storage, layout))
    enc, x = _random_storage_case(rng, storage, layout, pow2=True)
    scale, zp, attrs = _onnx_qparams(enc, x.shape)
    expected = _run_reference(_qdq_model("QDQ", STORAGE[storage][2], x.shape, scale, zp, attrs), x)
    np.testing.assert_array_equal(fake_quantize(x, enc), expected)


@pytest.mark.parametrize("pow2", [False, True], ids=["random_scale", "pow2_scale_ties"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("storage", ORT_NUMPY_STORAGE)
def test_quantize_and_dequantize_match_onnxruntime(storage, layout, pow2):
    rng = np.random.default_rng(_seed("ort", storage, layout, pow2))
    enc, x = _random_storage_case(rng, storage, layout, pow2)
    elem = STORAGE[storage][2]
    scale, zp, attrs = _onnx_qparams(enc, x.shape)
    q_ort = _run_ort(_qdq_model("Q", elem, x.shape, scale, zp, attrs), x)
    assert q_ort.dtype == helper.tensor_dtype_to_np_dtype(elem)
    np.testing.assert_array_equal(quantize(x, enc), q_ort.astype(np.int64))
    q = rng.integers(enc.qmin, enc.qmax + 1, x.shape)
    dq_ort = _run_ort(_qdq_model("DQ", elem, x.shape, scale, zp, attrs), q.astype(q_ort.dtype))
    np.testing.assert_array_equal(dequantize(q, enc), dq_ort)


@pytest.mark.parametrize("pow2", [False, True], ids=["random_scale", "pow2_scale_ties"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("storage", list(STORAGE))
def test_fake_quantize_matches_onnxruntime_qdq(storage, layout, pow2):
    """Q -> DQ in onnxruntime (the only way to observe int4/uint4 results there)."""
    rng = np.random.default_rng(_seed("ort_qdq", storage, layout, pow2))
    enc, x = _random_storage_case(rng, storage, layout, pow2)
    scale, zp, attrs = _onnx_qparams(enc, x.shape)
    model = _qdq_model("QDQ", STORAGE[storage][2], x.shape, scale, zp, attrs)
    ours = fake_quantize(x, enc)
    np.testing.assert_array_equal(ours, _run_ort(model, x))
    np.testing.assert_array_equal(ours, _run_ort(model, x, optimize=False))


@pytest.mark.parametrize("storage", list(STORAGE))
def test_ties_to_even_and_saturation_by_hand(storage):
    bits, signed, elem = STORAGE[storage]
    qmin, qmax = grid_bounds(bits, signed)
    zp = (qmin + qmax + 1) // 2  # mid grid: 0 signed, 2^(b-1) unsigned
    enc = Encoding(0.25, zp, bits, signed, qmin, qmax)
    t = np.array([0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5, 0.49, 0.51, qmax - zp + 0.5, qmin - zp - 0.5, 1e6, -1e6])
    expected = zp + np.array([0, 2, 2, 4, 0, -2, -2, -4, 0, 1, 10**9, -(10**9), 10**9, -(10**9)])
    expected = np.clip(expected, qmin, qmax)
    x = (t * 0.25).astype(np.float32)
    np.testing.assert_array_equal(quantize(x, enc), expected)
    reference = _run_reference(_qdq_model("Q", elem, x.shape, np.float32(0.25), np.int64(zp), {}), x)
    np.testing.assert_array_equal(reference.astype(np.int64), expected)
    np.testing.assert_array_equal(fake_quantize(x, enc), ((expected - zp) * 0.25).astype(np.float32))


@pytest.mark.parametrize("signed", [True, False])
def test_big_arrays_saturate_in_one_clip_with_the_same_codes(signed, monkeypatch):
    """Arrays from `CLIP_MIN_ELEMENTS` saturate with np.clip and a NaN fix-up: the same codes and fake-quantized
    bits as fmax then fmin (NaN to qmin, +-inf to the ends, -0.0 to 0.0), per tensor and per channel."""
    import quantsim.core.numerics as numerics

    rng = np.random.default_rng(_seed("clip", signed))
    x = rng.normal(scale=4.0, size=(16, 40)).astype(np.float32)
    x.flat[[0, 9, 33, 100, 101, 102]] = [np.nan, np.inf, -np.inf, -0.0, 3e38, -3e38]
    qmin, qmax = grid_bounds(8, signed)
    per_channel = Encoding(rng.uniform(0.05, 0.5, 40), np.zeros(40, np.int64) if signed else rng.integers(0, 200, 40),
                           8, signed, qmin, qmax, axis=1)
    for enc in (Encoding(0.25, 0 if signed else 131, 8, signed, qmin, qmax), per_channel):
        monkeypatch.setattr(numerics, "CLIP_MIN_ELEMENTS", 1 << 30)
        codes, fake = quantize(x, enc), fake_quantize(x, enc)
        monkeypatch.setattr(numerics, "CLIP_MIN_ELEMENTS", 1)
        np.testing.assert_array_equal(quantize(x, enc), codes)
        np.testing.assert_array_equal(fake_quantize(x, enc).view(np.uint32), fake.view(np.uint32))
        assert codes.flat[0] == qmin and codes.flat[9] == qmax and codes.flat[33] == qmin


@pytest.mark.parametrize("storage", list(STORAGE))
def test_non_finite_inputs_saturate_like_onnxruntime(storage):
    """+-inf saturate; NaN lands on qmin as onnxruntime's CPU QuantizeLinear does."""
    bits, signed, elem = STORAGE[storage]
    qmin, qmax = grid_bounds(bits, signed)
    enc = Encoding(0.5, (qmin + qmax) // 2 + 1, bits, signed, qmin, qmax)
    x = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 1.0], np.float32)
    ours = quantize(x, enc)
    np.testing.assert_array_equal(ours[:5], [qmin, qmax, qmin, qmax, qmin])
    model = _qdq_model("QDQ", elem, x.shape, np.float32(0.5), np.int64(enc.zero_point), {})
    np.testing.assert_array_equal(fake_quantize(x, enc), _run_ort(model, x))
    if storage in ORT_NUMPY_STORAGE:
        q_model = _qdq_model("Q", elem, x.shape, np.float32(0.5), np.int64(enc.zero_point), {})
        np.testing.assert_array_equal(ours, _run_ort(q_model, x).astype(np.int64))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("bits", [2, 3, 5, 6, 7, 9, 12, 15])
def test_narrow_grid_is_container_quantize_then_clip(bits, mode):
    """Bitwidths without a native type: QuantizeLinear into the next container, then Clip to the grid."""
    rng = np.random.default_rng(_seed("narrow", bits, mode))
    lo, hi = _random_ranges(rng, 8, nonnegative=(mode == "unsigned_sym"))
    enc = encoding_from_range(lo, hi, bits, axis=0, **MODES[mode])
    assert not enc.full_storage_range or (mode != "strict" and bits in (4, 8, 16))
    x = (rng.uniform(-1.3, 1.3, (8, 32)) * np.maximum(np.abs(lo), np.abs(hi))[:, None]).astype(np.float32)
    container = _container(bits, enc.signed)
    scale, zp, attrs = _onnx_qparams(enc, x.shape)
    raw = _run_reference(_qdq_model("Q", STORAGE[container][2], x.shape, scale, zp, attrs), x).astype(np.int64)
    np.testing.assert_array_equal(quantize(x, enc), np.clip(raw, enc.qmin, enc.qmax))


# =================================================================================================
# 2. AIMET hand-worked tables (reference §6.1)
# =================================================================================================
EPS = SCALE_FLOOR_EPS
# id -> (min, max, bits, mode, scale, aimet offset, enc.min, enc.max)
AIMET_TABLE = {
    "asym8[-1,2]": (-1.0, 2.0, 8, "asym", 3 / 255, -85, -1.0, 2.0),
    "asym8[-0.3,1.7]": (-0.3, 1.7, 8, "asym", 2 / 255, -38, -0.29804, 1.70196),
    "asym8[0.5,2]": (0.5, 2.0, 8, "asym", 2 / 255, 0, 0.0, 2.0),
    "asym8[-2,-0.5]": (-2.0, -0.5, 8, "asym", 2 / 255, -255, -2.0, 0.0),
    "sym8[-2,1]": (-2.0, 1.0, 8, "sym", 2 / 128, -128, -2.0, 1.984375),
    "strict8[-2,1]": (-2.0, 1.0, 8, "strict", 2 / 127, -127, -2.0, 2.0),
    "sym8[0.2,2]": (0.2, 2.0, 8, "sym", 2 / 127, -128, -256 / 127, 2.0),
    "unsigned_sym8[0.2,2]": (0.2, 2.0, 8, "unsigned_sym", 2 / 255, 0, 0.0, 2.0),
    "unsigned_sym8[-2,1]_falls_back": (-2.0, 1.0, 8, "unsigned_sym", 2 / 128, -128, -2.0, 1.984375),
    "sym4[-1,2]": (-1.0, 2.0, 4, "sym", 2 / 7, -8, -16 / 7, 2.0),
    "sym2[-1,1]": (-1.0, 1.0, 2, "sym", 0.5, -2, -1.0, 0.5),
    "strict2[-1,1]": (-1.0, 1.0, 2, "strict", 1.0, -1, -1.0, 1.0),
    "asym8_zeros": (0.0, 0.0, 8, "asym", 1.1920929e-07, 0, 0.0, 3.04e-5),
    "sym8_zeros": (0.0, 0.0, 8, "sym", 1.1920929e-07, -128, -128 * EPS, 127 * EPS),
    "asym8[-1e-6,1e-6]": (-1e-6, 1e-6, 8, "asym", 1.1920929e-07, -8, -8 * EPS, 247 * EPS),
    # -min / scale on an exact .5 tie: AIMET's C round goes away from zero (numpy's round would not)
    "asym8[-0.5,254.5]_tie": (-0.5, 254.5, 8, "asym", 1.0, -1, -1.0, 254.0),
    "asym8[-2.5,252.5]_tie": (-2.5, 252.5, 8, "asym", 1.0, -3, -3.0, 252.0),
    "asym16[-1,2]": (-1.0, 2.0, 16, "asym", 3 / 65535, -21845, -1.0, 2.0),
    "asym16[-0.3,1.7]": (-0.3, 1.7, 16, "asym", 2 / 65535, -9830, -9830 * 2 / 65535, 55705 * 2 / 65535),
    "sym16[-2,1]": (-2.0, 1.0, 16, "sym", 2 / 32768, -32768, -2.0, 32767 * 2 / 32768),
    "strict16[-2,1]": (-2.0, 1.0, 16, "strict", 2 / 32767, -32767, -2.0, 2.0),
    "unsigned_sym16[0,3]": (0.0, 3.0, 16, "unsigned_sym", 3 / 65535, 0, 0.0, 3.0),
}


@pytest.mark.parametrize("case", list(AIMET_TABLE))
def test_aimet_min_max_table(case):
    mn, mx, bits, mode, scale, offset, enc_min, enc_max = AIMET_TABLE[case]
    enc = encoding_from_range(mn, mx, bits, **MODES[mode])
    assert enc.is_per_tensor
    np.testing.assert_allclose(enc.scale, scale, rtol=1e-7 if scale == 1.1920929e-07 else 1e-12)
    assert int(aimet_offset(enc)) == offset
    np.testing.assert_allclose(enc.min, enc_min, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(enc.max, enc_max, rtol=1e-5 if case != "asym8_zeros" else 1e-3, atol=1e-12)
    # grid bookkeeping: AIMET's min/max are scale * (offset) and scale * (offset + N)
    assert enc.num_steps == 2**bits - 1 - (mode == "strict")
    np.testing.assert_allclose(enc.min, enc.scale * offset, rtol=1e-15)
    np.testing.assert_allclose(enc.max, enc.scale * (offset + enc.num_steps), rtol=1e-15)
    # and agrees with the scalar transcription of §6.1 used by the property tests
    ref = _aimet_minmax_reference(mn, mx, bits, **MODES[mode])
    assert float(enc.scale) == ref[0] and int(aimet_offset(enc)) == ref[1]


@pytest.mark.parametrize("case", list(AIMET_TABLE))
def test_encoding_from_aimet_inverts_table(case):
    mn, mx, bits, mode, *_ = AIMET_TABLE[case]
    enc = encoding_from_range(mn, mx, bits, **MODES[mode])
    back = encoding_from_aimet(enc.scale, aimet_offset(enc), bits, symmetric=enc.symmetric)
    assert back.same_as(enc), (back, enc)
    # the file form AIMET writes: float scale / integer-valued float offset
    back = encoding_from_aimet(float(enc.scale), float(aimet_offset(enc)), bits, symmetric=enc.symmetric)
    assert back.same_as(enc)


def test_signed_grids_by_mode():
    assert encoding_from_range(-2, 1, 8, symmetric=True).signed
    assert (lambda e: (e.qmin, e.qmax))(encoding_from_range(-2, 1, 8, symmetric=True)) == (-128, 127)
    assert (lambda e: (e.qmin, e.qmax))(encoding_from_range(-2, 1, 8, symmetric=True, strict=True)) == (-127, 127)
    assert (lambda e: (e.qmin, e.qmax))(encoding_from_range(-1, 1, 2, symmetric=True)) == (-2, 1)
    unsigned = encoding_from_range(0.2, 2, 8, symmetric=True, unsigned_symmetric=True)
    assert not unsigned.signed and unsigned.symmetric and (unsigned.qmin, unsigned.qmax) == (0, 255)
    asym = encoding_from_range(-1, 2, 8, symmetric=False, strict=True)  # strict only applies to symmetric
    assert not asym.signed and (asym.qmin, asym.qmax) == (0, 255)


@pytest.mark.parametrize(
    "bits,mode",
    [(8, "asym"), (8, "sym"), (8, "strict"), (16, "asym"), (16, "sym"), (4, "sym"), (2, "sym"), (8, "unsigned_sym")],
)
def test_per_channel_table_matches_per_tensor(bits, mode):
    rows = [
        v for v in AIMET_TABLE.values()
        if v[2] == bits and v[3] == mode and (mode != "unsigned_sym" or v[0] >= 0)
    ]
    rows += [(-1.0, 2.0, bits, mode), (-0.3, 1.7, bits, mode), (0.0, 0.0, bits, mode), (-1e-6, 1e-6, bits, mode)]
    if mode == "unsigned_sym":
        rows = [r for r in rows if r[0] >= 0]
    mins = np.array([r[0] for r in rows])
    maxs = np.array([r[1] for r in rows])
    per_channel = encoding_from_range(mins, maxs, bits, axis=0, **MODES[mode])
    assert per_channel.scale.shape == (len(rows),) and per_channel.axis == 0
    for c, (mn, mx, *_) in enumerate(rows):
        single = encoding_from_range(mn, mx, bits, **MODES[mode])
        assert per_channel.scale[c] == single.scale
        assert aimet_offset(per_channel)[c] == aimet_offset(single)
        assert per_channel.min[c] == single.min and per_channel.max[c] == single.max
    # (C, n_blocks) ranges give per-block results of the same shape
    blocked = encoding_from_range(
        np.stack([mins, mins[::-1]]), np.stack([maxs, maxs[::-1]]), bits, axis=0, block_axis=1, block_size=4,
        **MODES[mode],
    )
    np.testing.assert_array_equal(blocked.scale[0], per_channel.scale)
    np.testing.assert_array_equal(blocked.scale[1], per_channel.scale[::-1])
    np.testing.assert_array_equal(aimet_offset(blocked)[1], aimet_offset(per_channel)[::-1])
    back = encoding_from_aimet(blocked.scale, aimet_offset(blocked), bits, symmetric=blocked.symmetric,
                               axis=0, block_axis=1, block_size=4)
    assert back.same_as(blocked)


def test_encoding_from_aimet_grids():
    signed = encoding_from_aimet(0.1, -128, 8, symmetric=True)
    assert (signed.signed, signed.qmin, signed.qmax, int(signed.zero_point)) == (True, -128, 127, 0)
    strict = encoding_from_aimet(0.1, -127, 8, symmetric=True)
    assert (strict.signed, strict.qmin, strict.qmax, int(strict.zero_point)) == (True, -127, 127, 0)
    unsigned_sym = encoding_from_aimet(0.1, 0, 8, symmetric=True)
    assert (unsigned_sym.signed, unsigned_sym.qmin, unsigned_sym.qmax, unsigned_sym.symmetric) == (False, 0, 255, True)
    asym = encoding_from_aimet(0.1, -128, 8, symmetric=False)  # same offset, asymmetric: zero point 128
    assert (asym.signed, asym.qmin, asym.qmax, int(asym.zero_point)) == (False, 0, 255, 128)
    int4 = encoding_from_aimet([0.1, 0.2], [-8, -8], 4, symmetric=True, axis=0)
    assert (int4.signed, int4.qmin, int4.qmax, int4.axis) == (True, -8, 7, 0)
    int16 = encoding_from_aimet(1e-4, -32768, 16, symmetric=True)
    assert (int16.qmin, int16.qmax) == (-32768, 32767)
    edge = encoding_from_aimet([0.1, 0.1], [0, -255], 8, symmetric=False, axis=0)
    np.testing.assert_array_equal(edge.zero_point, [0, 255])


@pytest.mark.parametrize(
    "scale,offset,bits,symmetric",
    [
        (0.1, -85.5, 8, False),  # fractional (zero-point shift)
        (0.1, -0.25, 8, True),
        ([0.1, 0.2], [-3, -3.5], 8, False),
        (0.1, 1, 8, False),  # positive offset
        (0.1, -256, 8, False),  # beyond -N
        (0.1, -16, 4, False),
        ([0.1, 0.2], [-10, 300], 8, False),
        (0.1, -65536, 16, False),
    ],
)
def test_encoding_from_aimet_rejects_bad_offsets(scale, offset, bits, symmetric):
    with pytest.raises(ValueError):
        encoding_from_aimet(scale, offset, bits, symmetric=symmetric)


@pytest.mark.parametrize("scale", [0.0, -0.1, np.inf, np.nan])
def test_encoding_rejects_bad_scales(scale):
    with pytest.raises(ValueError):
        Encoding(scale, 0, 8, False, 0, 255)


def test_encoding_rejects_bad_ranges_and_zero_points():
    with pytest.raises(ValueError):
        encoding_from_range(np.nan, 1.0, 8, symmetric=False)
    with pytest.raises(ValueError):
        encoding_from_range(-1.0, np.inf, 8, symmetric=True)
    with pytest.raises(ValueError):
        encoding_from_range(np.zeros(3), np.ones(4), 8, symmetric=False)
    with pytest.raises(ValueError):
        Encoding(0.1, 256, 8, False, 0, 255)
    with pytest.raises(ValueError):
        Encoding(0.1, -1, 8, False, 0, 255)


def test_round_half_away():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, -0.51, 0.0])
    np.testing.assert_array_equal(round_half_away(x), [1, 2, 3, -1, -2, -3, 0, -1, 0])


def test_grid_bounds():
    assert grid_bounds(8, True) == (-128, 127)
    assert grid_bounds(8, True, strict=True) == (-127, 127)
    assert grid_bounds(8, False) == (0, 255)
    assert grid_bounds(8, False, strict=True) == (0, 255)
    assert grid_bounds(2, True) == (-2, 1)
    assert grid_bounds(4, True) == (-8, 7)
    assert grid_bounds(16, False) == (0, 65535)


# =================================================================================================
# 3. seeded property tests
# =================================================================================================
N_CHANNELS = 48
N_VALUES = 64


def _property_case(bits: int, mode: str):
    rng = np.random.default_rng(_seed("prop", bits, mode))
    lo, hi = _random_ranges(rng, N_CHANNELS, nonnegative=(mode == "unsigned_sym"))
    enc = encoding_from_range(lo, hi, bits, axis=0, **MODES[mode])
    return rng, lo, hi, enc


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("bits", range(2, 17))
def test_random_ranges_follow_aimet_rules(bits, mode):
    _, lo, hi, enc = _property_case(bits, mode)
    if mode == "unsigned_sym":
        assert not enc.signed
    for c in range(N_CHANNELS):
        delta, offset, ref_min, ref_max = _aimet_minmax_reference(lo[c], hi[c], bits, **MODES[mode])
        assert enc.scale[c] == delta
        assert aimet_offset(enc)[c] == offset
        np.testing.assert_allclose([enc.min[c], enc.max[c]], [ref_min, ref_max], rtol=1e-12, atol=0)
    # the grid spans the zero-including range (to within half a step for asymmetric grids)
    mn, mx = np.minimum(lo, 0), np.maximum(hi, 0)
    half = enc.scale / 2 * (1 + 1e-9)
    if enc.symmetric and enc.signed:
        assert np.all(enc.min <= mn * (1 - 1e-12))  # up to the last ulp of scale * Nneg
        if bits > 2:
            assert np.all(enc.max >= mx * (1 - 1e-12))
    else:
        assert np.all(enc.min <= mn + half) and np.all(enc.max >= mx - half)
    assert np.all(enc.scale >= min(F32_EPS, 0.01 / enc.num_steps))
    # AIMET's description round-trips
    back = encoding_from_aimet(enc.scale, aimet_offset(enc), bits, symmetric=enc.symmetric, axis=0)
    assert back.same_as(enc)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("bits", range(2, 17))
def test_quantization_properties(bits, mode):
    rng, lo, hi, enc = _property_case(bits, mode)
    s32 = enc.scale.astype(np.float32)[:, None].astype(np.float64)
    span = enc.num_steps

    # inputs inside [enc.min, enc.max], plus values beyond both ends
    u = rng.uniform(0, 1, (N_CHANNELS, N_VALUES))
    inside = (enc.min[:, None] + u * (enc.max - enc.min)[:, None]).astype(np.float32)
    wide = (enc.min[:, None] - 0.3 * (enc.max - enc.min)[:, None] + 1.6 * u * (enc.max - enc.min)[:, None])
    wide = wide.astype(np.float32)

    # quantize stays on the grid, even for huge / non-finite inputs
    extremes = np.tile(np.array([np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-30, -1e-30, 0.0], np.float32),
                       (N_CHANNELS, 1))
    for x in (inside, wide, extremes):
        q = quantize(x, enc)
        assert q.dtype == np.int64 and q.min() >= enc.qmin and q.max() <= enc.qmax

    # zero is exactly representable
    zeros = np.zeros((N_CHANNELS, 2), np.float32)
    zeros[:, 1] = -0.0
    np.testing.assert_array_equal(fake_quantize(zeros, enc), 0.0)
    np.testing.assert_array_equal(quantize(zeros, enc), np.repeat(enc.zero_point[:, None], 2, axis=1))

    # fake_quantize is idempotent
    for x in (inside, wide):
        once = fake_quantize(x, enc)
        np.testing.assert_array_equal(fake_quantize(once, enc), once)

    # grid values round-trip exactly
    q = rng.integers(enc.qmin, enc.qmax + 1, (N_CHANNELS, N_VALUES))
    q[:, 0], q[:, 1] = enc.qmin, enc.qmax
    np.testing.assert_array_equal(quantize(dequantize(q, enc), enc), q)

    # rounding error inside the range is at most half a step (+ float32 slack)
    y = fake_quantize(inside, enc).astype(np.float64)
    x64 = inside.astype(np.float64)
    tol = s32 * (0.5 + span * 2.0**-22) + 2.0**-21 * np.abs(x64)
    assert np.all(np.abs(x64 - y) <= tol)
    # ... and beyond it, error equals the distance to the clipped end
    y = fake_quantize(wide, enc).astype(np.float64)
    lo_end = dequantize(np.full((N_CHANNELS, 1), enc.qmin), enc).astype(np.float64)
    hi_end = dequantize(np.full((N_CHANNELS, 1), enc.qmax), enc).astype(np.float64)
    assert np.all((y >= lo_end) & (y <= hi_end))
    np.testing.assert_array_equal(y[wide < lo_end - s32], np.broadcast_to(lo_end, y.shape)[wide < lo_end - s32])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("bits", [2, 4, 8, 16])
def test_per_tensor_properties(bits, mode):
    rng = np.random.default_rng(_seed("per_tensor", bits, mode))
    lo, hi = _random_ranges(rng, 20, nonnegative=(mode == "unsigned_sym"))
    for mn, mx in zip(lo, hi):
        enc = encoding_from_range(mn, mx, bits, **MODES[mode])
        assert enc.is_per_tensor
        x = rng.uniform(float(enc.min) * 1.2, float(enc.max) * 1.2 + 1e-12, 200).astype(np.float32)
        once = fake_quantize(x, enc)
        np.testing.assert_array_equal(fake_quantize(once, enc), once)
        assert fake_quantize(np.float32(0.0), enc) == 0.0
        q = quantize(x, enc)
        assert q.min() >= enc.qmin and q.max() <= enc.qmax


def _loop_min_max(x, axis=None, block_axis=None, block_size=None):
    if axis is None:
        return x.min(), x.max()
    axis %= x.ndim
    mins, maxs = [], []
    for c in range(x.shape[axis]):
        if block_size is None:
            sl = [slice(None)] * x.ndim
            sl[axis] = c
            mins.append(x[tuple(sl)].min())
            maxs.append(x[tuple(sl)].max())
            continue
        b_axis = block_axis % x.ndim
        row_min, row_max = [], []
        for j in range(x.shape[b_axis] // block_size):
            sl = [slice(None)] * x.ndim
            sl[axis] = c
            sl[b_axis] = slice(j * block_size, (j + 1) * block_size)
            row_min.append(x[tuple(sl)].min())
            row_max.append(x[tuple(sl)].max())
        mins.append(row_min)
        maxs.append(row_max)
    return np.array(mins), np.array(maxs)


@pytest.mark.parametrize("trial", range(25))
def test_reduce_min_max_matches_loop(trial):
    rng = np.random.default_rng(_seed("reduce", trial))
    rank = int(rng.integers(1, 5))
    shape = [int(v) for v in rng.integers(1, 6, rank)]
    axis = int(rng.integers(-rank, rank))
    x = rng.normal(size=shape) * 10.0 ** rng.uniform(-3, 3)

    mn, mx = reduce_min_max(x)
    assert mn.shape == () and mn == x.min() and mx == x.max()
    for kwargs in ({"axis": axis},):
        got = reduce_min_max(x, **kwargs)
        want = _loop_min_max(x, **kwargs)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    if rank >= 2:
        b_axis = int(rng.choice([a for a in range(rank) if a != axis % rank]))
        block_size = int(rng.integers(1, 4))
        shape[b_axis] = block_size * int(rng.integers(1, 4))
        x = rng.normal(size=shape)
        for ax, bax in ((axis, b_axis), (axis % rank - rank, b_axis - rank)):  # also negative axes
            got = reduce_min_max(x, ax, bax, block_size)
            want = _loop_min_max(x, ax, bax, block_size)
            assert got[0].shape == (shape[axis], shape[b_axis] // block_size)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_reduce_min_max_rejects_ragged_blocks():
    with pytest.raises(ValueError):
        reduce_min_max(np.zeros((4, 10)), 0, 1, 4)


@pytest.mark.parametrize(
    "shape,axis,block_axis,block_size",
    [
        ((6, 16), 0, 1, 4),  # axis < block_axis (weight (C, K))
        ((16, 6), 1, 0, 4),  # axis > block_axis (MatMul weight (K, C))
        ((3, 5, 8, 2), 1, 2, 2),
        ((3, 5, 8, 2), 2, 0, 3),  # axis > block_axis, ragged last block
        ((3, 5, 8, 2), -1, -3, 5),  # negative axes, ragged
        ((4, 2, 6), -1, 0, 2),
    ],
)
def test_broadcast_param_per_block(shape, axis, block_axis, block_size):
    rng = np.random.default_rng(_seed("bcast", shape, axis, block_axis))
    pshape = _param_shape(shape, axis, block_axis, block_size)
    enc = Encoding(rng.uniform(0.1, 1.0, pshape), rng.integers(0, 256, pshape), 8, False, 0, 255,
                   axis=axis, block_axis=block_axis, block_size=block_size)
    for values in (enc.scale, enc.zero_point):
        got = broadcast_param(enc, values, shape)
        assert got.ndim == len(shape)
        np.testing.assert_array_equal(np.broadcast_to(got, shape),
                                      expand_param(values, shape, axis, block_axis, block_size))
    # the sim's ops agree with element-wise maths on the same layout
    x = rng.normal(size=shape).astype(np.float32)
    s = expand_param(enc.scale.astype(np.float32), shape, axis, block_axis, block_size)
    z = expand_param(enc.zero_point, shape, axis, block_axis, block_size)
    np.testing.assert_array_equal(quantize(x, enc), np.clip(np.rint(x / s) + z, 0, 255).astype(np.int64))


@pytest.mark.parametrize("shape,axis", [((5,), 0), ((4, 3), 0), ((4, 3), 1), ((2, 3, 4), -1), ((2, 3, 4), 1)])
def test_broadcast_param_per_axis_and_tensor(shape, axis):
    rng = np.random.default_rng(_seed("bcast_axis", shape, axis))
    c = shape[axis]
    enc = Encoding(rng.uniform(0.1, 1.0, c), 0, 8, True, -128, 127, axis=axis)
    got = broadcast_param(enc, enc.scale, shape)
    np.testing.assert_array_equal(np.broadcast_to(got, shape), expand_param(enc.scale, shape, axis))
    per_tensor = Encoding(0.5, 3, 8, False, 0, 255)
    assert np.ndim(broadcast_param(per_tensor, per_tensor.scale, shape)) == 0


# =================================================================================================
# 4. float16 simulation
# =================================================================================================
def _ort_fp16_cast_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT),
        ],
        "fp16_cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


FP16_CASES = [
    # (input, expected)
    (1.0, 1.0),
    (65504.0, 65504.0),  # float16 max
    (65519.99, 65504.0),  # just below the rounding boundary
    (65520.0, np.inf),  # tie -> rounds up to 2^16 -> overflow
    (1e5, np.inf),
    (-1e5, -np.inf),
    (3e38, np.inf),
    (2.0**-14, 2.0**-14),  # smallest normal
    (2.0**-24, 2.0**-24),  # smallest subnormal
    (3 * 2.0**-26, 2.0**-24),  # 0.75 ulp -> up
    (2.0**-25, 0.0),  # half the smallest subnormal: tie to even -> 0
    (1.5 * 2.0**-24, 2.0**-23),  # tie between 1 and 2 subnormal ulps -> even (2)
    (2.5 * 2.0**-24, 2.0**-23),  # tie between 2 and 3 -> even (2)
    (1e-9, 0.0),
    (-1e-9, -0.0),
    (1.0 + 2.0**-11, 1.0),  # tie -> even mantissa
    (1.0 + 3 * 2.0**-11, 1.0 + 2.0**-9),  # tie -> even mantissa (up)
    (0.1, 0.0999755859375),
    (np.inf, np.inf),
    (-np.inf, -np.inf),
    (np.nan, np.nan),
    (-0.0, -0.0),
]


def test_fp16_round_trip_hand_cases():
    x = np.array([c[0] for c in FP16_CASES], np.float32)
    want = np.array([c[1] for c in FP16_CASES], np.float32)
    got = fp16_round_trip(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_fp16_round_trip_matches_numpy_and_onnxruntime():
    rng = np.random.default_rng(_seed("fp16"))
    bits = rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32)
    near_range = rng.uniform(-7e4, 7e4, 20_000)
    tiny = rng.uniform(-2.0**-13, 2.0**-13, 20_000)
    x = np.concatenate([bits.view(np.float32), near_range.astype(np.float32), tiny.astype(np.float32)])
    got = fp16_round_trip(x)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))
    model = _ort_fp16_cast_model()
    for optimize in (True, False):
        ort_out = _run_ort(model, x, optimize=optimize)
        np.testing.assert_array_equal(got, ort_out)
        finite = ~np.isnan(got)
        np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(ort_out[finite]))
    # subnormals survive, out-of-range values become infinities
    assert np.any((got != 0) & (np.abs(got) < 2.0**-14))
    assert np.all(np.isinf(got[np.abs(x) >= 65520]))
    finite = np.isfinite(got) & (np.abs(x) >= 2.0**-14)
    assert np.all(np.abs(got[finite] - x[finite]) <= np.abs(x[finite]) * 2.0**-11)


def test_fp16_round_trip_accepts_lists_and_scalars():
    np.testing.assert_array_equal(fp16_round_trip([0.1, 70000.0]), np.array([0.0999755859375, np.inf], np.float32))
    assert fp16_round_trip(1.0).dtype == np.float32


@pytest.mark.parametrize("case", ["per_tensor_asym", "axis0", "axis_last", "block_axis0", "wide_grid", "fp16_input"])
def test_fake_quantize_in_slices_is_bit_identical(case, monkeypatch):
    """Big tensors are fake-quantized in row slices (cache-sized): the same bits as in one piece, -0.0,
    NaN and saturation included, and the element-wise formula of a Q->DQ pair."""
    import quantsim.core.numerics as numerics

    rng = np.random.default_rng(_seed("slices", case))
    shape = (37, 5, 6)
    x = rng.normal(scale=3.0, size=shape).astype(np.float32)
    x.flat[[0, 7, 100]] = [np.nan, np.inf, -np.inf]
    x.flat[[3, 5]] = [-0.0, -1e-9]
    axis, block_axis, block_size, bits, signed = {
        "per_tensor_asym": (None, None, None, 8, False), "axis0": (0, None, None, 8, True),
        "axis_last": (-1, None, None, 4, True), "block_axis0": (2, 0, 8, 8, True),
        "wide_grid": (1, None, None, 32, True), "fp16_input": (None, None, None, 16, False)}[case]
    pshape = () if axis is None else _param_shape(shape, axis, block_axis, block_size) if block_axis is not None \
        else (shape[axis],)
    qmin, qmax = grid_bounds(bits, signed=signed)
    zero_point = np.zeros(pshape, np.int64) if signed else rng.integers(0, qmax // 2, pshape)
    enc = Encoding(rng.uniform(0.01, 0.5, pshape), zero_point, bits, signed, qmin, qmax, signed,
                   axis=axis, block_axis=block_axis, block_size=block_size)
    if case == "fp16_input":
        x = x.astype(np.float16)
    whole = numerics._fake_quantize_whole(x, enc)
    whole_codes = numerics._float_codes(x, enc).astype(np.int64)
    monkeypatch.setattr(numerics, "FAKE_QUANTIZE_BLOCK", 64)  # slices of 2 rows of 30 values
    np.testing.assert_array_equal(numerics.quantize(x, enc), whole_codes)  # `quantize` slices alike
    if bits <= 8:
        narrow = np.int8 if signed else np.uint8
        codes = numerics.quantize(x, enc, narrow)
        assert codes.dtype == narrow and codes.shape == shape
        np.testing.assert_array_equal(codes, whole_codes.astype(narrow))
    sliced = fake_quantize(x, enc)
    assert sliced.dtype == np.float32 and sliced.shape == shape
    np.testing.assert_array_equal(sliced.view(np.uint32), whole.view(np.uint32))
    parts = list(numerics.fake_quantize_parts(x, enc))  # what a weight file takes block by block
    assert len(parts) == 19 and all(p.flags.c_contiguous and p.shape[1:] == shape[1:] for p in parts)
    np.testing.assert_array_equal(np.concatenate([p.reshape(-1) for p in parts]).view(np.uint32),
                                  whole.reshape(-1).view(np.uint32))
    if bits <= 16 and block_axis is None:  # the formula, element by element, in float64 (exact here)
        s = np.broadcast_to(broadcast_param(enc, enc.scale.astype(np.float32), shape), shape)
        z = np.broadcast_to(broadcast_param(enc, enc.zero_point, shape), shape)
        xf = np.nan_to_num(x.astype(np.float32), nan=-np.inf)
        with np.errstate(over="ignore", invalid="ignore"):
            codes = np.clip(np.rint((xf / s).astype(np.float32)) + z, qmin, qmax)
        np.testing.assert_array_equal(sliced, ((codes - z) * s).astype(np.float32))
