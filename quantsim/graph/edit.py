"""Small edits and queries over a ModelProto that preparation, the sim builder and the exports share."""
from __future__ import annotations

from collections.abc import Iterator

import onnx

from quantsim.graph.index import subgraph_references

__all__ = [
    "default_opset",
    "graphs_within",
    "constant_names",
    "referenced_names",
    "drop_unused_initializers",
    "drop_value_info",
    "describe",
]


def default_opset(model: onnx.ModelProto) -> int | None:
    """The version of the default (``ai.onnx``) domain the model imports, or None."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return None


def graphs_within(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph of its nodes (If / Loop / Scan bodies), depth first, each before its
    own subgraphs."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from graphs_within(attribute.g)
            for sub in attribute.graphs:
                yield from graphs_within(sub)


def constant_names(model: onnx.ModelProto) -> set[str]:
    """Initializers whose value is fixed: from IR version 4 on, those not also listed as (overridable)
    graph inputs; before it every initializer had to be listed as an input and all are constant."""
    graph = model.graph
    inputs = {i.name for i in graph.input} if model.ir_version >= 4 else set()
    return {t.name for t in graph.initializer if t.name not in inputs}


def referenced_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name the graph reads: node inputs, subgraph outer-scope reads, graph outputs."""
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(name for name in node.input if name)
        names.update(subgraph_references(node))
    return names


def drop_unused_initializers(graph: onnx.GraphProto, candidates: set[str]) -> set[str]:
    """Remove the initializers among ``candidates`` that nothing reads any more; returns their names."""
    used = referenced_names(graph) | {i.name for i in graph.input}
    dead = {name for name in candidates if name not in used}
    if dead:
        keep = [t for t in graph.initializer if t.name not in dead]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        drop_value_info(graph, dead)
    return dead


def drop_value_info(graph: onnx.GraphProto, names: set[str]) -> None:
    """Forget inferred types of values that no longer exist (stale entries confuse shape inference)."""
    if any(info.name in names for info in graph.value_info):
        keep = [info for info in graph.value_info if info.name not in names]
        del graph.value_info[:]
        graph.value_info.extend(keep)


def describe(node: onnx.NodeProto) -> str:
    """``'"name" (OpType)'`` for error messages."""
    return f'"{node.name}" ({node.op_type})' if node.name else f"an unnamed {node.op_type} node"
