"""AMP's phase 1 (the sensitivity of each quantizer group alone at each candidate) and the flip path phase 2
walks (`mixed_precision.amp` has the whole search)."""
from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from mixed_precision.amp_cache import ScoreCache
from mixed_precision.amp_executor import checked_score, run_evaluations
from mixed_precision.amp_space import AmpSpace, Config, group_label
from quantsim import apply_exception_rules
from quantsim.errors import warn_at_caller

__all__ = ["Counts", "phase1_ceiling", "phase1_scores", "flip_order", "flip_path"]


@dataclass
class Counts:
    """What a search spent: calibration passes and evaluations."""

    passes: int = 0
    phase1: int = 0
    phase2: int = 0
    refine: int = 0  # refinement trials (configurations scored, cached ones included)
    phase1_inferred: int = 0  # phase-1 scores given by the saturation rule, not evaluated


def phase1_ceiling(space: AmpSpace, cache: ScoreCache, counts: Counts, eval1: Callable, eval2: Callable,
                   float_score: float) -> float | None:
    """The phase-1 callback's score of the float model (every quantizer disabled): ``float_score`` when both
    phases use one callback, else one evaluation (cached). None when it is not a finite number (an SQNR
    callback scores the float model ``inf``): no group can then reach it."""
    if eval1 is eval2:
        return float_score
    cached = cache.get("float:phase1")
    if cached is None:
        sim = space.sim
        with sim.temporary_state():
            for q in sim.quantizers:
                q.enabled = False
            value = eval1(sim.session)
        counts.phase1 += 1
        try:
            cached = float(value)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(cached):
            return None
        cache.put("float:phase1", cached)
    return cached


def phase1_scores(space: AmpSpace, cache: ScoreCache, counts: Counts, table: Callable[[int], dict],
            at_baseline: Callable[[], None], eval1: Callable, forward: Any, executor: Executor | None, chunks: int,
            show: bool, optimize: bool, ceiling: Callable[[], float | None] | None = None
            ) -> dict[tuple[int, int], float]:
    """Score of every group alone at every other candidate (every other group's quantizers disabled), by the
    phase-1 callback, as aimet-onnx does. ``optimize`` (AIMET's ``phase1_optimize=True``): the group takes
    its encodings from the calibration pass of its candidate everywhere (one pass per candidate); else each
    evaluation is calibrated for itself (one pass per evaluation, here, not on ``executor``).

    ``ceiling`` (the saturation rule, module docstring): a callable giving the phase-1 callback's float score
    (None: no rule). Each group's candidates are then scored cheapest first, in rounds (one evaluation per
    open group and round, all of a round on ``executor``), and once a group scores at least the ceiling its
    costlier candidates are given that score without evaluation (``counts.phase1_inferred``)."""
    names = [p.name for p in space.candidates]
    mode = "phase1" if optimize else "phase1-recalibrated"
    scores: dict[tuple[int, int], float] = {}
    wanted: dict[int, list[int]] = {}  # group -> candidates to score, cheapest first
    base = space.uniform(0)
    for g in range(len(space.groups)):
        for c in range(1, len(names)):
            if not space.supports(g, c) or c == base[g] or space.group_types(g, c) == space.group_types(g, base[g]):
                continue  # not supported by the group, or the same types as its baseline: no flip to make
            wanted.setdefault(g, []).append(c)
    for g, cs in wanted.items():
        cs.sort(key=lambda c: (space.group_cost(g, c), c))
    top = ceiling() if ceiling is not None and any(len(cs) > 1 for cs in wanted.values()) else None
    if top is None:  # no rule: every (group, candidate) in one round
        rounds = [[(g, c) for g, cs in wanted.items() for c in cs]]
    else:
        rounds = [[(g, cs[0]) for g, cs in wanted.items()]]
    with tqdm(total=sum(map(len, wanted.values())), desc="AMP phase 1", unit="eval", leave=False,
              disable=None if show else True) as bar:
        started = False
        while rounds:
            batch = rounds.pop()
            todo = []
            for g, c in batch:
                cached = cache.get(f"{mode}:{g}:{names[c]}")
                if cached is None:
                    todo.append((g, c))
                else:
                    scores[(g, c)] = cached
                    bar.update(1)
            if todo:
                if not started:
                    table(0)
                    started = True
                _evaluate(space, cache, counts, table, at_baseline, eval1, forward, executor, chunks, optimize, mode,
                          todo, scores, bar)
            if top is None:
                continue
            following = []
            for g, c in batch:
                rest = wanted[g][wanted[g].index(c) + 1:]
                if rest and scores[(g, c)] >= top:  # saturated: the costlier candidates cannot score better
                    for k in rest:
                        scores[(g, k)] = scores[(g, c)]
                    counts.phase1_inferred += len(rest)
                    bar.update(len(rest))
                elif rest:
                    following.append((g, rest[0]))
            if following:
                rounds.append(following)
    if started:
        at_baseline()
    return scores


def _evaluate(space: AmpSpace, cache: ScoreCache, counts: Counts, table: Callable[[int], dict],
              at_baseline: Callable[[], None], eval1: Callable, forward: Any, executor: Executor | None, chunks: int,
              optimize: bool, mode: str, todo: list[tuple[int, int]], scores: dict[tuple[int, int], float],
              bar: Any) -> None:
    """Score ``todo``'s (group, candidate) pairs into ``scores`` (and the cache)."""
    names = [p.name for p in space.candidates]
    sim = space.sim
    by_candidate = {c: table(c) for c in sorted({c for _, c in todo})} if optimize else {}
    with sim.temporary_state():
        at_baseline()
        members = {n: sim.qc_quantize_op_dict[n] for group in space.groups for n in group.quantizers}
        fixed = {n: (q.spec, q.encoding, True) for n, q in members.items()}  # what a group alone re-enables
        for q in members.values():
            q.enabled = False

        def done(key: Any, score: float) -> None:
            g, c = key
            scores[(g, c)] = score
            counts.phase1 += 1
            cache.put(f"{mode}:{g}:{names[c]}", score)
            bar.update(1)

        if optimize:
            items = [((g, c), {**{n: fixed[n] for n in space.groups[g].quantizers},
                               **{n: by_candidate[c][n] for n in space.controlled[g]}},
                      f"phase 1: group {g} ({group_label(space.groups[g])}) at {names[c]}") for g, c in todo]
            run_evaluations(sim, eval1, items, done, executor=executor, chunks=chunks)
            return
        if executor is not None:
            warn_at_caller("choose_mixed_precision: phase1_optimize=False calibrates every phase-1 "
                           "evaluation in this process; executor is not used for them")
        for g, c in todo:
            with sim.temporary_state():
                for n in space.groups[g].quantizers:
                    members[n].enabled = True
                for n in space.controlled[g]:
                    if members[n].precision() != space.requested(n, c):
                        members[n].set_precision(space.requested(n, c))
                apply_exception_rules(sim)  # as AIMET: norm parameters keep >= 8 bits
                sim.compute_encodings(forward)
                counts.passes += 1
                done((g, c), checked_score(eval1(sim.session), f"phase 1: group {g} "
                                           f"({group_label(space.groups[g])}) at {names[c]}"))


def flip_order(space: AmpSpace, phase1: dict[tuple[int, int], float]) -> list[tuple[int, int]]:
    """(group, candidate) flips, least harmful first: phase-1 score, then the group's cost at the candidate."""
    return sorted(phase1, key=lambda gc: (-phase1[gc], space.group_cost(*gc), gc))


def flip_path(space: AmpSpace, phase1: dict[tuple[int, int], float]) -> list[tuple[Config, tuple[int, str] | None]]:
    """Configurations along the sorted flip list, starting at the baseline everywhere."""
    base = space.uniform(0)
    group_cost = space.group_cost
    current = list(base)
    path: list[tuple[Config, tuple[int, str] | None]] = [(base, None)]
    for g, c in flip_order(space, phase1):
        if group_cost(g, c) < group_cost(g, current[g]):
            current[g] = c
            path.append((tuple(current), (g, space.candidates[c].name)))
    return path
