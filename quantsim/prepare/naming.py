"""Names and structure: every node gets a unique stable name, every value a single definition, and the
nodes a topological order.

``check_graph`` (pre: any ModelProto; post: a well-formed, topologically sorted top-level graph)
    Rules, each violation a ``PrepareError`` naming the nodes and values involved:
    1. a value name is defined once: as a graph input, an initializer or one node output. Two nodes
       writing the same name, a node writing a graph input or initializer, repeated initializer or
       graph input names are errors. (An initializer also listed as a graph input is the overridable
       default of IR >= 4, not a duplicate.)
    2. every node input and every outer-scope name a subgraph reads is defined (no dangling inputs);
    3. every graph output is defined, and listed once;
    4. there is no cycle (the error lists the nodes on one);
    5. nodes out of topological order are reordered (stable: among ready nodes the earliest first);
       this is the only change it makes, and it is reported as ``modified``.

``name_nodes`` (pre: none; post: node names are non-empty and unique)
    A unique non-empty name is kept; an empty or repeated name becomes ``/<op_type>`` or, if taken,
    ``/<op_type>_<i>`` with the smallest free ``i`` (the first holder of a repeated name keeps it),
    the naming AIMET applies, but never on the caller's model. Names are stable: the same model
    always gets the same names. Nodes inside subgraphs are left alone.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict

import onnx

from quantsim.errors import PrepareError
from quantsim.graph.edit import describe
from quantsim.graph.index import subgraph_references

__all__ = ["check_graph", "name_nodes"]


def name_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Give every top-level node a unique, stable name (rules in the module docstring)."""
    seen: set[str] = set()
    taken = Counter(n.name for n in model.graph.node if n.name)
    modified = False
    for node in model.graph.node:
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = f"/{node.op_type}"
        candidate, counter = base, 0
        while candidate in seen or (candidate != node.name and taken.get(candidate)):
            counter += 1
            candidate = f"{base}_{counter}"
        node.name = candidate
        seen.add(candidate)
        modified = True
    return model, modified


def check_graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Reject malformed graphs with a clear error; sort nodes topologically (rules in the module docstring)."""
    graph = model.graph
    nodes = list(graph.node)
    producer = _definitions(graph, nodes)
    reads = [_reads(node) for node in nodes]
    for node, names in zip(nodes, reads):
        for name in names:
            if name not in producer:
                raise PrepareError(f'node {describe(node)} reads "{name}", which no node, graph input or '
                                   "initializer defines (dangling input)")
    listed = Counter(o.name for o in graph.output)
    for name, count in listed.items():
        if name not in producer:
            raise PrepareError(f'graph output "{name}" is not produced by any node, input or initializer')
        if count > 1:
            raise PrepareError(f'graph output "{name}" is listed {count} times')
    order = _topological_order(nodes, reads, producer)
    if order == list(range(len(nodes))):
        return model, False
    sorted_nodes = [nodes[i] for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)
    return model, True


def _definitions(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> dict[str, int]:
    """Map value name -> index of the node producing it (-1 for graph inputs and initializers)."""
    producer: dict[str, int] = {}
    for kind, names in (("graph input", [i.name for i in graph.input]),
                        ("initializer", [t.name for t in graph.initializer])):
        for name, count in Counter(names).items():
            if count > 1:
                raise PrepareError(f'{kind} "{name}" is defined {count} times')
        producer.update(dict.fromkeys(names, -1))
    for position, node in enumerate(nodes):
        for name in node.output:
            if not name:
                continue
            previous = producer.get(name)
            if previous is None:
                producer[name] = position
            elif previous == -1:
                raise PrepareError(f'node {describe(node)} writes "{name}", which is already a graph input '
                                   "or initializer")
            elif previous == position:
                raise PrepareError(f'node {describe(node)} lists output "{name}" twice')
            else:
                raise PrepareError(f'value "{name}" is written by two nodes: {describe(nodes[previous])} '
                                   f"and {describe(node)}; value names must be unique")
    return producer


def _reads(node: onnx.NodeProto) -> list[str]:
    return [name for name in node.input if name] + sorted(subgraph_references(node))


def _topological_order(nodes: list[onnx.NodeProto], reads: list[list[str]], producer: dict[str, int]) -> list[int]:
    """Kahn's algorithm, earliest original position first among ready nodes; raises on a cycle."""
    waiting = [0] * len(nodes)
    dependents: dict[int, list[int]] = defaultdict(list)
    for position, names in enumerate(reads):
        sources = {producer[name] for name in names} - {-1}
        waiting[position] = len(sources)
        for source in sources:
            dependents[source].append(position)
    ready = [position for position, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        position = heapq.heappop(ready)
        order.append(position)
        for dependent in dependents[position]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, dependent)
    if len(order) < len(nodes):
        raise PrepareError("the graph has a cycle through nodes " + _find_cycle(nodes, reads, producer, waiting))
    return order


def _find_cycle(nodes, reads, producer, waiting) -> str:
    """Walk back from an unordered node through unordered producers until a node repeats."""
    position = next(i for i, count in enumerate(waiting) if count > 0)
    path: list[int] = []
    while position not in path:
        path.append(position)
        position = next(producer[name] for name in reads[position]
                        if producer[name] != -1 and waiting[producer[name]] > 0)
    cycle = path[path.index(position):][::-1]
    start = cycle.index(min(cycle))  # begin at the earliest node, for a stable message
    cycle = cycle[start:] + cycle[:start]
    return " -> ".join(describe(nodes[i]) for i in cycle + [cycle[0]])
