"""The tensors placement leaves float for the fill values they hold, each group with its `Decision`.

Two structural rules of `quantsim.graph.attention_masks`: the masked scores of an additive or ``Where`` attention
mask with the mask arithmetic feeding them (`find_masked_softmaxes`), and tensors built from constants and indices
alone that hold a fill (`find_constant_fills`: a scatter max's identity, a ``Where(c, -inf, 0)`` mask). A grid
over a fill has steps of fill / 255: the scores would be flattened, an identity of finfo.min gets scale 1.3e36.
"""
from __future__ import annotations

from quantsim.graph.attention_masks import MASK_FILL_MAGNITUDE, find_constant_fills, find_masked_softmaxes
from quantsim.graph.index import GraphIndex
from quantsim.sim.decisions import Decision

__all__ = ["fill_floats"]


def fill_floats(index: GraphIndex) -> tuple[frozenset[str], list[Decision], list[tuple[str, str]]]:
    """The tensors to leave float, the decisions that say why, and their ``(tensor, why)`` entries."""
    masked = find_masked_softmaxes(index)
    masks = frozenset().union(*(m.tensors for m in masked))
    fills = find_constant_fills(index) - masks
    decisions = [Decision("attention mask", tuple(sorted(m.tensors)), "left float",
                          f"a fill of magnitude >= {MASK_FILL_MAGNITUDE:.3g} is added to the scores before "
                          f"{m.softmax}: one grid over fill and scores would flatten the attention; the scores "
                          "and the Softmax output stay quantized") for m in masked]
    if fills:
        decisions.append(Decision("constant fill", tuple(sorted(fills)), "left float",
                                  f"built from constants and indices alone and holding a fill of magnitude >= "
                                  f"{MASK_FILL_MAGNITUDE:.3g} (a max/min reduction's identity, a mask): a grid "
                                  "over the fill has steps of fill / 255"))
    reasons = [(name, "attention-mask fill arithmetic (huge fill values)") for name in sorted(masks)] + [
        (name, "holds a fill value (a max/min reduction's identity or a mask) built from constants and indices")
        for name in sorted(fills)]
    return masks | fills, decisions, reasons
