"""AIMET's ``analyze_per_layer_sensitivity`` and the node-to-quantizers mapping it and
``flip_layers_to_higher_precision`` share.

A node's quantizers, as aimet-onnx 2.42 attributes them (``QuantizationSimModel.get_op_quantizers``):

* inputs: the quantizers of the tensors it reads that no node produces and that are not parameters (model
  inputs, constant activations such as Clip bounds): a tensor another node produces belongs to that node;
* outputs: the quantizers of the tensors it writes (a quantizer tied across tensors, as Concat ties its
  inputs to its output, belongs to every node writing one of them);
* parameters: the quantizers of its weights and biases.

Only enabled quantizers count. A Conv whose output grid placement moved after the Relu that follows it
(Conv -> Relu share one output quantizer) owns its weights and model inputs; the grid belongs to the Relu,
which is scored (and flipped) on its own, as in AIMET.

`analyze_per_layer_sensitivity`: with every attributed quantizer disabled, each node in turn has its own
enabled and the user's callback scores the sim; ``{node name: score}`` in graph order, nodes without
quantizers left out. The sim ends exactly as it began (``sim.temporary_state()``, also when the callback
raises).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from mixed_precision.amp_executor import checked_score
from mixed_precision.html_page import write_layer_sensitivity_html
from quantsim import InvalidArgumentError, QcQuantizeOp, QuantizationSimModel

__all__ = ["NodeQuantizers", "node_quantizers", "analyze_per_layer_sensitivity"]


@dataclass(frozen=True)
class NodeQuantizers:
    """The enabled quantizers one node owns (module docstring)."""

    inputs: tuple[QcQuantizeOp, ...]
    outputs: tuple[QcQuantizeOp, ...]
    params: tuple[QcQuantizeOp, ...]

    @property
    def all(self) -> tuple[QcQuantizeOp, ...]:
        """Each quantizer once (a tied one may be both an input and an output)."""
        return tuple({id(q): q for q in (*self.inputs, *self.outputs, *self.params)}.values())


def node_quantizers(sim: QuantizationSimModel) -> dict[str, NodeQuantizers]:
    """Every node of the prepared model, in graph order, with the enabled quantizers it owns."""
    nodes = list(sim.model.graph.node)
    produced = {t for node in nodes for t in node.output if t}
    table = sim.qc_quantize_op_dict

    def enabled(names, keep: Callable[[QcQuantizeOp], bool]) -> tuple[QcQuantizeOp, ...]:
        found = {id(q): q for t in names if t and (q := table.get(t)) is not None and q.enabled and keep(q)}
        return tuple(found.values())

    return {node.name: NodeQuantizers(
        enabled([t for t in node.input if t not in produced], lambda q: q.role != "param"),
        enabled(node.output, lambda q: True),
        enabled(node.input, lambda q: q.role == "param")) for node in nodes}


def analyze_per_layer_sensitivity(sim: QuantizationSimModel, eval_fn: Callable[[Any], float],
                                  filename: str | os.PathLike | None = None) -> dict[str, float]:
    """``{node name: eval_fn(session) with only that node's quantizers enabled}`` (module docstring), as
    aimet-onnx's ``analyze_per_layer_sensitivity``; higher is better. The sim must be calibrated; it is left
    exactly as it was. ``filename``: also write the scores as an HTML page (bar chart, lowest first) there."""
    if not callable(eval_fn):
        raise InvalidArgumentError(f"eval_fn must be callable (session -> score), got {type(eval_fn).__name__}")
    owned = {name: found.all for name, found in node_quantizers(sim).items() if found.all}
    scores: dict[str, float] = {}
    with sim.temporary_state():
        for quantizers in owned.values():
            for q in quantizers:
                q.enabled = False
        for name, quantizers in tqdm(owned.items(), desc="per-layer sensitivity", unit="node", leave=False,
                                     disable=None if sim.progress else True):
            for q in quantizers:
                q.enabled = True
            scores[name] = checked_score(eval_fn(sim.session), f"per-layer sensitivity of node {name!r}")
            for q in quantizers:
                q.enabled = False
    if filename is not None:
        write_layer_sensitivity_html(scores, filename)
    return scores
