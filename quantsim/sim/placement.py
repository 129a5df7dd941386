"""Where quantizers go: parameter and activation sites from the graph and the config rules, then ties.

Rules, in order (AIMET's configurator order, reference §1.3 and §4.2):

1. Parameters are initializers in the parameter slots of `PARAM_SLOTS` (weights, biases, norm
   statistics), quantized per the config's ``params``/``op_type.params`` flags, per channel where the
   op type asks for it (channel axis from `channel_axis_of`). Norm-layer parameters follow AIMET's exception
   rules (`_norm_param_exceptions`: >= 8 bits; BN/LayerNorm symmetric only at 16 bits; Group/Instance/RMS
   normalization follow their output quantizer), applied after step 4's supergroups.
2. Activations are the model's float inputs (``model_input``), float node outputs (default ops rule;
   op types listed in `GRID_PRESERVING` or configured off are not quantized) and float constants feeding
   elementwise ops or gathered by indices (an embedding table, `GATHER_OPS`; aimet-onnx quantizes
   every constant input of a node), quantized like model inputs, encoded from their values. Constants
   holding inf/NaN (fill values such as -inf before a Max) stay float and are listed as such.
3. Shape and index arithmetic, normalization statistics (`tensor_roles`), additive attention masks
   with the masked scores (`attention_masks`: any fill value and construction) and fill-holding tensors built
   from constants and indices alone (a scatter max's identity, `find_constant_fills`) are never quantized; each
   masked Softmax is recorded as a `Decision`. The statistics rule covers the whole span between a
   reduction and the next 1/std, so a Conv/Gemm/MatMul between two decomposed norm layers (magika) runs
   in float; ``linear_ops_in_norm_blocks=True`` quantizes the activation input and output of those ops
   (their input reached back through data movement) and leaves the rest of the span float, so QDQ runtimes
   run them on integer kernels: an explicit speed-for-accuracy option (benchmarks/README.md, magika);
   ``linear_ops_in_norm_blocks="all"`` keeps only each norm layer's own statistics float
   (`find_normalization_statistics(per_layer=True)`) and quantizes everything between norm layers
   (PP-OCR rec: 77 -> 35 float ops in the integer export, 5 at opset 17, CER unchanged; magika: top-1
   99.4% -> 96.5%, so not the default).
4. Supergroups (e.g. Conv+Relu, Conv+Clip, Add+Relu) keep only the last op's output quantizer, and so does
   HardSwish spelled ``x * HardSigmoid(x)`` and a clamp by a constant after Relu/Clip (``Min(Relu(x), b)``,
   per-channel ``b`` included: the bound stays float); the MatmulAdd pass turns ``Add(MatMul(x, W), b)``'s
   constant into a bias. AIMET never starts a supergroup at a depthwise or 3-D convolution
   (`is_depthwise_or_3d_conv`), so their outputs keep a quantizer there; here ``depthwise_supergroups=True``
   (the default) lets them start supergroups too (one quantizer after the activation, better on MobileNet-style
   nets: the depthwise output's long negative tail is not put on a grid of its own), and
   ``depthwise_supergroups=False`` gives AIMET's placement. The LayerNormalization and RMSNormalization
   passes turn off the quantizers inside decomposed norm layers (`quantsim.sim.config_passes`), and so does
   MaskedSoftmax inside its pattern.
   An op type's ``encoding_constraints`` fix its output quantizer's range (``fixed_range``).
5. Ties: Relu/AveragePool/Resize outputs share the quantizer of their quantized input; Concat inputs
   share the output's quantizer (walking up through single-consumer grid-preserving ops; a source with
   other consumers keeps its own); an LSTM/GRU/RNN's ``Y``, ``Y_h`` and ``initial_h`` share one quantizer, its
   ``Y_c`` and ``initial_c`` another (`quantsim.sim.recurrent_ties`). Tied tensors form one `QuantizerPlan`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from quantsim.core.dtypes import qtype
from quantsim.core.spec import PerChannel, PerTensor, QSpec
from quantsim.errors import InvalidArgumentError
from quantsim.graph.index import GraphIndex
from quantsim.graph.op_facts import GATHER_OPS, GRID_MOVEMENT_OPS, GRID_PRESERVING, PARAM_SLOTS, WEIGHTED_OPS, channel_axis_of
from quantsim.graph.tensor_roles import find_index_tensors, find_normalization_statistics
from quantsim.sim.config import QuantsimConfig
from quantsim.sim.config_passes import norm_pass_sites
from quantsim.sim.decisions import Decision
from quantsim.sim.exception_rules import NORM_PARAM_RULE_OPS, norm_param_rule
from quantsim.sim.fill_decisions import fill_floats
from quantsim.sim.recurrent_ties import recurrent_state_ties

__all__ = ["QuantizerPlan", "Placement", "place_quantizers", "checked_norm_block_option", "is_depthwise_or_3d_conv"]

CONSTANT_INPUT_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Concat", "Where"})
FORWARD_TIED = frozenset({"Relu", "AveragePool", "Resize", "Upsample"})
BACKWARD_TIED = frozenset({"Concat"})
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})
_CLAMPS = frozenset({"Relu", "Clip", "Min", "Max"})


@dataclass
class QuantizerPlan:
    """One quantizer to create: the tensors it covers, its role, spec and initial enabled flag."""

    name: str
    role: str
    tensors: list[str]
    spec: QSpec
    enabled: bool
    param_type: str | None = None
    op_type: str = ""
    shape: tuple | None = None
    channel_axis: int | None = None
    fixed_range: tuple[float | None, float | None] | None = None  # config encoding_constraints


@dataclass
class Placement:
    """Every planned quantizer, what stays float and why, and the index tensors found on the way."""

    plans: list[QuantizerPlan]
    left_in_float: list[tuple[str, str]] = field(default_factory=list)  # (node or tensor, why)
    index_tensors: frozenset[str] = frozenset()
    decisions: list[Decision] = field(default_factory=list)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, item: str) -> str:
        self.parent.setdefault(item, item)
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, keep: str, other: str) -> None:
        self.parent[self.find(other)] = self.find(keep)


def linear_op_activations(index: GraphIndex, within: frozenset[str]) -> frozenset[str]:
    """Tensors of ``within`` that are the output (after a bias Add), or the activation input, of a
    Conv/Gemm/MatMul with a constant weight; an input is followed back through single-input data movement (Unsqueeze, Slice,
    Transpose, ...) so that the quantized tensor is where the data comes from (rule 3)."""
    found: set[str] = set()
    for node in index.nodes:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or not index.is_constant(node.input[1]):
            continue
        found.update(o for o in node.output if o in within)
        pair = index.bias_add(node.output[0])
        if pair is not None and pair[0].output[0] in within:
            found.add(pair[0].output[0])  # MatMul + bias Add: the pair's output quantizer is after the Add
        name = node.input[0]
        while name in within and name not in found:
            found.add(name)
            producer = index.producer_of(name)
            if producer is None or producer.op_type not in GRID_MOVEMENT_OPS:
                break
            name = producer.input[0]
    return frozenset(found)


def checked_norm_block_option(value: object) -> bool | str:
    """``linear_ops_in_norm_blocks`` as given (False, True or "all"); anything else is an InvalidArgumentError."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value == "all":
        return "all"
    raise InvalidArgumentError(f"linear_ops_in_norm_blocks must be False, True or 'all', got {value!r}")


def place_quantizers(
    index: GraphIndex, config: QuantsimConfig, param_type: qtype, activation_type: qtype,
    linear_ops_in_norm_blocks: bool | str = False, depthwise_supergroups: bool = True,
) -> Placement:
    """Plan every quantizer of the model (see the module docstring for the rules)."""
    index_tensors = find_index_tensors(index)
    statistics = find_normalization_statistics(index, per_layer=linear_ops_in_norm_blocks == "all")
    if linear_ops_in_norm_blocks is True:
        statistics = statistics - linear_op_activations(index, statistics)
    fill_held, decisions, fill_reasons = fill_floats(index)
    sites: dict[str, QuantizerPlan] = {}
    left_in_float: list[tuple[str, str]] = [
        (name, "normalization statistic (mean/variance/1-std of a decomposed norm layer)") for name in sorted(statistics)
    ] + fill_reasons

    def activation_spec(op_type: str) -> QSpec:
        rule = config.op_rule(op_type) if op_type else None
        symmetric = rule.is_symmetric if rule and rule.is_symmetric is not None else config.activation_symmetric
        return QSpec(activation_type, PerTensor(), symmetric, config.strict_symmetric, config.unsigned_symmetric)

    def quantizable(name: str) -> bool:
        return index.is_float(name) and name not in index_tensors and name not in statistics and name not in fill_held

    # 1. parameters
    bias_of_matmul = _matmul_add_biases(index, config)
    for node in index.nodes:
        for slot, ptype in PARAM_SLOTS.get(node.op_type, {}).items():
            if slot >= len(node.input) or not index.is_constant(node.input[slot]) or node.input[slot] in sites:
                continue
            name = node.input[slot]
            if not index.is_float(name) or not _finite_constant(index, name, left_in_float):
                continue
            sites[name] = _param_plan(index, config, node, slot, ptype, param_type)
    for _, name in bias_of_matmul:
        if name not in sites:
            flags = config.param_flags("Add", "bias")
            spec = QSpec(param_type, PerTensor(), bool(flags.is_symmetric), config.strict_symmetric, config.unsigned_symmetric)
            sites[name] = QuantizerPlan(name, "param", [name], spec, bool(flags.is_quantized), "bias", "Add",
                                        index.shape.get(name), 0)

    # 2. activations: model inputs, node outputs, constants feeding elementwise ops
    for name in index.graph_inputs:
        if quantizable(name):
            sites[name] = QuantizerPlan(name, "activation", [name], activation_spec(""), config.model_input_quantized)
    for node in index.nodes:
        if node.op_type in SUBGRAPH_OPS:
            left_in_float.append((node.name, f"{node.op_type} body is not quantized (subgraph ops run in float)"))
        rule = config.op_rule(node.op_type)
        for name in node.output:
            if not name or name in sites:
                continue
            if name not in index.elem_type and name not in index_tensors:
                left_in_float.append((name, "type unknown after shape inference"))
                continue
            if not quantizable(name):
                continue
            if rule.is_output_quantized is not None:
                enabled = rule.is_output_quantized
            else:
                enabled = config.output_quantized and node.op_type not in GRID_PRESERVING
            if config.model_output_quantized and name in index.graph_outputs:
                enabled = True
            sites[name] = QuantizerPlan(name, "activation", [name], activation_spec(node.op_type), enabled,
                                        op_type=node.op_type, fixed_range=rule.encoding_constraints)
        if node.op_type in CONSTANT_INPUT_OPS or node.op_type in GATHER_OPS:
            for slot, name in enumerate(node.input):
                if node.op_type in GATHER_OPS and slot != 0:  # a table gathered by indices (an embedding)
                    continue
                if (node.op_type == "Where" and slot == 0) or not index.is_constant(name) or name in sites:
                    continue
                if quantizable(name) and _finite_constant(index, name, left_in_float):
                    sites[name] = QuantizerPlan(name, "activation", [name], activation_spec(""),
                                                config.model_input_quantized, shape=index.shape.get(name))

    # 3. supergroups and MatmulAdd
    depthwise_fused = []
    for node in index.nodes:
        depthwise = is_depthwise_or_3d_conv(index, node)
        if depthwise and not depthwise_supergroups:
            continue
        for pattern in config.supergroups:
            chain = _match_chain(index, node, pattern)
            if depthwise and len(chain) > 1 and any(n in sites and sites[n].enabled for n in node.output):
                depthwise_fused.append(node.output[0])
            for member in chain[:-1]:
                for name in member.output:
                    if name in sites:
                        sites[name].enabled = False
    if depthwise_fused:
        decisions.append(Decision("depthwise supergroup", tuple(depthwise_fused),
                                  "no quantizer between the depthwise/3-D convolution and its activation",
                                  "one grid after the activation is more accurate; depthwise_supergroups=False "
                                  "gives aimet-onnx's placement"))
    for node in index.nodes:  # HardSwish spelled x * HardSigmoid(x): one activation, one quantizer
        gate = node.output[0] if node.op_type == "HardSigmoid" else None
        mul = index.single_consumer(gate) if gate else None
        if mul is not None and mul.op_type == "Mul" and node.input[0] in mul.input and gate in sites:
            sites[gate].enabled = False
    _merge_clamp_chains(index, sites)
    for add_node, _ in bias_of_matmul:
        matmul_out = next(n for n in add_node.input if not index.is_constant(n))
        if matmul_out in sites:
            sites[matmul_out].enabled = False
    norm_off, symmetric16 = norm_pass_sites(index, config.supergroup_pass_list)  # AIMET's norm / masked-softmax passes
    for name in norm_off:
        if name in sites:
            sites[name].enabled = False
    for name in symmetric16:
        plan = sites.get(name)
        if plan is not None and not plan.spec.is_float and plan.spec.dtype.bits == 16:
            plan.spec = plan.spec.with_(symmetric=True)
    _norm_param_exceptions(index, sites)

    # 4. ties
    ties = _UnionFind()
    enabled_act = {n for n, p in sites.items() if p.role == "activation" and p.enabled}
    for node in index.nodes:
        if node.op_type in FORWARD_TIED and node.input and node.input[0] in enabled_act:
            for out in node.output:
                if out in enabled_act:
                    ties.union(node.input[0], out)
        if node.op_type in BACKWARD_TIED and node.output[0] in enabled_act:
            for name in node.input:
                source = _closest_quantized_source(index, name, enabled_act)
                if source is not None:
                    ties.union(node.output[0], source)
    for keep, other in recurrent_state_ties(index, enabled_act):  # LSTM/GRU/RNN hidden and cell states
        ties.union(keep, other)
    groups: dict[str, QuantizerPlan] = {}
    for name, plan in sites.items():
        root = ties.find(name) if plan.role == "activation" and plan.enabled else name
        if root == name:
            groups.setdefault(name, plan)
        else:
            groups.setdefault(root, sites[root])
    for name, plan in sites.items():
        root = ties.find(name) if plan.role == "activation" and plan.enabled else name
        if root != name:
            groups[root].tensors.append(name)
    return Placement(list(groups.values()), left_in_float, index_tensors, decisions)


def _norm_param_exceptions(index: GraphIndex, sites: dict[str, QuantizerPlan]) -> None:
    """AIMET's exception rules for the integer parameter quantizers of norm layers (`norm_param_rule`), applied
    after the config and the supergroups, before ties."""
    for node in index.nodes:
        if node.op_type not in NORM_PARAM_RULE_OPS or not node.output:
            continue
        out = sites.get(node.output[0])
        output = (out.spec.dtype, out.spec.symmetric) if out is not None and out.enabled else None
        for name in node.input[1:]:
            plan = sites.get(name)
            if plan is None or plan.role != "param" or not plan.enabled:
                continue
            rule = norm_param_rule(node.op_type, plan.spec.dtype, output)
            if rule is not None:
                plan.spec = plan.spec.with_(dtype=rule[0], symmetric=rule[1])


def _merge_clamp_chains(index: GraphIndex, sites: dict[str, QuantizerPlan]) -> None:
    """A clamp by a constant (``Min``/``Max`` with a constant bound, scalar or per channel) reading the only use
    of a Relu/Clip/Min/Max output is part of that activation: one quantizer, after the last clamp, and the bound
    stays float (rounding is monotone, so quantizing after ``Min(x, b)`` equals clamping the codes by ``b``'s
    code). This is how a ReLU6 with per-channel bounds (`adaround.equalize_model`) or spelled ``Min(Relu(x), 6)``
    keeps the single output quantizer of ``Conv + Clip``."""
    for node in index.nodes:
        if node.op_type not in ("Min", "Max") or len(node.input) != 2:
            continue
        data = [name for name in node.input if not index.is_constant(name)]
        if len(data) != 1:
            continue
        producer = index.producer_of(data[0])
        if producer is None or producer.op_type not in _CLAMPS or index.single_consumer(data[0]) is not node:
            continue
        for name in node.input:
            if name in sites and sites[name].role == "activation":
                sites[name].enabled = False


def is_depthwise_or_3d_conv(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """AIMET's supergroup exclusion: a Conv / ConvTranspose with a 5-D input or weight, or a grouped one whose
    groups each read one input channel (Conv weight ``[M, 1, k...]``; ConvTranspose weight ``[group, ...]``)."""
    if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
        return False
    data, weight = index.shape.get(node.input[0]), index.shape.get(node.input[1])
    if (data is not None and len(data) == 5) or (weight is not None and len(weight) == 5):
        return True
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    if group == 1 or weight is None:
        return False
    return weight[1] == 1 if node.op_type == "Conv" else weight[0] == group


def _finite_constant(index: GraphIndex, name: str, left_in_float: list) -> bool:
    """Constants holding inf/NaN (e.g. a -inf fill value before a Max) cannot be put on a grid."""
    if np.isfinite(index.constant_value(name)).all():
        return True
    entry = (name, "constant holds inf/NaN values")
    if entry not in left_in_float:
        left_in_float.append(entry)
    return False


def _param_plan(index, config, node, slot, ptype, param_type) -> QuantizerPlan:
    name = node.input[slot]
    shape = index.shape.get(name)
    flags = config.param_flags(node.op_type, ptype)
    dtype = param_type  # norm-layer parameters: `_norm_param_exceptions`
    axis = channel_axis_of(node, slot, shape)
    granularity: PerTensor | PerChannel = PerTensor()
    if config.per_channel_for(node.op_type) and axis is not None and shape and len(shape) >= 1:
        granularity = PerChannel(axis)
    spec = QSpec(dtype, granularity, bool(flags.is_symmetric), config.strict_symmetric, config.unsigned_symmetric)
    return QuantizerPlan(name, "param", [name], spec, bool(flags.is_quantized), ptype, node.op_type, shape, axis)


def _matmul_add_biases(index: GraphIndex, config: QuantsimConfig) -> list[tuple[onnx.NodeProto, str]]:
    """``(Add node, bias constant)`` of each ``Add(MatMul(x, W), b)`` (`GraphIndex.bias_add`) when the MatmulAdd
    pass is configured. One constant may be the bias of several layers (torch's dynamo exporter shares equal
    initializers)."""
    if "MatmulAdd" not in config.supergroup_pass_list:
        return []
    found = []
    for node in index.nodes:
        if node.op_type != "MatMul" or not node.output:
            continue
        pair = index.bias_add(node.output[0])
        if pair is not None:
            found.append(pair)
    return found


def _match_chain(index: GraphIndex, node: onnx.NodeProto, pattern: tuple[str, ...]) -> list[onnx.NodeProto]:
    if node.op_type != pattern[0]:
        return []
    chain = [node]
    for op_type in pattern[1:]:
        if len(chain[-1].output) != 1:
            return []
        nxt = index.single_consumer(chain[-1].output[0])
        if nxt is None or nxt.op_type != op_type:
            return []
        chain.append(nxt)
    return chain


def _closest_quantized_source(index: GraphIndex, name: str, enabled: set[str]) -> str | None:
    """The tensor whose quantizer a Concat input should share, walking up through grid-preserving ops."""
    current = name
    while True:
        if len(index.uses(current)) != 1 or current in index.graph_outputs:
            return None
        if current in enabled:
            return current
        producer = index.producer_of(current)
        if producer is None or producer.op_type not in GRID_PRESERVING or producer.op_type == "Cast":
            return None
        data_inputs = [n for n in producer.input[:1] if n]
        if not data_inputs:
            return None
        current = data_inputs[0]
