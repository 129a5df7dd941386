"""What a target can run, as far as the precision search needs it: the ``supported_kernels`` of an AIMET
quantsim-config file.

AIMET's configs list, under ``defaults`` (and per op type), the ``(activation, param)`` bitwidth/dtype pairs
the hardware has kernels for. `filter_candidates` keeps the candidates whose pair is in the defaults' list,
as aimet-onnx's ``choose_mixed_precision(use_all_amp_candidates=False)`` does.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from mixed_precision.presets import Precision
from quantsim import ConfigError, qtype

__all__ = ["supported_pairs", "filter_candidates"]


def _side(entry: object, where: str) -> tuple[int, str]:
    if not isinstance(entry, dict) or "bitwidth" not in entry:
        raise ConfigError(f"{where}: a kernel side needs a 'bitwidth' (and a 'dtype'), got {entry!r}")
    dtype = str(entry.get("dtype", "int")).lower()
    if dtype not in ("int", "float"):
        raise ConfigError(f"{where}: dtype must be 'int' or 'float', got {entry.get('dtype')!r}")
    return int(entry["bitwidth"]), dtype


def supported_pairs(config: str | Path) -> list[tuple[tuple[int, str], tuple[int, str]]] | None:
    """``[((param bits, dtype), (activation bits, dtype)), ...]`` of the config's default kernels, or None
    when the file lists none."""
    path = Path(config)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"target {path}: cannot read it as a quantsim-config JSON ({error})") from None
    kernels = (data.get("defaults") or {}).get("supported_kernels") if isinstance(data, dict) else None
    if kernels is None:
        return None
    if not isinstance(kernels, list):
        raise ConfigError(f"target {path}: defaults.supported_kernels must be a list, got {type(kernels).__name__}")
    return [(_side(k.get("param"), f"target {path}: kernel {i}"), _side(k.get("activation"), f"target {path}: kernel {i}"))
            for i, k in enumerate(kernels)]


def _pair(dtype: qtype) -> tuple[int, str]:
    return dtype.bits, "float" if dtype.is_float else "int"


def filter_candidates(candidates: list[Precision], config: str | Path) -> list[Precision]:
    """The candidates the target has a default kernel for (all of them, with a warning, when the config lists
    no kernels)."""
    pairs = supported_pairs(config)
    if pairs is None:
        warnings.warn(f"target {config}: the config lists no defaults.supported_kernels, so every candidate is "
                      "kept", UserWarning, stacklevel=3)
        return list(candidates)
    return [c for c in candidates if (_pair(c.param_type), _pair(c.activation_type)) in pairs]
