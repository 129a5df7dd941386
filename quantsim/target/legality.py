"""Legality of a quantized graph on a `TargetProfile`: what would run where, and which rule each illegal
spot breaks.

`analyze(view, target)` reads a graph through a `GraphView` (the sim's quantizers, `quantsim.sim.
target_rules.SimView`, or the Q/DQ nodes of an exported model, `quantsim.export.legality.QdqView`): for every
tensor the precision its readers see (`TensorPrecision`: an integer grid, float16, float8, or float32 when
nothing quantizes it) and for every weighted op its weight's. Each node gets a `NodeVerdict` (``runs``:
``integer``, ``float16``, ``float8``, ``float`` (between DequantizeLinear and QuantizeLinear), ``shape``
(shape arithmetic, folded by compilers for static shapes) or ``illegal``) and every problem a `Finding`
naming the node, the tensors and the rule:

==================  ===========================================================================================
rule                illegal when
==================  ===========================================================================================
quantized-io        a graph input or output is float on a target with ``quantized_inputs``/``quantized_outputs``
activation-type     an activation grid's type is not among the target's ``activation_types``
param-type          a weight's type is not among the target's ``param_types``
activation-grid     an asymmetric activation grid on a target with ``symmetric_activations``
weight-grid         an asymmetric weight (``symmetric_weights``) or a granularity not in ``weight_granularities``
mixed-precisions    an op's quantized inputs differ in precision (float16 meeting uint8 in a MatMul) and the
                    target has no float fallback
float-input         an op reads a float32 input next to quantized ones, or a float input but writes a quantized
                    output, without float fallback
float-output        an op reads quantized inputs but writes float32, without float fallback
float-op            an op computes entirely in float32 on a target without float fallback
no-kernel           the op type has no kernel for its (activation, weight) types, without float fallback
accumulator         (warning) the worst-case sum of a weighted op's products exceeds ``accumulator_bits``
==================  ===========================================================================================

With ``float_fallback`` the same situations are legal: the op runs in float (``runs == "float"``, the reason
in ``detail``). An op whose float output feeds only one op that reads nothing else float and writes a
quantized output (Conv -> Relu, MatMul -> bias Add, HardSigmoid -> Mul) is fused with it: both count as
one kernel writing that output's precision; so is a chain of such ops, up to three float tensors long
(MatMul -> bias Add -> Relu, whose bias Add and Relu share the sim's one output quantizer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import onnx

from quantsim.core.dtypes import float32, qtype
from quantsim.graph.op_facts import facts_of
from quantsim.target.profile import TargetProfile

__all__ = ["TensorPrecision", "GraphView", "NodeVerdict", "Finding", "LegalityReport", "analyze", "RULES"]

RULES = ("quantized-io", "activation-type", "param-type", "activation-grid", "weight-grid", "mixed-precisions",
         "float-input", "float-output", "float-op", "no-kernel", "accumulator")


@dataclass(frozen=True)
class TensorPrecision:
    """The values a tensor's readers see: ``dtype`` (float32 = not quantized), grid symmetry and granularity
    (``per_tensor``/``per_channel``/``per_block``), and the quantizer (or Q/DQ tensor) that decides it."""

    dtype: qtype
    symmetric: bool = False
    granularity: str = "per_tensor"
    source: str = ""

    @property
    def quantized(self) -> bool:
        return self.dtype != float32

    def label(self) -> str:
        return "float32" if not self.quantized else repr(self.dtype)


FLOAT = TensorPrecision(float32)


class GraphView(Protocol):
    """What `analyze` reads of a graph (see `quantsim.sim.target_rules.SimView`)."""

    nodes: list[onnx.NodeProto]
    graph_inputs: list[str]
    graph_outputs: list[str]
    index_tensors: frozenset[str]

    def is_float(self, tensor: str) -> bool: ...

    def is_constant(self, tensor: str) -> bool: ...

    def is_plain_constant(self, tensor: str) -> bool:
        """A float constant without a quantizer of its own (compilers fold or quantize it themselves)."""
        ...

    def consumers(self, tensor: str) -> list[onnx.NodeProto]: ...

    def producer(self, tensor: str) -> onnx.NodeProto | None: ...

    def precision(self, tensor: str) -> TensorPrecision: ...

    def weight(self, node: onnx.NodeProto) -> tuple[str, TensorPrecision] | None:
        """The node's weight tensor and its precision, for ops with a weight slot."""
        ...

    def shape(self, tensor: str) -> tuple | None: ...


@dataclass(frozen=True)
class NodeVerdict:
    """Where one node runs on the target: ``runs`` (module docstring) and why."""

    node: str
    op_type: str
    runs: str
    detail: str = ""
    rule: str = ""


@dataclass(frozen=True)
class Finding:
    """One violation (``severity`` "error") or caution ("warning"): node, tensors, rule, message."""

    node: str
    op_type: str
    tensors: tuple[str, ...]
    rule: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"node {self.node!r} ({self.op_type}): rule {self.rule}: {self.message}"


@dataclass
class LegalityReport:
    """`analyze`'s result: a verdict per data node and every finding."""

    target: TargetProfile
    verdicts: list[NodeVerdict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def legal(self) -> bool:
        return not self.errors

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.verdicts:
            out[v.runs] = out.get(v.runs, 0) + 1
        return out

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items()))
        lines = [f"target {self.target.name}: {counts or 'no data nodes'}; {len(self.errors)} illegal, "
                 f"{len(self.warnings)} warning(s)"]
        lines += [f"  {f.severity}: {f}" for f in self.findings]
        return "\n".join(lines)


def _family(p: TensorPrecision, target: TargetProfile) -> tuple:
    """What must agree between an op's inputs: the kernel width a grid runs in (a 4-bit grid rides in 8 bits
    where the target widens narrow grids), or the float format."""
    d = p.dtype
    if d.kind == "int":
        return ("int", max(d.storage_bits(), 8) if target.narrow_grids_in_wider_kernels else d.bits)
    return ("float", d.bits, d.exponent_bits)


def _runs_as(p: TensorPrecision) -> str:
    if p.dtype.kind == "int":
        return "integer"
    return "float8" if p.dtype.is_fp8 else "float16" if p.dtype.bits == 16 else "float"


class _Analysis:
    def __init__(self, view: GraphView, target: TargetProfile):
        self.view, self.target = view, target
        self.report = LegalityReport(target)
        self.checked_sources: set[str] = set()
        self.fused: dict[str, TensorPrecision] = {}

    # helpers --------------------------------------------------------------------------------------
    def fail(self, node, tensors, rule: str, message: str, severity: str = "error") -> None:
        name, op = (node.name, node.op_type) if isinstance(node, onnx.NodeProto) else node
        self.report.findings.append(Finding(name, op, tuple(tensors), rule, message, severity))

    def precision(self, tensor: str) -> TensorPrecision:
        return self.fused.get(tensor) or self.view.precision(tensor)

    def data_inputs(self, node: onnx.NodeProto) -> list[str]:
        slots = facts_of(node.op_type).param_slots  # constants there are parameters (the weight: `view.weight`)
        return [t for i, t in enumerate(node.input)
                if t and self.view.is_float(t) and t not in self.view.index_tensors
                and not (i in slots and self.view.is_constant(t)) and not self.view.is_plain_constant(t)]

    def data_outputs(self, node: onnx.NodeProto) -> list[str]:
        return [t for t in node.output if t and self.view.is_float(t) and t not in self.view.index_tensors]

    # tensor rules ---------------------------------------------------------------------------------
    def check_activation(self, node, tensor: str, p: TensorPrecision) -> bool:
        if not p.quantized or p.source in self.checked_sources:
            return True
        self.checked_sources.add(p.source)
        ok = True
        if not self.target.activation_type_allowed(p.dtype):
            self.fail(node, [tensor], "activation-type", f"{tensor!r} is {p.label()}: {self.target.name} carries "
                      f"activations of {', '.join(map(repr, self.target.activation_types))}")
            ok = False
        if self.target.symmetric_activations and p.dtype.kind == "int" and not p.symmetric:
            self.fail(node, [tensor], "activation-grid", f"{tensor!r} has an asymmetric {p.label()} grid: "
                      f"{self.target.name} takes symmetric grids only (zero point 0)")
            ok = False
        return ok

    def check_weight(self, node: onnx.NodeProto, tensor: str, p: TensorPrecision) -> bool:
        if not p.quantized:
            return True
        ok = True
        if not self.target.param_type_allowed(p.dtype):
            self.fail(node, [tensor], "param-type", f"weight {tensor!r} is {p.label()}: {self.target.name} takes "
                      f"weights of {', '.join(map(repr, self.target.param_types))}")
            ok = False
        if p.dtype.kind == "int" and self.target.symmetric_weights and not p.symmetric:
            self.fail(node, [tensor], "weight-grid", f"weight {tensor!r} has an asymmetric grid: {self.target.name} "
                      "takes symmetric weights only")
            ok = False
        if p.dtype.kind == "int" and not self.target.granularity_allowed(p.granularity):
            self.fail(node, [tensor], "weight-grid", f"weight {tensor!r} is quantized {p.granularity.replace('_', ' ')}"
                      f": {self.target.name} takes {', '.join(sorted(self.target.weight_granularities))}")
            ok = False
        return ok

    # fusion ---------------------------------------------------------------------------------------
    def find_fused(self, nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            inputs = [self.view.precision(t) for t in self.data_inputs(node)]
            if not inputs or not all(p.quantized for p in inputs):
                continue
            for out in self.data_outputs(node):
                chain = self._fused_chain(out)
                if chain is not None:
                    for tensor in chain[0]:
                        self.fused[tensor] = chain[1]

    def _fused_chain(self, out: str) -> tuple[list[str], TensorPrecision] | None:
        """The float tensors from ``out`` on to the first quantized output, when each is read by one op that reads
        nothing else float (MatMul -> bias Add -> Relu: one kernel), with the precision that kernel writes."""
        chain = []
        for _ in range(_FUSED_CHAIN):
            if self.view.precision(out).quantized or out in self.view.graph_outputs:
                return None
            readers = self.view.consumers(out)
            if len(readers) != 1:
                return None
            reader = readers[0]
            if not all(self.view.precision(t).quantized for t in self.data_inputs(reader) if t != out):
                return None
            chain.append(out)
            written = [self.view.precision(t) for t in self.data_outputs(reader)]
            if written and all(p.quantized for p in written):
                return chain, written[0]
            if len(written) != 1:
                return None
            out = self.data_outputs(reader)[0]
        return None

    # node rules -----------------------------------------------------------------------------------
    def verdict(self, node: onnx.NodeProto, runs: str, detail: str = "", rule: str = "") -> None:
        self.report.verdicts.append(NodeVerdict(node.name, node.op_type, runs, detail, rule))

    def refuse_or_float(self, node, tensors, rule: str, message: str) -> None:
        if self.target.float_fallback:
            self.verdict(node, "float", message)
        else:
            self.fail(node, tensors, rule, message + f"; {self.target.name} has no float fallback")
            self.verdict(node, "illegal", message, rule)

    def node(self, node: onnx.NodeProto) -> None:
        ins, outs = self.data_inputs(node), self.data_outputs(node)
        if not ins and not outs:
            if any(self.view.is_float(t) for t in (*node.input, *node.output) if t):
                self.verdict(node, "shape", "shape arithmetic or constants only")
            return
        precisions = {t: self.precision(t) for t in ins}
        written = {t: self.precision(t) for t in outs}
        fine = all(self.check_activation(node, t, p) for t, p in written.items())
        weight = self.view.weight(node)
        wp = None
        if weight is not None:
            wp = weight[1]
            fine = self.check_weight(node, weight[0], wp) and fine
        quantized = {t: p for t, p in precisions.items() if p.quantized}
        floats = [t for t, p in precisions.items() if not p.quantized]
        if not ins:
            self.verdict(node, "shape", "computed from constants")
            return
        if not quantized and not any(p.quantized for p in written.values()):
            self.refuse_or_float(node, ins, "float-op", f"computes in float32 (inputs {_names(ins)} not quantized)")
            return
        if floats:
            self.refuse_or_float(node, floats, "float-input", f"reads float32 {_names(floats)}"
                                 + (f" next to quantized {_names(quantized)}" if quantized else
                                    f" and writes quantized {_names(written)}"))
            return
        families = {_family(p, self.target) for p in quantized.values()}
        if len(families) > 1:
            kinds = ", ".join(f"{t!r} ({p.label()})" for t, p in quantized.items())
            self.refuse_or_float(node, list(quantized), "mixed-precisions", f"inputs of different precisions meet: {kinds}")
            return
        act = next(iter(quantized.values()))
        param = None if wp is None else wp.dtype
        if not self.target.has_kernel(node.op_type, param, act.dtype):
            what = f"A {act.label()}" + (f" / W {wp.label()}" if wp is not None else "")
            self.refuse_or_float(node, [*quantized, *([weight[0]] if weight else [])], "no-kernel",
                                 f"{self.target.name} has no {node.op_type} kernel for {what}")
            return
        unquantized_out = [t for t, p in written.items() if not p.quantized]
        if unquantized_out:
            self.refuse_or_float(node, unquantized_out, "float-output", f"reads {act.label()} but writes float32 "
                                 f"{_names(unquantized_out)}")
            return
        self.accumulator(node, act, wp, weight)
        rule = next((f.rule for f in self.report.findings if f.node == node.name and f.severity == "error"), "")
        self.verdict(node, _runs_as(act) if fine else "illegal",
                     f"A {act.label()}" + (f" / W {wp.label()}" if wp is not None else ""), "" if fine else rule)

    def accumulator(self, node, act: TensorPrecision, wp: TensorPrecision | None, weight) -> None:
        if wp is None or weight is None or act.dtype.kind != "int" or wp.dtype.kind != "int":
            return
        shape = self.view.shape(weight[0])
        if not shape or any(not isinstance(d, int) for d in shape):
            return
        if node.op_type in ("Conv", "ConvTranspose"):
            terms = math.prod(shape[1:]) if node.op_type == "Conv" else shape[0] * math.prod(shape[2:])
        else:
            terms = shape[0] if len(shape) >= 2 else 1
        bound = terms * (2 ** act.dtype.bits - 1) * 2 ** (wp.dtype.bits - 1)
        if bound >= 2 ** (self.target.accumulator_bits - 1):
            self.fail(node, [weight[0]], "accumulator", f"{terms} products of A {act.label()} x W {wp.label()} can "
                      f"reach 2^{math.log2(bound):.1f}, past a {self.target.accumulator_bits}-bit accumulator",
                      "warning")

    def io(self) -> None:
        for flag, names, side in ((self.target.quantized_inputs, self.view.graph_inputs, "input"),
                                  (self.target.quantized_outputs, self.view.graph_outputs, "output")):
            for name in names:
                if not self.view.is_float(name):
                    continue
                p = self.precision(name)
                self.check_activation((name, f"graph {side}"), name, p)
                if flag and not p.quantized:
                    self.fail((name, f"graph {side}"), [name], "quantized-io",
                              f"model {side} {name!r} is left float32: {self.target.name} needs quantized {side}s")


_FUSED_CHAIN = 3  # float tensors one fused kernel may hold inside


def _names(tensors) -> str:
    names = list(tensors)
    return ", ".join(repr(t) for t in names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")


def analyze(view: GraphView, target: TargetProfile, nodes: list[onnx.NodeProto] | None = None,
            io: bool = True) -> LegalityReport:
    """Verdicts and findings for ``nodes`` (default: every node of ``view``) on ``target`` (module docstring)."""
    analysis = _Analysis(view, target)
    chosen = view.nodes if nodes is None else nodes
    if nodes is None:
        analysis.find_fused(chosen)
    else:  # fusion of the chosen nodes' outputs and of their inputs' producers is all their verdicts read
        around = {id(n): n for n in chosen}
        frontier = list(chosen)
        for _ in range(_FUSED_CHAIN):  # a chain's first op may be that many producers up
            found = []
            for node in frontier:
                for tensor in node.input:
                    producer = view.producer(tensor) if tensor else None
                    if producer is not None and id(producer) not in around:
                        around[id(producer)] = producer
                        found.append(producer)
            frontier = found
        analysis.find_fused(list(around.values()))
    for node in chosen:
        analysis.node(node)
    if io:
        analysis.io()
    return analysis.report
