"""The search space of automatic mixed precision: quantizer groups times candidates.

A configuration is one candidate index per quantizer group. A candidate sets a group's weight quantizers
to its parameter type and its activation quantizers to its activation type; frozen quantizers keep their
spec and bias quantizers keep theirs (a bias is added in 32-bit arithmetic on integer hardware), so they
are not "controlled". Quantizers outside every group (disabled ones) are never touched. The cost of a
configuration is its bit operations (`mixed_precision.bitops`).

What a candidate asks of a quantizer is not always what the sim runs: calibration applies the sim's
automatic decisions (`quantsim.sim.decisions`: range health moves a collapsed 8-bit activation to int16 or
leaves it float). AMP therefore distinguishes the type it *requests* (`AmpSpace.requested`, what `apply`
sets) from the type a quantizer *takes* (`AmpSpace.dtype`): once candidate ``c`` has been calibrated
everywhere, `observe_uniform` records what each controlled quantizer really became, and costs, the
equivalence of candidates for a group and the flips worth making follow that. Everything reported is read
from the sim after calibration (`AmpSpace.observe`: `Observed`), never predicted.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mixed_precision.bitops import (
    LayerCost,
    bit_operations,
    layer_costs,
    operand_bits,
    simulated_bit_operations,
    simulated_dtypes,
)
from mixed_precision.presets import Precision
from quantsim import InvalidArgumentError, QcQuantizeOp, QuantizationSimModel, QuantizerGroup, apply_exception_rules, qtype

__all__ = ["AmpSpace", "Config", "Observed", "group_label", "distinct", "type_label"]

Config = tuple[int, ...]


def group_label(group: QuantizerGroup) -> str:
    """A readable name: the group's nodes, else its quantizers."""
    return ", ".join(group.nodes) if group.nodes else ", ".join(group.quantizers)


def type_label(dtype: qtype | None) -> str:
    """``8`` for int8, ``F16`` for float16, ``F32`` for an unquantized (disabled) tensor."""
    if dtype is None:
        return "F32"
    return f"F{dtype.bits}" if dtype.is_float else str(dtype.bits)


@dataclass(frozen=True)
class Observed:
    """What the sim simulates after a calibration: its bit operations and the type each controlled
    quantizer took (None: left float by the sim)."""

    bops: float
    dtypes: dict[str, qtype | None]

    def to_json(self) -> dict[str, Any]:
        return {"bops": self.bops, "dtypes": {n: None if t is None else str(t) for n, t in self.dtypes.items()}}

    @classmethod
    def from_json(cls, value: Any) -> Observed:
        """The inverse of `to_json`; ValueError/TypeError on anything else."""
        if not isinstance(value, dict) or not isinstance(value.get("dtypes"), dict):
            raise ValueError(f"expected {{'bops': number, 'dtypes': {{quantizer: type}}}}, got {value!r:.80}")
        bops = value.get("bops")
        if isinstance(bops, bool) or not isinstance(bops, (int, float)) or not bops >= 0 or bops == float("inf"):
            raise ValueError(f"bops must be a finite number >= 0, got {bops!r:.40}")
        dtypes = {}
        for name, t in value["dtypes"].items():
            if t is not None and not isinstance(t, str):
                raise ValueError(f"type of quantizer {name!r} must be a string or null, got {t!r:.40}")
            dtypes[str(name)] = None if t is None else qtype.as_qtype(t)
        return cls(float(bops), dtypes)


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
    #: candidate -> the type each controlled quantizer took when the candidate was calibrated everywhere
    observed: dict[int, dict[str, qtype | None]] = field(default_factory=dict)
    #: per group, the candidates it supports (`mixed_precision.amp_kernels`); None: every candidate
    allowed: list[tuple[int, ...]] | None = None
    #: the tensors each quantizer covered when the space was built (an untied Concat's change them)
    base_tensors: dict[str, tuple[str, ...]] = field(default_factory=dict)

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
        return cls(sim, groups, candidates, controlled, quantizers, layer_costs(sim, sample), base,
                   base_tensors={q.name: tuple(q.tensors) for q in sim.quantizers})

    def uniform(self, c: int) -> Config:
        """Candidate ``c`` everywhere; a group that does not support it takes its costliest supported one."""
        if self.allowed is None:
            return (c,) * len(self.groups)
        return tuple(c if c in allowed else allowed[0] for allowed in self.allowed)

    def supports(self, g: int, c: int) -> bool:
        return self.allowed is None or c in self.allowed[g]

    def canonical(self, config: Config) -> Config:
        """The same configuration with each group's candidate replaced by the first one that means the same
        for it (W4A8 and W8A8 are one choice for a group without weights)."""
        return tuple(next(k for k in range(c + 1) if self.group_types(g, k) == self.group_types(g, c))
                     for g, c in enumerate(config))

    def requested(self, name: str, c: int) -> qtype:
        """The type candidate ``c`` asks of quantizer ``name``."""
        candidate = self.candidates[c]
        return candidate.param_type if self.quantizers[name].role == "param" else candidate.activation_type

    def dtype(self, name: str, c: int) -> qtype | None:
        """The type quantizer ``name`` takes under candidate ``c``: what it became when ``c`` was calibrated
        everywhere (`observe_uniform`), else what ``c`` asks of it."""
        seen = self.observed.get(c)
        if seen is not None and name in seen:
            return seen[name]
        return self.requested(name, c)

    def observe(self) -> Observed:
        """The sim as it is now (after a calibration): bit operations and the controlled quantizers' types."""
        now = simulated_dtypes(self.sim)
        return Observed(simulated_bit_operations(self.sim, self.costs),
                        {n: now.get(n) for names in self.controlled for n in names})

    def observe_uniform(self, c: int, observed: Observed) -> None:
        """Record what the quantizers took with candidate ``c`` calibrated everywhere."""
        self.observed[c] = dict(observed.dtypes)

    def describe_observed(self, observed: Observed, config: Config | None = None) -> list[str]:
        """Per group, the candidate whose types its controlled quantizers really have (``config``'s own
        when it is one of them), else their types spelled out (``W8A8/16``: 8-bit weights, activations
        partly 8 and partly 16 bits; ``F32``: float)."""
        labels = []
        for g, names in enumerate(self.controlled):
            types = tuple(observed.dtypes.get(n) for n in names)
            order = list(range(len(self.candidates)))
            if config is not None:
                order.insert(0, config[g])
            match = next((self.candidates[c].name for c in order
                          if types == tuple(self.requested(n, c) for n in names)), None)
            if match is None:
                params = [t for n, t in zip(names, types) if self.quantizers[n].role == "param"]
                acts = [t for n, t in zip(names, types) if self.quantizers[n].role != "param"]
                part = [("W", params), ("A", acts)]
                match = "".join(key + "/".join(dict.fromkeys(type_label(t) for t in ts)) for key, ts in part if ts)
            labels.append(match)
        return labels

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
        return self.bops(config) - self.bops(base), sum(operand_bits(b) for b in self.group_types(g, c))

    def group_types(self, g: int, c: int) -> tuple[qtype | None, ...]:
        """What candidate ``c`` means for group ``g`` (two candidates can mean the same, e.g. W4A8 and W8A8
        for a group without weights)."""
        return tuple(self.dtype(name, c) for name in self.controlled[g])

    def apply(self, config: Config) -> None:
        """Set every controlled quantizer to the type its candidate requests (encodings of changed ones are
        dropped); one an earlier calibration's range health left float is enabled again, for the next
        calibration to decide (not one whose tensors changed: a Concat output left float by untying)."""
        with self.sim.transaction():
            for names, c in zip(self.controlled, config):
                for name in names:
                    q, dtype = self.quantizers[name], self.requested(name, c)
                    if q.precision() != dtype:
                        q.set_precision(dtype)
                    if not q.enabled and tuple(q.tensors) == self.base_tensors.get(name):
                        q.enabled = True
            apply_exception_rules(self.sim)  # as AIMET at every point: norm parameters keep >= 8 bits

    def calibrated(self, config: Config, forward_pass_callback: Any, on_pass: Callable[[], None]) -> None:
        """Apply ``config`` and calibrate the sim for it (one pass of the user's forward pass: a callable
        taking the session, or feed dicts)."""
        self.apply(config)
        self.sim.compute_encodings(forward_pass_callback)
        on_pass()

    def describe(self, config: Config) -> list[str]:
        return [self.candidates[c].name for c in config]

    def promoted_share(self, observed: Observed, cheapest: int) -> tuple[float, float]:
        """Shares of the quantizers, and of the groups, that have a choice (the cheapest and the costliest
        candidate give them different types) and that the sim, as ``observed``, does not run at the cheapest
        candidate's type."""
        total = promoted = groups = choosing = 0
        for names in self.controlled:
            choice = [n for n in names if self.dtype(n, 0) != self.dtype(n, cheapest)]
            changed = [observed.dtypes.get(n) != self.dtype(n, cheapest) for n in choice]
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
