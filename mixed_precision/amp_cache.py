"""AMP's resumable cache of scores: ``<results_dir>/.cache/amp_scores.json``.

Every score AMP computes before its search (the float score, each candidate applied everywhere, each
quantizer group at each candidate) is written as soon as it is known, so an interrupted run resumed with
``clean_start=False`` only computes what is missing. The file holds a key: a SHA-256 over the prepared
model (`quantsim.prepare.hash_model`: its skeleton, then each weight's bytes one at a time; never the whole
model serialised, which would copy every weight and fails over 2 GiB), the quantizer table (names, roles,
specs, enabled, frozen), the candidates, the quantizer groups and the eval callbacks' names. A cache
written for anything else is not reused: it is reported with a warning and replaced. The eval data behind
a callback is not part of the key; start clean after changing it.

Next to each configuration's score the file keeps what the sim really simulated in it after calibration
(``"observed"``: bit operations and each controlled quantizer's type, `mixed_precision.amp_space.Observed`),
so a resumed run reports the same costs and precisions without calibrating again. A file that is not such
a cache (not JSON, a wrong structure, a score that is not a finite number) is refused with `AmpCacheError`
naming the file and the entry: resuming from it would compare against a meaningless target.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any

from mixed_precision.amp_space import Observed
from mixed_precision.files import write_text_atomic
from quantsim import ConfigError, QuantizationSimModel, QuantizerGroup
from quantsim.prepare import hash_model

__all__ = ["ScoreCache", "AmpCacheError", "cache_key", "CACHE_FILE"]

_log = logging.getLogger(__name__)

CACHE_FILE = Path(".cache") / "amp_scores.json"


def _callable_name(fn: Any) -> str:
    inner = getattr(fn, "func", fn)  # functools.partial, CallbackFunc
    return f"{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def cache_key(sim: QuantizationSimModel, candidates: list[str], groups: list[QuantizerGroup],
              callbacks: tuple[Any, ...], allowed: Any = None) -> str:
    """What the cached scores depend on (module docstring; ``allowed``: the candidates each group supports),
    as a hex digest."""
    digest = hashlib.sha256()
    hash_model(digest, sim.model.model)
    for q in sim.quantizers:
        digest.update(repr((q.name, q.role, q.spec, q.enabled, q.is_encoding_frozen())).encode())
    digest.update(repr(candidates).encode())
    digest.update(repr([(g.parameter_quantizers, g.activation_quantizers) for g in groups]).encode())
    digest.update(repr([_callable_name(fn) for fn in callbacks]).encode())
    if allowed is not None:
        digest.update(repr(allowed).encode())
    return digest.hexdigest()


class AmpCacheError(ConfigError):
    """An AMP score cache that cannot be resumed from (corrupt, or a score that is not a finite number)."""


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{value!r:.40} is not a finite number")
    return float(value)


class ScoreCache:
    """Scores by name, persisted in ``results_dir`` after every `put` (atomically: `write_text_atomic`)."""

    def __init__(self, results_dir: Path, key: str, *, clean_start: bool):
        self.path = results_dir / CACHE_FILE
        self.key = key
        self.scores: dict[str, float] = {}
        self.observed: dict[str, Observed] = {}
        self.hits = 0
        if clean_start or not self.path.exists():
            return
        try:
            stored = json.loads(self.path.read_text(encoding="utf-8"))
        except RecursionError:
            raise self._corrupt("JSON nested too deeply") from None
        except (OSError, ValueError) as error:
            raise self._corrupt(f"not readable JSON ({error})") from None
        if not isinstance(stored, dict):
            raise self._corrupt(f"expected a JSON object with 'key' and 'scores', got {type(stored).__name__}")
        if stored.get("key") != key:
            warnings.warn(f"AMP cache {self.path} was written for another sim, candidate list or callbacks; "
                          "it is not reused (starting clean)", RuntimeWarning, stacklevel=3)
            return
        scores, observed = stored.get("scores", {}), stored.get("observed", {})
        for what, value in (("scores", scores), ("observed", observed)):
            if not isinstance(value, dict):
                raise self._corrupt(f"'{what}' must be an object, got {type(value).__name__}")
        for name, value in scores.items():
            try:
                self.scores[str(name)] = _number(value)
            except ValueError as error:
                raise self._corrupt(f"score {name!r}: {error}") from None
        for name, value in observed.items():
            try:
                self.observed[str(name)] = Observed.from_json(value)
            except (ValueError, TypeError) as error:
                raise self._corrupt(f"observed {name!r}: {error}") from None
        _log.info("AMP: resuming with %d cached scores from %s", len(self.scores), self.path)

    def _corrupt(self, what: str) -> AmpCacheError:
        return AmpCacheError(f"AMP score cache {self.path} cannot be resumed from: {what}; delete it or pass "
                             "clean_start=True to compute every score again")

    def get(self, name: str) -> float | None:
        """The cached score, counting the hit; None when missing."""
        value = self.scores.get(name)
        if value is not None:
            self.hits += 1
        return value

    def get_observed(self, name: str) -> Observed | None:
        """What the sim simulated in configuration ``name`` (None when not recorded)."""
        return self.observed.get(name)

    def put(self, name: str, score: float | None, observed: Observed | None = None) -> None:
        """Record ``name``'s score (None: keep the cached one) and what the sim simulated for it; the file is
        rewritten atomically."""
        if score is not None:
            self.scores[name] = float(score)
        if observed is not None:
            self.observed[name] = observed
        self.path.parent.mkdir(parents=True, exist_ok=True)
        document = {"key": self.key, "scores": self.scores,
                    "observed": {n: o.to_json() for n, o in self.observed.items()}}
        write_text_atomic(self.path, json.dumps(document, indent=1))
