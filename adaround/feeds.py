"""Calibration batches as feed dicts, in every form AIMET's AdaRound and Sequential MSE accept.

AIMET (``aimet_onnx.utils.create_input_dict``) takes each batch as a dict ``{input name: array}``, a
single array (a one-input model), or a list / tuple of arrays in the order of the model's inputs; any
other count is an error. The same here, with the batch's number and the model's inputs in the message.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from quantsim import InvalidArgumentError, InvalidTypeError, QuantizationSimModel

__all__ = ["model_inputs", "as_feed", "as_feeds"]


def model_inputs(sim: QuantizationSimModel) -> list[str]:
    """The names of the sim's model inputs, in graph order (initializers listed as inputs left out)."""
    constants = {t.name for t in sim.model.graph.initializer}
    return [i.name for i in sim.model.graph.input if i.name not in constants]


def as_feed(batch: Any, input_names: list[str], where: str) -> Mapping[str, np.ndarray]:
    """One batch as a feed dict (see the module docstring); ``where`` names the batch in errors."""
    if isinstance(batch, Mapping):
        return batch
    if isinstance(batch, np.ndarray):
        arrays: list[Any] = [batch]
    elif isinstance(batch, (list, tuple)):
        arrays = list(batch)
    else:
        raise InvalidTypeError(f"{where}: expected a dict of input name -> array, an array or a list/tuple of arrays, "
                               f"got {type(batch).__name__}")
    if len(arrays) != len(input_names):
        raise InvalidArgumentError(
            f"{where}: {len(arrays)} array(s) for the model's {len(input_names)} input(s) {input_names} (a list or "
            "tuple holds one array per model input, in order, as in AIMET; leave labels out or pass a dict)")
    return dict(zip(input_names, arrays))


def as_feeds(batches: Iterable[Any], input_names: list[str], where: str,
             limit: int | None = None) -> list[Mapping[str, np.ndarray]]:
    """The first ``limit`` batches (all for None) as feed dicts; none at all is an error."""
    if isinstance(batches, (Mapping, np.ndarray)):
        raise InvalidTypeError(f"{where}: expected a collection of batches, got a single "
                               f"{type(batches).__name__} (wrap it in a list)")
    chosen = batches if limit is None else itertools.islice(batches, limit)
    feeds = [as_feed(batch, input_names, f"{where}: batch {number}") for number, batch in enumerate(chosen)]
    if not feeds:
        raise InvalidArgumentError(f"{where}: needs at least one calibration batch (the inputs are empty)")
    return feeds
