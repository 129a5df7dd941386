"""The fast paths that cut `compute_encodings`' fixed cost compute exactly what the plain paths compute.

1. `encoding_from_range` on scalars (Python floats) against its array path on one-element arrays, over
   seeded random and edge-case ranges, every bitwidth 2..16 and every symmetric/strict/unsigned flag.
2. `quantize` / `fake_quantize` (float codes) against the integer formulation (float64 codes, int64
   zero points) bit for bit, including NaN/inf/huge inputs, signed zeros and grids wider than 2^23.
3. `reduce_min_max` in the input's own type against reducing a float64 copy.
4. `GraphIndex.cached_constants`: one read-only array per initializer inside the block, none after.
5. `build_sim_model(external=...)`: the placeholders plus the arrays are exactly the full model; the
   caller's model is untouched; sessions with in-memory weights (small and "large" models) and the
   calibration session give the same bits as sessions of the full model.
6. `find_nonnegative_tensors` with constants on either side of Add/Mul and big constants.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from models import make_model
from onnx import TensorProto, helper, numpy_helper

import quantsim
import quantsim.graph.session as session_module
import quantsim.sim.model as sim_model_module
from quantsim.core.numerics import Encoding, broadcast_param, encoding_from_range, fake_quantize, quantize, reduce_min_max
from quantsim.graph.index import GraphIndex
from quantsim.graph.model_io import IN_MEMORY_LOCATION, IN_MEMORY_MIN_BYTES
from quantsim.graph.session import make_session
from quantsim.graph.tensor_roles import find_nonnegative_tensors
from quantsim.sim.build import build_sim_model

FLAGS = [dict(symmetric=s, strict=t, unsigned_symmetric=u) for s in (False, True) for t in (False, True)
         for u in (False, True)]
EDGES = [0.0, -0.0, 1e-30, -1e-30, 1e-9, -1e-9, 1.5e-7, -3.7e-8, 2.0 ** -24, 1.0, -1.0, 0.5, -0.5, 127.5, -128.0,
         255.0, 1e308, -1e308, 5e-324, -5e-324, np.inf, -np.inf, np.nan]


def _outcome(lo, hi, bits, flags, as_array):
    try:
        if as_array:
            enc = encoding_from_range(np.array([lo], np.float64), np.array([hi], np.float64), bits, **flags)
            return ("ok", float(enc.scale[0]), int(enc.zero_point[0]), enc.qmin, enc.qmax, enc.signed, enc.symmetric)
        enc = encoding_from_range(lo, hi, bits, **flags)
        assert enc.scale.shape == enc.zero_point.shape == () and enc.scale.dtype == np.float64
        assert enc.zero_point.dtype == np.int64
        return ("ok", float(enc.scale), int(enc.zero_point), enc.qmin, enc.qmax, enc.signed, enc.symmetric)
    except ValueError as error:
        return ("error", str(error))


def _ranges(rng, count):
    for _ in range(count):
        pair = []
        for _ in range(2):
            pick = rng.random()
            if pick < 0.3:
                pair.append(EDGES[rng.integers(len(EDGES))])
            elif pick < 0.6:
                pair.append(float(rng.standard_normal() * 10.0 ** rng.integers(-12, 12)))
            else:
                pair.append(float(np.float32(rng.standard_normal() * 10.0 ** rng.integers(-8, 8))))
        lo, hi = pair
        if rng.random() < 0.1:
            hi = -lo  # symmetric about zero
        yield lo, hi


def _ties(bits):
    """Ranges whose zero point ``-min / scale`` is exactly ``z + 0.5`` (rounded away from zero)."""
    steps = (1 << bits) - 1
    floor = min(float(np.finfo(np.float32).eps), 0.01 / steps)
    ties = [(-(z + 0.5), steps - z - 0.5) for z in {0, 1, steps // 2, max(0, steps - 2)}]  # scale 1
    return ties + [(-2.5 * floor, 0.0), (-1.5 * floor, 0.0)]  # scale at the floor


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the array path warns on overflowing ranges
def test_scalar_encoding_from_range_equals_the_array_path():
    rng = np.random.default_rng(7)
    checked = 0
    for bits in range(2, 17):
        for flags in FLAGS:
            for lo, hi in list(_ranges(rng, 150)) + _ties(bits) + [(a, b) for a in (0.0, -1e-12, -2.0)
                                                                     for b in (0.0, 1e-12, 3.0)]:
                scalar, array = _outcome(lo, hi, bits, flags, False), _outcome(lo, hi, bits, flags, True)
                assert scalar == array, (lo, hi, bits, flags)
                checked += scalar[0] == "ok"
    assert checked > 10000
    # other scalar types take the same path: numpy scalars, 0-d arrays, ints
    for lo, hi in [(np.float32(-0.3), np.float32(1.7)), (np.asarray(-2.0), np.asarray(0.25)), (-3, 5)]:
        scalar = _outcome(lo, hi, 8, FLAGS[0], False)
        assert scalar == _outcome(float(lo), float(hi), 8, FLAGS[0], True)


def test_scalar_encoding_from_range_keeps_the_documented_edge_cases():
    empty = encoding_from_range(np.inf, -np.inf, 8, symmetric=False)  # no data: the range [0, 0]
    assert float(empty.scale) == min(float(np.finfo(np.float32).eps), 0.01 / 255) and int(empty.zero_point) == 0
    with pytest.raises(ValueError, match="non-finite"):
        encoding_from_range(np.nan, 1.0, 8, symmetric=True)
    with pytest.raises(ValueError, match="non-finite"):
        encoding_from_range(-np.inf, 1.0, 8, symmetric=False)
    with pytest.raises(ValueError, match="finite and positive"):
        Encoding(np.nan, 0, 8, False, 0, 255)
    with pytest.raises(ValueError, match="zero point outside"):
        Encoding(1.0, 256, 8, False, 0, 255)
    zero_point = np.array(3)
    enc = Encoding(0.5, zero_point, 8, False, 0, 255)
    zero_point[...] = 9  # the encoding owns its arrays
    assert int(enc.zero_point) == 3


def _reference_codes(x, enc):
    """The integer formulation: float32 division, ties to even, float64 codes, int64 zero points."""
    x = np.asarray(x, dtype=np.float32)
    scale = broadcast_param(enc, enc.scale.astype(np.float32), x.shape)
    zp = broadcast_param(enc, enc.zero_point, x.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.rint(x / scale).astype(np.float64) + zp
    q = np.where(np.isnan(q), enc.qmin, q)
    return np.clip(q, enc.qmin, enc.qmax).astype(np.int64)


def _reference_fake(x, enc):
    codes = _reference_codes(x, enc)
    scale = broadcast_param(enc, enc.scale.astype(np.float32), codes.shape)
    zp = broadcast_param(enc, enc.zero_point, codes.shape)
    return (codes - zp).astype(np.float32) * scale


def _values(rng, shape):
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 4)).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45, -1e-45, -1e-30], np.float32)
    index = rng.integers(0, flat.size, max(1, flat.size // 8))
    flat[index] = rng.choice(specials, index.size)
    return x


@pytest.mark.parametrize("layout", ["tensor", "channel", "block"])
def test_float_codes_equal_the_integer_formulation(layout):
    rng = np.random.default_rng(11)
    shape = (4, 6, 5)
    for bits in list(range(2, 17)) + [20, 24, 26]:
        for flags in FLAGS:
            finite = rng.standard_normal(shape).astype(np.float32) * np.float32(rng.choice([1e-6, 1.0, 1e3]))
            if rng.random() < 0.3:
                finite = np.abs(finite)
            extra = {}
            if layout == "tensor":
                lo, hi = reduce_min_max(finite)
            elif layout == "channel":
                lo, hi = reduce_min_max(finite, 1)
                extra = dict(axis=1)
            else:
                lo, hi = reduce_min_max(finite, 0, 1, 3)
                extra = dict(axis=0, block_axis=1, block_size=3)
            enc = encoding_from_range(lo, hi, bits, **flags, **extra)
            for x in (_values(rng, shape), finite, _values(rng, shape).astype(np.float64)):
                codes = quantize(x, enc)
                assert codes.dtype == np.int64 and np.array_equal(codes, _reference_codes(x, enc))
                fake, reference = fake_quantize(x, enc), _reference_fake(x, enc)
                assert fake.dtype == np.float32 and fake.tobytes() == reference.tobytes()  # signed zeros too


def test_zero_dimensional_inputs_give_numpy_scalars():
    enc = encoding_from_range(-1.0, 2.0, 8, symmetric=False)
    for x in (np.asarray(np.float32(0.7)), np.float32(-5.0), 0.3):
        assert type(quantize(x, enc)) is np.int64 and quantize(x, enc) == _reference_codes(x, enc)
        assert type(fake_quantize(x, enc)) is np.float32 and fake_quantize(x, enc) == _reference_fake(x, enc)


def test_reduce_min_max_in_the_input_type_equals_float64():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4, 8)).astype(np.float32)
    x[1, 2, 3] = np.nan
    for values in (x, x.astype(np.float16), (np.nan_to_num(x) * 1000).astype(np.int64), x > 0,
                   np.nan_to_num(x) - 1e30):
        wide = np.asarray(values, dtype=np.float64)
        for args in ((), (1,), (-1,), (0, 2, 4)):
            got, expected = reduce_min_max(values, *args), _reference_min_max(wide, *args)
            for a, b in zip(got, expected):
                assert a.dtype == np.float64 and a.shape == b.shape and a.tobytes() == b.tobytes()


def _reference_min_max(x, axis=None, block_axis=None, block_size=None):
    if axis is None:
        return np.asarray(x.min()), np.asarray(x.max())
    axis %= x.ndim
    if block_size is None:
        moved = np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)
        return moved.min(axis=1), moved.max(axis=1)
    moved = np.moveaxis(x, (axis, block_axis), (0, 1))
    blocks = moved.reshape(x.shape[axis], x.shape[block_axis] // block_size, -1)
    return blocks.min(axis=2), blocks.max(axis=2)


def _model(channels: int = 16):
    """Conv (weights of 4.5 KiB) -> Relu -> Add(negative constant) -> Mul(big non-negative constant) -> Conv."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((4, channels, 1, 1)) * 0.3).astype(np.float32)
    shift = -np.abs(rng.standard_normal((1, channels, 1, 1))).astype(np.float32)
    gain = np.abs(rng.standard_normal((1, channels, 8, 8))).astype(np.float32) + 0.5
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Mul", ["gain", "r1"], ["m1"], name="mul1"),
        helper.make_node("Add", ["shift", "m1"], ["a1"], name="add1"),
        helper.make_node("Conv", ["a1", "w2"], ["y"], name="conv2"),
    ]
    inits = [numpy_helper.from_array(v, n) for n, v in
             [("w1", w1), ("b1", np.zeros(channels, np.float32)), ("w2", w2), ("shift", shift), ("gain", gain)]]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])], inits)
    feeds = [{"x": np.random.default_rng(s).standard_normal((2, 3, 8, 8)).astype(np.float32)} for s in range(3)]
    return model, feeds


def _sim(**kwargs):
    model, feeds = _model()
    sim = quantsim.QuantizationSimModel(model, progress=False, **kwargs)
    sim.compute_encodings(feeds)
    return sim, feeds


def test_cached_constants_convert_once_and_are_dropped_after_the_block():
    model, _ = _model()
    index = GraphIndex(model)
    assert index.constant_value("w1") is not index.constant_value("w1")
    with index.cached_constants():
        first = index.constant_value("w1")
        with index.cached_constants():
            assert index.constant_value("w1") is first
        assert index.constant_value("w1") is first  # the inner block does not drop the outer cache
        assert not first.flags.writeable
        np.testing.assert_array_equal(first, numpy_helper.to_array(model.graph.initializer[0]))
    assert index.constant_value("w1") is not first


def _assemble(light: onnx.ModelProto, arrays: dict) -> onnx.ModelProto:
    full = onnx.ModelProto()
    full.CopyFrom(light)
    for tensor in full.graph.initializer:
        if tensor.name in arrays:
            assert tensor.data_location == TensorProto.EXTERNAL
            assert [(e.key, e.value) for e in tensor.external_data] == [("location", IN_MEMORY_LOCATION)]
            tensor.CopyFrom(numpy_helper.from_array(arrays[tensor.name], tensor.name))
    return full


@pytest.mark.parametrize("weights", ["fake", "qdq"])
def test_in_memory_weights_reassemble_to_the_full_model(weights):
    sim, _ = _sim()
    before = sim.model.SerializeToString(deterministic=True)
    full = build_sim_model(sim.model, sim.quantizers, weights=weights)
    arrays: dict = {}
    with sim._index.cached_constants():
        light = build_sim_model(sim.model, sim.quantizers, weights=weights, source=sim._index, external=arrays)
    assert set(arrays) == ({"w1", "gain"} if weights == "fake" else {"gain"})  # w2 and the biases are small
    assert all(a.nbytes >= IN_MEMORY_MIN_BYTES for a in arrays.values())
    assert _assemble(light, arrays).SerializeToString(deterministic=True) == full.SerializeToString(deterministic=True)
    assert sim.model.SerializeToString(deterministic=True) == before  # the caller's model is never modified


def _bits(outputs):
    return [(o.dtype, o.shape, o.tobytes()) for o in outputs]


def test_sessions_with_in_memory_weights_match_the_full_model(monkeypatch):
    sim, feeds = _sim()
    reference = make_session(sim.sim_model())
    for feed in feeds:
        assert _bits(sim.session.run(None, feed)) == _bits(reference.run(None, feed))
    # the calibration session: same statistics, so the same encodings, without in-memory weights
    calibrated = {q.name: (q.encoding.scale.tobytes(), q.encoding.zero_point.tobytes()) for q in sim.quantizers
                  if q.encoding is not None}
    real_build = sim_model_module.build_sim_model
    monkeypatch.setattr(sim_model_module, "build_sim_model",
                        lambda *args, external=None, **kwargs: real_build(*args, **kwargs))
    plain, _ = _sim()
    assert calibrated == {q.name: (q.encoding.scale.tobytes(), q.encoding.zero_point.tobytes())
                          for q in plain.quantizers if q.encoding is not None}


def test_large_model_path_with_in_memory_weights(monkeypatch):
    import importlib

    common = importlib.import_module("quantsim.graph.large_models")
    sim, feeds = _sim()
    expected = [_bits(sim.session.run(None, feed)) for feed in feeds]
    monkeypatch.setattr(common, "LARGE_MODEL_BYTES", 512)  # the rest of the model still counts as large
    sources = []
    real_source = session_module.session_model_source
    monkeypatch.setattr(session_module, "session_model_source",
                        lambda model: sources.append(real_source(model)) or sources[-1])
    sim._invalidate()
    assert [_bits(sim.session.run(None, feed)) for feed in feeds] == expected
    assert isinstance(sources[0][0], str)  # a file path: the large-model route


def test_nonnegative_tensors_with_constants_on_either_side():
    model, _ = _model()
    found = find_nonnegative_tensors(GraphIndex(model))
    assert "r1" in found and "m1" in found  # Relu, then Mul by a non-negative constant given first
    assert "a1" not in found  # plus a negative constant
    # a big constant whose first elements are non-negative but a later one is negative
    gain = numpy_helper.to_array(model.graph.initializer[4]).copy()
    gain.reshape(-1)[-1] = -1.0
    model.graph.initializer[4].CopyFrom(numpy_helper.from_array(gain, "gain"))
    assert "m1" not in find_nonnegative_tensors(GraphIndex(model))
