"""Per-node precision overrides with a clear precedence: exact node name > regular expression (first match,
in the order given) > op type > default.

A node's precision sets its parameter quantizers to the preset's weight type and its output quantizers to
the activation type (inputs belong to the nodes that produce them; model inputs take the precision of their
first reader). A quantizer tied across nodes (a Concat's inputs and output, a Relu sharing its input's grid)
takes the precision of the most specific rule among those nodes (a BatchNormalization set to FP16 by op
type keeps FP16 although the Relu after it falls under the default); two rules of the same rank asking it
for different precisions raise `OverrideConflictError` naming both nodes, and nothing changes. Frozen
quantizers keep their spec.

A rule acts on the quantizer that decides each tensor in the sim (`quantsim.deciding_quantizer`): a node's
output fused with the activation after it (Conv -> Relu, MatMul -> bias Add) is decided by the fused
output's grid, a Reshape's output by its input's. A file naming a key twice (a node, a section, "default")
is refused; a regular expression that matches no node is reported with a warning. JSON form::

    {"default": "W8A8", "op_type": {"Gemm": "W8A16"}, "regex": {"^encoder/.*attn": "W16A16"},
     "node": {"conv1": "W4A8", "bn1": "FP16"}}
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mixed_precision.files import read_json_strict
from mixed_precision.presets import Precision, preset
from quantsim import ConfigError, QuantizationSimModel, deciding_quantizer
from quantsim.errors import warn_at_caller

__all__ = ["PrecisionOverrides", "OverrideConflictError", "load_overrides", "apply_precision_overrides"]

_KEYS = ("default", "op_type", "regex", "node")


class OverrideConflictError(ConfigError):
    """Two nodes ask one tied quantizer for different precisions."""


@dataclass(frozen=True)
class PrecisionOverrides:
    """Resolved override rules (see the module docstring)."""

    default: Precision | None = None
    op_type: dict[str, Precision] = field(default_factory=dict)
    regex: list[tuple[re.Pattern, Precision]] = field(default_factory=list)
    node: dict[str, Precision] = field(default_factory=dict)

    def precision_of(self, node_name: str, op_type: str) -> tuple[Precision | None, str, int]:
        """``(precision, which rule, its rank)`` for one node (node 3 > regex 2 > op type 1 > default 0)."""
        if node_name in self.node:
            return self.node[node_name], f"node {node_name!r}", 3
        for pattern, precision in self.regex:
            if pattern.search(node_name):
                return precision, f"regex {pattern.pattern!r}", 2
        if op_type in self.op_type:
            return self.op_type[op_type], f"op type {op_type}", 1
        return self.default, "default", 0


def load_overrides(source: str | os.PathLike | Mapping[str, Any]) -> PrecisionOverrides:
    """Rules from a JSON file or an already-decoded mapping; errors name the file and key."""
    label = "<dict>"
    if not isinstance(source, Mapping):
        label = str(source)
        source = read_json_strict(source, "precision overrides")
    if not isinstance(source, Mapping):
        raise ConfigError(f"{label}: precision overrides must be a JSON object")
    unknown = sorted(set(source) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{label}: unknown key(s) {unknown}; expected {list(_KEYS)}")

    def table(key: str) -> dict[str, Precision]:
        value = source.get(key, {})
        if not isinstance(value, Mapping):
            raise ConfigError(f"{label}: '{key}' must map names to presets")
        try:
            return {str(name): preset(p) for name, p in value.items()}
        except ValueError as error:
            raise ConfigError(f"{label}: '{key}': {error}") from None

    try:
        default = preset(source["default"]) if source.get("default") is not None else None
    except ValueError as error:
        raise ConfigError(f"{label}: 'default': {error}") from None
    patterns = []
    for pattern, precision in table("regex").items():
        try:
            patterns.append((re.compile(pattern), precision))
        except (re.error, RecursionError, OverflowError) as error:
            raise ConfigError(f"{label}: 'regex': pattern {pattern!r} is not a valid regular expression: "
                              f"{error}") from None
    return PrecisionOverrides(default, table("op_type"), patterns, table("node"))


def apply_precision_overrides(sim: QuantizationSimModel, overrides: PrecisionOverrides | Mapping | str | os.PathLike,
                              ) -> list[tuple[str, str, str]]:
    """Set every node's quantizers by the rules; returns ``(node, preset, rule)`` for each node a rule
    chose. Unknown node names or op types in the rules are an error (nothing is changed then)."""
    rules = overrides if isinstance(overrides, PrecisionOverrides) else load_overrides(overrides)
    graph_nodes = list(sim.model.graph.node)
    names, op_types = {n.name for n in graph_nodes}, {n.op_type for n in graph_nodes}
    missing = [n for n in rules.node if n not in names]
    if missing:
        raise ConfigError(f"precision overrides name node(s) {missing[:5]} not in the prepared model "
                          f"(nodes: {sorted(names)[:8]}...)")
    absent = [t for t in rules.op_type if t not in op_types]
    if absent:
        raise ConfigError(f"precision overrides name op type(s) {absent} the model does not have "
                          f"(it has {sorted(op_types)})")
    unmatched = [p.pattern for p, _ in rules.regex if not any(p.search(name) for name in names)]
    if unmatched:
        warn_at_caller(f"precision overrides: regex pattern(s) {unmatched[:5]} match no node of the prepared model; "
                       "they have no effect")
    wanted: dict[int, tuple[Any, Any, str, int]] = {}  # id(quantizer) -> (quantizer, qtype, node, rule rank)
    chosen = []
    graph_inputs = {i.name for i in sim.model.graph.input}
    for node in graph_nodes:
        precision, rule, rank = rules.precision_of(node.name, node.op_type)
        if precision is None:
            continue
        chosen.append((node.name, precision.name, rule))
        for tensor in node.input:
            q = sim.qc_quantize_op_dict.get(tensor)
            if q is not None and q.role == "param":
                _want(wanted, q, precision.param_type, node.name, rank)
            elif tensor in graph_inputs and (q := deciding_quantizer(sim, tensor)) is not None \
                    and id(q) not in wanted:
                _want(wanted, q, precision.activation_type, node.name, rank)  # a model input: its first reader
        for tensor in node.output:
            q = deciding_quantizer(sim, tensor) if tensor else None
            if q is not None:
                _want(wanted, q, precision.activation_type, node.name, rank)
    with sim.transaction():
        for q, dtype, _, _ in wanted.values():
            if not q.is_encoding_frozen() and q.precision() != dtype:
                q.set_precision(dtype)
    return chosen


def _want(wanted: dict, q, dtype, node: str, rank: int) -> None:
    """Record that ``node``'s rule of ``rank`` asks ``q`` for ``dtype``; the higher rank wins a tie."""
    previous = wanted.get(id(q))
    if previous is None or rank > previous[3]:
        wanted[id(q)] = (q, dtype, node, rank)
    elif rank == previous[3] and previous[1] != dtype:
        raise OverrideConflictError(
            f"quantizer {q.name!r} is shared by nodes {previous[2]!r} and {node!r}, whose rules of the same rank "
            f"ask for {previous[1]} and {dtype}: give both the same precision")
