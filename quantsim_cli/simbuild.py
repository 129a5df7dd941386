"""A `QuantizationSimModel` from the command line's quantization options, and the precision overrides."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from quantsim import InvalidArgumentError, QuantizationSimModel

__all__ = ["config_from_args", "sim_from_args", "load_overrides_from_args", "apply_overrides", "show_progress"]

_log = logging.getLogger(__name__)
_CONFIG_ALIASES = ("default", "per_channel", "per_tensor")


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars only on a terminal and never with ``--quiet``."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def config_from_args(args: argparse.Namespace) -> str | None:
    """``--config FILE`` / alias, ``--per-channel`` / ``--per-tensor``, or None (the per-channel default)."""
    config = getattr(args, "config", None)
    if config is None:
        return getattr(args, "granularity", None)
    if config not in _CONFIG_ALIASES and not Path(config).is_file():
        raise InvalidArgumentError(f"--config {config}: no such file (or use one of {', '.join(_CONFIG_ALIASES)})")
    return config


def sim_from_args(args: argparse.Namespace, model: str) -> QuantizationSimModel:
    """The sim of ``model`` with ``--param-type``, ``--activation-type``, ``--quant-scheme``, ``--percentile``,
    the config options, ``--keep-batchnorm`` and ``--providers`` (not calibrated yet)."""
    config = config_from_args(args)
    _log.info("preparing %s (param %s, activation %s, scheme %s, config %s)", model, args.param_type,
              args.activation_type, args.quant_scheme, config or "default")
    return QuantizationSimModel(model, param_type=args.param_type, activation_type=args.activation_type,
                                quant_scheme=args.quant_scheme, config_file=config, percentile=args.percentile,
                                progress=show_progress(args), fold_batchnorm=not args.keep_batchnorm,
                                range_health=True, depthwise_supergroups=True, providers=args.providers,
                                target=getattr(args, "target_profile", None))


def load_overrides_from_args(args: argparse.Namespace) -> Any | None:
    """The parsed ``--overrides`` file (read before any slow step, so a bad file fails fast), or None."""
    if not getattr(args, "overrides", None):
        return None
    from mixed_precision import load_overrides

    if not Path(args.overrides).is_file():
        raise InvalidArgumentError(f"--overrides {args.overrides}: no such file")
    return load_overrides(args.overrides)


def apply_overrides(sim: QuantizationSimModel, overrides: Any, source: str) -> list[tuple[str, str, str]]:
    """Apply parsed overrides; errors name the overrides file. Returns ``(node, preset, rule)`` per node chosen."""
    from mixed_precision import apply_precision_overrides

    try:
        return apply_precision_overrides(sim, overrides)
    except ValueError as error:
        raise InvalidArgumentError(f"--overrides {source}: {error}") from None
