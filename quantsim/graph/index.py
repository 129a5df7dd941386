"""Read-only index over an ONNX graph: producers, consumers, initializers, value types, fresh names.

The index never mutates the model it describes. Subgraph bodies (If/Loop/Scan) are opaque: their
outer-scope references count as consumers of the outer tensor so nothing they read is renamed away.
"""
from __future__ import annotations

import itertools
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantsim.graph.deferred import WeightSource
from quantsim.graph.large_models import value_bytes
from quantsim.graph.mapped import active_weights, is_mapped
from quantsim.graph.wrapped import as_model_proto

__all__ = ["GraphIndex", "Use", "FLOAT_TYPES", "CONSTANT_CACHE_BYTES", "subgraph_references", "node_attributes",
           "rename_outer_references"]

CONSTANT_CACHE_BYTES = 64 << 20
"""At most this many bytes of converted constants are kept by `GraphIndex.cached_constants`: the others are
converted on each use, so a large model's weights are never held twice (read at call time)."""
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
        for graph in [*attr.graphs, *([attr.g] if attr.HasField("g") else [])]:
            local = _local_names(graph)
            for inner in graph.node:
                names.update(n for n in inner.input if n and n not in local)
                names.update(subgraph_references(inner) - local)
            names.update(o.name for o in graph.output if o.name not in local)
    return names


def _local_names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for inner in graph.node:
        names.update(inner.output)
    return names


def rename_outer_references(node: onnx.NodeProto, renames: dict[str, str]) -> None:
    """Rewrite, in place, the enclosing-scope names that the subgraphs of ``node`` read (`subgraph_references`)
    as ``renames`` says; names a subgraph defines itself are left alone, at every depth."""
    for attr in node.attribute:
        for graph in [*attr.graphs, *([attr.g] if attr.HasField("g") else [])]:
            outer = {old: new for old, new in renames.items() if old not in _local_names(graph)}
            if not outer:
                continue
            for inner in graph.node:
                inner.input[:] = [outer.get(n, n) for n in inner.input]
                rename_outer_references(inner, outer)
            for out in graph.output:
                out.name = outer.get(out.name, out.name)


class GraphIndex:
    """Lookup tables over ``model.graph`` built once; rebuild after changing the graph.

    ``initializers`` (default: ``model.graph.initializer``) are the constants of the graph, for a model
    whose initializers are kept apart from it. ``weights`` reads the initializers whose values are in
    external-data files (`quantsim.graph.mapped`) as read-only arrays over memory maps, or computes those an
    export defers (`quantsim.graph.deferred`); without, those `mapped.reading_from` made current.
    """

    def __init__(self, model: onnx.ModelProto, initializers: Iterable[TensorProto] | None = None,
                 weights: WeightSource | None = None):
        model = as_model_proto(model)  # sim.model (a view) too
        graph = model.graph
        self.model = model
        self.weights = weights if weights is not None else active_weights()
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        self.initializers: dict[str, TensorProto] = {
            t.name: t for t in (graph.initializer if initializers is None else initializers)
        }
        self._constant_cache: dict[str, np.ndarray] | None = None
        self._cached_bytes = 0
        self._initializer_bytes: int | None = None
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
        self._typed: list[tuple[str, onnx.TypeProto.Tensor]] = []  # typed values, in order, for `shape`
        for info in itertools.chain(graph.value_info, graph.input, graph.output):
            tensor_type = info.type.tensor_type
            if info.type.HasField("tensor_type") and tensor_type.elem_type:
                self.elem_type[info.name] = tensor_type.elem_type
                self._typed.append((info.name, tensor_type))
        for name, tensor in self.initializers.items():
            self.elem_type[name] = tensor.data_type
        self._names = self.tensor_names() | {n.name for n in self.nodes}
        self._names.update(itertools.chain.from_iterable(n.input for n in self.nodes))

    @cached_property
    def shape(self) -> dict[str, tuple | None]:
        """``{tensor: shape}`` of typed values with a shape and of initializers (dims: int, name or None);
        built on first use."""
        shapes: dict[str, tuple | None] = {}
        for name, tensor_type in self._typed:
            if tensor_type.HasField("shape"):
                shapes[name] = tuple(
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim
                )
        for name, tensor in self.initializers.items():
            shapes[name] = tuple(tensor.dims)
        return shapes

    # queries -----------------------------------------------------------------------------------
    def initializer_bytes(self) -> int:
        """Total payload bytes of the initializers, from their shapes and types (nothing converted)."""
        if self._initializer_bytes is None:
            self._initializer_bytes = value_bytes(self.initializers.values())
        return self._initializer_bytes

    def is_float(self, name: str) -> bool:
        return self.elem_type.get(name) in FLOAT_TYPES

    def code_type(self, node: onnx.NodeProto) -> int:
        """The storage type (TensorProto enum) of a QuantizeLinear's output / DequantizeLinear's input codes.

        Read from the graph, not from value_info alone (a Q -> DQ pair built without shape inference has
        none): the codes' declared type, else the zero point's type, else (for a DequantizeLinear) the
        producing QuantizeLinear's, else ``output_dtype``, else uint8 (the ONNX default)."""
        if node.op_type == "DequantizeLinear" and self.elem_type.get(node.input[0]):
            return self.elem_type[node.input[0]]
        if len(node.input) > 2 and node.input[2] and self.elem_type.get(node.input[2]):
            return self.elem_type[node.input[2]]
        if node.op_type == "DequantizeLinear":
            producer = self.producer_of(node.input[0])
            return self.code_type(producer) if producer is not None and producer.op_type == "QuantizeLinear" \
                else TensorProto.UINT8
        output_dtype = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
        return output_dtype or TensorProto.UINT8

    def is_constant(self, name: str) -> bool:
        return name in self.initializers

    def constant_value(self, name: str) -> np.ndarray:
        """The value of initializer ``name``; inside `cached_constants`, converted once and read-only."""
        tensor = self.initializers[name]
        if self.weights is not None and is_mapped(tensor):
            return self.weights.array(tensor)  # a view of the page cache: nothing to keep
        cache = self._constant_cache
        if cache is None:
            return numpy_helper.to_array(tensor)
        value = cache.get(name)
        if value is None:
            value = _read_only_array(tensor)
            if self._cached_bytes + value.nbytes <= CONSTANT_CACHE_BYTES:
                cache[name] = value
                self._cached_bytes += value.nbytes
        return value

    @contextmanager
    def cached_constants(self) -> Iterator[GraphIndex]:
        """Within this block `constant_value` converts each initializer once (the values must not change
        meanwhile; up to `CONSTANT_CACHE_BYTES` in all, larger sets are converted again on each use) and
        returns read-only arrays; they are dropped when the outermost block ends."""
        outermost = self._constant_cache is None
        if outermost:
            self._constant_cache, self._cached_bytes = {}, 0
        try:
            yield self
        finally:
            if outermost:
                self._constant_cache = None

    def tensor_names(self) -> set[str]:
        """Every tensor the graph declares or computes (typed values, initializers, node outputs)."""
        return set(self.elem_type) | set(self.producer)

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

    def bias_add(self, name: str) -> tuple[onnx.NodeProto, str] | None:
        """``(Add node, constant name)`` when ``name`` comes from a node with a constant input (a layer's weight)
        and its only consumer adds one float constant to it that is a per-column bias (shape ``[N]``, or
        ``[1, ..., 1, N]``).

        The one home of "MatMul followed by a constant Add": placement puts the pair's output quantizer after
        the Add, the int32-bias fit and the integer export fold the constant into the kernel's bias. As in
        AIMET's pass (rank-1 biases of weighted MatMuls), a constant of any other shape (a Swin block's
        ``[1, heads, 49, 49]`` relative-position table) or one added to a product of two activations
        (``q @ k^T``) is an ordinary Add."""
        producer = self.producer_of(name)
        if producer is None or not any(self.is_constant(n) for n in producer.input):
            return None
        add = self.single_consumer(name)
        if add is None or add.op_type != "Add":
            return None
        others = [n for n in add.input if n != name]
        if len(others) != 1 or not self.is_constant(others[0]) or not self.is_float(others[0]):
            return None
        dims = self.initializers[others[0]].dims
        if len(dims) == 0 or int(np.prod(dims[:-1], dtype=np.int64)) != 1:
            return None
        return add, others[0]

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

    def reserved_names(self) -> frozenset[str]:
        """The names reserved so far (graph names and `fresh_name`'s), for `release_names`."""
        return frozenset(self._names)

    def release_names(self, reserved: frozenset[str]) -> None:
        """Forget every name `fresh_name` reserved since `reserved_names` returned ``reserved`` (a builder
        that throws its first attempt away gets the same names again)."""
        self._names = set(reserved)


def _read_only_array(tensor: onnx.TensorProto) -> np.ndarray:
    """A read-only array of ``tensor``: a view of its raw bytes where they are in native order (one copy
    fewer than `numpy_helper.to_array`, which matters for gigabytes of weights), else a converted copy."""
    if tensor.HasField("raw_data") and tensor.data_location != onnx.TensorProto.EXTERNAL and sys.byteorder == "little":
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        except Exception:  # noqa: BLE001 - types numpy has no native form for (e.g. float8): the slow path
            dtype = None
        if dtype is not None and dtype.kind in "fiu":
            raw = tensor.raw_data
            count = int(np.prod(tensor.dims, dtype=np.int64))
            if len(raw) == count * dtype.itemsize:  # packed sub-byte types (int4) take the slow path
                return np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims))
    value = numpy_helper.to_array(tensor).view()
    value.flags.writeable = False
    return value
