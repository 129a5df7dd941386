"""Read-only index over an ONNX graph: producers, consumers, initializers, value types, fresh names.

The index never mutates the model it describes. Subgraph bodies (If/Loop/Scan) are opaque: their
outer-scope references count as consumers of the outer tensor so nothing they read is renamed away.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["GraphIndex", "Use", "FLOAT_TYPES", "subgraph_references", "node_attributes"]

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})


@dataclass(frozen=True)
class Use:
    """One consumer slot: ``node`` reads the tensor as input number ``index`` (-1: inside a subgraph)."""

    node: onnx.NodeProto
    index: int


def node_attributes(node: onnx.NodeProto) -> dict:
    """``{attribute name: Python value}`` of ``node``."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def subgraph_references(node: onnx.NodeProto) -> set[str]:
    """Names that the subgraphs of ``node`` read from the enclosing scope."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for graph in graphs:
            local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
            for inner in graph.node:
                local.update(inner.output)
            for inner in graph.node:
                names.update(n for n in inner.input if n and n not in local)
                names.update(subgraph_references(inner) - local)
            names.update(o.name for o in graph.output if o.name not in local)
    return names


class GraphIndex:
    """Lookup tables over ``model.graph`` built once; rebuild after changing the graph."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.model = model
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        self.initializers: dict[str, TensorProto] = {t.name: t for t in graph.initializer}
        self.graph_inputs: list[str] = [i.name for i in graph.input if i.name not in self.initializers]
        self.graph_outputs: list[str] = [o.name for o in graph.output]
        self.producer: dict[str, tuple[onnx.NodeProto, int]] = {}
        self.consumers: dict[str, list[Use]] = defaultdict(list)
        for node in self.nodes:
            for position, name in enumerate(node.output):
                if name:
                    self.producer[name] = (node, position)
            for position, name in enumerate(node.input):
                if name:
                    self.consumers[name].append(Use(node, position))
            for name in subgraph_references(node):
                self.consumers[name].append(Use(node, -1))
        self.elem_type: dict[str, int] = {}
        self.shape: dict[str, tuple | None] = {}
        for info in itertools.chain(graph.value_info, graph.input, graph.output):
            tensor_type = info.type.tensor_type
            if info.type.HasField("tensor_type") and tensor_type.elem_type:
                self.elem_type[info.name] = tensor_type.elem_type
                if tensor_type.HasField("shape"):
                    self.shape[info.name] = tuple(
                        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim
                    )
        for name, tensor in self.initializers.items():
            self.elem_type[name] = tensor.data_type
            self.shape[name] = tuple(tensor.dims)
        self._names = set(self.elem_type) | set(self.producer) | {n.name for n in self.nodes}
        self._names.update(itertools.chain.from_iterable(n.input for n in self.nodes))

    # queries -----------------------------------------------------------------------------------
    def is_float(self, name: str) -> bool:
        return self.elem_type.get(name) in FLOAT_TYPES

    def is_constant(self, name: str) -> bool:
        return name in self.initializers

    def constant_value(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.initializers[name])

    def uses(self, name: str) -> list[Use]:
        return self.consumers.get(name, [])

    def producer_of(self, name: str) -> onnx.NodeProto | None:
        entry = self.producer.get(name)
        return entry[0] if entry else None

    def single_consumer(self, name: str) -> onnx.NodeProto | None:
        """The only consumer node of ``name``, if it has exactly one use and is not a graph output."""
        uses = self.uses(name)
        if len(uses) != 1 or uses[0].index < 0 or name in self.graph_outputs:
            return None
        return uses[0].node

    def opset(self, domain: str = "") -> int:
        for entry in self.model.opset_import:
            if entry.domain in (domain, "ai.onnx" if domain == "" else domain):
                return entry.version
        return 0

    def fresh_name(self, base: str) -> str:
        """A tensor/node name not used anywhere in the graph yet (reserved once returned)."""
        candidate, counter = base, 1
        while candidate in self._names:
            candidate = f"{base}_{counter}"
            counter += 1
        self._names.add(candidate)
        return candidate
