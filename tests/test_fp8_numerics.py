"""FP8 numerics (`quantsim.core.fp8`, the float8 paths of `quantsim.core.numerics`) against independent oracles.

1. The formats' values: the table decoded from the bit fields by `format_values` against every one of the 256
   codes decoded by onnx (``numpy_helper.to_array`` of a raw float8 tensor) and hand-written facts (largest
   finite value, smallest subnormal, count of distinct finite values).
2. Rounding: `round_to_format` against onnx's reference QuantizeLinear (float8 zero point, ``saturate=1``) on every
   value of the format, every midpoint between neighbours (exact ties), the float32 neighbours of each
   midpoint, values beyond the largest finite one, infinities, NaN, signed zeros and random magnitudes; plus a
   hand-worked table of ties and saturation.
3. `quantize` / `fake_quantize` with float8 encodings (per tensor and per axis) against QuantizeLinear ->
   DequantizeLinear run by onnx's reference evaluator and by onnxruntime, bit for bit.
4. `fp8_encoding` and the helpers that derive it from ranges and integer grids (AIMET 2.42's rule).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantsim import float8e4m3fn, float8e5m2, qtype
from quantsim.core.dtypes import QuantizationDataType
from quantsim.core.fp8 import FP8_FORMATS, format_values, round_to_format
from quantsim.core.fp8_encodings import fp8_encoding, fp8_encoding_from_grid, fp8_encoding_from_range
from quantsim.core.numerics import encoding_from_range, fake_quantize, quantize
from quantsim.errors import InvalidArgumentError

ONNX_TYPES = {"float8e4m3fn": TensorProto.FLOAT8E4M3FN, "float8e5m2": TensorProto.FLOAT8E5M2}
FORMATS = sorted(FP8_FORMATS)


def _onnx_decoded_codes(name: str) -> np.ndarray:
    """All 256 codes of the format decoded by onnx itself (a raw-data float8 tensor), as float64."""
    tensor = helper.make_tensor("codes", ONNX_TYPES[name], [256], bytes(range(256)), raw=True)
    return numpy_helper.to_array(tensor).astype(np.float64)


@pytest.mark.parametrize("name, top, tiny, count", [
    ("float8e4m3fn", 448.0, 2.0 ** -9, 253),  # 256 codes - 2 NaN codes - the second zero
    ("float8e5m2", 57344.0, 2.0 ** -16, 247),  # 256 codes - 2 inf - 6 NaN - the second zero
])
def test_format_table_against_onnx_decoding(name, top, tiny, count):
    fmt = FP8_FORMATS[name]
    values = format_values(fmt)
    decoded = _onnx_decoded_codes(name)
    assert np.array_equal(values, np.unique(decoded[np.isfinite(decoded)]))
    assert (fmt.max_value, fmt.min_subnormal, len(values)) == (top, tiny, count)
    assert values[-1] == top and values[values > 0][0] == tiny
    assert np.isnan(decoded).sum() == (2 if name == "float8e4m3fn" else 6)
    assert np.isinf(decoded).sum() == (0 if name == "float8e4m3fn" else 2)


def _reference_quantize(x: np.ndarray, name: str) -> np.ndarray:
    """onnx's reference QuantizeLinear (scale 1, float8 zero point 0, saturate=1) then DequantizeLinear."""
    zp = helper.make_tensor("zp", ONNX_TYPES[name], [], [0.0])
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], saturate=1),
         helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "s"), zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    return ReferenceEvaluator(model).run(None, {"x": x.astype(np.float32)})[0]


def _probe_values(name: str) -> np.ndarray:
    """Every value, every midpoint between neighbours and its float32 neighbours, beyond-range, special values."""
    values = format_values(FP8_FORMATS[name]).astype(np.float32)
    mids = ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)  # exact in float32
    top = np.float32(FP8_FORMATS[name].max_value)
    rng = np.random.default_rng(7)
    randoms = (rng.standard_normal(20000) * 10.0 ** rng.integers(-8, 7, 20000)).astype(np.float32)
    beyond = np.array([top * 1.03, top * 1.0625, top * 1.2, top * 1000, 3e38], np.float32)
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -1e-30, 1e-45], np.float32)
    return np.concatenate([values, mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf)), beyond, -beyond, randoms, specials])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, NaN where NaN, and the same sign of zero."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return bool(np.all(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("name", FORMATS)
def test_rounding_matches_onnx_reference_quantize_linear(name):
    x = _probe_values(name)
    assert _same(round_to_format(x, FP8_FORMATS[name]), _reference_quantize(x, name))


@pytest.mark.parametrize("name, x, expected", [
    # ties between neighbours go to the even mantissa
    ("float8e4m3fn", 1.0625, 1.0), ("float8e4m3fn", 1.1875, 1.25), ("float8e4m3fn", -1.0625, -1.0),
    ("float8e4m3fn", 2.0 ** -10, 0.0), ("float8e4m3fn", 3 * 2.0 ** -10, 2.0 ** -8),  # subnormal ties
    ("float8e5m2", 1.125, 1.0), ("float8e5m2", 1.375, 1.5), ("float8e5m2", 2.0 ** -17, 0.0),
    # carry into the next binade
    ("float8e4m3fn", 1.96875, 2.0), ("float8e5m2", 1.875, 2.0),
    # saturation at the largest finite value (infinities included), NaN kept
    ("float8e4m3fn", 464.0, 448.0), ("float8e4m3fn", 1e9, 448.0), ("float8e4m3fn", -np.inf, -448.0),
    ("float8e5m2", 61440.0, 57344.0), ("float8e5m2", np.inf, 57344.0), ("float8e5m2", -1e30, -57344.0),
    ("float8e4m3fn", np.nan, np.nan), ("float8e5m2", np.nan, np.nan),
])
def test_rounding_hand_worked(name, x, expected):
    got = round_to_format(np.float32(x), FP8_FORMATS[name])
    assert _same(got, np.float32(expected)), (x, got)


def test_negative_zero_kept():
    got = round_to_format(np.array([-1e-30, -0.0], np.float32), FP8_FORMATS["float8e4m3fn"])
    assert np.all(got == 0) and np.all(np.signbit(got))


def _qdq_model(scale: np.ndarray, name: str, shape, axis: int | None) -> onnx.ModelProto:
    zp = helper.make_tensor("zp", ONNX_TYPES[name], list(scale.shape), [0.0] * scale.size)
    attrs = {} if axis is None else {"axis": axis}
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], **attrs),
         helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape)),
         helper.make_tensor_value_info("q", ONNX_TYPES[name], list(shape))],
        [numpy_helper.from_array(scale.astype(np.float32), "s"), zp])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("axis", [None, 1])
def test_fake_quantize_matches_reference_and_onnxruntime(name, axis):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 3, 40)) * 4).astype(np.float32)
    x[0, :, :6] = [[np.inf, -np.inf, np.nan, 1e30, -0.0, 5e-8]] * 3
    amax = np.float64(2.5) if axis is None else np.array([0.01, 2.0, 300.0])
    enc = fp8_encoding(amax, name, axis=axis)
    model = _qdq_model(enc.scale, name, x.shape, axis)
    y_ref, q_ref = ReferenceEvaluator(model).run(None, {"x": x})
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    y_ort = ort.InferenceSession(model.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    y = fake_quantize(x, enc)
    assert _same(y, y_ref) and _same(y, y_ort)
    assert _same(quantize(x, enc), q_ref.astype(np.float32))


def test_fake_quantize_in_row_slices_is_the_same(monkeypatch):
    import quantsim.core.numerics as numerics

    x = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32) * 30
    enc = fp8_encoding(np.abs(x).max(axis=1), "float8e4m3fn", axis=0)
    whole = fake_quantize(x, enc)
    monkeypatch.setattr(numerics, "FAKE_QUANTIZE_BLOCK", 100)  # slices of 3 rows
    assert _same(fake_quantize(x, enc), whole)
    assert _same(np.concatenate(list(numerics.fake_quantize_parts(x, enc))), whole)


def test_fp8_encoding_rule():
    enc = fp8_encoding_from_range(-3.0, 7.0, "float8e4m3fn")
    assert float(enc.scale) == 7.0 / 448 and int(enc.zero_point) == 0 and enc.symmetric
    assert (float(enc.min), float(enc.max)) == (-7.0, 7.0)
    assert float(fp8_encoding_from_range(-3.0, 7.0, "float8e5m2").scale) == 7.0 / 57344
    # AIMET's verified example: [-3, 7] would be scale 0.015625 for amax 7 only if max were 448: 7/448
    assert float(fp8_encoding(7.0, "float8e4m3fn").scale) == 0.015625
    assert float(fp8_encoding(0.0, "float8e4m3fn").scale) == float(np.finfo(np.float32).tiny)
    per_channel = fp8_encoding_from_range(np.array([-1.0, 0.0]), np.array([0.5, 2.0]), "float8e5m2", axis=0)
    assert np.array_equal(per_channel.scale, np.array([1.0, 2.0]) / 57344) and per_channel.axis == 0
    with pytest.raises(InvalidArgumentError, match="non-finite"):
        fp8_encoding(np.inf, "float8e4m3fn")


def test_fp8_encoding_from_integer_grid_uses_the_grids_bounds():
    grid = encoding_from_range(-3.7, 40.0, 8, symmetric=False)  # asymmetric: max moves onto the grid
    enc = fp8_encoding_from_grid(grid, "float8e4m3fn")
    assert float(enc.scale) == max(abs(float(grid.min)), abs(float(grid.max))) / 448
    assert fp8_encoding_from_grid(enc, "float8e4m3fn") is enc
    blocked = encoding_from_range(np.zeros((2, 2)) - 1, np.ones((2, 2)), 4, symmetric=True, axis=0, block_axis=1,
                                  block_size=8)
    with pytest.raises(InvalidArgumentError, match="per block"):
        fp8_encoding_from_grid(blocked, "float8e4m3fn")


def test_qtypes():
    assert float8e4m3fn == qtype.float(4, 3, finite=True) == qtype.from_string("float8e4m3fn")
    assert float8e5m2 == qtype.float(5, 2) == qtype.as_qtype("float8e5m2")
    assert (repr(float8e4m3fn), repr(float8e5m2)) == ("float8e4m3fn", "float8e5m2")
    assert float8e4m3fn.is_float and float8e4m3fn.is_fp8 and not float8e4m3fn.is_cast_float
    assert float8e4m3fn.to_legacy_repr() == (QuantizationDataType.float, 8)
    assert qtype.from_legacy_repr(QuantizationDataType.float, 8) == float8e4m3fn  # AIMET's choice
    assert float8e4m3fn.storage_type(True) == TensorProto.FLOAT8E4M3FN and float8e5m2.min_opset() == 19
    for unsupported in ((4, 3), (5, 2, True, True), (4, 3, True, True), (3, 4)):
        with pytest.raises(InvalidArgumentError, match="not supported"):
            qtype.float(*unsupported)
