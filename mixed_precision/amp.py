"""Automatic mixed precision (AMP): AIMET's ``choose_mixed_precision``, with each candidate calibrated once.

The search, as in aimet-onnx (`reference/aimet_onnx_api.md` §8.2):

0. Candidates are ordered by cost (bit operations with the candidate everywhere, `mixed_precision.bitops`);
   the costliest is the baseline. Scores: the float model (every quantizer disabled) and each candidate
   everywhere, with the phase-2 callback; ``target = float score - allowed_accuracy_drop``.
   If the baseline everywhere misses the target, the sim is left at the baseline everywhere (a warning, and
   ``budget_met=False``); if the cheapest candidate everywhere meets it, there it is left.
1. Phase 1, sensitivity: every quantizer group alone (every other group's quantizers disabled) at every
   other candidate, scored by the phase-1 callback, as aimet-onnx does. With ``phase1_optimize=True`` (the
   default, AIMET's optimized phase 1) statistics are collected once per candidate (a calibration pass with
   that candidate everywhere) and each group takes its encodings from that pass, so phase 1 costs one pass
   per candidate plus one evaluation per (group, candidate); these evaluations are independent: with
   ``executor`` they run in worker threads, processes or on a Dask cluster (`mixed_precision.amp_executor`).
   With ``phase1_optimize=False`` every evaluation is calibrated for itself (one pass each, here).
   The saturation rule (``phase1_saturation=True``, with three candidates or more; not in AIMET): a group's
   candidates are scored cheapest first, and once the group alone scores at least what the float model
   scores with the phase-1 callback (its ceiling: quantization cannot do better than no quantization), its
   costlier candidates are given that same score without evaluation. Those flips sort after the one that
   saturated (equal score, higher cost), so the path never takes them: the search is unchanged whenever
   their real scores would have been that score too, the usual case for task metrics against FP32
   (agreement, CER) where a group's cheapest candidate already loses nothing; a continuous proxy (KL, SQNR)
   never reaches the float model's score, so it saves nothing there. The result counts the scores given
   (``phase1_inferred``); ``phase1_saturation=False`` evaluates every one, as AIMET.
2. Phase 2, the Pareto search: (group, candidate) flips sorted least harmful first (phase-1 score, then
   the bit operations saved) are taken one after another from the baseline (a flip applies only when it
   makes its group cheaper); each prefix of the list is a configuration, cheaper than the one before. A
   binary search (or, with ``AMPSearchAlgo.BruteForce`` or no budget, every prefix) finds the longest
   prefix whose score meets the target; each point it evaluates is calibrated for its own configuration.
   The sim is left in that configuration, calibrated.

What the sim runs is what is reported: every calibration applies the sim's automatic decisions (range
health can give an activation a candidate asked to be 8-bit a 16-bit grid, or leave it float), so each
point's cost and per-group precisions are read from the quantizers after its calibration
(`mixed_precision.amp_space.Observed`), and the types a candidate really gives each quantizer (learnt from
its calibration everywhere) decide which flips change anything. ``use_all_amp_candidates=False`` keeps each
group to the candidates the config's ``supported_kernels`` allow (`mixed_precision.amp_kernels`).

``results_dir`` gets ``pareto.json`` and ``pareto.html`` (`mixed_precision.amp_result`) and the score cache that
``clean_start=False`` resumes from (`mixed_precision.amp_cache`). If anything raises (a callback
included), the sim is restored exactly as it was.
"""
from __future__ import annotations

import enum
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mixed_precision.amp_cache import ScoreCache, cache_key
from mixed_precision.amp_executor import checked_score
from mixed_precision.amp_kernels import supported_candidates, target_candidates
from mixed_precision.amp_phases import Counts, flip_order, flip_path, phase1_ceiling, phase1_scores
from mixed_precision.amp_refine import default_limit
from mixed_precision.amp_refine import refine as refine_flips
from mixed_precision.amp_result import AmpResult, ParetoPoint, write_pareto_files
from mixed_precision.amp_space import AmpSpace, Config, Observed, distinct
from mixed_precision.presets import candidate
from quantsim import InvalidArgumentError, QuantizationSimModel
from quantsim.errors import warn_if_forking_pool

__all__ = ["choose_mixed_precision", "AMPSearchAlgo", "CallbackFunc"]

_log = logging.getLogger(__name__)


class AMPSearchAlgo(enum.Enum):
    """How phase 2 walks the sorted flip list (AIMET's names)."""

    BruteForce = "brute_force"  # evaluate every prefix
    Binary = "binary"  # binary search for the longest prefix meeting the target


@dataclass(frozen=True)
class CallbackFunc:
    """AIMET's ``CallbackFunc``: ``func`` called as ``func(session, args)``."""

    func: Callable[..., Any]
    args: Any = None

    def __call__(self, session: Any) -> Any:
        return self.func(session, self.args)


def _check_inputs(candidates, eval1, eval2, drop, forward) -> tuple[list, float | None]:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise InvalidArgumentError("candidates must be a list of presets or ((act_bw, act_dtype), (param_bw, "
                                   f"param_dtype)) pairs, got {candidates!r}")
    parsed = distinct([candidate(c) for c in candidates])
    if len(parsed) < 2:
        raise InvalidArgumentError(f"AMP needs at least two distinct candidates, got {[p.name for p in parsed]}")
    for name, fn in (("eval_callback_for_phase1", eval1), ("eval_callback_for_phase2", eval2)):
        if not callable(fn):
            raise InvalidArgumentError(f"{name} must be callable (session -> score), got {type(fn).__name__}")
    if drop is not None:
        if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not math.isfinite(drop) or drop < 0:
            raise InvalidArgumentError(f"allowed_accuracy_drop must be a number >= 0 or None, got {drop!r}")
        drop = float(drop)
    if forward is None or not callable(forward) and not isinstance(forward, Iterable):
        raise InvalidArgumentError("forward_pass_callback must be callable (session -> None) or a list of feed dicts")
    if not callable(forward) and isinstance(forward, Iterator):
        raise InvalidArgumentError("forward_pass_callback is a one-shot iterator, but AMP calibrates several times: "
                                   "pass a list of feed dicts or a callable")
    return parsed, drop


def choose_mixed_precision(sim: QuantizationSimModel, candidates: Iterable[Any], eval_callback_for_phase1: Callable,
                           eval_callback_for_phase2: Callable, allowed_accuracy_drop: float | None,
                           results_dir: str | Path, clean_start: bool, forward_pass_callback: Any,
                           use_all_amp_candidates: bool = False, phase1_optimize: bool = True,
                           amp_search_algo: AMPSearchAlgo = AMPSearchAlgo.Binary, *,
                           executor: Executor | None = None, executor_chunks: int = 16,
                           progress: bool | None = None, refine: bool | int = True,
                           phase1_saturation: bool = True,
                           known_scores: Mapping[str, float] | None = None) -> AmpResult:
    """Choose a precision per quantizer group: the cheapest configuration (in bit operations) whose score is
    within ``allowed_accuracy_drop`` of the float model's (module docstring). AIMET's signature and return
    value (`AmpResult` is AIMET's pareto list, with more attributes). ``phase1_optimize``: one calibration
    pass per candidate in phase 1 (True) or one per evaluation (False). ``use_all_amp_candidates=False``
    restricts each group to the candidates the sim's config lists as ``supported_kernels`` for its ops
    (`mixed_precision.amp_kernels`); True (or a config without them) uses every candidate everywhere.

    ``candidates``: presets ("W8A16", "W8A8", ...) or AIMET's ``((act_bw, act_dtype), (param_bw,
    param_dtype))``. Eval callbacks take the sim's onnxruntime session and return a float, higher is better;
    ``forward_pass_callback`` calibrates (a callable taking the session, or a list of feed dicts).
    ``executor`` runs phase 1 elsewhere, in ``executor_chunks`` tasks that each carry the pickled sim;
    ``progress`` shows tqdm bars, the calibrations' included (default: the sim's setting).
    ``refine``: after the prefix search, try taking the flips it left out, by bisection
    (`mixed_precision.amp_refine`); ``True`` spends at most `amp_refine.default_limit` trials, an int at most
    that many, ``False`` (or 0) keeps AIMET's prefix search alone. Only with a budget and the binary search.
    ``phase1_saturation``: phase 1's saturation rule (module docstring); ``False`` scores every (group,
    candidate) as aimet-onnx does. ``known_scores`` (not in AIMET): phase-2 scores the caller already has,
    ``"float"`` for the float model and a candidate's name for that candidate everywhere on this sim (as
    `AmpSpace.build` configures it with ``AmpSpace.uniform``), used instead of evaluating them (each
    candidate is still calibrated everywhere once, for phase 1 and its observed cost); a known ``"float"``
    also sets the target (its score minus ``allowed_accuracy_drop``). Candidates' scores are used only when
    every group may take every candidate (else "everywhere" is not the same configuration: they are
    evaluated as usual).
    """
    start = time.perf_counter()
    warn_if_forking_pool(executor, "choose_mixed_precision")
    precisions, drop = _check_inputs(candidates, eval_callback_for_phase1, eval_callback_for_phase2,
                                     allowed_accuracy_drop, forward_pass_callback)
    if not isinstance(refine, (bool, int)) or not isinstance(refine, bool) and refine < 0:
        raise InvalidArgumentError(f"refine must be True, False or a number of trials >= 0, got {refine!r}")
    given = _known(known_scores, [p.name for p in precisions])
    algo = AMPSearchAlgo(amp_search_algo)
    show = sim.progress if progress is None else bool(progress)
    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True)
    sample = None
    if isinstance(forward_pass_callback, (list, tuple)) and forward_pass_callback \
            and isinstance(forward_pass_callback[0], Mapping):
        sample = forward_pass_callback[0]  # fixes symbolic dimensions for the MAC counts
    space = AmpSpace.build(sim, precisions, sample)
    space = replace(space, candidates=[precisions[c] for c in space.order_by_cost()])  # costliest first
    allowed = supported_candidates(sim, space.groups, space.candidates, bool(use_all_amp_candidates))
    allowed = target_candidates(sim, space.controlled, [", ".join(g.nodes or g.quantizers) for g in space.groups],
                                space.requested, allowed)
    space = replace(space, allowed=None if all(len(a) == len(space.candidates) for a in allowed) else allowed)
    if space.allowed is not None:  # "everywhere" is not every group at the candidate: only the float score holds
        given = {k: v for k, v in given.items() if k == "float"}
    names = [p.name for p in space.candidates]
    cache = ScoreCache(results, cache_key(sim, names, space.groups, (eval_callback_for_phase1,
                                                                     eval_callback_for_phase2), space.allowed),
                       clean_start=clean_start)
    counts = Counts()
    previous, sim.progress = sim.progress, show  # the calibrations' bars follow AMP's setting
    try:
        with sim.transaction():
            result = _search(space, cache, counts, drop, algo, eval_callback_for_phase1, eval_callback_for_phase2,
                             forward_pass_callback, executor, executor_chunks, show, start, refine,
                             bool(phase1_optimize), bool(phase1_saturation), given)
    finally:
        sim.progress = previous
    write_pareto_files(result, results, drop)
    _log.info("AMP: %s (score %.6g, relative BOPs %.4f, %.1f%% of quantizers promoted; %d calibration passes, "
              "%d evaluations, %d cached)", result.message, result.score, result.bitops_ratio,
              100 * result.promoted_share, result.calibration_passes, result.evaluations, result.cached_scores)
    return result


def _search(space: AmpSpace, cache: ScoreCache, counts: Counts, drop: float | None, algo: AMPSearchAlgo,
            eval1: Callable, eval2: Callable, forward: Any, executor: Executor | None, chunks: int, show: bool,
            start: float, refine_limit: bool | int = True, phase1_optimize: bool = True,
            saturation: bool = True, given: Mapping[str, float] | None = None) -> AmpResult:
    sim, names = space.sim, [p.name for p in space.candidates]
    baseline, cheapest = 0, len(names) - 1
    calibrated: list[Config | None] = [None]  # the configuration the sim is calibrated for now

    def passed() -> None:
        counts.passes += 1

    def phase2_score(key: str, what: str) -> float:
        if given and key in given:  # the caller's (known_scores)
            cache.put(key, given[key])
            return given[key]
        cached = cache.get(key)
        if cached is not None:
            return cached
        score = checked_score(eval2(sim.session), what)
        counts.phase2 += 1
        cache.put(key, score)
        return score

    with sim.temporary_state():
        for q in sim.quantizers:
            q.enabled = False
        float_score = phase2_score("float", "float model (every quantizer disabled)")

    tables: dict[int, dict] = {}
    uniform_seen: dict[int, Observed] = {}

    def table(c: int) -> dict:
        """Specs, encodings and enabled flags of every controlled quantizer with candidate ``c`` everywhere,
        as calibration (and the sim's automatic decisions) left them (one pass)."""
        if c not in tables:
            space.calibrated(space.uniform(c), forward, passed)
            calibrated[0] = space.uniform(c)
            uniform_seen[c] = space.observe()
            space.observe_uniform(c, uniform_seen[c])
            tables[c] = {n: (space.quantizers[n].spec, space.quantizers[n].encoding, space.quantizers[n].enabled)
                         for names_ in space.controlled for n in names_}
        return tables[c]

    def at_baseline() -> None:
        """The baseline everywhere, with its own pass's encodings (no new pass)."""
        with sim.transaction():
            for name, (spec, encoding, enabled) in table(baseline).items():
                space.quantizers[name].set_qspec(spec)
                space.quantizers[name].set_encoding(encoding)
                space.quantizers[name].enabled = enabled
        calibrated[0] = space.uniform(baseline)

    uniform: dict[str, float] = {}
    for c in reversed(range(len(names))):  # the baseline last: phase 1 starts from its pass
        key = f"uniform:{names[c]}"
        seen = cache.get_observed(key)
        if key not in cache.scores or seen is None:
            table(c)
        uniform[names[c]] = phase2_score(key, f"{names[c]} everywhere")
        if seen is None:
            cache.put(key, None, uniform_seen[c])
        else:
            uniform_seen[c] = seen
            space.observe_uniform(c, seen)
    full = uniform_seen[baseline].bops or 1.0
    target = None if drop is None else float_score - drop
    _log.info("AMP: float score %.6g, target %s; everywhere: %s", float_score,
              "none" if target is None else f"{target:.6g}", ", ".join(f"{n} {uniform[n]:.6g}" for n in names))

    def point(index: int, config: Config, seen: Observed, score: float | None, flip: tuple[int, str] | None = None,
              refinement: bool = False) -> ParetoPoint:
        """A point as the sim simulates it (``seen``), never as it was requested (``config``)."""
        return ParetoPoint(index, seen.bops / full, score, tuple(space.describe_observed(seen, config)), flip,
                           refinement)

    def finish(config: Config, points: list[ParetoPoint], chosen: ParetoPoint, met: bool, message: str,
               phase1: dict | None = None) -> AmpResult:
        if calibrated[0] is None or space.canonical(calibrated[0]) != space.canonical(config):
            space.calibrated(config, forward, passed)
        final = space.observe()  # what the sim is left simulating: the chosen point reports exactly that
        truth = point(chosen.index, config, final, chosen.score, chosen.flip, chosen.refinement)
        if truth != chosen:
            _log.debug("AMP: the chosen point recalibrated to %s (recorded %s)", truth, chosen)
            points = [truth if p == chosen else p for p in points]
        share, group_share = space.promoted_share(final, cheapest)
        return AmpResult(tuple(names), float_score, target, uniform,
                         {n: uniform_seen[c].bops / full for c, n in enumerate(names)},
                         tuple(space.groups), tuple(points), truth, met, message, share, group_share,
                         counts.passes, counts.phase1, counts.phase2, cache.hits, time.perf_counter() - start,
                         phase1 or {}, counts.refine, tuple(space.candidates), counts.phase1_inferred)

    def uniform_point(c: int) -> ParetoPoint:
        changed = sum(space.group_types(g, c) != space.group_types(g, baseline) for g in range(len(space.groups)))
        return point(changed, space.uniform(c), uniform_seen[c], uniform[names[c]])

    base_point = uniform_point(baseline)
    if target is not None and uniform[names[baseline]] < target:
        message = (f"no candidate meets the budget: {names[baseline]} everywhere scores {uniform[names[baseline]]:.6g}"
                   f" < target {target:.6g} (float {float_score:.6g} - allowed drop {drop}); left at "
                   f"{names[baseline]} everywhere")
        warnings.warn(f"choose_mixed_precision: {message}", RuntimeWarning, stacklevel=3)
        return finish(space.uniform(baseline), [base_point], base_point, False, message)
    if target is not None and uniform[names[cheapest]] >= target \
            and uniform_seen[cheapest].bops <= uniform_seen[baseline].bops:  # cheapest as the sim runs it, too
        cheap_point = uniform_point(cheapest)
        return finish(space.uniform(cheapest), [base_point, cheap_point], cheap_point, True,
                      f"{names[cheapest]} everywhere meets the target")

    ceiling = (lambda: phase1_ceiling(space, cache, counts, eval1, eval2, float_score)) if saturation else None
    phase1 = phase1_scores(space, cache, counts, table, at_baseline, eval1, forward, executor, chunks, show,
                           phase1_optimize, ceiling)
    _log.info("AMP phase 1: %d scores (%d evaluated, %d saturated, the rest cached) after %d calibration passes",
              len(phase1), counts.phase1, counts.phase1_inferred, counts.passes)
    path = flip_path(space, phase1)
    configs = [c for c, _ in path]
    known: dict[Config, float] = {}
    observations: dict[Config, Observed] = {}
    for c in range(len(names)):
        known[space.canonical(space.uniform(c))] = uniform[names[c]]
        observations[space.canonical(space.uniform(c))] = uniform_seen[c]
    scores: dict[int, float] = {}

    def score_config(config: Config, what: str) -> float:
        """Phase-2 score of a configuration, calibrated for itself (or known: cached, on the path, uniform);
        what the sim simulated in it is recorded in ``observations``."""
        config = space.canonical(config)
        if config in known:
            return known[config]
        key = "point:" + ",".join(space.describe(config))
        seen = cache.get_observed(key)
        score = cache.get(key) if seen is not None else None
        if score is None:
            space.calibrated(config, forward, passed)
            calibrated[0] = config
            seen = space.observe()
            score = phase2_score(key, what)
            cache.put(key, None, seen)
        assert seen is not None
        known[config], observations[config] = score, seen
        return score

    def seen_at(config: Config) -> Observed:
        return observations[space.canonical(config)]

    def evaluate(k: int) -> float:
        if k not in scores:
            scores[k] = score_config(configs[k], f"phase 2 point {k}")
            bar.update(1)
        return scores[k]

    n = len(configs) - 1
    brute = target is None or algo is AMPSearchAlgo.BruteForce
    with tqdm(total=n if brute else max(1, math.ceil(math.log2(n + 1))), desc="AMP phase 2", unit="point",
              leave=False, disable=None if show else True) as bar:
        if brute:
            for k in range(n + 1):
                evaluate(k)
            feasible = [k for k in scores if target is None or scores[k] >= target]
            best = 0 if target is None else min(feasible, key=lambda k: (seen_at(configs[k]).bops, -k))
        else:
            assert target is not None
            lo, hi = 0, n + 1  # lo meets the target; hi is the first prefix known (or assumed) not to
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if evaluate(mid) >= target else (lo, mid)
            best = lo
            evaluate(best)  # the baseline (known) when no prefix met the target
    points = [point(k, configs[k], seen_at(configs[k]), scores[k], path[k][1]) for k in sorted(scores)]
    chosen = next(p for p in points if p.index == best)
    phase1_named = {(g, names[c]): s for (g, c), s in phase1.items()}
    if target is None:
        message = f"no budget: the whole front was evaluated; left at {names[baseline]} everywhere"
        return finish(configs[best], points, chosen, True, message, phase1_named)
    message = f"{best} of {n} flips taken: the cheapest evaluated point meeting the target {target:.6g}"
    limit = _refine_limit(refine_limit, n - best)
    rest = flip_order(space, phase1)  # the flips already taken are skipped (not cheaper any more)
    failed = path[best + 1][1] if best + 1 in scores else None  # the next flip, known to break the budget alone
    if failed is not None:
        rest.remove((failed[0], names.index(failed[1])))

    def trial_score(config: Config, flips: tuple) -> float:
        counts.refine += 1
        return score_config(config, f"refinement trial {counts.refine}")

    config, trials = refine_flips(configs[best], rest, lambda cfg, f: space.group_cost(*f) < space.group_cost(
        f[0], cfg[f[0]]), trial_score, target, limit) if limit else (configs[best], [])
    for j, trial in enumerate(trials):
        trial_point = point(n + 1 + j, trial.config, seen_at(trial.config), trial.score,
                            (trial.flips[-1][0], names[trial.flips[-1][1]]), refinement=True)
        points.append(trial_point)
        if trial.kept:
            chosen = trial_point
    kept = sum(len(t.flips) for t in trials if t.kept)
    if trials:
        message += (f"; refinement: {kept} more flips kept in {len(trials)} trials "
                    f"({sum(t.kept for t in trials)} kept)")
    return finish(config, points, chosen, True, message, phase1_named)


def _known(scores: Mapping[str, float] | None, names: list[str]) -> dict[str, float]:
    """``known_scores`` as cache keys (``float``, ``uniform:<name>``), checked."""
    if scores is None:
        return {}
    if not isinstance(scores, Mapping):
        raise InvalidArgumentError(f"known_scores must be a mapping of 'float' or candidate names to scores, got "
                                   f"{type(scores).__name__}")
    given = {}
    for name, value in scores.items():
        if name != "float" and name not in names:
            raise InvalidArgumentError(f"known_scores: {name!r} is neither 'float' nor one of the candidates {names}")
        given["float" if name == "float" else f"uniform:{name}"] = checked_score(value, f"known_scores[{name!r}]")
    return given


def _refine_limit(setting: bool | int, remaining: int) -> int:
    if setting is True:
        return default_limit(remaining)
    return int(setting)
