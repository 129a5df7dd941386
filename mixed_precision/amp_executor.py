"""Phase-1 evaluations of AMP, here or on any `concurrent.futures.Executor` (threads, processes, a Dask
cluster through ``client.get_executor()``).

An evaluation is "this sim with these quantizers changed to these specs and encodings, scored by the user's
callback". Locally it runs on the user's sim inside ``sim.temporary_state()``. With an executor the work is
cut into ``chunks`` tasks; each task carries the sim pickled once (`QuantizationSimModel` pickles its
prepared model, quantizer table and settings; sessions are rebuilt where it lands), the list of changes and
the callback, unpickles its own private copy of the sim and returns the scores. The same quantizer state
builds the same graph, so a worker's score equals a local one. What crosses must pickle: the callback
with it (with processes, a module-level function or a ``functools.partial`` of one; Dask also takes
closures through cloudpickle). The sim's state before each evaluation is the pickled one.
"""
from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Executor, Future, as_completed
from typing import Any

from quantsim import Encoding, InvalidArgumentError, QSpec, QuantizationSimModel

__all__ = ["Changes", "evaluate_changes", "run_evaluations", "checked_score", "plain_score"]

Changes = Mapping[str, tuple[QSpec, Encoding | None, bool]]  # quantizer name -> (spec, encoding, enabled)


def checked_score(value: Any, what: str) -> float:
    """The callback's score as a finite float, or an error saying which evaluation returned what."""
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what}: the eval callback returned {value!r}, not a number") from None
    if not math.isfinite(score):
        raise InvalidArgumentError(f"{what}: the eval callback returned {score} (scores must be finite)")
    return score


def plain_score(value: Any, what: str) -> float:
    """The callback's score as a float, infinite ones included (an SQNR of exact outputs is ``inf``)."""
    return float(value)


def evaluate_changes(sim: QuantizationSimModel, eval_fn: Callable[[Any], Any], changes: Changes, what: str,
                     convert: Callable[[Any, str], float] = checked_score) -> float:
    """Score of ``sim`` with ``changes`` applied (``convert``: the callback's value to a float, or an error);
    the sim is restored exactly afterwards (also on errors)."""
    by_name = {q.name: q for q in sim.quantizers}
    with sim.temporary_state():
        for name, (spec, encoding, enabled) in changes.items():
            q = by_name[name]
            if not q.is_encoding_frozen():  # a frozen quantizer keeps its spec and encoding (the ones sent)
                q.set_qspec(spec)
                q.set_encoding(encoding)
            q.enabled = enabled
        return convert(eval_fn(sim.session), what)


def _evaluate_chunk(payload: bytes, items: list[tuple[Hashable, Changes, str]], eval_fn: Callable[[Any], Any],
                    convert: Callable[[Any, str], float] = checked_score) -> list[tuple[Hashable, float]]:
    """A task: unpickle a private copy of the sim, score every item on it."""
    sim = pickle.loads(payload)  # noqa: S301 - bytes pickled by run_evaluations from the caller's own sim
    return [(key, evaluate_changes(sim, eval_fn, changes, what, convert)) for key, changes, what in items]


def run_evaluations(sim: QuantizationSimModel, eval_fn: Callable[[Any], Any],
                    items: Sequence[tuple[Hashable, Changes, str]], on_done: Callable[[Hashable, float], None], *,
                    executor: Executor | None = None, chunks: int = 16,
                    convert: Callable[[Any, str], float] = checked_score) -> None:
    """Score every ``(key, changes, description)`` item, calling ``on_done(key, score)`` as each finishes (in
    this process, in completion order). Without an executor they run here, one by one, on ``sim``.
    ``convert``: the callback's value to a float (`checked_score`: finite numbers only; `plain_score`)."""
    if not items:
        return
    if executor is None:
        for key, changes, what in items:
            on_done(key, evaluate_changes(sim, eval_fn, changes, what, convert))
        return
    if chunks < 1:
        raise InvalidArgumentError(f"executor chunks must be at least 1, got {chunks}")
    payload = pickle.dumps(sim, protocol=pickle.HIGHEST_PROTOCOL)
    count = min(chunks, len(items))
    parts = [list(items[i::count]) for i in range(count)]
    futures: list[Future] = [executor.submit(_evaluate_chunk, payload, part, eval_fn, convert) for part in parts]
    try:
        for future in as_completed(futures):
            for key, score in future.result():
                on_done(key, score)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
