"""One layer's AdaRound as a self-contained problem: plain data in, the rounded weight out.

`apply_adaround` builds a `LayerProblem` per layer (the captured sim-side input, the float model's target,
the weight, its grid, bias, the following activation and BatchNormalization as plain values) and `solve`s
it, here or on any `concurrent.futures.Executor` (threads, processes, a Dask ``Client``): a problem
pickles (its batches as lists), and `solve` reads nothing else, so a worker computes what the caller's
process would, bit for bit. Every random draw of a layer (column samples, the windows of its steps) comes
from its own generator, seeded by the run's ``seed`` and the node's name (`layer_seed`): a layer's result
does not depend on which layers ran before it, or where.
"""
from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from adaround.activations import activation_for
from adaround.layer_data import ColumnSample, SecondMoments, column_sample, second_moments
from adaround.layer_rounding import OutputAffine, RoundingResult, WeightGrid, optimize_rounding
from adaround.linear_form import LinearForm
from adaround.params import AdaroundSettings

__all__ = ["ActivationSpec", "LayerProblem", "layer_seed", "solve"]


def layer_seed(seed: int, node: str) -> list[int]:
    """The entropy of one layer's generator: the run's seed and a stable hash of the node's name (CRC-32,
    the same in every process, unlike Python's ``hash``)."""
    return [int(seed), zlib.crc32(node.encode("utf-8"))]


@dataclass(frozen=True)
class ActivationSpec:
    """The activation after the layer as plain values (`adaround.activations.activation_for`'s arguments;
    the `Activation` itself holds closures, which do not pickle)."""

    op_type: str
    attributes: dict[str, Any]
    rows: int
    on_channels: bool


@dataclass(frozen=True)
class LayerProblem:
    """Everything `solve` reads for one layer. ``sim_batches``: ``{input tensor: array}`` per batch (the sim's
    input to the layer, earlier layers rounded); ``float_batches``: ``{target tensor: array}`` per batch (the
    float model's layer input for the moment modes, its activation output for ``"sampled"``)."""

    node: str
    mode: str  # "sampled", "moments" or "moments+sampled" (see `adaround.apply`)
    form: LinearForm
    weight: np.ndarray
    grid: WeightGrid
    bias: np.ndarray
    activation: ActivationSpec | None
    affine: tuple[np.ndarray, np.ndarray] | None  # a following BatchNormalization's (scale, shift)
    input_tensor: str
    target_tensor: str
    sim_batches: Iterable[Mapping[str, np.ndarray]]
    float_batches: Iterable[Mapping[str, np.ndarray]]
    num_batches: int
    settings: AdaroundSettings

    def materialized(self) -> LayerProblem:
        """The problem with its batches as lists holding only the two tensors it reads (iterators and the
        float cache's other tensors do not travel)."""
        return replace(self, sim_batches=[{self.input_tensor: b[self.input_tensor]} for b in self.sim_batches],
                       float_batches=[{self.target_tensor: b[self.target_tensor]} for b in self.float_batches])


def solve(problem: LayerProblem, on_step: Callable[[int], None] | None = None) -> tuple[RoundingResult, float]:
    """``(result, seconds)`` of one layer; ``on_step(i)`` after each iteration (progress only)."""
    start = time.perf_counter()
    p, settings = problem, problem.settings
    rng = np.random.default_rng(layer_seed(settings.seed, p.node))
    data: SecondMoments | ColumnSample
    if p.mode == "sampled":
        data = column_sample(p.form, iter(p.sim_batches), iter(p.float_batches), p.input_tensor, p.target_tensor,
                             num_batches=p.num_batches, memory_budget_bytes=settings.memory_budget_bytes, rng=rng)
    else:
        data = second_moments(p.form, iter(p.sim_batches), iter(p.float_batches), p.target_tensor,
                              sample_bytes=settings.memory_budget_bytes if p.mode == "moments+sampled" else 0,
                              num_batches=p.num_batches, rng=rng)
    spec = p.activation
    activation = None if spec is None else activation_for(spec.op_type, spec.attributes, spec.rows, spec.on_channels)
    affine = None if p.affine is None else OutputAffine(p.form, *p.affine)
    result = optimize_rounding(p.form, p.weight, p.grid, data, p.bias, activation, settings, rng, on_step=on_step,
                               output_affine=affine)
    return result, time.perf_counter() - start
