"""``quantsim quantize MODEL --data PATH --out DIR --max-drop 0.01 --eval module:function``.

With ``--max-drop`` the sim is not built from ``--param-type``/``--activation-type``/``--quant-scheme``: the
search (`mixed_precision.auto_quantize`) chooses the configuration, scoring each with the ``--eval`` function
(``function(session) -> float``, higher is better) against the float model's score. Its score cache and
report (``auto_quantize.md``, ``.json``, ``.html``) go to ``--out``; ``--resume`` reuses the scores of an
interrupted search there. ``--seq-mse`` / ``--adaround``, when given, set the search's Sequential MSE
candidates and AdaRound iterations; the options that would set a precision or scheme the search chooses are
refused with ``--max-drop``, and ``--eval``, ``--candidates``, ``--time-budget``, ``--resume``, ``--phase1``,
``--score-on`` without it.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from quantsim import InvalidArgumentError
from quantsim_cli.data import load_function
from quantsim_cli.simbuild import config_from_args, show_progress

__all__ = ["check_budget_options", "run_search", "SEARCH_FILES"]

_log = logging.getLogger(__name__)

SEARCH_FILES = ("auto_quantize.md", "auto_quantize.json", "auto_quantize.html")
_BUDGET_ONLY = ("eval", "candidates", "time_budget", "resume", "phase1", "score_on")
_CHOSEN_BY_SEARCH = {"param_type": "int8", "activation_type": "int8", "quant_scheme": "min_max", "overrides": None}


def check_budget_options(args: argparse.Namespace) -> None:
    """Refuse option combinations the search cannot honour (before any slow step)."""
    if getattr(args, "max_drop", None) is None:
        given = [f"--{name.replace('_', '-')}" for name in _BUDGET_ONLY if getattr(args, name, None)]
        if given:
            raise InvalidArgumentError(f"{', '.join(given)}: only with --max-drop (the accuracy-budget search)")
        return
    if not args.eval:
        raise InvalidArgumentError("--max-drop needs --eval module:function (function(session) -> float, higher is "
                                   "better) to score each configuration")
    changed = [f"--{name.replace('_', '-')}" for name, default in _CHOSEN_BY_SEARCH.items()
               if getattr(args, name, default) != default]
    if changed:
        raise InvalidArgumentError(f"{', '.join(changed)}: with --max-drop the search chooses precisions and the "
                                   "calibration scheme (use --candidates to restrict the precisions)")


def run_search(args: argparse.Namespace, data: Any, out: Path) -> tuple[Any, str]:
    """Run `mixed_precision.auto_quantize`; ``(its result, the report section in Markdown)``."""
    from mixed_precision import auto_quantize

    evaluate = cast(Callable[[Any], float], load_function(args.eval, "--eval"))  # its scores are checked there
    options: dict[str, Any] = {"results_dir": out, "clean_start": not args.resume, "progress": show_progress(args),
                               "fold_batchnorm": not args.keep_batchnorm, "providers": args.providers}
    if args.candidates:
        options["candidates"] = args.candidates
    if args.time_budget:
        options["time_budget"] = args.time_budget
    if args.phase1:
        options["phase1"] = args.phase1
    if args.score_on:
        options["score_on"] = args.score_on
    if args.seq_mse:
        options["seq_mse_candidates"] = args.seq_mse
    if args.adaround:
        options["adaround_iterations"] = args.adaround
    config = config_from_args(args)
    if config:
        options["config_file"] = config
    out.mkdir(parents=True, exist_ok=True)
    result = auto_quantize(args.model, data, evaluate, args.max_drop, **options)
    _log.info("auto_quantize: %s", result.message)
    section = result.summary().replace("# auto_quantize", "## Accuracy budget search (auto_quantize)", 1)
    section += f"\nThe search's Pareto chart: [{SEARCH_FILES[2]}]({SEARCH_FILES[2]}).\n"
    return result, section


def search_settings(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The report's settings rows for a search."""
    return [("accuracy budget", f"--max-drop {args.max_drop:g} on {args.eval}"),
            ("candidates", ", ".join(args.candidates) if args.candidates else "W4A8, W8A8, W8A16, W16A16, FP16"),
            ("time budget", f"{args.time_budget:g} s" if args.time_budget else "none"),
            ("phase-1 ranking", args.phase1 or "proxy"), ("scored on", args.score_on or "export")]
