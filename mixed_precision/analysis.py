"""Per-layer analysis (AIMET's QuantAnalyzer, first part): data only, rendering is a separate step.

* `group_sensitivity`: for every quantizer group (a weighted op's parameters with the activations it reads,
  `QuantizationSimModel.quantizer_groups`), the user's score with only that group quantized and with only
  that group left float; every change runs inside `sim.temporary_state()`, so the sim ends exactly as it
  began (even when the callback raises). The evaluations are independent: with ``executor`` (threads,
  processes, a Dask cluster) they run there, each on a private copy of the sim, with the scores a local run
  gives (`mixed_precision.amp_executor`).
* `tensor_health`: per quantized activation, the SQNR of the sim's value against the float model's
  (streamed over the data), the SQNR its own grid alone gives its float values (so a tensor that only
  inherits error from earlier quantizers is told apart from one whose range is at fault), how many of its
  grid's codes its float values really use (its own values on its own grid: a tensor downstream of a collapsed
  one is not blamed for it), its float range against the calibrated grid's, and the histogram of the codes
  its float values round to. A tensor whose many distinct values collapse onto a few codes, or whose own grid
  keeps far less than a well-spread tensor would get (``6.02 dB`` per bit, less `LOW_SQNR_MARGIN_DB`), is
  flagged with the usual fix.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mixed_precision.amp_executor import Changes, plain_score, run_evaluations
from mixed_precision.sqnr import power_sqnr_db
from quantsim import Encoding, QuantizationSimModel, QuantizerGroup, fake_quantize
from quantsim.errors import warn_if_forking_pool

__all__ = ["GroupScore", "TensorHealth", "group_sensitivity", "tensor_health", "report_dict", "FEW_CODES",
           "LOW_SQNR_MARGIN_DB", "HISTOGRAM_BINS"]

#: a tensor whose values use fewer codes than this, though they hold at least twice as many distinct values, has
#: collapsed (a tensor with only a few distinct values, such as a 0/1 mask, is not flagged)
FEW_CODES = 16
#: a tensor's own grid keeping this much less than ``6.02 * bits`` dB (a uniformly spread tensor's SQNR) is
#: flagged: typical activations lose 10-15 dB against that ideal, outlier-stretched ranges 30 dB and more
LOW_SQNR_MARGIN_DB = 30.0
HISTOGRAM_BINS = 32  # bins of each tensor's histogram over its calibrated grid (runs of adjacent codes)


@dataclass(frozen=True)
class GroupScore:
    """Scores of one quantizer group: ``alone`` (only it quantized) and ``without`` (only it float)."""

    nodes: tuple[str, ...]
    quantizers: tuple[str, ...]
    alone: float
    without: float


@dataclass(frozen=True)
class TensorHealth:
    """SQNR (dB) of one quantized activation against float, the codes its float values use on its grid, its
    ranges and histogram."""

    tensor: str
    sqnr_db: float
    codes_used: int
    codes_available: int
    verdict: str
    grid_sqnr_db: float | None = None  # the tensor's own grid applied to its float values
    float_min: float | None = None  # the float model's values on the analysis data
    float_max: float | None = None
    grid_min: float | None = None  # the calibrated grid's range (per-channel: the widest)
    grid_max: float | None = None
    #: how many float values round to each code of the (per-tensor) grid, summed over HISTOGRAM_BINS equal runs
    #: of codes from grid_min to grid_max: the values' histogram over the grid (clipped values on the end codes)
    histogram: tuple[int, ...] = ()
    clipped: tuple[int, int] = (0, 0)  # float values below grid_min, above grid_max


def group_sensitivity(sim: QuantizationSimModel, eval_fn: Callable[[Any], float],
                      groups: Iterable[QuantizerGroup] | None = None, *,
                      compute: tuple[str, ...] = ("alone", "without"), executor: Executor | None = None,
                      chunks: int = 16) -> tuple[float, float, list[GroupScore]]:
    """``(float score, fully quantized score, per-group scores)``; ``eval_fn(session) -> float`` (higher is
    better). ``compute`` names the per-group scores to compute (the other is NaN). The sim must be calibrated;
    it is left exactly as it was. ``executor``: run the evaluations there, in ``chunks`` tasks (module
    docstring; with processes ``eval_fn`` must pickle)."""
    groups = list(sim.quantizer_groups() if groups is None else groups)
    warn_if_forking_pool(executor, "group_sensitivity")
    active = {q.name for q in sim.quantizers if q.enabled}
    state = {q.name: (q.spec, q.encoding) for q in sim.quantizers}

    def enabled_only(names: set[str]) -> Changes:
        """The changes that leave exactly ``names`` enabled."""
        return {n: (*state[n], n in names) for n in state if (n in names) != (n in active)}

    items: list[tuple[Hashable, Changes, str]] = [("quantized", {}, "the quantized model"),
                                                   ("float", enabled_only(set()), "the float model")]
    for i, group in enumerate(groups):
        members = set(group.quantizers)
        if "alone" in compute:
            items.append((("alone", i), enabled_only(members & active), f"group {i} quantized alone"))
        if "without" in compute:
            items.append((("without", i), enabled_only(active - members), f"group {i} left float alone"))
    scores: dict[Any, float] = {}
    run_evaluations(sim, eval_fn, items, scores.__setitem__, executor=executor, chunks=chunks, convert=plain_score)
    rows = [GroupScore(g.nodes, g.quantizers, scores.get(("alone", i), math.nan), scores.get(("without", i), math.nan))
            for i, g in enumerate(groups)]
    return scores["float"], scores["quantized"], rows


def tensor_health(sim: QuantizationSimModel, inputs: Iterable[Mapping[str, np.ndarray]],
                  tensors: Iterable[str] | None = None) -> list[TensorHealth]:
    """SQNR (end to end and of the tensor's own grid), codes used, ranges and histogram of calibrated integer
    activation quantizers' tensors, streamed over ``inputs``: flagged tensors first (a huge outlier can keep
    the SQNR high while the rest collapses), then by SQNR, worst first."""
    if tensors is None:
        tensors = [name for name in sim.activation_names
                   if sim.qc_quantize_op_dict[name].enabled and sim.qc_quantize_op_dict[name].encoding is not None]
    names = list(dict.fromkeys(tensors))
    if not names:
        return []
    feeds = list(inputs)
    stats = {name: _Stats(sim.qc_quantize_op_dict[name].encoding) for name in names}
    for float_values, sim_values in zip(sim.capture(names, feeds, quantized=False), sim.capture(names, feeds)):
        for name in names:
            stats[name].add(float_values[name], sim_values[name])
    rows = [stats[name].result(name) for name in names]
    return sorted(rows, key=lambda r: (r.verdict == "ok", r.sqnr_db))


class _Stats:
    """One tensor's streamed sums, codes, range and histogram."""

    def __init__(self, enc: Encoding | None) -> None:
        self.enc = enc
        self.signal = self.noise = self.grid_noise = 0.0
        self.distinct: set[float] = set()  # the float values, counted up to 2 * FEW_CODES
        self.lo, self.hi = math.inf, -math.inf
        self.grid = (float(np.min(enc.min)), float(np.max(enc.max))) if enc is not None else None
        codes = enc.num_steps + 1 if enc is not None and enc.is_per_tensor else 0
        self.counts = np.zeros(codes, np.int64)  # values per code of the grid
        self.below = self.above = 0

    def add(self, float_values: np.ndarray, sim_values: np.ndarray) -> None:
        ref, got = float_values.astype(np.float64), sim_values.astype(np.float64)
        self.signal += float(np.sum(ref * ref))
        self.noise += float(np.sum((ref - got) ** 2))
        if ref.size:
            self.lo, self.hi = min(self.lo, float(ref.min())), max(self.hi, float(ref.max()))
        enc = self.enc
        if enc is None or self.grid is None:
            return
        own = fake_quantize(np.asarray(float_values, np.float32), enc).astype(np.float64)
        self.grid_noise += float(np.sum((ref - own) ** 2))
        if enc.is_per_tensor and own.size:
            index = np.rint(own / float(enc.scale)).astype(np.int64) + (int(enc.zero_point) - enc.qmin)
            self.counts += np.bincount(index.ravel(), minlength=self.counts.size)
            if np.count_nonzero(self.counts) < FEW_CODES and len(self.distinct) < 2 * FEW_CODES:
                self.distinct.update(np.unique(ref)[:2 * FEW_CODES].tolist())  # a sort: only for few codes
        self.below += int(np.count_nonzero(ref < self.grid[0]))
        self.above += int(np.count_nonzero(ref > self.grid[1]))

    def result(self, name: str) -> TensorHealth:
        enc, used = self.enc, int(np.count_nonzero(self.counts))
        grid_sqnr = power_sqnr_db(self.signal, self.grid_noise) if enc is not None else None
        verdict = "ok"
        if enc is not None and used and used < FEW_CODES and len(self.distinct) >= 2 * used:
            verdict = f"collapsed onto {used} of {enc.num_steps + 1} codes: give it a 16-bit grid or keep it float"
        elif enc is not None and grid_sqnr is not None and grid_sqnr < 6.02 * enc.bits - LOW_SQNR_MARGIN_DB:
            verdict = (f"its own {enc.bits}-bit grid keeps only {grid_sqnr:.1f} dB of it (a few outliers stretch the "
                       "range): try a percentile or MSE range, a 16-bit grid, or keep it float")
        finite = math.isfinite(self.lo)
        return TensorHealth(name, power_sqnr_db(self.signal, self.noise), used, enc.num_steps + 1 if enc is not None else 0,
                            verdict, grid_sqnr, self.lo if finite else None, self.hi if finite else None,
                            self.grid[0] if self.grid else None, self.grid[1] if self.grid else None,
                            _binned(self.counts), (self.below, self.above))


def _binned(counts: np.ndarray) -> tuple[int, ...]:
    """Per-code counts summed into at most HISTOGRAM_BINS bins of (nearly) equal numbers of codes."""
    if not counts.size or not counts.any():
        return ()
    bins = min(HISTOGRAM_BINS, counts.size)
    starts = (np.arange(bins) * counts.size) // bins
    return tuple(int(c) for c in np.add.reduceat(counts, starts))


def report_dict(float_score: float, quantized_score: float, groups: list[GroupScore],
                health: list[TensorHealth]) -> dict[str, Any]:
    """A JSON-ready report: groups worst first (the lowest score quantized alone), tensors worst first."""
    ordered = sorted(groups, key=lambda g: g.alone)
    return {
        "float_score": float_score,
        "quantized_score": quantized_score,
        "groups": [asdict(g) for g in ordered],
        "tensors": [{**asdict(t), "sqnr_db": _json_db(t.sqnr_db), "grid_sqnr_db": _json_db(t.grid_sqnr_db)}
                    for t in health],
    }


def _json_db(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value
