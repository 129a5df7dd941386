"""AMP's phase 1 (the sensitivity of each quantizer group alone at each candidate) and the flip path phase 2
walks (`mixed_precision.amp` has the whole search)."""
from __future__ import annotations

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

__all__ = ["Counts", "phase1_scores", "flip_order", "flip_path"]


@dataclass
class Counts:
    """What a search spent: calibration passes and evaluations."""

    passes: int = 0
    phase1: int = 0
    phase2: int = 0
    refine: int = 0  # refinement trials (configurations scored, cached ones included)


def phase1_scores(space: AmpSpace, cache: ScoreCache, counts: Counts, table: Callable[[int], dict],
            at_baseline: Callable[[], None], eval1: Callable, forward: Any, executor: Executor | None, chunks: int,
            show: bool, optimize: bool) -> dict[tuple[int, int], float]:
    """Score of every group alone at every other candidate (every other group's quantizers disabled), by the
    phase-1 callback, as aimet-onnx does. ``optimize`` (AIMET's ``phase1_optimize=True``): the group takes
    its encodings from the calibration pass of its candidate everywhere (one pass per candidate); else each
    evaluation is calibrated for itself (one pass per evaluation, here, not on ``executor``)."""
    names = [p.name for p in space.candidates]
    mode = "phase1" if optimize else "phase1-recalibrated"
    scores: dict[tuple[int, int], float] = {}
    todo = []
    base = space.uniform(0)
    for g in range(len(space.groups)):
        for c in range(1, len(names)):
            if not space.supports(g, c) or c == base[g] or space.group_types(g, c) == space.group_types(g, base[g]):
                continue  # not supported by the group, or the same types as its baseline: no flip to make
            cached = cache.get(f"{mode}:{g}:{names[c]}")
            if cached is not None:
                scores[(g, c)] = cached
            else:
                todo.append((g, c))
    if not todo:
        return scores
    sim = space.sim
    table(0)
    by_candidate = {c: table(c) for c in sorted({c for _, c in todo})} if optimize else {}
    with sim.temporary_state():
        at_baseline()
        members = {n: sim.qc_quantize_op_dict[n] for group in space.groups for n in group.quantizers}
        fixed = {n: (q.spec, q.encoding, True) for n, q in members.items()}  # what a group alone re-enables
        for q in members.values():
            q.enabled = False
        with tqdm(total=len(todo), desc="AMP phase 1", unit="eval", leave=False,
                  disable=None if show else True) as bar:
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
            else:
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
    at_baseline()
    return scores


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
