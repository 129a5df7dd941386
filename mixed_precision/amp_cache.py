"""AMP's resumable cache of scores: ``<results_dir>/.cache/amp_scores.json``.

Every score AMP computes before its search (the float score, each candidate applied everywhere, each
quantizer group at each candidate) is written as soon as it is known, so an interrupted run resumed with
``clean_start=False`` only computes what is missing. The file holds a key: a SHA-256 over the prepared
model (`quantsim.prepare.hash_model`: its skeleton, then each weight's bytes one at a time; never the whole
model serialised, which would copy every weight and fails over 2 GiB), the quantizer table (names, roles,
specs, enabled, frozen), the candidates, the quantizer groups and the eval callbacks' names. A cache
written for anything else is not reused: it is reported with a warning and replaced. The eval data behind
a callback is not part of the key; start clean after changing it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import warnings
from pathlib import Path
from typing import Any

from mixed_precision.files import write_text_atomic
from quantsim import QuantizationSimModel, QuantizerGroup
from quantsim.prepare import hash_model

__all__ = ["ScoreCache", "cache_key", "CACHE_FILE"]

_log = logging.getLogger(__name__)

CACHE_FILE = Path(".cache") / "amp_scores.json"


def _callable_name(fn: Any) -> str:
    inner = getattr(fn, "func", fn)  # functools.partial, CallbackFunc
    return f"{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def cache_key(sim: QuantizationSimModel, candidates: list[str], groups: list[QuantizerGroup],
              callbacks: tuple[Any, ...]) -> str:
    """What the cached scores depend on (module docstring), as a hex digest."""
    digest = hashlib.sha256()
    hash_model(digest, sim.model.model)
    for q in sim.quantizers:
        digest.update(repr((q.name, q.role, q.spec, q.enabled, q.is_encoding_frozen())).encode())
    digest.update(repr(candidates).encode())
    digest.update(repr([(g.parameter_quantizers, g.activation_quantizers) for g in groups]).encode())
    digest.update(repr([_callable_name(fn) for fn in callbacks]).encode())
    return digest.hexdigest()


class ScoreCache:
    """Scores by name, persisted in ``results_dir`` after every `put` (atomically: `write_text_atomic`)."""

    def __init__(self, results_dir: Path, key: str, *, clean_start: bool):
        self.path = results_dir / CACHE_FILE
        self.key = key
        self.scores: dict[str, float] = {}
        self.hits = 0
        if clean_start or not self.path.exists():
            return
        try:
            stored = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            warnings.warn(f"AMP cache {self.path} is unreadable ({error}); starting clean", RuntimeWarning,
                          stacklevel=3)
            return
        if not isinstance(stored, dict) or stored.get("key") != key:
            warnings.warn(f"AMP cache {self.path} was written for another sim, candidate list or callbacks; "
                          "it is not reused (starting clean)", RuntimeWarning, stacklevel=3)
            return
        self.scores = {str(k): float(v) for k, v in stored.get("scores", {}).items()}
        _log.info("AMP: resuming with %d cached scores from %s", len(self.scores), self.path)

    def get(self, name: str) -> float | None:
        """The cached score, counting the hit; None when missing."""
        value = self.scores.get(name)
        if value is not None:
            self.hits += 1
        return value

    def put(self, name: str, score: float) -> None:
        self.scores[name] = float(score)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps({"key": self.key, "scores": self.scores}, indent=1))
