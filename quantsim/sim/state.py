"""Snapshots of a sim's mutable state, for changes that must be undone exactly.

A sim's only mutable state is its table of quantizers (spec, encoding, enabled, frozen, fixed range,
scheme, percentile) and the weights replaced through `replace_weight`. A `SimState` records the
quantizer fields by reference (encodings and specs are immutable values, so nothing is copied) plus the
sim's session caches, so restoring a state also restores the sessions built for it: undoing a temporary
change costs no session rebuild. Weights are recorded lazily: `replace_weight` keeps the first value it
overwrites inside each open snapshot scope.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["SimState", "QuantizerState", "snapshot", "restore", "release", "record_weight", "temporary_state", "transaction"]


@dataclass(frozen=True)
class QuantizerState:
    """Every mutable field of one quantizer."""

    spec: Any
    encoding: Any
    enabled: bool
    frozen: bool
    fixed_range: tuple | None
    quant_scheme: Any
    percentile: float


@dataclass
class SimState:
    """What `restore` needs to put a sim back exactly: quantizer fields, replaced weights, sessions."""

    quantizers: dict[str, QuantizerState]
    version: int
    sessions: tuple
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # weight name -> value before the first change


def _quantizer_state(q) -> QuantizerState:
    return QuantizerState(q._spec, q._encoding, q._enabled, q._frozen, q.fixed_range, q._scheme,
                          q._percentile)


def snapshot(sim: QuantizationSimModel) -> SimState:
    """The sim's current state; weights replaced after this call are recorded into it until it is restored."""
    state = SimState({q.name: _quantizer_state(q) for q in sim.quantizers}, sim._version,
                     (sim._session, sim._session_version, sim._fused, sim._calibration_cache,
                      dict(sim._capture_sessions)))
    sim._open_states.append(state)
    return state


def restore(sim: QuantizationSimModel, state: SimState) -> None:
    """Put the sim back into ``state`` (quantizers, weights and the sessions built for that state)."""
    for name, values in state.weights.items():
        sim._write_weight(name, values)
    for q in sim.quantizers:
        saved = state.quantizers.get(q.name)
        if saved is None:
            continue
        q._spec, q._encoding, q._enabled, q._frozen = saved.spec, saved.encoding, saved.enabled, saved.frozen
        q.fixed_range, q._scheme, q._percentile = saved.fixed_range, saved.quant_scheme, saved.percentile
    # versions only grow, so no cache built during the change can be mistaken for a current one; the
    # sessions that were current at the snapshot are current again under a fresh version number
    fresh = sim._version + 1
    session, session_version, fused, calibration, captures = state.sessions
    sim._session, sim._session_version = session, (fresh if session_version == state.version else -1)
    sim._fused = (fresh,) + fused[1:] if fused is not None and fused[0] == state.version else None
    sim._calibration_cache = calibration  # keyed by the quantizer state it was built for, not by version
    sim._capture_sessions = {k: (fresh,) + v[1:] for k, v in captures.items() if v[0] == state.version}
    sim._version = fresh
    release(sim, state)


def release(sim: QuantizationSimModel, state: SimState) -> None:
    """Stop recording weight changes into ``state`` (it can still be restored from what it holds)."""
    if state in sim._open_states:
        sim._open_states.remove(state)


def record_weight(sim: QuantizationSimModel, name: str, old_values: np.ndarray) -> None:
    """Called before a weight changes: every open snapshot keeps the first value it saw."""
    for state in sim._open_states:
        state.weights.setdefault(name, old_values)


@contextmanager
def temporary_state(sim: QuantizationSimModel) -> Iterator[SimState]:
    """Within the block, change anything; on exit (normal or by exception) the sim is restored exactly."""
    state = snapshot(sim)
    try:
        yield state
    finally:
        restore(sim, state)


@contextmanager
def transaction(sim: QuantizationSimModel) -> Iterator[SimState]:
    """Within the block, change anything; if it raises (any BaseException) the sim is restored exactly,
    otherwise the changes stay and the snapshot is released."""
    state = snapshot(sim)
    try:
        yield state
        if sim._open_states and sim._open_states[0] is state:  # outermost: the target's rules between tensors
            from quantsim.sim.target_rules import commit_pending

            commit_pending(sim)
    except BaseException:
        restore(sim, state)
        raise
    release(sim, state)
