"""The state quantizers of LSTM / GRU / RNN nodes: one grid for the hidden state, one for the cell state.

A recurrent node's outputs ``Y`` (every step's hidden state) and ``Y_h`` (the last step's) hold the same
values, and its ``initial_h`` is the state a step-by-step decoder feeds back from ``Y_h`` (likewise
``initial_c`` and ``Y_c`` for an LSTM's cell state). With a grid each, the state fed back is requantized
between steps, and a model exported with integer inputs and outputs returns ``Y_h`` codes on one grid that
the next call reads on another: silently wrong values. aimet-onnx ties them ("always", whatever its tying
flag): ``Y``, ``Y_h`` and the closest quantized source of ``initial_h`` share one quantizer, and ``Y_c`` with
the source of ``initial_c``. The source is found by walking up through data movement (a Slice of a stacked
state input, a Squeeze, a Transpose), whatever else reads it.

aimet-onnx also ties the sequence input ``X`` to the hidden state (a constraint of some NPU kernels); here it
keeps its own grid: ``X`` is whatever feeds the layer (an embedding's rows, a CNN's features) and its range
need not be the state's ``[-1, 1]`` (tanh): tied to an embedding of N(0, 1) rows the hidden state's grid is
four times coarser. `recurrent_state_ties` returns the pairs to tie; placement applies them.
"""
from __future__ import annotations

from quantsim.graph.index import GraphIndex
from quantsim.graph.op_facts import GRID_PRESERVING, RECURRENT_OPS

__all__ = ["recurrent_state_ties", "quantized_source"]

_NOT_VALUES = frozenset({"Cast", "Shape", "Size", "NonZero"})


def quantized_source(index: GraphIndex, name: str, quantized: set[str] | frozenset[str]) -> str | None:
    """``name`` if it has an enabled quantizer, else the closest tensor up a chain of data-movement ops
    (their data input) that has one; None if the chain ends first (a constant, a computation)."""
    seen: set[str] = set()
    current = name
    while current and current not in seen:
        if current in quantized:
            return current
        seen.add(current)
        producer = index.producer_of(current)
        if producer is None or producer.op_type not in GRID_PRESERVING or producer.op_type in _NOT_VALUES:
            return None
        current = producer.input[0] if producer.input else ""
    return None


def recurrent_state_ties(index: GraphIndex, quantized: set[str] | frozenset[str]) -> list[tuple[str, str]]:
    """``(a, b)`` pairs of quantized tensors that must share a quantizer (module docstring)."""
    pairs: list[tuple[str, str]] = []

    def output(node, slot: int) -> str | None:
        name = node.output[slot] if len(node.output) > slot else ""
        return name if name in quantized else None

    def source(node, slot: int) -> str | None:
        name = node.input[slot] if len(node.input) > slot else ""
        return quantized_source(index, name, quantized) if name else None

    for node in index.nodes:
        if node.op_type not in RECURRENT_OPS:
            continue
        hidden = [t for t in (output(node, 0), output(node, 1), source(node, 5)) if t is not None]
        pairs += [(hidden[0], other) for other in hidden[1:]]
        if node.op_type == "LSTM":
            cell = [t for t in (output(node, 2), source(node, 6)) if t is not None]
            pairs += [(cell[0], other) for other in cell[1:]]
    return pairs
