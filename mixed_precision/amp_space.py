"""The search space of automatic mixed precision: quantizer groups times candidates.

A configuration is one candidate index per quantizer group. A candidate sets a group's weight quantizers
to its parameter type and its activation quantizers to its activation type; frozen quantizers keep their
spec and bias quantizers keep theirs (a bias is added in 32-bit arithmetic on integer hardware), so they
are not "controlled". Quantizers outside every group (disabled ones) are never touched. The cost of a
configuration is its bit operations (`mixed_precision.bitops`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mixed_precision.bitops import LayerCost, bit_operations, layer_costs, operand_bits
from mixed_precision.presets import Precision
from quantsim import InvalidArgumentError, QcQuantizeOp, QuantizationSimModel, QuantizerGroup, qtype

__all__ = ["AmpSpace", "Config", "group_label", "distinct"]

Config = tuple[int, ...]


def group_label(group: QuantizerGroup) -> str:
    """A readable name: the group's nodes, else its quantizers."""
    return ", ".join(group.nodes) if group.nodes else ", ".join(group.quantizers)


@dataclass
class AmpSpace:
    """Groups, candidates and the quantizers AMP controls in each group (module docstring)."""

    sim: QuantizationSimModel
    groups: list[QuantizerGroup]
    candidates: list[Precision]
    controlled: list[tuple[str, ...]]
    quantizers: dict[str, QcQuantizeOp]
    costs: list[LayerCost]
    base_dtypes: dict[str, qtype | None]

    @classmethod
    def build(cls, sim: QuantizationSimModel, candidates: list[Precision], sample: Any = None) -> AmpSpace:
        """The space of ``sim`` (its groups as they are now); ``sample``: a feed dict fixing symbolic shapes
        for the MAC counts."""
        groups = sim.quantizer_groups()
        if not groups:
            raise InvalidArgumentError("AMP: the sim has no enabled quantizer, so there is no precision to choose")
        quantizers = {q.name: q for q in sim.quantizers}
        controlled = [tuple(n for n in g.quantizers if not quantizers[n].is_encoding_frozen()
                            and quantizers[n].param_type != "bias") for g in groups]
        if not any(controlled):
            raise InvalidArgumentError("AMP: every enabled quantizer is frozen (or a bias): nothing to choose")
        base = {q.name: (q.precision() if q.enabled else None) for q in sim.quantizers}
        return cls(sim, groups, candidates, controlled, quantizers, layer_costs(sim, sample), base)

    def uniform(self, c: int) -> Config:
        return (c,) * len(self.groups)

    def canonical(self, config: Config) -> Config:
        """The same configuration with each group's candidate replaced by the first one that means the same
        for it (W4A8 and W8A8 are one choice for a group without weights)."""
        return tuple(next(k for k in range(c + 1) if self.group_types(g, k) == self.group_types(g, c))
                     for g, c in enumerate(config))

    def dtype(self, name: str, c: int) -> qtype:
        candidate = self.candidates[c]
        return candidate.param_type if self.quantizers[name].role == "param" else candidate.activation_type

    def dtypes(self, config: Config) -> dict[str, qtype | None]:
        """Every quantizer's type under ``config``."""
        dtypes = dict(self.base_dtypes)
        for names, c in zip(self.controlled, config):
            for name in names:
                dtypes[name] = self.dtype(name, c)
        return dtypes

    def bops(self, config: Config) -> float:
        return bit_operations(self.costs, self.dtypes(config))

    def group_cost(self, g: int, c: int) -> tuple[float, float]:
        """What group ``g`` costs at candidate ``c``, the rest at the baseline: bit operations above the
        baseline everywhere, then the bits of its controlled quantizers (orders groups without MACs)."""
        base = self.uniform(0)
        config = base[:g] + (c,) + base[g + 1:]
        return self.bops(config) - self.bops(base), sum(b.bits for b in self.group_types(g, c))

    def group_types(self, g: int, c: int) -> tuple[qtype, ...]:
        """What candidate ``c`` means for group ``g`` (two candidates can mean the same, e.g. W4A8 and W8A8
        for a group without weights)."""
        return tuple(self.dtype(name, c) for name in self.controlled[g])

    def apply(self, config: Config) -> None:
        """Set every controlled quantizer's precision (encodings of changed ones are dropped)."""
        with self.sim.transaction():
            for names, c in zip(self.controlled, config):
                for name in names:
                    q, dtype = self.quantizers[name], self.dtype(name, c)
                    if q.precision() != dtype:
                        q.set_precision(dtype)

    def calibrated(self, config: Config, forward_pass_callback: Any, on_pass: Callable[[], None]) -> None:
        """Apply ``config`` and calibrate the sim for it (one pass of the user's forward pass: a callable
        taking the session, or feed dicts)."""
        self.apply(config)
        self.sim.compute_encodings(forward_pass_callback)
        on_pass()

    def describe(self, config: Config) -> list[str]:
        return [self.candidates[c].name for c in config]

    def promoted_share(self, config: Config, cheapest: int) -> tuple[float, float]:
        """Shares of the quantizers, and of the groups, that have a choice (the cheapest and the costliest
        candidate give them different types) and are not at the cheapest candidate's type."""
        total = promoted = groups = choosing = 0
        for names, c in zip(self.controlled, config):
            choice = [n for n in names if self.dtype(n, 0) != self.dtype(n, cheapest)]
            changed = [self.dtype(n, c) != self.dtype(n, cheapest) for n in choice]
            total += len(choice)
            promoted += sum(changed)
            choosing += bool(choice)
            groups += any(changed)
        return promoted / max(total, 1), groups / max(choosing, 1)

    def order_by_cost(self) -> list[int]:
        """Candidate indices from the costliest (everywhere) to the cheapest; ties (a model without weighted
        layers) by the candidate's operand bits, then in the given order."""
        def key(c: int) -> tuple[float, float]:
            p = self.candidates[c]
            return -self.bops(self.uniform(c)), -(operand_bits(p.param_type) + operand_bits(p.activation_type))

        return sorted(range(len(self.candidates)), key=key)


def distinct(values: Sequence[Precision]) -> list[Precision]:
    """Candidates without repeats (by their types), in order."""
    seen, out = set(), []
    for p in values:
        if (p.param_type, p.activation_type) not in seen:
            seen.add((p.param_type, p.activation_type))
            out.append(p)
    return out
