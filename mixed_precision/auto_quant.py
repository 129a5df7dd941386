"""`auto_quantize`: from a float model and an accuracy budget to the cheapest configuration that meets it.

The search tries techniques from the cheapest (in search time) to the most expensive and stops as soon as
the budget is met at the lowest cost it can reach. With ``target = reference - allowed_accuracy_drop``,
where ``reference`` is ``eval_callback`` on the float model (one onnxruntime session of the model as given):

1. **defaults**: the base precision (W8A8, or the first candidate with 8-bit or wider weights) with min-max
   calibration and the sim's calibrated rules;
2. **scheme**: the other calibration schemes (``quant_schemes``, default TF-enhanced and percentile) at the
   base precision, if the defaults miss the target; the best scheme is kept for what follows;
3. **cle**: cross-layer equalization (`adaround.equalize_model`) on a copy of the model, only when the
   equalized float model computes what the original does (largest output difference at most
   `CLE_TOLERANCE` of the output range on the first calibration batch); otherwise it is skipped, said in
   the result's message;
4. when the base precision meets the target, **cheaper candidates** (low-bit weights such as W4A8): each
   everywhere with Sequential MSE then AdaRound (``seq_mse_candidates``, ``adaround_iterations``), and if
   none meets the target, a mix of the base and the cheaper candidates per quantizer group;
5. when the base misses the target, the **costlier candidates** (W8A16, W16A16, FP16, ...) each everywhere
   (stage **uniform**), cheapest first, up to the first that meets the target (one calibration and one callback each); if none
   does, the search stops there and says so (no mix of them can do better than the costliest everywhere, as
   far as the search can tell). Else a mix per quantizer group of the base and the costlier candidates up to
   that first meeting one (the costlier ones are not needed), unless that one everywhere costs no more than
   the base does as the sim runs them (range health can leave activations 16-bit under W8A8 too).

A mix is searched exhaustively when the space has at most `EXHAUSTIVE_LIMIT` distinct configurations
(cheapest first, each calibrated for itself and scored, up to the first that meets the target), else by
`choose_mixed_precision`
(AMP, in ``<results_dir>/amp``, resumable). AMP's phase 2 (the prefix search and its refinement) is always
scored by ``eval_callback`` (on the export, below), so the budget is judged by the user's metric; its phase 1
(each quantizer group alone at each cheaper candidate, hundreds of evaluations on a real model, only used to
rank the flips) is
scored with ``phase1="proxy"`` (the default) by `auto_quant_proxy.OutputSQNR`: the SQNR of the sim's outputs
against the float model's on the first calibration batch (float outputs computed once; a session rebuild
and one batch per evaluation instead of the user's whole evaluation), or with ``phase1="callback"`` by
``eval_callback`` as well (then phase 1 skips a group's costlier candidates once a cheaper one already scores
what the float model does: AMP's saturation rule). Costs are bit operations relative to the costliest
candidate everywhere (`mixed_precision.bitops`), read from the sim's actual quantizers after every automatic
decision. The result counts what was spent (``AutoQuantResult.counts``: callback evaluations, phase-1 proxy
evaluations, calibration passes), also said in its message.

Scores are what the deployment computes (``score_on="export"``, the default): every configuration the
search chooses among (each stage's, each exhaustive one, AMP's phase 2: its uniform points, Pareto front and
refinement trials) is scored on its QDQ export in onnxruntime's fused integer kernels
(`QuantizationSimModel.fused_session`), so the chosen model, exported, delivers the score the search reports.
The sim cannot promise that itself: the integer kernels accumulate exactly and requantize with a float
multiplier, where the sim sums float products (a result within ~1e-6 of a rounding midpoint goes the other
way), and onnxruntime runs the float parts of the two graphs with different kernels (NCHWc convolutions,
LayerNorm fusions: one float ulp); each such flip is rare (1e-6 to 1e-4 of a layer's outputs) but grows
through the layers after it, and on a deep model at a tight budget the score moves by more than the budget's
margin (PP-OCRv4 rec: CER 0.0093 in the sim, 0.0182 exported). AMP's phase 1 (a per-group sensitivity
ranking) stays on the sim. ``score_on="sim"`` scores the sim's own session everywhere (the search as before:
no export per configuration); ``"both"`` scores the lower of the two (twice the callback evaluations), for a
model deployed both through the fused QDQ kernels and the exact integer export, which computes what the sim
does up to the same near-tie flips. Whatever the mode, the chosen configuration is scored both ways at the
end (``deployed_score``, ``sim_score``) and a warning names either that misses a met target.

Every score is written to ``<results_dir>/.cache/auto_quantize_scores.json`` as soon as it is known, keyed
by the prepared model, the candidates, the callback, ``phase1`` and ``score_on``: after an interruption, ``clean_start=False``
scores only what is missing. Nothing is changed on the caller's model; an exception from the callback
propagates after the scores so far are saved.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from tqdm.auto import tqdm

from adaround import apply_adaround, apply_seq_mse
from mixed_precision.amp import choose_mixed_precision
from mixed_precision.amp_executor import checked_score
from mixed_precision.amp_space import AmpSpace, Config
from mixed_precision.auto_quant_inputs import (
    CLE_TOLERANCE,
    calibration_batches,
    equalized,
    float_session,
    legal_candidates,
    small_space,
)
from mixed_precision.auto_quant_proxy import OutputSQNR
from mixed_precision.auto_quant_result import AutoQuantResult, AutoQuantStep, write_auto_quant_report
from mixed_precision.auto_quant_scoring import OnExport, check_final
from mixed_precision.bitops import layer_costs, simulated_bit_operations
from mixed_precision.files import write_text_atomic
from mixed_precision.presets import Precision, candidate
from quantsim import InvalidArgumentError, QuantizationSimModel, TargetError, load_target
from quantsim.prepare import hash_model

__all__ = ["auto_quantize", "DEFAULT_LADDER", "EXHAUSTIVE_LIMIT", "CLE_TOLERANCE", "PHASE1_MODES"]

_log = logging.getLogger(__name__)

DEFAULT_LADDER = ("W4A8", "W8A8", "W8A16", "W16A16", "FP16")
EXHAUSTIVE_LIMIT = 16
"""Largest number of distinct per-group configurations searched exhaustively (else AMP): each is calibrated
for itself and scored, cheapest first, so the search stops at the cheapest that meets the target."""
PHASE1_MODES = ("proxy", "callback")
SCORE_MODES = ("export", "sim", "both")
"""What scores AMP's phase 1 in `auto_quantize` (module docstring): the built-in output SQNR, or ``eval_callback``."""
_CACHE = Path(".cache") / "auto_quantize_scores.json"


class _Budget(Exception):
    """The time budget is spent."""


class _Timed:
    """The score callback, refusing (`_Budget`) to start an evaluation once the wall-clock ``deadline``
    (``time.time()``) has passed: AMP is one step of the search, and without this it ran to its end whatever
    the budget. Picklable for process and Dask executors; ``func`` names the user's callback for AMP's cache."""

    def __init__(self, evaluate: Callable, deadline: float):
        self.evaluate, self.deadline = evaluate, deadline
        self.func = getattr(evaluate, "func", evaluate)

    def __call__(self, session: Any) -> Any:
        if time.time() > self.deadline:
            raise _Budget
        return self.evaluate(session)


class _Search:
    def __init__(self, model: onnx.ModelProto, batches: Callable[[], list], evaluate: Callable, drop: float,
                 ladder: list[Precision], results: Path | None, clean_start: bool, executor: Executor | None,
                 time_budget: float | None, show: bool, sim_kwargs: dict, phase1: str = "proxy",
                 score_on: str = "export"):
        self.model, self.batches, self.evaluate, self.drop = model, batches, evaluate, drop
        self.phase1, self.score_on = phase1, score_on
        self.counts = {"callback_evaluations": 0, "proxy_evaluations": 0, "calibration_passes": 0}
        self.ladder, self.results, self.executor, self.show = ladder, results, executor, show
        self.time_budget, self.sim_kwargs, self.start = time_budget, sim_kwargs, time.perf_counter()
        self.steps: list[AutoQuantStep] = []
        self.best: tuple[AutoQuantStep, Callable[[], QuantizationSimModel], QuantizationSimModel | None] | None = None
        self.notes: list[str] = []
        self.reference = self.call(float_session(model), "the float model")
        self.target = self.reference - drop
        self.clean_start = clean_start
        self.known: dict[str, float] = {}  # scores of candidates everywhere, as AMP configures them (for AMP)
        self.key = self._cache_key(clean_start)

    def call(self, session: Any, what: str) -> float:
        """``eval_callback`` on ``session``, counted."""
        self.counts["callback_evaluations"] += 1
        return checked_score(self.evaluate(session), what)

    def calibrate(self, sim: QuantizationSimModel) -> None:
        """One calibration pass over the calibration data, counted."""
        self.counts["calibration_passes"] += 1
        sim.compute_encodings(self.batches())

    # scores, cached ---------------------------------------------------------------------------------------
    def _cache_key(self, clean_start: bool) -> str:
        digest = hashlib.sha256()
        hash_model(digest, self.model)
        digest.update(json.dumps([p.name for p in self.ladder]).encode())
        fn = getattr(self.evaluate, "func", self.evaluate)
        digest.update(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}".encode())
        digest.update(f"phase1={self.phase1}".encode())
        if self.score_on != "sim":  # sim-scored and export-scored caches never mix
            digest.update(f"score_on={self.score_on}".encode())
        key = digest.hexdigest()
        self.cache: dict[str, dict] = {}
        path = self._cache_path()
        if path is not None and path.exists() and not clean_start:
            try:
                stored = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                warnings.warn(f"auto_quantize: {path} is unreadable ({error}); starting clean", RuntimeWarning,
                              stacklevel=4)
                stored = {}
            if stored.get("key") == key and isinstance(stored.get("scores"), dict):
                self.cache = stored["scores"]
            elif stored:
                warnings.warn(f"auto_quantize: {path} was written for another model, candidates, callback or phase1; "
                              "starting clean", RuntimeWarning, stacklevel=4)
        return key

    def _cache_path(self) -> Path | None:
        return None if self.results is None else self.results / _CACHE

    def _save(self) -> None:
        path = self._cache_path()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps({"key": self.key, "scores": self.cache}, indent=1))

    def check_time(self) -> None:
        """Stop (`_Budget`) once the time budget is spent; the defaults are always scored."""
        if self.steps and self.time_budget is not None and time.perf_counter() - self.start > self.time_budget:
            raise _Budget

    # one configuration ------------------------------------------------------------------------------------
    def sim(self, precision: Precision, scheme: str, model: onnx.ModelProto | None = None) -> QuantizationSimModel:
        sim = QuantizationSimModel(model if model is not None else self.model, param_type=precision.param_type,
                                   activation_type=precision.activation_type, quant_scheme=scheme, **self.sim_kwargs)
        sim.progress = False
        return sim

    def score(self, stage: str, settings: dict[str, Any], build: Callable[[], QuantizationSimModel], *,
              shared: bool = False) -> AutoQuantStep:
        """Score the configuration ``build`` makes (or take its cached score), record the step. ``shared``: the
        sim ``build`` returns is reused by later steps, so the chosen one is built again at the end."""
        self.check_time()
        key = stage + json.dumps(settings, sort_keys=True)
        t0 = time.perf_counter()
        made: QuantizationSimModel | None = None
        if key in self.cache:
            score, bops, cached = self.cache[key]["score"], self.cache[key]["relative_bops"], True
        else:
            try:
                made = build()
            except TargetError as error:  # the target refuses this configuration: noted, not scored
                self.notes.append(f"{stage} {settings} skipped: {str(error).splitlines()[0]}")
                return AutoQuantStep(stage, settings, float("-inf"), float("inf"), time.perf_counter() - t0, False)
            score = self.score_of(made, f"{stage} {settings}")
            bops, cached = self.relative_bops(made), False
            self.cache[key] = {"score": score, "relative_bops": bops}
            self._save()
        step = AutoQuantStep(stage, settings, score, bops, 0.0 if cached else time.perf_counter() - t0,
                             score >= self.target, cached)
        self.steps.append(step)
        _log.info("auto_quantize: %s -> score %.6g, relative BOPs %.4f%s", step.label, score, bops,
                  " (cached)" if cached else "")
        self.offer(step, build, None if shared else made)
        return step

    def score_of(self, sim: QuantizationSimModel, what: str) -> float:
        """A configuration's score: its QDQ export's in onnxruntime's fused kernels, the sim's own, or (``"both"``)
        the lower of the two."""
        if self.score_on == "sim":
            return self.call(sim.session, what)
        exported = self.call(sim.fused_session(), what)
        return exported if self.score_on == "export" else min(exported, self.call(sim.session, what + " (sim)"))

    def offer(self, step: AutoQuantStep, build: Callable[[], QuantizationSimModel],
              sim: QuantizationSimModel | None) -> None:
        """Keep ``step`` if it is the cheapest meeting the target (or, while none does, the best scoring)."""
        if self.best is None:
            self.best = (step, build, sim)
            return
        held = self.best[0]
        better = (step.met and (not held.met or step.relative_bops < held.relative_bops
                                or step.relative_bops == held.relative_bops and step.score > held.score)) \
            or (not step.met and not held.met and step.score > held.score)
        if better:
            self.best = (step, build, sim)

    # costs --------------------------------------------------------------------------------------------------
    def relative_bops(self, sim: QuantizationSimModel) -> float:
        return simulated_bit_operations(sim, layer_costs(sim, self.sample)) / self.full_bops

    def prepare_costs(self) -> None:
        self.sample = self.batches()[0]
        probe = self.sim(self.ladder[0], "min_max")
        space = AmpSpace.build(probe, self.ladder, self.sample)
        uniform = {p.name: space.bops(space.uniform(i)) for i, p in enumerate(self.ladder)}
        self.full_bops = max(uniform.values()) or 1.0
        self.ladder = sorted(self.ladder, key=lambda p: uniform[p.name])  # cheapest first

    # mixes ----------------------------------------------------------------------------------------------------
    def mix(self, precisions: list[Precision], scheme: str, model: onnx.ModelProto | None) -> None:
        names = [p.name for p in precisions]
        sim = self.sim(precisions[0], scheme, model)
        space = AmpSpace.build(sim, precisions, self.sample)
        configs = small_space(space, EXHAUSTIVE_LIMIT)
        settings = {"candidates": "/".join(names), "scheme": scheme, "cle": model is not None}
        if configs is not None:
            self.exhaustive(space, configs, settings)
        else:
            self.amp(sim, names, settings, model)

    def exhaustive(self, space: AmpSpace, configs: list[Config], settings: dict) -> None:
        """Each configuration, cheapest first, calibrated for itself and scored, until one meets the target."""
        for config in configs:
            def build(config: Config = config) -> QuantizationSimModel:
                space.calibrated(config, self.batches(), self.passed)
                return space.sim
            step = self.score("exhaustive", {**settings, "config": "/".join(space.describe(config))}, build,
                              shared=True)
            if step.met:
                return

    def passed(self) -> None:
        self.counts["calibration_passes"] += 1

    def amp(self, sim: QuantizationSimModel, names: list[str], settings: dict, model: onnx.ModelProto | None) -> None:
        self.check_time()
        folder = None if self.results is None else self.results / "amp"
        evaluate: Callable = self.evaluate
        phase1: Callable = evaluate
        if self.phase1 == "proxy":  # the first calibration batch, float outputs computed once
            phase1 = OutputSQNR(model if model is not None else self.model, self.batches()[:1])
        if self.time_budget is not None:  # stop inside AMP too (its scores so far stay in results_dir's cache)
            deadline = time.time() + self.time_budget - (time.perf_counter() - self.start)
            evaluate = _Timed(evaluate, deadline)
            phase1 = evaluate if self.phase1 == "callback" else _Timed(phase1, deadline)
        try:
            with tempfile.TemporaryDirectory() as scratch:
                phase2 = evaluate if self.score_on == "sim" else OnExport(evaluate, sim, self.score_on)
                known = {"float": self.reference, **{n: v for n, v in self.known.items() if n in names}}
                result = choose_mixed_precision(sim, names, phase1, phase2, self.drop,
                                                folder or scratch, self.clean_start, self.batches(),
                                                executor=self.executor, progress=self.show, known_scores=known)
        except TargetError as error:  # a flip the target refuses
            self.notes.append(f"AMP stopped: {str(error).splitlines()[0]}")
            return
        proxy = self.phase1 == "proxy"
        per_point = 2 if self.score_on == "both" else 1
        self.counts["callback_evaluations"] += per_point * result.phase2_evaluations + (
            0 if proxy else result.phase1_evaluations)
        self.counts["proxy_evaluations"] += result.phase1_evaluations if proxy else 0
        self.counts["calibration_passes"] += result.calibration_passes
        self.notes.append(f"AMP ({'/'.join(names)}): {result.phase1_evaluations} phase-1 "
                          f"{'proxy (output SQNR)' if proxy else 'callback'} evaluations, "
                          f"{result.phase2_evaluations} phase-2 callback evaluations "
                          f"({result.refinement_trials} refinement trials), {result.calibration_passes} calibration "
                          f"passes, {result.cached_scores} cached scores")
        step = AutoQuantStep("amp", settings, result.score, self.relative_bops(sim), result.wall_time_s,
                             result.score >= self.target)
        self.steps.append(step)
        self.offer(step, lambda: sim, sim)


def auto_quantize(model: onnx.ModelProto | str | Path, calibration_data: Sequence[Mapping[str, np.ndarray]] | Callable,
                  eval_callback: Callable[[Any], float], allowed_accuracy_drop: float, *,
                  results_dir: str | Path | None = None, candidates: Sequence[Any] | None = None,
                  target: str | Path | None = None, executor: Executor | None = None,
                  time_budget: float | None = None, quant_schemes: Sequence[str] = ("tf_enhanced", "percentile"),
                  adaround_iterations: int = 1000, seq_mse_candidates: int = 20, clean_start: bool = True,
                  progress: bool | None = None, phase1: str = "proxy", score_on: str = "export",
                  **sim_kwargs: Any) -> AutoQuantResult:
    """The cheapest configuration whose score is at least ``eval_callback(float model) - allowed_accuracy_drop``
    (module docstring for the search).

    ``calibration_data``: feed dicts, or a callable returning an iterable of them (called once per pass).
    ``eval_callback(session) -> float``, higher is better (AMP's convention). ``candidates``: presets or
    AIMET candidates (default `DEFAULT_LADDER`); ``target``: a target profile (`quantsim.load_target`: a shipped
    name such as "generic-npu", a profile file, or an AIMET config with ``supported_kernels``): only candidates
    it allows on every weighted op type are tried, every sim is built with it (so each precision decision stays
    legal), and configurations it refuses are skipped and named in the message.
    ``phase1``: what scores AMP's phase 1 (`PHASE1_MODES`): ``"proxy"`` (default), the SQNR of the sim's
    outputs against the float model's on the first calibration batch (`auto_quant_proxy.OutputSQNR`), or
    ``"callback"``, ``eval_callback`` (the old behaviour, one full evaluation per quantizer group and
    candidate); phase 2, which judges the budget, always uses ``eval_callback``.
    ``executor`` runs AMP's phase 1 elsewhere (any ``concurrent.futures.Executor``, Dask's included);
    ``time_budget`` (seconds) stops the search once it is spent: between steps, and inside the AMP stage
    before its next evaluation. ``score_on``: ``"export"`` (default) scores each configuration on its QDQ
    export in onnxruntime's fused integer kernels, what deploys; ``"sim"`` on the sim's session; ``"both"`` on
    the lower of the two (module docstring). ``results_dir`` gets
    the score cache (resumed with ``clean_start=False``) and the report (`write_auto_quant_report`). Other
    keyword arguments go to every `QuantizationSimModel` (``config_file``, ``providers``, ...).
    Returns an `AutoQuantResult` whose ``sim`` is calibrated in the chosen configuration.
    """
    if not isinstance(allowed_accuracy_drop, (int, float)) or not allowed_accuracy_drop >= 0:
        raise InvalidArgumentError(f"allowed_accuracy_drop must be a number >= 0, got {allowed_accuracy_drop!r}")
    if time_budget is not None and not time_budget > 0:
        raise InvalidArgumentError(f"time_budget must be a number of seconds > 0, got {time_budget!r}")
    if not callable(eval_callback):
        raise InvalidArgumentError("eval_callback must be a callable taking an onnxruntime session")
    if not isinstance(phase1, str) or phase1 not in PHASE1_MODES:
        raise InvalidArgumentError(f"auto_quantize: phase1 must be one of {', '.join(map(repr, PHASE1_MODES))}, "
                                   f"got {phase1!r}")
    if score_on not in SCORE_MODES:
        raise InvalidArgumentError(f"score_on must be one of {', '.join(map(repr, SCORE_MODES))}, got {score_on!r}")
    source = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
    if not isinstance(source, onnx.ModelProto):
        raise InvalidArgumentError(f"model must be an onnx.ModelProto or a path, got {type(model).__name__}")
    ladder = [candidate(c) for c in (candidates or DEFAULT_LADDER)]
    if target is not None:
        profile = load_target(target)
        ladder = legal_candidates(ladder, profile, source)
        sim_kwargs["target"] = profile
    if not ladder:
        raise InvalidArgumentError("auto_quantize: no candidate left (check candidates= and the target's kernels)")
    show = True if progress is None else bool(progress)
    for switch in ("fold_batchnorm", "range_health", "depthwise_supergroups"):  # this project's defaults, unannounced
        sim_kwargs.setdefault(switch, True)
    search = _Search(source, calibration_batches(calibration_data), eval_callback, float(allowed_accuracy_drop), ladder,
                     None if results_dir is None else Path(results_dir), clean_start, executor, time_budget, show,
                     sim_kwargs, phase1, score_on)
    try:
        _run(search, quant_schemes, adaround_iterations, seq_mse_candidates)
    except _Budget:
        search.notes.append(f"time budget of {time_budget:g} s spent: the search stopped early")
    return _finish(search, results_dir)


def _run(search: _Search, schemes: Sequence[str], iterations: int, seq_mse: int) -> None:
    search.prepare_costs()
    ladder = search.ladder
    base = next((p for p in ladder if p.param_type.bits >= 8 and not p.param_type.is_float
                 and p.activation_type.bits >= 8), ladder[0])
    bar = tqdm(total=5, desc="auto_quantize", disable=not search.show, leave=False)
    step = search.score("defaults", {"precision": base.name, "scheme": "min_max"},
                        partial(_calibrated, search, base, "min_max", None))
    best_scheme, best_score, model = "min_max", step.score, None
    bar.update()
    if not step.met:
        for scheme in schemes:
            step = search.score("scheme", {"precision": base.name, "scheme": scheme},
                                partial(_calibrated, search, base, scheme, None))
            if step.score > best_score:
                best_scheme, best_score = scheme, step.score
            if step.met:
                break
    bar.update()
    if not any(s.met for s in search.steps):
        copied, why = equalized(search.model, search.batches()[0])
        if copied is None:
            search.notes.append(why)
        else:
            step = search.score("cle", {"precision": base.name, "scheme": best_scheme},
                                partial(_calibrated, search, base, best_scheme, copied))
            if step.score > best_score:
                best_score, model = step.score, copied
    bar.update()
    cheaper = ladder[:ladder.index(base)]
    if any(s.met for s in search.steps):
        for low in cheaper:  # cheapest first
            step = search.score("seq_mse+adaround", {"precision": low.name, "scheme": best_scheme, "cle": model is not None,
                                                     "iterations": iterations},
                                partial(_rounded, search, low, best_scheme, model, seq_mse, iterations))
            if step.met:
                break
        bar.update()
        if cheaper and not any(s.met and s.stage == "seq_mse+adaround" for s in search.steps):
            search.mix(cheaper + [base], best_scheme, model)
    else:
        bar.update()
        if math.isfinite(best_score):  # the base everywhere, with the scheme and model the mix uses
            search.known[base.name] = best_score
        costlier = _uniform_costlier(search, ladder[ladder.index(base):], best_scheme, model)
        if len(costlier) > 1:
            search.mix(costlier, best_scheme, model)
    bar.update()
    bar.close()


def _uniform_costlier(search: _Search, costlier: list[Precision], scheme: str,
                      model: onnx.ModelProto | None) -> list[Precision]:
    """Each costlier candidate everywhere, cheapest first, up to the first meeting the target; the candidates
    a mix then needs (the base and those up to that one), or none when no candidate meets the target even
    everywhere (a note says so: the search stops there, without a mix). Each is configured as AMP configures
    a candidate everywhere (one sim at the base precision, `AmpSpace.uniform`), so AMP takes these scores
    (``search.known``) instead of evaluating them again."""
    space: list[AmpSpace] = []

    def build(k: int) -> QuantizationSimModel:
        if not space:
            space.append(AmpSpace.build(search.sim(costlier[0], scheme, model), costlier, search.sample))
        space[0].calibrated(space[0].uniform(k), search.batches(), search.passed)
        return space[0].sim

    for k, precision in enumerate(costlier[1:], start=1):
        step = search.score("uniform", {"precision": precision.name, "scheme": scheme, "cle": model is not None},
                            partial(build, k), shared=True)
        if math.isfinite(step.score):
            search.known[precision.name] = step.score
        if step.met:
            base = min((s for s in search.steps if s.stage in ("defaults", "scheme", "cle")),
                       key=lambda s: s.relative_bops)
            if step.relative_bops <= base.relative_bops:  # as cheap as the base as the sim runs it: no mix is cheaper
                search.notes.append(f"{precision.name} everywhere costs what {base.settings['precision']} does "
                                    "(relative BOPs as the sim runs them): no mix was searched")
                return []
            return costlier[:k + 1]
    if len(costlier) > 1:
        tried = [s for s in search.steps if s.stage == "uniform"]
        scores = ", ".join(f"{s.settings['precision']} {s.score:.6g}" for s in tried)
        search.notes.append(f"no candidate meets the target even everywhere ({scores}): no mix was searched")
    return []


def _calibrated(search: _Search, precision: Precision, scheme: str, model: onnx.ModelProto | None):
    sim = search.sim(precision, scheme, model)
    search.calibrate(sim)
    return sim


def _rounded(search: _Search, precision: Precision, scheme: str, model, candidates: int, iterations: int):
    sim = _calibrated(search, precision, scheme, model)
    if candidates:
        apply_seq_mse(sim, search.batches(), num_candidates=candidates, progress=False)
    if iterations:
        apply_adaround(sim, search.batches(), num_iterations=iterations, progress=False)
    search.calibrate(sim)
    return sim


def _missing_costlier(search: _Search) -> str:
    """"costlier candidates (...) or " naming the usual ones the ladder lacks ("" when it has them all)."""
    missing = [name for name in ("W8A16", "W16A16", "FP16") if name not in {p.name for p in search.ladder}]
    return f"costlier candidates ({', '.join(missing)}) or " if missing else ""


def _finish(search: _Search, results_dir: str | Path | None) -> AutoQuantResult:
    if search.best is None:
        raise InvalidArgumentError("auto_quantize: the time budget ran out before any configuration was scored")
    step, build, sim = search.best
    if sim is None:
        sim = build()  # its score came from the cache
    met = step.score >= search.target
    if met:
        message = (f"chosen: {step.label} (score {step.score:.6g} >= target {search.target:.6g}, relative BOPs "
                   f"{step.relative_bops:.4f})")
    else:
        best = max(search.steps, key=lambda s: s.score)
        message = (f"budget not met: the best configuration tried, {best.label}, scores {best.score:.6g} < target "
                   f"{search.target:.6g}; it would need an allowed drop of at least "
                   f"{search.reference - best.score:.6g}, or {_missing_costlier(search)}more calibration data")
    deployed, own = check_final(search, sim, met)
    counts = search.counts
    search.notes.append(f"spent {counts['callback_evaluations']} callback evaluations, "
                        f"{counts['proxy_evaluations']} phase-1 proxy evaluations and {counts['calibration_passes']} "
                        "calibration passes (besides Sequential MSE / AdaRound)")
    message = "; ".join([message, *search.notes])
    if not met:
        warnings.warn(f"auto_quantize: {message}", RuntimeWarning, stacklevel=3)
    enabled = [q for q in sim.quantizers if q.enabled and q.param_type != "bias"]
    share = sum(q.precision().bits > 8 for q in enabled) / max(len(enabled), 1)
    result = AutoQuantResult(sim, step.score, step.relative_bops, search.reference, search.target, search.drop, met,
                             step, search.steps, message, time.perf_counter() - search.start, share, deployed,
                             dict(counts), own)
    if results_dir is not None:
        write_auto_quant_report(result, results_dir)
    return result
