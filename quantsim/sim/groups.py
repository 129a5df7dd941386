"""Quantizer groups: the unit mixed-precision searches change together.

As in AIMET's AMP, a group is a weighted op's parameter quantizer(s) together with the quantizers of the
activations that op reads (so a layer's weight and input precisions move as one), and ties are respected
because tied tensors share one quantizer object. Every enabled quantizer ends up in exactly one group:
activation quantizers that feed no weighted op form groups of their own. A data input reached through
grid-preserving ops (Reshape, Transpose, MaxPool, ...) counts as read from the quantized tensor before
them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantsim.graph.op_facts import GRID_PRESERVING, facts_of

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel
    from quantsim.sim.quantizer import QcQuantizeOp

__all__ = ["QuantizerGroup", "find_quantizer_groups", "reading_quantizer"]


@dataclass(frozen=True)
class QuantizerGroup:
    """Names of quantizers (``QcQuantizeOp.name``) that change together, and the nodes they serve."""

    parameter_quantizers: tuple[str, ...]
    activation_quantizers: tuple[str, ...]
    nodes: tuple[str, ...]

    @property
    def quantizers(self) -> tuple[str, ...]:
        return self.activation_quantizers + self.parameter_quantizers


def reading_quantizer(sim: QuantizationSimModel, tensor: str) -> QcQuantizeOp | None:
    """The enabled quantizer whose grid ``tensor`` carries, looking back through grid-preserving ops."""
    index = sim.graph_index
    seen = set()
    while tensor not in seen:
        seen.add(tensor)
        q = sim.qc_quantize_op_dict.get(tensor)
        if q is not None and q.enabled:
            return q
        producer = index.producer_of(tensor)
        if producer is None or producer.op_type not in GRID_PRESERVING or not producer.input:
            return None
        tensor = producer.input[0]
    return None


def find_quantizer_groups(sim: QuantizationSimModel) -> list[QuantizerGroup]:
    """Every enabled quantizer in exactly one group, groups in graph order."""
    parent: dict[str, str] = {}
    nodes: dict[str, list[str]] = {}

    def find(name: str) -> str:
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    index = sim.graph_index
    enabled = [q for q in sim.quantizers if q.enabled]
    for q in enabled:
        find(q.name)
    for node in index.nodes:
        slots = facts_of(node.op_type).param_slots
        found = [sim.qc_quantize_op_dict.get(node.input[s]) for s in slots if s < len(node.input) and node.input[s]]
        members = [q for q in found if q is not None and q.enabled and q.role == "param"]
        if not members:
            continue
        for slot, tensor in enumerate(node.input):
            if tensor and slot not in slots and not index.is_constant(tensor):
                reader = reading_quantizer(sim, tensor)
                if reader is not None and reader.role == "activation":
                    members.append(reader)
        root = find(members[0].name)
        for q in members[1:]:
            parent[find(q.name)] = root
        nodes.setdefault(root, []).append(node.name)
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for q in enabled:
        param_names, activation_names = groups.setdefault(find(q.name), ([], []))
        (param_names if q.role == "param" else activation_names).append(q.name)
    node_lists: dict[str, list[str]] = {}
    for root, names in nodes.items():
        node_lists.setdefault(find(root), []).extend(names)
    return [QuantizerGroup(tuple(p), tuple(a), tuple(node_lists.get(root, ()))) for root, (p, a) in groups.items()]
