"""Weighted layers grouped into levels of independent problems, for `apply_seq_mse`'s ``executor=``.

A layer's input depends on the weights of the layers upstream of it. Level 0 holds the layers whose input
depends on no chosen layer, level ``n`` those whose input depends on some layer of level ``n - 1`` and none of
a later level: once every earlier level is done, the inputs of a level's layers are final, and the layers
are independent problems that may run in any order or at once, with the results of the sequential run.
"""
from __future__ import annotations

from collections.abc import Sequence

from quantsim import QuantizationSimModel, WeightedLayer

__all__ = ["independent_levels"]


def independent_levels(sim: QuantizationSimModel, layers: Sequence[WeightedLayer]) -> list[list[WeightedLayer]]:
    """``layers`` (in topological order) grouped into levels, each in the order given (module docstring)."""
    bit = {layer.node: 1 << i for i, layer in enumerate(layers)}
    upstream: dict[str, int] = {}  # tensor -> bit mask of the chosen layers it depends on
    for node in sim.model.graph.node:  # ONNX graphs list nodes in topological order
        mask = 0
        for name in node.input:
            mask |= upstream.get(name, 0)
        mask |= bit.get(node.name, 0)
        for name in node.output:
            upstream[name] = mask
    level: dict[str, int] = {}
    for layer in layers:
        mask = upstream.get(layer.input, 0)
        level[layer.node] = 1 + max((level[other.node] for other in layers if mask & bit[other.node]
                                     and other.node in level), default=-1)
    grouped: list[list[WeightedLayer]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for layer in layers:
        grouped[level[layer.node]].append(layer)
    return grouped
