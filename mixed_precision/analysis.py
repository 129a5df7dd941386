"""Per-layer analysis (AIMET's QuantAnalyzer, first part): data only, rendering is a separate step.

* `group_sensitivity`: for every quantizer group (a weighted op's parameters with the activations it reads,
  `QuantizationSimModel.quantizer_groups`), the user's score with only that group quantized and with only
  that group left float; every change runs inside `sim.temporary_state()`, so the sim ends exactly as it
  began (even when the callback raises).
* `tensor_health`: per quantized activation, the SQNR of the sim's value against the float model's
  (streamed over the data) and how many of its grid's codes the values really use; a tensor whose values
  collapse onto a few codes is flagged with the usual fix (a 16-bit grid, or float).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from quantsim import QuantizationSimModel, QuantizerGroup

__all__ = ["GroupScore", "TensorHealth", "group_sensitivity", "tensor_health", "report_dict", "FEW_CODES"]

FEW_CODES = 16  # a tensor using fewer distinct codes than this has collapsed


@dataclass(frozen=True)
class GroupScore:
    """Scores of one quantizer group: ``alone`` (only it quantized) and ``without`` (only it float)."""

    nodes: tuple[str, ...]
    quantizers: tuple[str, ...]
    alone: float
    without: float


@dataclass(frozen=True)
class TensorHealth:
    """SQNR (dB) of one quantized activation against float, and the codes its values use."""

    tensor: str
    sqnr_db: float
    codes_used: int
    codes_available: int
    verdict: str


def _set_enabled(sim: QuantizationSimModel, enabled: set[str]) -> None:
    for q in sim.quantizers:
        q.enabled = q.name in enabled


def group_sensitivity(sim: QuantizationSimModel, eval_fn: Callable[[Any], float],
                      groups: Iterable[QuantizerGroup] | None = None) -> tuple[float, float, list[GroupScore]]:
    """``(float score, fully quantized score, per-group scores)``; ``eval_fn(session) -> float`` (higher is
    better). The sim must be calibrated; it is left exactly as it was."""
    groups = list(sim.quantizer_groups() if groups is None else groups)
    active = {q.name for q in sim.quantizers if q.enabled}
    quantized = float(eval_fn(sim.session))
    with sim.temporary_state():
        _set_enabled(sim, set())
        float_score = float(eval_fn(sim.session))
    scores = []
    for group in groups:
        members = set(group.quantizers)
        with sim.temporary_state():
            _set_enabled(sim, members & active)
            alone = float(eval_fn(sim.session))
        with sim.temporary_state():
            _set_enabled(sim, active - members)
            without = float(eval_fn(sim.session))
        scores.append(GroupScore(group.nodes, group.quantizers, alone, without))
    return float_score, quantized, scores


def tensor_health(sim: QuantizationSimModel, inputs: Iterable[Mapping[str, np.ndarray]],
                  tensors: Iterable[str] | None = None) -> list[TensorHealth]:
    """SQNR and codes used of calibrated integer activation quantizers' tensors: flagged tensors first (a
    huge outlier can keep the SQNR high while the rest collapses), then by SQNR, worst first."""
    if tensors is None:
        tensors = [name for name in sim.activation_names
                   if sim.qc_quantize_op_dict[name].enabled and sim.qc_quantize_op_dict[name].encoding is not None]
    names = list(dict.fromkeys(tensors))
    if not names:
        return []
    feeds = list(inputs)
    signal, noise = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
    codes: dict[str, set] = {name: set() for name in names}
    for float_values, sim_values in zip(sim.capture(names, feeds, quantized=False), sim.capture(names, feeds)):
        for name in names:
            ref, got = float_values[name].astype(np.float64), sim_values[name].astype(np.float64)
            signal[name] += float(np.sum(ref * ref))
            noise[name] += float(np.sum((ref - got) ** 2))
            enc = sim.qc_quantize_op_dict[name].encoding
            if enc is not None and enc.is_per_tensor:
                codes[name].update(np.unique(np.rint(got / float(enc.scale))).astype(np.int64).tolist())
    rows = []
    for name in names:
        enc = sim.qc_quantize_op_dict[name].encoding
        available = enc.num_steps + 1 if enc is not None else 0
        sqnr = 10 * math.log10(signal[name] / noise[name]) if noise[name] > 0 and signal[name] > 0 else math.inf
        used = len(codes[name])
        verdict = "ok"
        if enc is not None and used and used < FEW_CODES:
            verdict = f"collapsed onto {used} of {available} codes: give it a 16-bit grid or keep it float"
        rows.append(TensorHealth(name, sqnr, used, available, verdict))
    return sorted(rows, key=lambda r: (r.verdict == "ok", r.sqnr_db))


def report_dict(float_score: float, quantized_score: float, groups: list[GroupScore],
                health: list[TensorHealth]) -> dict[str, Any]:
    """A JSON-ready report: groups worst first (the lowest score quantized alone), tensors worst first."""
    ordered = sorted(groups, key=lambda g: g.alone)
    return {
        "float_score": float_score,
        "quantized_score": quantized_score,
        "groups": [asdict(g) for g in ordered],
        "tensors": [{**asdict(t), "sqnr_db": None if math.isinf(t.sqnr_db) else t.sqnr_db} for t in health],
    }
