"""A sim bound to a `TargetProfile` (``QuantizationSimModel(..., target=...)``): every precision stays legal.

* **Construction** (`attach_target`): explicit ``param_type``/``activation_type`` the target cannot carry raise
  `TargetError`; standard fixes are applied and recorded as decisions (asymmetric grids made symmetric on
  symmetric-only targets, per-channel weights made per-tensor where the target has no per-channel kernels,
  disabled graph input/output quantizers enabled where the target needs quantized I/O); whatever placement
  left illegal (float islands on a target without float fallback) is reported: one warning, and a
  ``Decision`` per spot in ``sim.decisions`` / ``sim.summary()`` (exports refuse it until it is fixed).
* **Overrides** (`TargetGuard`, called by every quantizer spec change: ``set_precision``, ``set_bitwidth``,
  ``set_qspec``, ``sim.set_tensor_precision``, ``set_param_type``, mixed_precision's overrides): a change
  that makes a node illegal raises `TargetError` naming the quantizer, the node and the rule, and changes
  nothing. Inside ``sim.transaction()`` (where grouped changes are made) rules about the quantizer's own
  type and grid are checked at once and rules between tensors (kernels, mixed inputs) when the outermost
  transaction ends, so changing a layer's weight and activations together is judged on the result.
* **Automatic decisions** (`legal_option`): range health and untied Concats ask which of their candidate
  precisions is legal and take the first (`quantsim.sim.decisions`).
* **Exports** (`check_export`): `ExportLegalityError` listing every finding of `quantsim.target.legality`.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import onnx

from quantsim.core.dtypes import float32, qtype
from quantsim.core.spec import PerBlock, PerChannel, PerTensor, QSpec
from quantsim.errors import ExportLegalityError, InvalidArgumentError, TargetError, warn_at_caller
from quantsim.graph.op_facts import facts_of
from quantsim.graph.tensor_roles import find_index_tensors
from quantsim.target.legality import FLOAT, Finding, LegalityReport, TensorPrecision, analyze
from quantsim.target.profile import TargetProfile, load_target

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel
    from quantsim.sim.quantizer import QcQuantizeOp

__all__ = ["SimView", "change_findings", "TargetGuard", "TargetProfile", "attach_target", "legal_option", "check_export",
           "sim_report", "LOCAL_RULES", "commit_pending"]

_log = logging.getLogger(__name__)

LOCAL_RULES = frozenset({"activation-type", "param-type", "activation-grid", "weight-grid"})
"""Rules about one quantizer's own type and grid (checked at once, even inside a transaction)."""

_UNSET = object()


def _granularity(spec: QSpec) -> str:
    g = spec.granularity
    return "per_block" if isinstance(g, PerBlock) else "per_channel" if isinstance(g, PerChannel) else "per_tensor"


class SimView:
    """The sim's graph as `quantsim.target.legality.analyze` reads it; ``overrides`` maps quantizer ids to a
    hypothetical spec (None: disabled)."""

    def __init__(self, sim: QuantizationSimModel, overrides: dict[int, QSpec | None] | None = None):
        self.sim, self.index = sim, sim._index
        self.overrides = overrides or {}
        self.nodes = self.index.nodes
        self.graph_inputs = self.index.graph_inputs
        self.graph_outputs = self.index.graph_outputs
        self.index_tensors = _index_tensors(sim)

    def _spec(self, q: QcQuantizeOp) -> QSpec | None:
        spec = self.overrides.get(id(q), _UNSET)
        if spec is _UNSET:
            return q.spec if q.enabled else None
        return spec  # type: ignore[return-value]

    def deciding(self, tensor: str) -> tuple[QcQuantizeOp, QSpec] | None:
        """The enabled quantizer deciding ``tensor``'s values (its own, or the closest upstream through
        grid-preserving ops) and its spec."""
        seen: set[str] = set()
        while tensor not in seen:
            seen.add(tensor)
            q = self.sim.qc_quantize_op_dict.get(tensor)
            if q is not None and (spec := self._spec(q)) is not None:
                return q, spec
            producer = self.index.producer.get(tensor)
            if producer is None or not facts_of(producer[0].op_type).grid_preserving or not producer[0].input:
                return None
            tensor = producer[0].input[0]
        return None

    def is_float(self, tensor: str) -> bool:
        return self.index.is_float(tensor)

    def is_constant(self, tensor: str) -> bool:
        return self.index.is_constant(tensor)

    def is_plain_constant(self, tensor: str) -> bool:
        return self.index.is_constant(tensor) and self.deciding(tensor) is None

    def consumers(self, tensor: str) -> list[onnx.NodeProto]:
        return [u.node for u in self.index.uses(tensor) if u.index >= 0]

    def producer(self, tensor: str) -> onnx.NodeProto | None:
        return self.index.producer_of(tensor)

    def precision(self, tensor: str) -> TensorPrecision:
        found = self.deciding(tensor)
        if found is None:
            return FLOAT
        q, spec = found
        if spec.dtype == float32:
            return FLOAT
        return TensorPrecision(spec.dtype, bool(spec.symmetric), _granularity(spec), q.name)

    def weight(self, node: onnx.NodeProto) -> tuple[str, TensorPrecision] | None:
        for slot, kind in sorted(facts_of(node.op_type).param_slots.items()):
            if kind == "weight" and slot < len(node.input) and self.index.is_constant(node.input[slot]):
                return node.input[slot], self.precision(node.input[slot])
        return None

    def shape(self, tensor: str) -> tuple | None:
        return self.index.shape.get(tensor)


def _index_tensors(sim: QuantizationSimModel) -> frozenset[str]:
    rules = getattr(sim, "_target_rules", None)
    if rules is not None and rules.index_tensors is not None and rules.index_version is sim._index:
        return rules.index_tensors
    found = find_index_tensors(sim._index)
    if rules is not None:
        rules.index_tensors, rules.index_version = found, sim._index
    return found


def _affected_nodes(sim: QuantizationSimModel, q: QcQuantizeOp) -> list[onnx.NodeProto]:
    """The nodes whose verdict can depend on ``q``: producers of its tensors (and theirs, for fused pairs),
    readers, and readers through grid-preserving ops that inherit its grid (outputs without an enabled
    quantizer of their own: `SimView.deciding`)."""
    index, out, seen_nodes = sim._index, [], set()

    def add(node: onnx.NodeProto | None) -> None:
        if node is not None and id(node) not in seen_nodes:
            seen_nodes.add(id(node))
            out.append(node)

    stack, seen = list(q.tensors), set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        producer = index.producer_of(tensor)
        add(producer)
        for name in (producer.input if producer is not None else ()):
            add(index.producer_of(name))
        for use in index.uses(tensor):
            if use.index < 0:
                continue
            add(use.node)
            if facts_of(use.node.op_type).grid_preserving:  # a disabled quantizer there inherits q's grid too
                stack += [t for t in use.node.output if t and not _own_grid(sim.qc_quantize_op_dict.get(t))]
    return out


def _own_grid(q: QcQuantizeOp | None) -> bool:
    return q is not None and q.enabled


def _keys(report: LegalityReport) -> set[tuple]:
    return {(f.node, f.rule, f.tensors) for f in report.errors}


class TargetRules:
    """The sim's target and its bookkeeping (pending checks of an open transaction, cached index tensors)."""

    def __init__(self, sim: QuantizationSimModel, target: TargetProfile):
        self.sim, self.target = sim, target
        self.pending: dict[int, tuple[QcQuantizeOp, set[tuple]]] = {}
        self.index_tensors: frozenset[str] | None = None
        self.index_version: object = None

    def report(self, nodes=None, overrides=None, io: bool = False) -> LegalityReport:
        return analyze(SimView(self.sim, overrides), self.target, nodes, io=io)

    def new_errors(self, q: QcQuantizeOp, spec: QSpec | None, local_only: bool) -> list[Finding]:
        nodes = _affected_nodes(self.sim, q)
        before = _keys(self.report(nodes, io=True))
        after = self.report(nodes, {id(q): spec}, io=True)
        return [f for f in after.errors if (f.node, f.rule, f.tensors) not in before
                and (not local_only or f.rule in LOCAL_RULES)]


class TargetGuard:
    """Installed on every quantizer of a sim with a target: called with the new spec before it is taken."""

    def __init__(self, rules: TargetRules):
        self.rules = rules

    def __call__(self, q: QcQuantizeOp, spec: QSpec) -> None:
        rules = self.rules
        deferred = bool(rules.sim._open_states)
        if deferred and id(q) not in rules.pending:
            rules.pending[id(q)] = (q, _keys(rules.report(_affected_nodes(rules.sim, q))))
        errors = rules.new_errors(q, spec if q.enabled else None, local_only=deferred)
        if errors:
            raise _override_error(rules.target, q, spec, errors)


def _override_error(target: TargetProfile, q: QcQuantizeOp, spec: QSpec, errors: list[Finding]) -> TargetError:
    first = errors[0]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    hint = ("" if first.rule in LOCAL_RULES else "; change tensors that must agree together inside "
            "`with sim.transaction():`, or pick a precision the target runs")
    return TargetError(f"quantizer {q.name!r} -> {spec.describe()} is illegal on target {target.name}: {first}{more}{hint}")


def commit_pending(sim: QuantizationSimModel) -> None:
    """At the end of the outermost transaction: the rules between tensors for every quantizer changed in it."""
    rules: TargetRules | None = getattr(sim, "_target_rules", None)
    if rules is None or not rules.pending:
        return
    pending, rules.pending = rules.pending, {}
    nodes, before = [], set()
    seen: set[int] = set()
    for q, keys in pending.values():
        before |= keys
        for node in _affected_nodes(sim, q):
            if id(node) not in seen:
                seen.add(id(node))
                nodes.append(node)
    errors = [f for f in rules.report(nodes).errors if (f.node, f.rule, f.tensors) not in before]
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        changed = ", ".join(repr(q.name) for q, _ in list(pending.values())[:5])
        raise TargetError(f"the precision changes to {changed} are illegal on target {rules.target.name}: "
                          f"{errors[0]}{more}; nothing was changed")


def legal_option(sim: QuantizationSimModel, q: QcQuantizeOp, options: list[QSpec | None]) -> list[QSpec | None]:
    """``options`` (specs; None = float32, the quantizer disabled) that keep every node around ``q`` legal on the
    sim's target, in order; all of them when the sim has no target. Findings that every option and the
    quantizer's current state share are not ``q``'s doing and do not count against an option."""
    rules: TargetRules | None = getattr(sim, "_target_rules", None)
    if rules is None:
        return list(options)
    nodes = _affected_nodes(sim, q)
    current = q.spec if q.enabled else None
    errors = [_keys(rules.report(nodes, {id(q): o})) for o in [current, *options]]
    shared = set.intersection(*errors)
    return [o for o, found in zip(options, errors[1:]) if found <= shared]


def change_findings(sim: QuantizationSimModel, changes) -> list[str]:
    """What the sim's target would refuse if the quantizers named in ``changes`` (``{quantizer name: type}``,
    None = left in float32) took those types together, the others staying as they are: the new findings,
    as messages naming the node and the rule; [] when the sim has no target. Nothing is changed."""
    rules: TargetRules | None = getattr(sim, "_target_rules", None)
    if rules is None:
        return []
    by_name = {q.name: q for q in sim.quantizers}
    overrides: dict[int, QSpec | None] = {}
    nodes: list[onnx.NodeProto] = []
    seen: set[int] = set()
    for name, dtype in changes.items():
        q = by_name.get(name) or sim.qc_quantize_op_dict.get(name)
        if q is None:
            raise InvalidArgumentError(f"target_findings: no quantizer named {name!r}")
        overrides[id(q)] = None if dtype is None else q.spec.with_(dtype=qtype.as_qtype(dtype))
        for node in _affected_nodes(sim, q):
            if id(node) not in seen:
                seen.add(id(node))
                nodes.append(node)
    before = _keys(rules.report(nodes, io=True))  # io: a graph input or output is checked as such
    return [str(f) for f in rules.report(nodes, overrides, io=True).errors if (f.node, f.rule, f.tensors) not in before]


def sim_report(sim, target=None) -> LegalityReport | None:
    """The legality report of ``sim`` on ``target`` (default: the sim's own target; None without one)."""
    profile = getattr(sim, "target", None) if target is None else load_target(target)
    if profile is None:
        return None
    return analyze(SimView(sim), profile)


def check_export(sim, target, what: str) -> None:
    """Refuse an export the target cannot run (``target``: a profile, name or path; None: the sim's own;
    False: no check)."""
    if target is False:
        return
    report = sim_report(sim, target)
    if report is None:
        return
    for warning in report.warnings:
        _log.warning("%s on target %s: %s", what, report.target.name, warning)
    if report.errors:
        lines = "\n".join(f"  {f}" for f in report.errors[:10])
        more = f"\n  (+{len(report.errors) - 10} more)" if len(report.errors) > 10 else ""
        raise ExportLegalityError(f"{what}: {len(report.errors)} illegal spot(s) on target {report.target.name}:\n"
                                  f"{lines}{more}", tuple(report.errors))


def _fix(sim: QuantizationSimModel, target: TargetProfile) -> list:
    """Standard fixes applied at construction (module docstring); the decisions taken."""
    from quantsim.sim.decisions import Decision

    decisions = []
    symmetric, per_tensor, enabled = [], [], []
    for q in sim.quantizers:
        spec = q.spec
        if not q.enabled or spec.is_float or spec.is_fp8 or q.param_type == "bias":
            continue
        weight = q.role == "param"
        if (target.symmetric_weights if weight else target.symmetric_activations) and not spec.symmetric:
            spec = spec.with_(symmetric=True)
            symmetric.append(q)
        if weight and isinstance(spec.granularity, PerChannel) and not target.granularity_allowed("per_channel"):
            spec = spec.with_(granularity=PerTensor())
            per_tensor.append(q)
        q.set_qspec(spec)
    for flag, names in ((target.quantized_inputs, sim._index.graph_inputs), (target.quantized_outputs,
                                                                             sim._index.graph_outputs)):
        for name in names:
            io_q = sim.qc_quantize_op_dict.get(name)
            if flag and io_q is not None and not io_q.enabled and sim._index.is_float(name):
                io_q.enabled = True
                enabled.append(io_q)
    for qs, action, why in ((symmetric, "made symmetric", "takes symmetric grids only"),
                            (per_tensor, "made per tensor", "has no per-channel weights"),
                            (enabled, "quantized", "needs quantized model inputs and outputs")):
        if qs:
            tensors = tuple(t for q in qs for t in q.tensors)
            decisions.append(Decision("target", tensors, action, f"{target.name} {why}"))
    return decisions


def attach_target(sim: QuantizationSimModel, target) -> None:
    """Bind ``target`` (None: no target) to a newly built sim (module docstring); sets ``sim.target``."""
    from quantsim.sim.decisions import Decision

    sim.target = None if target is None else load_target(target)
    if sim.target is None:
        return
    profile = sim.target
    for what, dtype, allowed in (("activation_type", sim.activation_type, profile.activation_type_allowed),
                                 ("param_type", sim.param_type, profile.param_type_allowed)):
        if not allowed(dtype):
            kinds = profile.activation_types if what == "activation_type" else profile.param_types
            raise TargetError(f"{what}={dtype} is illegal on target {profile.name}: rule "
                              f"{what.replace('_type', '')}-type: it carries {', '.join(map(repr, kinds))}")
    decisions = _fix(sim, profile)
    rules = TargetRules(sim, profile)
    setattr(sim, "_target_rules", rules)  # noqa: B010 - the sim's private slot for its target bookkeeping
    guard = TargetGuard(rules)
    for q in sim.quantizers:
        q.guard = guard
    report = rules.report(io=True)
    for finding in report.errors:
        decisions.append(Decision(f"target {finding.rule}", finding.tensors or (finding.node,), "no legal precision",
                                  f"node {finding.node!r} ({finding.op_type}): {finding.message}"))
    if report.errors:
        warn_at_caller(f"target {profile.name}: {len(report.errors)} spot(s) of the sim as placed have no legal "
                       f"precision (first: {report.errors[0]}); exports refuse them until they are changed "
                       "(see sim.decisions)")
    sim._record_decisions(decisions)
