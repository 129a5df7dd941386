"""Rules that must hold on unseen models: additive attention masks of any fill and construction stay float,
heterogeneous Concats are untied, collapsed grids are promoted; each decision is listed with its reason.

Oracles: onnxruntime's FP32 run of the same model, and numpy fake quantization of the tensor a rule keeps
off one 8-bit grid (showing the rule is what makes the difference)."""
import numpy as np
import onnxruntime as ort
import pytest
from models import make_model  # tests/models.py
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel, encoding_from_range, fake_quantize

T, D = 12, 16  # tokens, width
VALID = 8  # tokens 8..11 are padding


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return float(np.mean(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _mask_nodes(style: str, fill: float) -> tuple[list, list]:
    """Nodes building ``extended`` ([N, 1, T], fill at padding, 0 elsewhere) from the int64 ``mask`` input."""
    if style == "torch":  # torch exporter: (1.0 - mask[:, None, :]) * fill
        nodes = [helper.make_node("Unsqueeze", ["mask", "axis1"], ["mask_u"]),
                 helper.make_node("Cast", ["mask_u"], ["mask_f"], to=TensorProto.FLOAT),
                 helper.make_node("Sub", ["one", "mask_f"], ["inverted"]),
                 helper.make_node("Mul", ["inverted", "fill"], ["extended"])]
        return nodes, [_init("axis1", np.array([1], np.int64)), _init("one", np.float32(1.0)),
                       _init("fill", np.float32(fill))]
    if style == "hf_where":  # HF: inverted.masked_fill(inverted.bool(), fill), cast first, then expand
        nodes = [helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
                 helper.make_node("Sub", ["one", "mask_f"], ["inverted"]),
                 helper.make_node("Cast", ["inverted"], ["inverted_b"], to=TensorProto.BOOL),
                 helper.make_node("Where", ["inverted_b", "fill", "inverted"], ["filled"]),
                 helper.make_node("Unsqueeze", ["filled", "axis1"], ["filled_u"]),
                 helper.make_node("Expand", ["filled_u", "shape"], ["extended"])]
        return nodes, [_init("axis1", np.array([1], np.int64)), _init("one", np.float32(1.0)),
                       _init("fill", np.float32(fill)), _init("shape", np.array([1, 1, T], np.int64))]
    assert style == "equal_where"  # mask == 0 -> fill from a ConstantOfShape (dynamic shape), else 0
    nodes = [helper.make_node("Equal", ["mask", "zero_i"], ["padding"]),
             helper.make_node("Shape", ["mask"], ["mask_shape"]),
             helper.make_node("ConstantOfShape", ["mask_shape"], ["fills"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [fill])),
             helper.make_node("Where", ["padding", "fills", "zero_f"], ["filled"]),
             helper.make_node("Unsqueeze", ["filled", "axis1"], ["extended"])]
    return nodes, [_init("zero_i", np.int64(0)), _init("zero_f", np.float32(0.0)), _init("axis1", np.array([1], np.int64))]


def _attention(style: str, fill: float):
    """One self-attention head over ``x`` [N, T, D] with an additive padding mask before the Softmax."""
    rng = np.random.default_rng(3)
    mask_nodes, mask_inits = _mask_nodes(style, fill)
    nodes = mask_nodes + [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "k_t"], ["qk"]),
        helper.make_node("Div", ["qk", "sqrt_d"], ["scores"]),
        helper.make_node("Add", ["scores", "extended"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"]),
    ]
    inits = mask_inits + [_init(n, (rng.standard_normal((D, D)) * 0.6).astype(np.float32)) for n in ("wq", "wk", "wv")]
    inits.append(_init("sqrt_d", np.float32(np.sqrt(D) / 4)))  # scores of order +-10, as in trained encoders
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, D]),
              helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", T])]
    outputs = [helper.make_tensor_value_info("context", TensorProto.FLOAT, ["N", T, D])]
    return make_model(nodes, inputs, outputs, inits, opset=17)


def _attention_feeds(n_batches: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    mask = np.ones((4, T), np.int64)
    mask[:, VALID:] = 0
    return [{"x": rng.standard_normal((4, T, D)).astype(np.float32), "mask": mask} for _ in range(n_batches)]


FILLS = {"-1e4": -1e4, "-1e9": -1e9, "finfo.min": float(np.finfo(np.float32).min), "-inf": -np.inf}


@pytest.mark.parametrize("style", ["torch", "hf_where", "equal_where"])
@pytest.mark.parametrize("fill", list(FILLS))
def test_additive_attention_mask_of_any_fill_and_construction_stays_float(style, fill):
    if style == "torch" and fill == "-inf":
        pytest.skip("(1 - mask) * -inf is NaN at valid positions: no exporter writes it")
    model = _attention(style, FILLS[fill])
    sim = QuantizationSimModel(model, progress=False)
    assert "masked" not in sim.qc_quantize_op_dict and "extended" not in sim.qc_quantize_op_dict
    assert sim.qc_quantize_op_dict["scores"].enabled and sim.qc_quantize_op_dict["probs"].enabled
    [decision] = [d for d in sim.decisions if d.rule == "attention mask"]
    assert "masked" in decision.tensors and "scores" not in decision.tensors and "Softmax" in decision.reason
    sim.compute_encodings(_attention_feeds(3, seed=1))
    [feed] = _attention_feeds(1, seed=2)
    fp32 = ort.InferenceSession(model.SerializeToString())
    expected = fp32.run(None, feed)[0]
    got = sim.session.run(None, feed)[0]
    assert _cosine(got, expected) > 0.99
    # the oracle of what the rule prevents: the masked scores on one 8-bit grid flatten the attention
    if np.isfinite(FILLS[fill]):
        with_scores = helper.make_tensor_value_info("masked", TensorProto.FLOAT, None)
        model.graph.output.append(with_scores)
        masked = ort.InferenceSession(model.SerializeToString()).run(["masked"], feed)[0]
        enc = encoding_from_range(float(masked.min()), float(masked.max()), 8, symmetric=False)
        flat = fake_quantize(masked, enc)
        probs = np.exp(flat - flat.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        exact = np.exp(masked - masked.max(-1, keepdims=True))
        exact /= exact.sum(-1, keepdims=True)
        assert _cosine(probs, exact) < 0.9


def test_a_large_scale_or_clamp_on_the_scores_is_not_a_mask():
    """CLIP-style ``scores * 100`` and ``Max(scores, finfo.min)`` before a Softmax: no mask, all quantized."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
             helper.make_node("Max", ["scaled", "floor"], ["clamped"]),
             helper.make_node("Softmax", ["clamped"], ["probs"], axis=-1)]
    inits = [_init("w", np.eye(D, dtype=np.float32)), _init("scale", np.float32(100.0)),
             _init("floor", np.float32(np.finfo(np.float32).min))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
                       [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", D])], inits)
    sim = QuantizationSimModel(model, progress=False)
    assert not sim.decisions
    assert sim.qc_quantize_op_dict["scaled"].enabled


# --- heterogeneous Concat ------------------------------------------------------------------------------
ANCHORS, FEATURES, CLASSES = 64, 8, 3


def _detector_head(box_scale: float):
    """YOLO-style output: boxes (pixels, ~0..320 for box_scale 100) joined with class probabilities."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["feats", "wb"], ["box_raw"]),
             helper.make_node("Mul", ["box_raw", "box_scale"], ["box_scaled"]),
             helper.make_node("Add", ["box_scaled", "centre"], ["boxes"]),
             helper.make_node("MatMul", ["feats", "wc"], ["logits"]),
             helper.make_node("Sigmoid", ["logits"], ["scores"]),
             helper.make_node("Concat", ["boxes", "scores"], ["detections"], axis=-1)]
    inits = [_init("wb", (rng.standard_normal((FEATURES, 4)) * 0.5).astype(np.float32)),
             _init("wc", (rng.standard_normal((FEATURES, CLASSES)) * 1.5).astype(np.float32)),
             _init("box_scale", np.float32(box_scale)), _init("centre", np.float32(1.6 * box_scale))]
    return make_model(nodes, [helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["N", ANCHORS, FEATURES])],
                      [helper.make_tensor_value_info("detections", TensorProto.FLOAT, ["N", ANCHORS, 4 + CLASSES])],
                      inits)


def _head_feeds(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"feats": rng.standard_normal((2, ANCHORS, FEATURES)).astype(np.float32)} for _ in range(n)]


def _score_agreement(model, sim, feeds) -> tuple[float, float]:
    """(F1 of ``score > 0.5`` detections against FP32, mean box error in pixels)."""
    fp32 = ort.InferenceSession(model.SerializeToString())
    tp = fp = fn = 0
    box_errors = []
    for feed in feeds:
        ref, got = fp32.run(None, feed)[0], sim.session.run(None, feed)[0]
        ref_hit, got_hit = ref[..., 4:] > 0.5, got[..., 4:] > 0.5
        tp += int(np.sum(ref_hit & got_hit))
        fp += int(np.sum(~ref_hit & got_hit))
        fn += int(np.sum(ref_hit & ~got_hit))
        box_errors.append(np.abs(ref[..., :4] - got[..., :4]).mean())
    return 2 * tp / (2 * tp + fp + fn), float(np.mean(box_errors))


def test_concat_of_parts_with_ranges_orders_of_magnitude_apart_is_untied():
    model = _detector_head(100.0)
    tied = QuantizationSimModel(model, progress=False, range_health=False)
    assert tied.qc_quantize_op_dict["boxes"] is tied.qc_quantize_op_dict["scores"]  # placement ties them
    tied.compute_encodings(_head_feeds(4, seed=1))
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(_head_feeds(4, seed=1))
    boxes, scores, out = (sim.qc_quantize_op_dict[t] for t in ("boxes", "scores", "detections"))
    assert boxes is not scores and boxes.enabled and scores.enabled and not out.enabled
    assert float(np.max(scores.encoding.max)) <= 1.0 + 1e-6 and float(np.max(boxes.encoding.max)) > 200
    [decision] = [d for d in sim.decisions if d.rule == "untied concat"]
    assert set(decision.tensors) == {"boxes", "scores", "detections"} and "x" in decision.reason
    assert "untied concat" in sim.summary()
    evaluation = _head_feeds(4, seed=2)
    f1_tied, _ = _score_agreement(model, tied, evaluation)
    f1, box_error = _score_agreement(model, sim, evaluation)
    assert f1_tied < 0.9 and f1 > 0.97, (f1_tied, f1)
    assert box_error < 3  # boxes keep their own 8-bit grid (delta 5 px over [-460, 815])
    sim.compute_encodings(_head_feeds(4, seed=3))  # recalibration keeps the split, decides nothing new
    assert len([d for d in sim.decisions if d.rule == "untied concat"]) == 1


def test_concat_of_parts_with_similar_ranges_or_on_a_low_bit_grid_stays_tied():
    model = _detector_head(0.1)  # boxes ~0..0.3: same order as the scores
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(_head_feeds(2, seed=1))
    assert sim.qc_quantize_op_dict["boxes"] is sim.qc_quantize_op_dict["detections"]
    assert not [d for d in sim.decisions if d.rule == "untied concat"]
    low = QuantizationSimModel(_detector_head(100.0), activation_type="int4", progress=False)
    low.compute_encodings(_head_feeds(2, seed=1))  # a 4-bit grid is a deliberate choice: ties stay
    assert low.qc_quantize_op_dict["boxes"] is low.qc_quantize_op_dict["detections"] and not low.decisions


# --- range health ----------------------------------------------------------------------------------------
def _offset_model(outlier: float):
    """``shifted = x + c``: c is 0 except on one column, where it is ``outlier``."""
    offset = np.zeros((1, D), np.float32)
    offset[0, 0] = outlier
    nodes = [helper.make_node("Add", ["x", "c"], ["shifted"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
                      [helper.make_tensor_value_info("shifted", TensorProto.FLOAT, ["N", D])], [_init("c", offset)])


def _x_feeds(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((32, D)).astype(np.float32)} for _ in range(n)]


def _sqnr_of_normal_columns(model, sim, feeds) -> float:
    fp32 = ort.InferenceSession(model.SerializeToString())
    ref = np.concatenate([fp32.run(None, f)[0][:, 1:] for f in feeds])
    got = np.concatenate([sim.session.run(None, f)[0][:, 1:] for f in feeds])
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)))


def test_range_health_promotes_a_collapsed_grid_to_16_bits():
    model = _offset_model(5000.0)
    off = QuantizationSimModel(model, progress=False, range_health=False)
    off.compute_encodings(_x_feeds(2, seed=1))
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(_x_feeds(2, seed=1))
    q = sim.qc_quantize_op_dict["shifted"]
    assert q.enabled and q.bitwidth == 16 and off.qc_quantize_op_dict["shifted"].bitwidth == 8
    decisions = [d for d in sim.decisions if d.rule == "range health"]
    assert {d.tensors for d in decisions} >= {("shifted",)}
    assert all(d.action == "promoted to int16" for d in decisions)
    assert "codes" in decisions[0].reason and "range health" in sim.summary()
    assert sim.qc_quantize_op_dict["x"].bitwidth == 8  # a healthy tensor keeps its 8-bit grid
    evaluation = _x_feeds(2, seed=2)
    # on 8 bits delta is ~20: the normal columns vanish; on 16 bits they keep ~40 dB
    assert _sqnr_of_normal_columns(model, off, evaluation) < 3
    assert _sqnr_of_normal_columns(model, sim, evaluation) > 30


def test_range_health_leaves_float_what_16_bits_cannot_hold_and_respects_the_opt_out():
    model = _offset_model(1e9)
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(_x_feeds(2, seed=1))
    assert not sim.qc_quantize_op_dict["shifted"].enabled
    assert any(d.tensors == ("shifted",) and d.action == "left float" for d in sim.decisions)
    sim.range_health = False
    sim.qc_quantize_op_dict["shifted"].enabled = True
    sim.qc_quantize_op_dict["shifted"].set_precision("int8")
    sim.compute_encodings(_x_feeds(2, seed=1))
    assert sim.qc_quantize_op_dict["shifted"].enabled and sim.qc_quantize_op_dict["shifted"].bitwidth == 8


def test_range_health_ignores_few_valued_tensors_low_bit_grids_and_bounded_outputs():
    """A 0/1 tensor uses two codes without losing anything; 4-bit grids are the user's choice; a saturated
    Sigmoid sits on its own [0, 1] range."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("Cast", ["positive"], ["binary"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "gain"], ["big"]),
             helper.make_node("Sigmoid", ["big"], ["gate"]),
             helper.make_node("Add", ["binary", "gate"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", D])],
                       [_init("zero", np.float32(0.0)), _init("gain", np.float32(1000.0))])
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(_x_feeds(2, seed=1))
    assert not sim.decisions
    low = QuantizationSimModel(_offset_model(5000.0), activation_type="int4", progress=False)
    low.compute_encodings(_x_feeds(2, seed=1))
    assert not low.decisions and low.qc_quantize_op_dict["shifted"].bitwidth == 4
