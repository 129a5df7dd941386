"""AMP's refinement pass: after the prefix search, take back flips the prefix could not reach.

The phase-2 path takes flips strictly in phase-1 order, so one flip that breaks the budget stops the
search there: every flip sorted after it stays promoted, however cheap it would be to take. The
refinement starts from the configuration the prefix search chose and walks the flips it did not take
(in the same order, least harmful first; the caller leaves out the one flip the prefix search already saw
break the budget on top of the chosen prefix) by bisection: a chunk of flips is applied together and scored;
if the score still meets the target the whole chunk is kept, otherwise the chunk is split in halves and
each half is tried in turn (on top of whatever the first half kept), down to single flips. Every kept
configuration was itself evaluated (calibrated for itself, scored by the phase-2 callback), so the result
always meets the target. With ``k`` flips that must stay out of ``n``, the walk costs about
``2 k log2(n / k)`` evaluations; ``limit`` bounds the number of trials (configurations already scored,
e.g. on the path, count as trials too, so a resumed run walks the same way).

Pure logic over configurations (tuples of candidate indices); the caller scores them.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["RefineTrial", "refine", "default_limit"]

Config = tuple[int, ...]
Flip = tuple[int, int]  # (group, candidate index)


@dataclass(frozen=True)
class RefineTrial:
    """One configuration the refinement scored: the flips it added to the current one, and the outcome."""

    config: Config
    flips: tuple[Flip, ...]
    score: float
    kept: bool


def default_limit(remaining: int) -> int:
    """Trials the refinement may spend when the caller does not say: enough for a few kept chunks and the
    bisection down to single flips, ``4 * ceil(log2(remaining + 1)) + 8``."""
    return 4 * math.ceil(math.log2(remaining + 1)) + 8 if remaining else 0


def refine(start: Config, flips: Sequence[Flip], cheaper: Callable[[Config, Flip], bool],
           score: Callable[[Config, tuple[Flip, ...]], float], target: float,
           limit: int) -> tuple[Config, list[RefineTrial]]:
    """Starting from ``start`` (which meets ``target``), apply as many of ``flips`` as possible while the score
    stays ``>= target`` (module docstring). ``cheaper(config, flip)``: whether the flip makes its group cheaper
    there (flips that do not are skipped); ``score(config, flips)``: the phase-2 score of a configuration.
    Returns the final configuration and every trial, in order. Deterministic for deterministic scores."""
    current = tuple(start)
    trials: list[RefineTrial] = []
    stack: list[list[Flip]] = [list(flips)] if flips else []
    while stack and len(trials) < limit:
        chunk = [f for f in stack.pop() if cheaper(current, f)]
        if not chunk:
            continue
        trial = list(current)
        for g, c in chunk:
            trial[g] = c
        config = tuple(trial)
        value = score(config, tuple(chunk))
        kept = value >= target
        trials.append(RefineTrial(config, tuple(chunk), value, kept))
        if kept:
            current = config
        elif len(chunk) > 1:
            half = (len(chunk) + 1) // 2
            stack.append(chunk[half:])  # tried after the first half, on top of what it kept
            stack.append(chunk[:half])
    return current, trials
