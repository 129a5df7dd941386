"""What automatic mixed precision returns and writes: `ParetoPoint`, `AmpResult`, ``pareto.json`` and the
``pareto.html`` page.

``<results_dir>/pareto.json`` (all scores are the phase-2 callback's, higher is better)::

    {"candidates": ["W8A16", "W8A8"],          # costliest first; "baseline" is the first
     "baseline": "W8A16", "cheapest": "W8A8",
     "float_score": 0.91, "allowed_accuracy_drop": 0.01, "target": 0.90,   # target = float - drop (or null)
     "uniform": {"W8A16": {"bitops_ratio": 1.0, "score": 0.909}, ...},     # each candidate everywhere
     "groups": [{"nodes": ["conv1"], "quantizers": ["input", "conv1.weight"]}, ...],
     "points": [                                  # evaluated points of the search path, costliest first
        {"index": 0, "bitops_ratio": 1.0, "score": 0.909, "pareto_optimal": true, "chosen": false,
         "flip": null, "refinement": false, "precisions": ["W8A16", "W8A16", ...]},        # one candidate per group, in order
        {"index": 7, "bitops_ratio": 0.62, "score": 0.903, ..., "flip": {"group": 3, "candidate": "W8A8"}}],
     "chosen": 7, "budget_met": true, "message": "...",
     "counts": {"calibration_passes": 3, "phase1_evaluations": 40, "phase2_evaluations": 4,
                "cached_scores": 0, "refinement_trials": 0, "phase1_inferred": 0,  # given by the saturation rule
                "promoted_share": 0.1, "promoted_group_share": 0.12,
                "wall_time_s": 9.5}}

``index`` is the number of flips along the path (flips are taken in order of phase-1 sensitivity, least
harmful first); ``flip`` is the last one taken to reach the point. Trials of the refinement pass
(`mixed_precision.amp_refine`) have ``"refinement": true`` and continue the numbering after the path's last
index; their ``flip`` is the last flip of the chunk tried. ``counts.refinement_trials`` counts them (cached
ones included); their fresh evaluations are part of ``phase2_evaluations``.

Every cost and precision is what the sim simulated at that point after calibration, the sim's automatic
decisions included (range health can give an activation AMP asked to be 8-bit a 16-bit grid, or leave it
float): a group's ``precisions`` entry names the candidate its quantizers really have, else spells their
types out (``W8A8/16``).

`AmpResult` is also AIMET's return value: a list of `ParetoEntry` ``(relative_bit_ops, eval_score,
quantizer_group, candidate)``, one per evaluated point of the search path after the baseline, in path
order, ``candidate`` in AIMET's ``((act_bw, act_dtype), (param_bw, param_dtype))`` form (aimet-onnx 2.42's
``pareto_list``). Where AIMET returns ``None`` (no search: the cheapest candidate everywhere meets the budget,
or the costliest misses it) the list is empty; the attributes say what happened.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from mixed_precision.amp_space import group_label
from mixed_precision.files import write_text_atomic
from mixed_precision.html_page import write_pareto_html
from mixed_precision.presets import Precision
from quantsim import QuantizationDataType, QuantizerGroup

__all__ = ["ParetoPoint", "ParetoEntry", "AmpResult", "aimet_candidate", "pareto_optimal", "write_pareto_files",
           "PARETO_FILE", "PARETO_PAGE"]

PARETO_FILE = "pareto.json"
PARETO_PAGE = "pareto.html"


@dataclass(frozen=True)
class ParetoPoint:
    """A configuration on the search path: ``index`` flips taken, its cost and (if evaluated) its score."""

    index: int
    bitops_ratio: float
    score: float | None
    precisions: tuple[str, ...]  # candidate name per quantizer group
    flip: tuple[int, str] | None = None  # (group index, candidate) of the last flip taken
    refinement: bool = False  # a trial of the refinement pass (`mixed_precision.amp_refine`), not on the path


AimetCandidate = tuple[tuple[int, QuantizationDataType], tuple[int, QuantizationDataType]]


def aimet_candidate(precision: Precision) -> AimetCandidate:
    """``precision`` as AIMET writes a candidate: ``((act_bw, act_dtype), (param_bw, param_dtype))``."""
    act_kind, act_bits = precision.activation_type.to_legacy_repr()
    param_kind, param_bits = precision.param_type.to_legacy_repr()
    return (act_bits, act_kind), (param_bits, param_kind)


class ParetoEntry(NamedTuple):
    """One entry of AIMET's pareto list: the point's bit operations relative to the baseline everywhere, its
    phase-2 score, the quantizer group flipped last to reach it and the candidate it was flipped to."""

    relative_bit_ops: float
    eval_score: float
    quantizer_group: QuantizerGroup
    candidate: AimetCandidate


def pareto_optimal(points: list[ParetoPoint]) -> list[ParetoPoint]:
    """Evaluated points that no other evaluated point beats on both cost and score, costliest first."""
    scored = [p for p in points if p.score is not None]

    def beaten(p: ParetoPoint) -> bool:
        return any(q.bitops_ratio <= p.bitops_ratio and q.score >= p.score  # type: ignore[operator]
                   and (q.bitops_ratio < p.bitops_ratio or q.score > p.score) for q in scored)  # type: ignore[operator]

    return sorted((p for p in scored if not beaten(p)), key=lambda p: (-p.bitops_ratio, p.index))


@dataclass(frozen=True, eq=False)
class AmpResult(list):
    """Outcome of `choose_mixed_precision`; the sim is left in ``chosen``'s configuration, calibrated. As a
    list: AIMET's pareto list of `ParetoEntry` (module docstring); list equality."""

    candidates: tuple[str, ...]  # costliest first
    float_score: float
    target: float | None
    uniform_scores: dict[str, float]
    uniform_bitops: dict[str, float]
    groups: tuple[QuantizerGroup, ...]
    points: tuple[ParetoPoint, ...]  # evaluated points, in path order
    chosen: ParetoPoint
    budget_met: bool
    message: str
    promoted_share: float  # of the quantizers with a choice, those not at the cheapest candidate's type
    promoted_group_share: float  # the same for groups
    calibration_passes: int
    phase1_evaluations: int
    phase2_evaluations: int
    cached_scores: int
    wall_time_s: float
    phase1_scores: dict[tuple[int, str], float] = field(default_factory=dict)  # (group, candidate) -> score
    refinement_trials: int = 0  # configurations the refinement pass scored (part of phase2_evaluations)
    precisions: tuple[Precision, ...] = ()  # the candidates, as ``candidates`` orders them
    phase1_inferred: int = 0  # phase-1 scores the saturation rule gave without evaluating

    def __post_init__(self) -> None:
        by_name = {p.name: p for p in self.precisions}
        list.extend(self, [ParetoEntry(p.bitops_ratio, p.score, self.groups[p.flip[0]],
                                       aimet_candidate(by_name[p.flip[1]]))
                           for p in self.points if p.flip is not None and not p.refinement
                           and p.score is not None and p.flip[1] in by_name])

    def __hash__(self) -> int:  # type: ignore[override]
        return id(self)

    def __reduce__(self) -> Any:
        return _rebuild, (tuple(getattr(self, f) for f in self.__dataclass_fields__),)

    @property
    def baseline(self) -> str:
        return self.candidates[0]

    @property
    def cheapest(self) -> str:
        return self.candidates[-1]

    @property
    def score(self) -> float:
        assert self.chosen.score is not None
        return self.chosen.score

    @property
    def bitops_ratio(self) -> float:
        return self.chosen.bitops_ratio

    @property
    def evaluations(self) -> int:
        return self.phase1_evaluations + self.phase2_evaluations

    @property
    def configuration(self) -> dict[str, str]:
        """Chosen candidate per quantizer group, by the group's nodes (or quantizers)."""
        return {group_label(g): name for g, name in zip(self.groups, self.chosen.precisions)}

    @property
    def pareto_front(self) -> list[ParetoPoint]:
        return pareto_optimal(list(self.points))

    @property
    def pareto_list(self) -> list[ParetoEntry]:
        """AIMET's pareto list (the result itself, as a plain list)."""
        return list(self)

    def to_dict(self, allowed_accuracy_drop: float | None = None) -> dict[str, Any]:
        """The ``pareto.json`` document (module docstring)."""
        front = {p.index for p in self.pareto_front}
        return {
            "candidates": list(self.candidates), "baseline": self.baseline, "cheapest": self.cheapest,
            "float_score": self.float_score, "allowed_accuracy_drop": allowed_accuracy_drop, "target": self.target,
            "uniform": {name: {"bitops_ratio": self.uniform_bitops[name], "score": self.uniform_scores.get(name)}
                        for name in self.candidates},
            "groups": [{"nodes": list(g.nodes), "quantizers": list(g.quantizers)} for g in self.groups],
            "points": [{"index": p.index, "bitops_ratio": p.bitops_ratio, "score": p.score,
                        "pareto_optimal": p.index in front, "chosen": p.index == self.chosen.index,
                        "flip": {"group": p.flip[0], "candidate": p.flip[1]} if p.flip else None,
                        "refinement": p.refinement, "precisions": list(p.precisions)}
                       for p in sorted(self.points, key=lambda p: (-p.bitops_ratio, p.index))],
            "chosen": self.chosen.index, "budget_met": self.budget_met, "message": self.message,
            "counts": {"calibration_passes": self.calibration_passes, "phase1_evaluations": self.phase1_evaluations,
                       "phase2_evaluations": self.phase2_evaluations, "cached_scores": self.cached_scores,
                       "refinement_trials": self.refinement_trials,
                       "phase1_inferred": self.phase1_inferred,
                       "promoted_share": self.promoted_share, "promoted_group_share": self.promoted_group_share,
                       "wall_time_s": self.wall_time_s},
        }


def _rebuild(values: tuple) -> AmpResult:
    return AmpResult(*values)


def write_pareto_files(result: AmpResult, results_dir: Path, allowed_accuracy_drop: float | None) -> Path:
    """Write ``pareto.json`` and ``pareto.html`` (the Pareto curve with the chosen point highlighted, see
    `mixed_precision.html_page.write_pareto_html`) into ``results_dir``, each atomically; the JSON's path."""
    document = result.to_dict(allowed_accuracy_drop)
    path = write_text_atomic(results_dir / PARETO_FILE, json.dumps(document, indent=1))
    groups = [group_label(g) for g in result.groups]
    scored = [p for p in document["points"] if p["score"] is not None]
    points = [{"bitops_ratio": p["bitops_ratio"], "score": p["score"],
               "label": _point_label(p, groups), "precisions": dict(zip(groups, p["precisions"]))} for p in scored]
    chosen = next((i for i, p in enumerate(scored) if p["chosen"]), None)
    target = "" if result.target is None else f", target score {result.target:.6g}"
    write_pareto_html(results_dir / PARETO_PAGE, points, chosen,
                      f"Automatic mixed precision: {result.message}{target}")
    return path


def _point_label(point: dict[str, Any], groups: list[str]) -> str:
    flip = point["flip"]
    if point["refinement"]:
        return f"refinement trial {point['index']} (last flip: {groups[flip['group']]} to {flip['candidate']})"
    if flip is None:
        return f"{point['precisions'][0] if len(set(point['precisions'])) == 1 else 'start'} everywhere"
    return f"{point['index']} flips (last: {groups[flip['group']]} to {flip['candidate']})"
