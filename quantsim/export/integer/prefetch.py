"""The 256-code graphs an integer export will ask for, found before it lowers anything.

Lookup tables and kernel probes (`lut`, `piecewise`) are small onnxruntime graphs over the 256 codes of a
grid; `code_graphs` computes many of them in one session when it knows them in advance. `prefetch` finds
them with a dry run of the rules that ask for them over a scratch context (`code_graphs` planning: every
evaluation is recorded and answered with zeros), then computes them all:

* every node whose op's rule may ask (all rules except the weighted kernels and LayerNorm, which never do
  and cost the most) runs its rule on the scratch context; a rule that succeeds leaves its outputs' codes
  there (data movement passes its input's grid on, as in the real lowering);
* a node skipped or refused leaves its outputs on their own quantizers' grids, which is where the real
  lowering leaves the output of nearly every lowered op.

The real lowering then reads the answers. Its requests are the same graphs wherever the scratch run saw the
same grids; where it did not (a grid the real lowering inherits differently), the graph it asks for runs
alone, as before: the dry run decides how many sessions are built, never what a table holds.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import onnx

from quantsim.export.integer import layernorm as lowering_layernorm
from quantsim.export.integer import linear as lowering_linear
from quantsim.export.integer.code_graphs import CodeGraphs
from quantsim.export.integer.context import Grid, LoweringContext
from quantsim.graph.deferred import DeferredWeights
from quantsim.graph.index import GraphIndex

__all__ = ["prefetch", "NEVER_ASK"]

#: op types whose rules never evaluate a 256-code graph (and are the costly ones to run)
NEVER_ASK = frozenset(lowering_linear.RULES) | frozenset(lowering_layernorm.RULES)


def prefetch(sim, index: GraphIndex, opset: int, rules: Mapping[str, Callable[[LoweringContext, onnx.NodeProto], None]],
             exact_grids: dict[str, Grid | None] | None = None) -> CodeGraphs:
    """A `CodeGraphs` holding the answers of every 256-code graph the rules ask for in a dry run over
    ``index`` (module docstring); the names the dry run reserved in ``index`` are released again."""
    graphs = CodeGraphs(planning=True)
    names = index.reserved_names()
    ctx = LoweringContext(sim, index, opset, DeferredWeights(), graphs, exact_grids)
    try:
        for name in index.graph_inputs:
            _seed(ctx, name)
        for node in index.nodes:
            if node.name in ctx.absorbed:
                continue
            rule = rules.get(node.op_type) if node.domain in ("", "ai.onnx") and node.op_type not in NEVER_ASK else None
            if rule is not None:
                state = ctx.snapshot()
                try:
                    rule(ctx, node)
                    continue
                except Exception:  # noqa: BLE001 - Unsupported, or a scratch state the real lowering never has
                    ctx.restore(state)
            for name in node.output:
                _seed(ctx, name)
    finally:
        index.release_names(names)
    graphs.compute()
    return graphs


def _seed(ctx: LoweringContext, name: str) -> None:
    """Codes of ``name`` on its own quantizer's grid (nothing when it has no 8-bit grid)."""
    grid = ctx.grid_of(name) if name and ctx.index.is_float(name) else None
    if grid is not None and name not in ctx.ints:
        ctx.set_int(name, name, grid)
