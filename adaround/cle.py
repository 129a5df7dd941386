"""Cross-layer equalization (Nagel et al. 2019, as AIMET's ``equalize_model``): equalizes the caller's float
model IN PLACE (and returns it) so that consecutive layers have equal per-channel weight ranges, and per-tensor
(and per-channel) weight grids lose less. What the float model computes is kept, within float rounding.

Steps, on the model as `quantsim.prepare` leaves it (BatchNormalization folded into the layers):

1. **Pairs**: ``L0 -> [Relu | LeakyRelu | PRelu (one slope) | Clip | nothing] -> L1`` (Conv, ConvTranspose
   without groups on the second side, Gemm; the middle tensor read by ``L1`` only).
2. **Scaling.** Output channel ``i`` of ``L0`` is divided by ``s_i = sqrt(r0_i / r1_i)`` and input channel ``i``
   of ``L1`` multiplied by it, where ``r0_i`` is the largest ``|w|`` of ``L0``'s output channel and ``r1_i`` of
   ``L1``'s input channel; both ranges become ``sqrt(r0_i r1_i)``. Positive homogeneity (``f(x / s) = f(x) / s``)
   keeps the model's function. Grouped and depthwise layers are equalized channel by channel, and chains
   (Conv -> depthwise Conv -> Conv) are swept ``passes`` times so every pair settles.
3. **Bounded activations** (ReLU6 = ``Clip(0, 6)``) are not homogeneous: ``Clip(z / s, lo, hi)`` equals
   ``Clip(z, lo, hi) / s`` only with the bounds divided by ``s`` too, per channel. Clip takes scalar bounds, so
   the Clip becomes ``Min(Relu(z / s), hi / s)`` with a ``[C, 1, ...]`` constant (``clip_pairs="rescale"``, the
   default): the sim keeps one output quantizer after it (as for Conv + Clip) and the integer export clamps
   the codes per channel with one uint8 Min. ``clip_pairs="skip"`` leaves such pairs alone;
   ``clip_pairs="relu"`` replaces ``Clip(0, hi)`` by Relu as AIMET does, which changes the float function
   wherever an activation exceeded ``hi`` (on MobileNet-style nets, most of the outputs' top-1).
4. **High-bias absorption** (where the BatchNormalization folded into ``L0`` gave ``gamma, beta``): the
   part ``c = max(0, beta - 3 |gamma|)`` (``beta`` without an activation) of ``L0``'s bias that almost never
   falls below the Relu's kink moves into ``L1``'s bias (``b1 += W1 c``): exact wherever the activation stays
   above ``beta - 3 |gamma|`` (three standard deviations by the BatchNormalization's own statistics). Unlike
   AIMET, not into a zero-padded ``L1`` (its border would miss ``W1 c``: a function change at every image
   edge), and not across LeakyRelu, PRelu or Clip.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from quantsim import InvalidArgumentError, QuantsimWarning, prepare
from quantsim.errors import warn_at_caller

__all__ = ["equalize_model", "find_equalization_pairs", "CLIP_PAIRS", "EQUIVALENCE_RTOL"]

_log = logging.getLogger(__name__)
#: ``dummy_input`` check: outputs may differ by this much of their largest magnitude (float rounding of the
#: rescaled weights; an activation's kink crossed by a rounding error moves one value by about as much)
EQUIVALENCE_RTOL = 1e-3

_LAYERS = frozenset({"Conv", "ConvTranspose", "Gemm"})
_HOMOGENEOUS = frozenset({"Relu", "LeakyRelu", "PRelu"})


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.inits = {t.name: t for t in model.graph.initializer}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
            for name in node.output:
                self.producer[name] = node
        self.outputs = {o.name for o in model.graph.output}

    def value(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name]).astype(np.float64)

    def write(self, name: str, value: np.ndarray) -> None:
        old = self.inits[name]
        self.inits[name].CopyFrom(numpy_helper.from_array(value.astype(numpy_helper.to_array(old).dtype), name))

    def only_consumer(self, tensor: str) -> onnx.NodeProto | None:
        users = self.consumers.get(tensor, [])
        return users[0] if len(users) == 1 and tensor not in self.outputs else None

    def is_layer(self, node: onnx.NodeProto) -> bool:
        return (node.op_type in _LAYERS and len(node.input) >= 2 and node.input[1] in self.inits
                and all(n in self.inits for n in node.input[2:3] if n)
                and len([u for u in self.consumers.get(node.input[1], [])]) == 1)


def find_equalization_pairs(model: onnx.ModelProto) -> list[tuple[str, str | None, str]]:
    """``(first layer, activation node or None, second layer)`` node names that can be equalized."""
    graph = _Graph(model)
    return [(a.name, act.name if act is not None else None, b.name) for a, act, b in _pairs(graph)]


def _pairs(graph: _Graph):
    pairs = []
    for node in graph.model.graph.node:
        if not graph.is_layer(node):
            continue
        nxt = graph.only_consumer(node.output[0])
        act = None
        if nxt is not None and (nxt.op_type in _HOMOGENEOUS or _clip_bounds(graph, nxt) is not None):
            act, nxt = nxt, graph.only_consumer(nxt.output[0])
        if nxt is None or not graph.is_layer(nxt) or nxt.input[0] != (act or node).output[0]:
            continue
        if nxt.op_type == "ConvTranspose" and _attrs(nxt).get("group", 1) != 1:
            continue
        if act is not None and act.op_type == "PRelu" and graph.value(act.input[1]).size != 1:
            continue  # a per-channel slope would need rescaling too: left alone
        pairs.append((node, act, nxt))
    return pairs


def _clip_bounds(graph: _Graph, node: onnx.NodeProto) -> tuple[float, float] | None:
    """``(lo, hi)`` of a Clip with constant scalar bounds (absent: infinite), else None."""
    if node.op_type != "Clip" or not node.input:
        return None
    bounds = [-np.inf, np.inf]
    for slot, name in enumerate(node.input[1:3]):
        if not name:
            continue
        if name not in graph.inits or graph.value(name).size != 1:
            return None
        bounds[slot] = float(graph.value(name).reshape(()))
    for attr in node.attribute:  # opset < 11
        if attr.name in ("min", "max"):
            bounds[attr.name == "max"] = float(attr.f)
    return bounds[0], bounds[1]


def _out_view(node: onnx.NodeProto, w: np.ndarray) -> tuple[np.ndarray, tuple]:
    """``w`` viewed as ``[out channels, rest]`` for output-channel ranges and scaling (and the shape back)."""
    attrs = _attrs(node)
    if node.op_type == "Conv":
        return w.reshape(w.shape[0], -1), w.shape
    if node.op_type == "ConvTranspose":  # W[C, M/g, k]: output channel g*M/g + j
        g = attrs.get("group", 1)
        c, m_g = w.shape[:2]
        view = w.reshape(g, c // g, m_g, -1).transpose(0, 2, 1, 3).reshape(g * m_g, -1)
        return view, w.shape
    return (w if attrs.get("transB", 0) else w.T), w.shape


def _from_out_view(node: onnx.NodeProto, view: np.ndarray, shape: tuple) -> np.ndarray:
    attrs = _attrs(node)
    if node.op_type == "Conv":
        return view.reshape(shape)
    if node.op_type == "ConvTranspose":
        g = attrs.get("group", 1)
        c, m_g = shape[:2]
        return view.reshape(g, m_g, c // g, -1).transpose(0, 2, 1, 3).reshape(shape)
    return view if attrs.get("transB", 0) else view.T


def _in_scale(node: onnx.NodeProto, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``w`` with input channel ``i`` multiplied by ``s_i``."""
    attrs = _attrs(node)
    if node.op_type == "Conv":
        g = attrs.get("group", 1)
        n, c_g = w.shape[:2]
        view = w.reshape(g, n // g, c_g, -1) * s.reshape(g, 1, c_g, 1)
        return view.reshape(w.shape)
    if node.op_type == "ConvTranspose":  # W[C, M, k]: input channel on axis 0
        return w * s.reshape((-1,) + (1,) * (w.ndim - 1))
    return w * (s[None, :] if attrs.get("transB", 0) else s[:, None])


def _in_ranges(node: onnx.NodeProto, w: np.ndarray) -> np.ndarray:
    attrs = _attrs(node)
    if node.op_type == "Conv":
        g = attrs.get("group", 1)
        n, c_g = w.shape[:2]
        return np.abs(w.reshape(g, n // g, c_g, -1)).max(axis=(1, 3)).reshape(-1)
    if node.op_type == "ConvTranspose":
        return np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
    return np.abs(w if not attrs.get("transB", 0) else w.T).max(axis=1)


def _in_sums(node: onnx.NodeProto, w: np.ndarray) -> np.ndarray:
    """``[out channels, in channels]`` sums of ``w`` over the kernel (what a constant input adds)."""
    attrs = _attrs(node)
    if node.op_type == "Conv":
        g = attrs.get("group", 1)
        n, c_g = w.shape[:2]
        per_group = w.reshape(g, n // g, c_g, -1).sum(axis=3)
        full = np.zeros((n, g * c_g))
        for k in range(g):
            full[k * (n // g):(k + 1) * (n // g), k * c_g:(k + 1) * c_g] = per_group[k]
        return full
    if node.op_type == "ConvTranspose":
        return w.sum(axis=tuple(range(2, w.ndim))).T
    return w if attrs.get("transB", 0) else w.T


def _bias(graph: _Graph, node: onnx.NodeProto, rows: int) -> np.ndarray:
    if len(node.input) > 2 and node.input[2]:
        return np.broadcast_to(graph.value(node.input[2]).reshape(-1), (rows,)).copy()
    return np.zeros(rows)


def _set_bias(graph: _Graph, node: onnx.NodeProto, bias: np.ndarray) -> None:
    if len(node.input) > 2 and node.input[2]:
        graph.write(node.input[2], bias.reshape(graph.value(node.input[2]).shape) if graph.value(
            node.input[2]).size == bias.size else bias)
        return
    name = f"{node.name}.bias"
    tensor = numpy_helper.from_array(bias.astype(np.float32), name)
    graph.model.graph.initializer.append(tensor)
    graph.inits[name] = graph.model.graph.initializer[-1]
    while len(node.input) < 2:
        node.input.append("")
    node.input.append(name)


def _scale_pair(graph: _Graph, first: onnx.NodeProto, second: onnx.NodeProto, stats: dict) -> np.ndarray | None:
    """Equalize one pair; the per-channel factors ``s`` that ``first``'s outputs were divided by."""
    w0, w1 = graph.value(first.input[1]), graph.value(second.input[1])
    view0, shape0 = _out_view(first, w0)
    r0, r1 = np.abs(view0).max(axis=1), _in_ranges(second, w1)
    if r0.size != r1.size:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.sqrt(r0 / r1)
    s = np.where(np.isfinite(s) & (s > 0), s, 1.0)
    graph.write(first.input[1], _from_out_view(first, view0 / s[:, None], shape0))
    if len(first.input) > 2 and first.input[2]:
        _set_bias(graph, first, _bias(graph, first, s.size) / s)
    graph.write(second.input[1], _in_scale(second, w1, s))
    if first.output[0] in stats:
        gamma, beta = stats[first.output[0]]
        stats[first.output[0]] = (gamma / s, beta / s)
    return s


def _absorb_bias(graph: _Graph, first: onnx.NodeProto, act: onnx.NodeProto | None, second: onnx.NodeProto,
                 stats: dict) -> None:
    gamma, beta = stats[first.output[0]]
    c = beta if act is None else np.maximum(0.0, beta - 3 * np.abs(gamma))
    if act is not None and act.op_type != "Relu":
        return  # LeakyRelu/PRelu pass negative values: only plain Relu bounds them
    if not np.any(c) or _pads(second):
        return  # a zero-padded border would miss the moved bias: the float function would change there
    b0 = _bias(graph, first, c.size)
    _set_bias(graph, first, b0 - c)
    sums = _in_sums(second, graph.value(second.input[1]))
    if second.op_type == "Gemm":  # Y = alpha A B + beta C: the added output alpha * B c goes to C / beta
        attrs = _attrs(second)
        sums = sums * float(attrs.get("alpha", 1.0)) / float(attrs.get("beta", 1.0))
    _set_bias(graph, second, _bias(graph, second, sums.shape[0]) + sums @ c)


def _pads(node: onnx.NodeProto) -> bool:
    attrs = _attrs(node)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    return node.op_type != "Gemm" and (any(attrs.get("pads", ())) or auto_pad not in (b"NOTSET", b"VALID"))


def _batchnorm_stats(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{BN output: (gamma, beta)}`` for BatchNormalizations reading a layer (folded by preparation)."""
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    stats = {}
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or node.input[1] not in inits or node.input[2] not in inits:
            continue
        if producers.get(node.input[0]) is None or producers[node.input[0]].op_type not in _LAYERS:
            continue
        stats[node.output[0]] = (numpy_helper.to_array(inits[node.input[1]]).astype(np.float64),
                                 numpy_helper.to_array(inits[node.input[2]]).astype(np.float64))
    return stats


def _rescale_clip(graph: _Graph, first: onnx.NodeProto, act: onnx.NodeProto, s: np.ndarray) -> None:
    """``Clip(z / s, lo, hi)`` -> ``Min(Relu(z / s), hi / s)`` (``Max(., lo / s)`` for ``lo != 0``), per channel:
    equal to ``Clip(z, lo, hi) / s``, so the pair's second layer (its inputs multiplied by ``s``) sees what it
    saw before. The bound is a ``[C, 1, ...]`` constant (Clip takes scalars only)."""
    lo, hi = _clip_bounds(graph, act) or (-np.inf, np.inf)
    rank = graph.value(first.input[1]).ndim if first.op_type != "Gemm" else 2
    shape = (s.size,) + (1,) * (rank - 2)
    out, x = act.output[0], act.input[0]
    nodes: list[onnx.NodeProto] = []
    if lo == 0.0:
        nodes.append(onnx.helper.make_node("Relu", [x], [f"{out}.cle_lower"], name=act.name))
    elif np.isfinite(lo):
        nodes.append(onnx.helper.make_node("Max", [x, _constant(graph, f"{act.name}.cle_lo", lo / s, shape)],
                                           [f"{out}.cle_lower"], name=act.name))
    if np.isfinite(hi):
        nodes.append(onnx.helper.make_node("Min", [nodes[-1].output[0] if nodes else x,
                                                   _constant(graph, f"{act.name}.cle_hi", hi / s, shape)],
                                           [out], name=f"{act.name}.cle_upper" if nodes else act.name))
    if not nodes:
        nodes.append(onnx.helper.make_node("Identity", [x], [out], name=act.name))
    nodes[-1].output[0] = out
    position = list(graph.model.graph.node).index(act)
    del graph.model.graph.node[position]
    for offset, node in enumerate(nodes):
        graph.model.graph.node.insert(position + offset, node)


def _drop_unused_initializers(model: onnx.ModelProto, candidates: set[str]) -> None:
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name not in candidates or t.name in used]
    if len(keep) < len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def _constant(graph: _Graph, name: str, values: np.ndarray, shape: tuple) -> str:
    tensor = numpy_helper.from_array(values.reshape(shape).astype(np.float32), name)
    graph.model.graph.initializer.append(tensor)
    graph.inits[name] = graph.model.graph.initializer[-1]
    return name


CLIP_PAIRS = ("rescale", "skip", "relu")


def equalize_model(model: onnx.ModelProto, input_shapes: object = None, dummy_input: Mapping[str, np.ndarray] | None = None,
                   *, clip_pairs: str = "rescale", high_bias_fold: bool = True, passes: int = 3) -> onnx.ModelProto:
    """Equalize ``model`` IN PLACE (as AIMET's ``equalize_model``: the caller's ModelProto becomes the
    BatchNormalization-folded, equalized model) and return it; see the module docstring.

    ``clip_pairs`` says what happens to pairs with a Clip (ReLU6) between their layers: ``"rescale"`` (the
    default) scales them and gives the Clip per-channel bounds (the float function is kept); ``"skip"`` leaves
    them alone; ``"relu"`` replaces ``Clip(0, hi)`` by Relu first, as AIMET does (changes what the float model
    computes wherever the activation exceeded ``hi``). ``input_shapes`` (aimet_torch's argument) has no effect:
    an ONNX model carries its shapes. ``dummy_input`` (``{input name: array}``), when given, checks that the
    equalized model computes what the original did on it, within float rounding (`EQUIVALENCE_RTOL`), and
    warns where it does not.
    """
    target = model.model if not isinstance(model, onnx.ModelProto) and isinstance(
        getattr(model, "model", None), onnx.ModelProto) else model  # onnxruntime's ONNXModel wrapper
    if not isinstance(target, onnx.ModelProto):
        raise InvalidArgumentError(f"equalize_model takes an onnx.ModelProto, got {type(model).__name__}")
    if passes < 1:
        raise InvalidArgumentError(f"passes must be >= 1, got {passes}")
    if clip_pairs not in CLIP_PAIRS:
        raise InvalidArgumentError(f"clip_pairs must be one of {CLIP_PAIRS}, got {clip_pairs!r}")
    if input_shapes is not None:
        warn_at_caller("equalize_model: input_shapes has no effect (an ONNX model carries its own shapes)")
    reference = _outputs(target, dummy_input) if dummy_input is not None else None
    work = _equalized(target, clip_pairs, high_bias_fold, passes)
    if reference is not None and dummy_input is not None:  # (both: for mypy)
        _check_equivalent(reference, _outputs(work, dummy_input), clip_pairs)
    target.CopyFrom(work)
    return target


def _equalized(model: onnx.ModelProto, clip_pairs: str, high_bias_fold: bool, passes: int) -> onnx.ModelProto:
    stats = _batchnorm_stats(model)
    work = prepare(model)
    graph = _Graph(work)
    if clip_pairs == "relu":
        for _, act, _ in _pairs(graph):
            if act is not None and act.op_type == "Clip" and (_clip_bounds(graph, act) or (1, 0))[0] == 0.0:
                act.op_type = "Relu"
                del act.input[1:]
                del act.attribute[:]
        graph = _Graph(work)
    pairs = _pairs(graph)
    clipped = [(a, act, b) for a, act, b in pairs if act is not None and act.op_type == "Clip"]
    if clipped and clip_pairs == "skip":
        _log.info("equalize_model: %d pair(s) with a Clip between their layers left alone (clip_pairs='skip'): %s",
                  len(clipped), [f"{a.name} -> {b.name}" for a, _, b in clipped])
        pairs = [p for p in pairs if p not in clipped]
    total = {first.name: np.ones(1) for first, _, _ in pairs}
    for _ in range(passes):
        for first, _, second in pairs:
            s = _scale_pair(graph, first, second, stats)
            if s is not None:
                total[first.name] = total[first.name] * s
    for first, act, _ in clipped if clip_pairs != "skip" else ():  # "relu" leaves Clips with a lower bound
        if np.any(total[first.name] != 1.0):
            _rescale_clip(graph, first, act, total[first.name])
    _drop_unused_initializers(work, {name for _, act, _ in clipped for name in act.input[1:]})
    if high_bias_fold:
        for first, act, second in pairs:
            if first.output[0] in stats and (act is None or act.op_type != "Clip"):
                _absorb_bias(graph, first, act, second, stats)
    _log.info("equalize_model: %d pair(s) equalized", len(pairs))
    return work


def _outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in session.run(None, dict(feeds))]
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own classes
        raise InvalidArgumentError(f"equalize_model: the model does not run on dummy_input: {exc}") from exc


def _check_equivalent(before: list[np.ndarray], after: list[np.ndarray], clip_pairs: str) -> None:
    worst = 0.0
    for a, b in zip(before, after):
        if a.dtype.kind != "f" or not a.size:
            continue
        scale = float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) or 1.0
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0)) / scale)
    _log.info("equalize_model: outputs on dummy_input differ by %.3g of their range", worst)
    if worst > EQUIVALENCE_RTOL:
        why = " (clip_pairs='relu' changes the float function)" if clip_pairs == "relu" else ""
        warn_at_caller(f"equalize_model: the equalized model's outputs on dummy_input differ from the original's "
                       f"by {worst:.3g} of their range{why}", QuantsimWarning)
