"""Cross-layer equalization (Nagel et al. 2019, as AIMET's ``equalize_model``): a float model in, an
equivalent float model out whose consecutive layers have equal per-channel weight ranges, so per-tensor
(and per-channel) weight grids lose less.

Steps, on a copy prepared by `quantsim.prepare` (which folds BatchNormalization into the layers):

1. **ReLU6 -> ReLU** for ``Clip(0, 6)`` between two layers of a pair, as AIMET does (ReLU6 is not
   scale-equivariant; the model then matches the original wherever those activations stay below 6).
2. **Scaling.** For layers ``L0 -> [Relu | LeakyRelu | PRelu | nothing] -> L1`` (Conv, ConvTranspose
   without groups on the second side, Gemm; the middle tensor read by ``L1`` only), output channel ``i``
   of ``L0`` is divided by ``s_i = sqrt(r0_i / r1_i)`` and input channel ``i`` of ``L1`` multiplied by it,
   where ``r0_i`` is the largest ``|w|`` of ``L0``'s output channel and ``r1_i`` of ``L1``'s input channel;
   both ranges become ``sqrt(r0_i r1_i)``. Positive homogeneity (``f(x / s) = f(x) / s``) keeps the
   model's function. Grouped and depthwise layers are equalized channel by channel, and chains
   (Conv -> depthwise Conv -> Conv) are swept ``passes`` times so every pair settles.
3. **High-bias absorption** (where the BatchNormalization folded into ``L0`` gave ``gamma, beta``): the
   part ``c = max(0, beta - 3 |gamma|)`` (``beta`` without an activation) of ``L0``'s bias that almost never
   falls below the activation's kink moves into ``L1``'s bias (``b1 += W1 c``). Exact away from ``L1``'s
   zero padding, as in AIMET.

The input model is never modified.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from quantsim import InvalidArgumentError, prepare

__all__ = ["equalize_model", "find_equalization_pairs"]

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
        if nxt is not None and (nxt.op_type in _HOMOGENEOUS or _is_relu6(graph, nxt)):
            act, nxt = nxt, graph.only_consumer(nxt.output[0])
        if nxt is None or not graph.is_layer(nxt) or nxt.input[0] != (act or node).output[0]:
            continue
        if nxt.op_type == "ConvTranspose" and _attrs(nxt).get("group", 1) != 1:
            continue
        if act is not None and act.op_type == "PRelu" and graph.value(act.input[1]).size != 1:
            continue  # a per-channel slope would need rescaling too: left alone
        pairs.append((node, act, nxt))
    return pairs


def _is_relu6(graph: _Graph, node: onnx.NodeProto) -> bool:
    if node.op_type != "Clip" or len(node.input) < 3 or not all(n in graph.inits for n in node.input[1:3]):
        return False
    return float(graph.value(node.input[1])) == 0.0 and float(graph.value(node.input[2])) == 6.0


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


def _scale_pair(graph: _Graph, first: onnx.NodeProto, second: onnx.NodeProto, stats: dict) -> None:
    w0, w1 = graph.value(first.input[1]), graph.value(second.input[1])
    view0, shape0 = _out_view(first, w0)
    r0, r1 = np.abs(view0).max(axis=1), _in_ranges(second, w1)
    if r0.size != r1.size:
        return
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


def _absorb_bias(graph: _Graph, first: onnx.NodeProto, act: onnx.NodeProto | None, second: onnx.NodeProto,
                 stats: dict) -> None:
    gamma, beta = stats[first.output[0]]
    c = beta if act is None else np.maximum(0.0, beta - 3 * np.abs(gamma))
    if act is not None and act.op_type != "Relu":
        return  # LeakyRelu/PRelu pass negative values: only plain Relu bounds them
    if not np.any(c):
        return
    b0 = _bias(graph, first, c.size)
    _set_bias(graph, first, b0 - c)
    sums = _in_sums(second, graph.value(second.input[1]))
    if second.op_type == "Gemm":  # Y = alpha A B + beta C: the added output alpha * B c goes to C / beta
        attrs = _attrs(second)
        sums = sums * float(attrs.get("alpha", 1.0)) / float(attrs.get("beta", 1.0))
    _set_bias(graph, second, _bias(graph, second, sums.shape[0]) + sums @ c)


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


def equalize_model(model: onnx.ModelProto, *, relu6_to_relu: bool = True, high_bias_fold: bool = True,
                   passes: int = 3) -> onnx.ModelProto:
    """An equalized, BatchNormalization-folded copy of ``model`` (see the module docstring)."""
    if not isinstance(model, onnx.ModelProto):
        raise InvalidArgumentError(f"equalize_model takes an onnx.ModelProto, got {type(model).__name__}")
    if passes < 1:
        raise InvalidArgumentError(f"passes must be >= 1, got {passes}")
    stats = _batchnorm_stats(model)
    work = prepare(model)
    graph = _Graph(work)
    if relu6_to_relu:
        for _, act, _ in _pairs(graph):
            if act is not None and act.op_type == "Clip":
                act.op_type = "Relu"
                del act.input[1:]
        graph = _Graph(work)
    pairs = [(a, act, b) for a, act, b in _pairs(graph) if act is None or act.op_type != "Clip"]
    for _ in range(passes):
        for first, _, second in pairs:
            _scale_pair(graph, first, second, stats)
    if high_bias_fold:
        for first, act, second in pairs:
            if first.output[0] in stats:
                _absorb_bias(graph, first, act, second, stats)
    return work
