"""End-to-end fidelity of the sim against an independent oracle, hand-computed encodings, placement facts
and round trips (export/load, QDQ export/import).

1. Oracle: the float model the sim is built on (``sim.model``: the user's model after ``prepare``, which
   is checked against the user's model in float) is evaluated node by node with
   ``onnx.reference.ReferenceEvaluator`` (one single-node graph per node) and a fake quantizer written here
   from scratch, applied at exactly the tensors whose quantizer is enabled (weights: initializers replaced
   by their fake-quantized values; activations: model inputs and node outputs). Only the *encodings* come
   from the sim. The sim's onnxruntime output must agree within a tolerance stated in output quantization
   steps (brevitas style): ``<= 1`` step for at least 99 % of the elements, ``<= 2`` steps for all and the
   same grid point for 95 % (a float difference between onnxruntime and the reference evaluator may flip
   one rounding, which can then travel downstream; 16-bit grids get a wider, stated tolerance). In
   practice they agree exactly at 4..8 bits, except at exact ties (see the AveragePool test).
2. Hand-computed encodings: AIMET's asymmetric formula for a model input with known extremes, per-channel
   symmetric weight scales per output channel with the channel axis of Conv, Gemm (transB 1/0), MatMul.
3. Placement facts with the default (per-channel) config.
4. Round trips: export -> load_encodings_to_sim (0.6.1, 1.0.0, 2.0.0) exact; to_onnx_qdq in a default
   onnxruntime session; from_onnx_qdq(to_onnx_qdq()); checker on the sim and QDQ models.
5. Quant schemes (tf_enhanced, percentile) and other activation types (int4, int16, 6-bit, float16).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import BUILDERS, avgpool_ties
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import quantsim
from quantsim import PerChannel, QuantizationSimModel

ALL_MODELS = sorted(BUILDERS)
CALIBRATION_SEEDS = (0, 1, 2)
EVAL_SEEDS = (0, 100)
BATCH = 2


# =================================================================================================
# oracle
# =================================================================================================
def fake_quant(x: np.ndarray, enc) -> np.ndarray:
    """``q = clip(rint(x / s) + zp, qmin, qmax)``; ``(q - zp) * s``, in float32, per tensor or per axis."""
    x = np.asarray(x, dtype=np.float32)
    scale = np.asarray(enc.scale, dtype=np.float64).astype(np.float32)
    zp = np.asarray(enc.zero_point, dtype=np.float64)
    if scale.ndim:
        assert enc.block_size is None, "blocked encodings are not used in these tests"
        view = [1] * x.ndim
        view[enc.axis % x.ndim] = scale.shape[0]
        scale, zp = scale.reshape(view), zp.reshape(view)
    q = np.clip(np.rint(x / scale).astype(np.float64) + zp, enc.qmin, enc.qmax)
    return (q - zp).astype(np.float32) * scale


def fp16_cast(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def quantizer_functions(sim) -> dict:
    """``{tensor: x -> x'}`` for every tensor whose quantizer is enabled (and calibrated), and the biases the
    sim puts on the int32 grid (`int32_bias_functions`)."""
    functions = {}
    for name, q in sim.qc_quantize_op_dict.items():
        if not q.enabled:
            continue
        if q.spec.is_float:
            functions[name] = fp16_cast
        else:
            assert q.encoding is not None, f"enabled quantizer {name!r} has no encoding after calibration"
            functions[name] = lambda x, enc=q.encoding: fake_quant(x, enc)
    functions.update(int32_bias_functions(sim, sim.model))
    return functions


def int32_bias_functions(sim, model: onnx.ModelProto) -> dict:
    """``{bias: b -> b'}`` for the biases the sim adds on the int32 accumulator grid (``int32_bias=True``, as the
    exports do): ``round(b / (s_in * s_w)) * (s_in * s_w)`` in float32, where the Conv/ConvTranspose/Gemm's data
    input (through data movement) and weight are quantized on integer grids and the bias has no quantizer."""
    from quantsim.graph.op_facts import GRID_MOVEMENT_OPS

    if not sim.int32_bias:
        return {}
    producer = {o: n for n in model.graph.node for o in n.output}
    uses: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    constants = {t.name for t in model.graph.initializer}

    def grid_of(name):
        q = sim.qc_quantize_op_dict.get(name)
        return q.encoding if q is not None and q.enabled and not q.spec.is_float and q.encoding is not None \
            and q.encoding.fp8 is None else None

    functions = {}
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(node.input) < 3 or node.input[2] not in constants:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Gemm" and (attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0
                                       or attrs.get("transA", 0)):
            continue
        bias, x = node.input[2], node.input[0]
        own = sim.qc_quantize_op_dict.get(bias)
        if uses[bias] != 1 or (own is not None and own.enabled):
            continue
        while sim.qc_quantize_op_dict.get(x) is None or not sim.qc_quantize_op_dict[x].enabled:
            if x not in producer or producer[x].op_type not in GRID_MOVEMENT_OPS:
                break
            x = producer[x].input[0]
        x_enc, w_enc = grid_of(x), grid_of(node.input[1])
        if x_enc is None or w_enc is None or np.ndim(x_enc.scale) or w_enc.block_size is not None:
            continue
        grid = (np.float32(x_enc.scale) * np.asarray(w_enc.scale, np.float32)).astype(np.float32).reshape(-1)
        functions[bias] = lambda b, g=grid: (np.rint(np.asarray(b, np.float32) / g).astype(np.float32) * g
                                             ).astype(np.float32)
    return functions


class Oracle:
    """Node-by-node float evaluation with the reference evaluator and fake quantization in between."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        self.initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.cache: dict = {}

    def _evaluator(self, position: int, node: onnx.NodeProto, inputs: dict) -> ReferenceEvaluator:
        key = (position, tuple((n, v.dtype.str) for n, v in inputs.items()))
        if key not in self.cache:
            graph = helper.make_graph(
                [node], f"node{position}",
                [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
                 for n, v in inputs.items()],
                [helper.make_empty_tensor_value_info(o) for o in node.output if o],
            )
            self.cache[key] = ReferenceEvaluator(graph, opsets={"": self.opset})
        return self.cache[key]

    def run(self, feed: dict, quantizers: dict) -> list[np.ndarray]:
        env = {}
        for name, value in list(self.initializers.items()) + list(feed.items()):
            env[name] = quantizers[name](value) if name in quantizers else value
        for position, node in enumerate(self.model.graph.node):
            inputs = {n: env[n] for n in dict.fromkeys(node.input) if n}
            outputs = self._evaluator(position, node, inputs).run(None, inputs)
            for name, value in zip([o for o in node.output if o], outputs):
                value = np.asarray(value)
                if value.dtype == np.float64:
                    value = value.astype(np.float32)
                env[name] = quantizers[name](value) if name in quantizers else value
        return [env[o.name] for o in self.model.graph.output]


def make_sim(model, feeds, calibrate=True, **kwargs) -> QuantizationSimModel:
    # One quantizer after a depthwise Conv and its activation: these tests bound export/sim differences in output
    # steps, and AIMET's placement (the depthwise output on its own grid, `test_aimet_placement`) puts a grid up to
    # 5x coarser than the output's before the Clip, where one step of it is several output steps.
    kwargs.setdefault("depthwise_supergroups", True)
    sim = QuantizationSimModel(model, progress=False, **kwargs)
    if calibrate:
        sim.compute_encodings([feeds(seed, BATCH) for seed in CALIBRATION_SEEDS])
    return sim


def output_step(sim, name: str) -> float:
    q = sim.qc_quantize_op_dict.get(name)
    assert q is not None and q.enabled and not q.spec.is_float, f"graph output {name!r} is not int-quantized"
    return float(np.float32(q.encoding.scale))


def assert_within_steps(actual, expected, step, *, label="", one_step_fraction=0.99, max_steps=2.0,
                        exact_fraction=0.0):
    """Brevitas-style: ``|a - e| <= 1`` step for ``one_step_fraction`` of the elements, ``<= max_steps`` for all,
    and (both on one grid) the same grid point for ``exact_fraction`` of them."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    steps = np.abs(actual - expected) / step
    slack = 1e-3
    exact = float(np.mean(steps < 0.5))
    assert exact >= exact_fraction, f"{label}: only {exact:.2%} of elements on the same grid point"
    within_one = float(np.mean(steps <= 1 + slack))
    assert within_one >= one_step_fraction, f"{label}: only {within_one:.2%} of elements within 1 step"
    assert steps.max() <= max_steps + slack, f"{label}: max error {steps.max():.2f} steps > {max_steps}"


#: the oracle's default tolerance (8-bit and narrower grids); in practice sim and oracle agree exactly
INT8_TOLERANCE = {"one_step_fraction": 0.99, "max_steps": 2.0, "exact_fraction": 0.95}
#: 16-bit: float differences between onnxruntime and the reference evaluator (~1e-7 relative) are ~1 % of
#: a 16-bit step instead of ~0.004 % of an 8-bit one, so rounding flips are frequent enough that a few
#: of them can meet in one output element (seen: up to 3 steps, ~96 % exact on the softmax output)
INT16_TOLERANCE = {"one_step_fraction": 0.9, "max_steps": 4.0, "exact_fraction": 0.8}


def check_against_oracle(sim, model, feeds, seeds=EVAL_SEEDS, batch=BATCH, **tolerance) -> None:
    tolerance = {**INT8_TOLERANCE, **tolerance}
    oracle, functions = Oracle(sim.model), quantizer_functions(sim)
    names = [o.name for o in model.graph.output]
    for seed in seeds:
        feed = feeds(seed, batch)
        got = sim.session.run(None, feed)
        want = oracle.run(feed, functions)
        for name, g, w in zip(names, got, want):
            assert_within_steps(g, w, output_step(sim, name), label=f"{name} seed {seed}", **tolerance)


# =================================================================================================
# 1. oracle
# =================================================================================================
@pytest.mark.parametrize("name", ALL_MODELS)
def test_sim_matches_oracle_int8(name):
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds)
    check_against_oracle(sim, model, feeds)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_prepared_model_is_the_float_model(name):
    """The oracle evaluates ``sim.model`` (the prepared float model: BatchNormalization folded, ...); here
    that model is checked against the user's model in float, with onnxruntime."""
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds, calibrate=False)
    assert [o.name for o in sim.model.graph.output] == [o.name for o in model.graph.output]
    assert [i.name for i in sim.model.graph.input if i.name not in {t.name for t in sim.model.graph.initializer}] \
        == [i.name for i in model.graph.input]
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prepared = ort.InferenceSession(sim.model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = feeds(3, BATCH)
    for a, b in zip(original.run(None, feed), prepared.run(None, feed)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_oracle_is_not_trivially_the_float_model():
    """The comparison is meaningful: the oracle lands on the sim's output codes almost everywhere, the
    float model (even snapped to the output grid) does not."""
    model, feeds = BUILDERS["conv_relu"]()
    sim = make_sim(model, feeds)
    feed = feeds(0, 8)
    step, enc = output_step(sim, "y"), sim.qc_quantize_op_dict["y"].encoding
    sim_out = sim.session.run(None, feed)[0]
    oracle_out = Oracle(sim.model).run(feed, quantizer_functions(sim))[0]
    float_out = fake_quant(ort.InferenceSession(model.SerializeToString()).run(None, feed)[0], enc)
    assert np.mean(np.abs(sim_out - oracle_out) < step / 2) >= 0.99
    assert np.mean(np.abs(sim_out - float_out) < step / 2) < 0.9
    assert np.abs(sim_out - float_out).max() > 2 * step


def test_exact_ties_of_tied_average_pool():
    """AveragePool 2x2 tied to its input's quantizer: averages of four codes are exact rounding ties whenever
    the code sum is 2 mod 4. Ties to even is only as good as the float arithmetic before it, so onnxruntime
    and the reference evaluator may round a tie differently: by one step, and only at ties."""
    model, feeds = avgpool_ties()
    sim = make_sim(model, feeds)
    q = sim.qc_quantize_op_dict["x"]
    assert sim.qc_quantize_op_dict["relu.out"] is q and sim.qc_quantize_op_dict["y"] is q
    enc, step = q.encoding, output_step(sim, "y")
    feed = feeds(0, 8)
    got = sim.session.run(None, feed)[0]
    want = Oracle(sim.model).run(feed, quantizer_functions(sim))[0]
    # exact ties, from the codes of the quantized input
    codes = np.rint(fake_quant(np.maximum(feed["x"], 0), enc) / np.float32(enc.scale)) + int(enc.zero_point)
    n, c, h, w = codes.shape
    sums = (codes - int(enc.zero_point)).reshape(n, c, h // 2, 2, w // 2, 2).sum(axis=(3, 5))
    ties = sums % 4 == 2
    assert ties.mean() > 0.05  # the model does exercise ties
    differs = np.abs(got - want) > step / 2
    assert np.abs(got - want).max() <= step * (1 + 1e-3)
    assert not np.any(differs & ~ties), "sim and oracle differ away from an exact tie"


@pytest.mark.parametrize("name, param_type", [("mixed", "int8"), ("conv_relu6", "int8"), ("mixed", "float16"),
                                              ("layernorm", "float16")])
def test_sim_matches_oracle_float16_activations(name, param_type):
    """float16 activations (``Cast -> Cast``) against ``np.float16`` casts; the step is the float16 ulp of the
    largest output (the float model misses this by 4 to 35 ulps)."""
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds, activation_type="float16", param_type=param_type)
    act = [q for q in sim.quantizers if q.role == "activation" and q.enabled]
    assert act and all(q.spec.is_float and q.encoding is None for q in act)
    weights = [q for q in sim.quantizers if q.role == "param" and q.enabled]
    assert weights and all(q.spec.is_float == (param_type == "float16") for q in weights)
    oracle, functions = Oracle(sim.model), quantizer_functions(sim)
    for seed in EVAL_SEEDS:
        feed = feeds(seed, BATCH)
        for o, got, want in zip(model.graph.output, sim.session.run(None, feed), oracle.run(feed, functions)):
            # outputs are float16 values: exactly representable
            assert np.array_equal(fp16_cast(got), got), o.name
            ulp = np.spacing(np.float16(np.abs(want).max())).astype(np.float64)
            assert_within_steps(got, want, ulp, label=f"{o.name} fp16 seed {seed}", **INT8_TOLERANCE)


# =================================================================================================
# 2. hand-computed encodings
# =================================================================================================
def test_input_encoding_matches_aimet_formula():
    model, _ = BUILDERS["gemm"]()
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(3):
        x = rng.uniform(-0.9, 2.9, size=(4, 16)).astype(np.float32)
        batches.append({"x": x})
    batches[0]["x"][1, 3] = -1.0
    batches[2]["x"][0, 7] = 3.0
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(batches)
    (enc,) = sim.qc_quantize_op_dict["x"].get_encodings()
    delta = (3.0 - -1.0) / 255
    offset = round(-1.0 / delta)  # -63.75 -> -64
    assert offset == -64
    assert enc.bw == 8
    assert enc.delta == pytest.approx(delta, rel=1e-12)
    assert enc.offset == offset
    assert enc.min == pytest.approx(offset * delta, rel=1e-12)
    assert enc.max == pytest.approx((offset + 255) * delta, rel=1e-12)
    internal = sim.qc_quantize_op_dict["x"].encoding
    assert int(internal.zero_point) == 64 and (internal.qmin, internal.qmax) == (0, 255)


def test_positive_input_range_includes_zero():
    model, _ = BUILDERS["gemm"]()
    x = np.linspace(0.5, 2.0, 64, dtype=np.float32).reshape(4, 16)
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": x}])
    (enc,) = sim.qc_quantize_op_dict["x"].get_encodings()
    assert enc.delta == pytest.approx(2.0 / 255, rel=1e-12)
    assert enc.offset == 0 and enc.min == 0.0
    assert enc.max == pytest.approx(2.0, rel=1e-12)


def _hand_scales(weight: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(weight.astype(np.float64), axis, 0).reshape(weight.shape[axis], -1)
    mx, mn = np.maximum(moved.max(axis=1), 0.0), np.minimum(moved.min(axis=1), 0.0)
    return np.maximum(mx / 127.0, -mn / 128.0)


@pytest.mark.parametrize(
    "model_name, weight, axis",
    [("conv_relu", "conv1.w", 0), ("conv_relu6", "dw.w", 0), ("gemm", "fc1.w", 0), ("gemm", "fc2.w", 1),
     ("matmul", "mm1.w", 1), ("mixed", "head.w", 1)],
)
def test_per_channel_weight_scales_by_hand(model_name, weight, axis):
    model, feeds = BUILDERS[model_name]()
    sim = make_sim(model, feeds)
    values = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == weight)
    prepared = next(numpy_helper.to_array(t) for t in sim.model.graph.initializer if t.name == weight)
    np.testing.assert_array_equal(prepared, values)  # nothing folded into these weights
    q = sim.qc_quantize_op_dict[weight]
    assert q.spec.granularity == PerChannel(axis)
    expected = _hand_scales(values, axis)
    encodings = q.get_encodings()
    assert len(encodings) == values.shape[axis]
    np.testing.assert_allclose([e.delta for e in encodings], expected, rtol=1e-12)
    assert all(e.offset == -128 and e.bw == 8 for e in encodings)
    np.testing.assert_allclose([e.min for e in encodings], -128 * expected, rtol=1e-12)
    np.testing.assert_allclose([e.max for e in encodings], 127 * expected, rtol=1e-12)
    # the baked weight in the sim graph is the hand fake-quantized weight
    sim_weights = {t.name: numpy_helper.to_array(t) for t in sim.sim_model().graph.initializer}
    view = [1] * values.ndim
    view[axis] = -1
    s = expected.astype(np.float32).reshape(view)
    hand = np.clip(np.rint(values / s), -128, 127).astype(np.float32) * s
    np.testing.assert_array_equal(sim_weights[weight], hand)


# =================================================================================================
# 3. placement facts (default config)
# =================================================================================================
def _sim(name, calibrate=False, **kwargs):
    model, feeds = BUILDERS[name]()
    return make_sim(model, feeds, calibrate=calibrate, **kwargs)


def _on(sim, name) -> bool:
    return sim.qc_quantize_op_dict[name].enabled


@pytest.mark.parametrize(
    "model_name, fused, after",
    [("conv_relu", "conv1.out", "relu1.out"), ("conv_relu6", "conv.out", "clip1.out"),
     ("conv_relu6", "dw.out", "y"), ("residual", "add.out", "y"), ("gemm", "fc1.out", "relu.out"),
     ("mixed", "conv2.out", "clip2.out"), ("mixed", "dw.out", "clip3.out"), ("mixed", "add.out", "relu2.out"),
     ("conv_bn_relu", "bn.out", "y")],  # BatchNormalization folded by prepare: the Conv now writes bn.out
)
def test_supergroups_quantize_after_the_activation(model_name, fused, after):
    sim = _sim(model_name)
    assert not _on(sim, fused)
    assert _on(sim, after)
    assert sim.qc_quantize_op_dict[fused] is not sim.qc_quantize_op_dict[after]


@pytest.mark.parametrize("model_name, source, tied", [("avgpool_ties", "x", "relu.out"), ("avgpool_ties", "x", "y"),
                                                      ("pool", "relu1.out", "avg.out"), ("resize", "relu1.out", "up.out")])
def test_forward_ties(model_name, source, tied):
    """Relu, AveragePool and Resize outputs share the quantizer of their quantized input."""
    if model_name == "avgpool_ties":
        model, feeds = avgpool_ties()
        sim = make_sim(model, feeds, calibrate=False)
    else:
        sim = _sim(model_name)
    q = sim.qc_quantize_op_dict[source]
    assert q.enabled and sim.qc_quantize_op_dict[tied] is q
    assert set(q.tensors) >= {source, tied}


def test_concat_inputs_share_the_output_quantizer():
    sim = _sim("concat")
    q = sim.qc_quantize_op_dict["cat.out"]
    assert q.enabled
    assert sim.qc_quantize_op_dict["relu1.out"] is q
    assert sim.qc_quantize_op_dict["conv2.out"] is q  # through the single-consumer MaxPool
    assert not _on(sim, "pool.out")
    mixed = _sim("mixed")
    q = mixed.qc_quantize_op_dict["cat.out"]
    assert mixed.qc_quantize_op_dict["relu2.out"] is q
    # pool.out feeds conv2 too: its source keeps its own quantizer
    assert mixed.qc_quantize_op_dict["relu1.out"] is not q


def test_grid_preserving_outputs_biases_and_inputs():
    cases = [("concat", ["pool.out"]), ("pool", ["flat.out"]), ("mixed", ["pool.out", "flat.out"]), ("conv_bn_relu", [])]
    for name, grid_preserving in cases:
        sim = _sim(name)
        for t in grid_preserving:
            assert not _on(sim, t), (name, t)
        assert _on(sim, "x"), name
        params = {t for q in sim.quantizers if q.role == "param" for t in q.tensors}
        graph = sim.model.graph
        biases = {n.input[2] for n in graph.node if n.op_type in ("Conv", "Gemm") and len(n.input) > 2}
        matmul_outputs = {n.output[0] for n in graph.node if n.op_type == "MatMul"}
        biases |= {i for n in graph.node if n.op_type == "Add" and set(n.input) & matmul_outputs
                   for i in n.input if i in params}  # MatmulAdd
        assert biases, name
        for t in params:
            assert _on(sim, t) == (t not in biases), (name, t)
    sim = _sim("matmul")  # MatmulAdd: the Add's constant is a (disabled) bias, the MatMul output is not quantized
    assert sim.qc_quantize_op_dict["mm1.b"].role == "param"
    assert not _on(sim, "mm1.b") and not _on(sim, "mm1.out") and not _on(sim, "add.out") and _on(sim, "relu.out")


def test_mixed_model_weights_per_channel_and_outputs_in_order():
    model, feeds = BUILDERS["mixed"]()
    sim = make_sim(model, feeds)
    axes = {"conv1.w": 0, "conv2.w": 0, "dw.w": 0, "fc.w": 0, "head.w": 1}
    for node in sim.model.graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul"):
            q = sim.qc_quantize_op_dict[node.input[1]]
            assert q.enabled and q.spec.granularity == PerChannel(axes[node.input[1]]), node.name
            assert q.encoding.scale.shape == (q.shape[axes[node.input[1]]],)
    names = [o.name for o in model.graph.output]
    assert names == ["probs", "embedding"]
    assert [o.name for o in sim.session.get_outputs()] == names
    assert [o.name for o in sim.sim_model().graph.output] == names
    assert [o.name for o in sim.to_onnx_qdq().graph.output] == names
    # embedding is a graph output and also consumed: both see the same quantized value
    assert _on(sim, "embedding")
    feed = feeds(5, BATCH)
    probs, embedding = sim.session.run(None, feed)
    enc = sim.qc_quantize_op_dict["embedding"].encoding
    np.testing.assert_array_equal(fake_quant(embedding, enc), embedding)


# =================================================================================================
# 4. round trips
# =================================================================================================
def _same_encodings(a, b) -> None:
    assert set(a.qc_quantize_op_dict) == set(b.qc_quantize_op_dict)
    for name, qa in a.qc_quantize_op_dict.items():
        qb = b.qc_quantize_op_dict[name]
        assert qa.enabled == qb.enabled, name
        if not qa.enabled:
            continue
        assert qa.spec.dtype == qb.spec.dtype, name
        if qa.spec.is_float:
            continue
        assert qa.encoding.same_as(qb.encoding), (name, qa.encoding, qb.encoding)


@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
@pytest.mark.parametrize("name", ["mixed", "conv_bn_relu", "layernorm"])
def test_export_load_round_trip_is_exact(tmp_path, name, version):
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds)
    sim.export(tmp_path, "m", encoding_version=version)
    fresh = make_sim(model, feeds, calibrate=False)
    quantsim.load_encodings_to_sim(fresh, tmp_path / "m.encodings", strict=True)
    _same_encodings(sim, fresh)
    for seed in EVAL_SEEDS:
        feed = feeds(seed, BATCH)
        for a, b in zip(sim.session.run(None, feed), fresh.session.run(None, feed)):
            np.testing.assert_array_equal(a, b)


def _exact_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime running every Q/DQ as written (no fusion into integer kernels)."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.int8_kernels
@pytest.mark.parametrize("name", ALL_MODELS)
def test_qdq_export_matches_sim(name):
    """``to_onnx_qdq()`` (int32 biases) in a default onnxruntime session, free to fuse Q/DQ into integer
    kernels, is within one output step of the sim; without int32 biases and without fusion it is exact."""
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds)
    qdq = sim.to_onnx_qdq()
    onnx.checker.check_model(qdq, full_check=True)
    onnx.checker.check_model(sim.sim_model(), full_check=True)
    assert [o.name for o in qdq.graph.output] == [o.name for o in model.graph.output]
    default = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    exact = _exact_session(sim.to_onnx_qdq(int32_bias=False))
    names = [o.name for o in model.graph.output]
    for seed in EVAL_SEEDS:
        feed = feeds(seed, BATCH)
        reference = sim.session.run(None, feed)
        for o, a, b in zip(names, reference, default.run(None, feed)):
            assert_within_steps(b, a, output_step(sim, o), label=f"qdq {o}", one_step_fraction=1.0, max_steps=1.0)
        for a, b in zip(reference, exact.run(None, feed)):
            np.testing.assert_array_equal(a, b)




@pytest.mark.parametrize("name, activation_type", [
    ("conv_relu", quantsim.qtype.int(6)), ("mixed", quantsim.qtype.int(6)), ("conv_relu", "int16"),
    ("conv_relu6", "int4"),
    ("conv_relu", "int4"),
    ("mixed", "int16"),
])
def test_qdq_export_other_bitwidths_in_default_session(name, activation_type):
    """The QDQ export of 4/6/16-bit activation sims in a default onnxruntime session (and the sim's own
    ``fused_session``, the same graph and optimisations) is within one output step of the sim.
    Not for the 4-bit mixed model: there one integer-kernel step on a 4-bit logit (1/15 of its range) is
    legitimately several steps after Softmax (seen: 6)."""
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds, activation_type=activation_type)
    default = ort.InferenceSession(sim.to_onnx_qdq().SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in EVAL_SEEDS:
        feed = feeds(seed, BATCH)
        for o, a, b in zip(model.graph.output, sim.session.run(None, feed), default.run(None, feed)):
            assert_within_steps(b, a, output_step(sim, o.name), label=f"qdq {o.name}", one_step_fraction=1.0,
                                max_steps=1.0)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_from_onnx_qdq_round_trip(name):
    """The imported sim computes what the file computes: from the default export (int32 biases) it is the
    same sim, bit for bit; from a float-bias export it adds the file's float biases (``int32_bias=False``) and
    equals the file run without graph fusions, bit for bit, where the int32-bias sim would differ."""
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds)
    float_bias_file = sim.to_onnx_qdq(int32_bias=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = QuantizationSimModel.from_onnx_qdq(float_bias_file, progress=False)
        back_int32 = QuantizationSimModel.from_onnx_qdq(sim.to_onnx_qdq(), progress=False)
    assert back_int32.int32_bias
    names = [o.name for o in model.graph.output]
    assert [o.name for o in back.session.get_outputs()] == names
    for imported in (back, back_int32):
        for tensor, q in sim.qc_quantize_op_dict.items():
            if q.enabled:
                b = imported.qc_quantize_op_dict[tensor]
                assert b.enabled and b.spec.dtype == q.spec.dtype, tensor
                # the QDQ model stores float32 scales: compare the scales onnxruntime applies
                np.testing.assert_array_equal(b.encoding.scale.astype(np.float32), q.encoding.scale.astype(np.float32))
                np.testing.assert_array_equal(b.encoding.zero_point, q.encoding.zero_point)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    file_session = ort.InferenceSession(float_bias_file.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for seed in EVAL_SEEDS:
        feed = feeds(seed, BATCH)
        for a, b in zip(sim.session.run(None, feed), back_int32.session.run(None, feed)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(file_session.run(None, feed), back.session.run(None, feed)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["conv_relu6", "mixed"])
def test_from_onnx_qdq_keeps_the_files_depthwise_quantizers(name):
    """A file written with AIMET's placement (a Q/DQ after each depthwise Conv as well) is followed, not
    re-placed: the imported sim keeps those quantizers, with no warning, and computes what the file does."""
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds, depthwise_supergroups=False)
    qdq = sim.to_onnx_qdq()
    depthwise = [n for n in sim.model.graph.node if n.op_type == "Conv"
                 and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert depthwise and all(sim.qc_quantize_op_dict[n.output[0]].enabled for n in depthwise)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = QuantizationSimModel.from_onnx_qdq(qdq, progress=False)
    assert all(back.qc_quantize_op_dict[n.output[0]].enabled for n in depthwise)
    for seed in EVAL_SEEDS:
        feed = feeds(seed, BATCH)
        for a, b in zip(sim.session.run(None, feed), back.session.run(None, feed)):
            np.testing.assert_array_equal(a, b)


def test_from_onnx_qdq_names_a_file_that_mixes_bias_forms():
    """One int32 bias and one float bias on quantized layers: one sim-wide switch cannot follow both, so the
    import warns naming a layer of the other form."""
    model, feeds = BUILDERS["mixed"]()
    sim = make_sim(model, feeds)
    qdq = sim.to_onnx_qdq()
    graph = qdq.graph
    producers = {o: n for n in graph.node for o in n.output}
    convs = [n for n in graph.node if n.op_type == "Conv" and len(n.input) > 2 and n.input[2] in producers]
    assert len(convs) >= 2
    victim = convs[-1]
    bias_dq = producers[victim.input[2]]
    codes = numpy_helper.to_array(next(t for t in graph.initializer if t.name == bias_dq.input[0]))
    scale = numpy_helper.to_array(next(t for t in graph.initializer if t.name == bias_dq.input[1]))
    graph.initializer.append(numpy_helper.from_array((codes * scale).astype(np.float32), "float_bias"))
    victim.input[2] = "float_bias"
    with pytest.warns(UserWarning, match=f"{victim.name!r}.*half an accumulator unit"):
        back = QuantizationSimModel.from_onnx_qdq(qdq, progress=False)
    assert back.int32_bias


def _symmetric_activation_config() -> dict:
    config = json.loads((Path(quantsim.__file__).parent / "sim" / "configs" / "default_config_per_channel.json").read_text())
    config["defaults"]["ops"]["is_symmetric"] = "True"
    return config


@pytest.mark.parametrize("variant", ["default", "symmetric", "6-bit"])
@pytest.mark.parametrize("name", ["conv_relu6", "mixed"])
def test_from_onnx_qdq_keeps_the_models_clips(name, variant):
    """A model's own Clip (Relu6) before a Q/DQ pair is part of the model, not of the quantizer: the imported
    float model keeps it, and only the sim's own grid Clips (6-bit here) are read as narrowed grids.
    Regression: the importer used to absorb every constant Clip; with symmetric activations Clip(0, 6)
    before an int8 pair became a 7-bit [-64, 63] grid and the outputs saturated at half the range."""
    model, feeds = BUILDERS[name]()
    kwargs = {"symmetric": {"config_file": _symmetric_activation_config()},
              "6-bit": {"activation_type": quantsim.qtype.int(6)}}.get(variant, {})
    sim = make_sim(model, feeds, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a non-default config reports its differences from the default
        back = QuantizationSimModel.from_onnx_qdq(sim.to_onnx_qdq(), progress=False, **kwargs)
    assert sorted(n.op_type for n in back.model.graph.node) == sorted(n.op_type for n in model.graph.node)
    for tensor, q in sim.qc_quantize_op_dict.items():
        if q.enabled and q.role == "activation":
            b = back.qc_quantize_op_dict[tensor]
            assert b.enabled and (b.encoding.bits, b.encoding.qmin, b.encoding.qmax) == (
                q.encoding.bits, q.encoding.qmin, q.encoding.qmax), tensor
    for seed in EVAL_SEEDS:
        feed = feeds(seed, BATCH)
        for a, b in zip(sim.session.run(None, feed), back.session.run(None, feed)):
            np.testing.assert_array_equal(a, b)


# =================================================================================================
# 5. schemes and other activation types
# =================================================================================================
@pytest.mark.parametrize("scheme", ["tf_enhanced", "percentile"])
def test_histogram_schemes_give_finite_encodings(scheme):
    model, feeds = BUILDERS["mixed"]()
    kwargs = {"percentile": 99.9} if scheme == "percentile" else {}
    sim = make_sim(model, feeds, quant_scheme=scheme, **kwargs)
    for q in sim.quantizers:
        if q.enabled:
            assert q.encoding is not None, q
            assert np.all(np.isfinite(q.encoding.scale)) and np.all(q.encoding.scale > 0), q
            for e in q.get_encodings():
                assert np.isfinite([e.min, e.max, e.delta, e.offset]).all()
    check_against_oracle(sim, model, feeds)


@pytest.mark.parametrize("activation_type, bits", [("int4", 4), ("int16", 16), (quantsim.qtype.int(6), 6)])
@pytest.mark.parametrize("name", ["mixed", "conv_relu", "gemm"])
def test_other_activation_bitwidths_match_oracle(name, activation_type, bits):
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds, activation_type=activation_type)
    act = [q for q in sim.quantizers if q.role == "activation" and q.enabled]
    assert act and all(q.bitwidth == bits and q.encoding.bits == bits for q in act)
    assert all(q.encoding.qmax - q.encoding.qmin == (1 << bits) - 1 for q in act)
    if bits == 6:
        clips = [n for n in sim.sim_model().graph.node if n.op_type == "Clip" and n.name.endswith("/clip")]
        assert len(clips) == sum(len(q.tensors) for q in act)
    if bits == 16:
        check_against_oracle(sim, model, feeds, batch=8, **INT16_TOLERANCE)
    else:
        check_against_oracle(sim, model, feeds)


@pytest.mark.parametrize("name", ["concat", "conv_relu6"])
def test_int4_sim_keeps_relu_and_clip(name):
    """Regression: onnxruntime's ReluQuantRewrite dropped a Relu before a uint4 QuantizeLinear whose zero
    point is not 0 (concat: Relu output tied to a signed Conv output), and ClipQuantRewrite failed to create
    the session for Clip -> uint4 QuantizeLinear (Relu6); the exact sim session now disables both."""
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds, activation_type="int4")
    if name == "concat":
        assert int(sim.qc_quantize_op_dict["relu1.out"].encoding.zero_point) > 0
    check_against_oracle(sim, model, feeds)
