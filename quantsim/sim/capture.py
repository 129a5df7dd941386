"""Capturing intermediate tensors of the float model or of the sim over calibration data, streamed.

`iter_tensors` runs one onnxruntime session over the float (prepared) model or over the sim graph with
the requested tensors added as graph outputs, and yields one ``{tensor: array}`` dict per batch; nothing
is kept between batches. In the sim a tensor's value is the one its consumers read, i.e. after its
quantizer (for a quantized model input, the quantized copy its consumers were rewired to); in the float
model it is the plain float value. Sessions are cached per (model kind, tensor set) and rebuilt when the
sim changed.

`TensorCache` keeps captured batches for algorithms that revisit them (AdaRound's sampled mini-batches):
in memory up to ``memory_budget_bytes``, then spilled to ``.npy`` files in a private temporary folder
and read back memory-mapped, so the resident size stays bounded whatever the data set's size.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.calibration.run import check_feed
from quantsim.errors import InvalidArgumentError
from quantsim.graph.edit import referenced_names
from quantsim.graph.index import GraphIndex, subgraph_references
from quantsim.graph.large_models import copy_without_initializers
from quantsim.graph.session import make_session
from quantsim.sim.build import _constant_key
from quantsim.sim.fake_values import FakeValues
from quantsim.sim.int32_bias import biased_ops, sim_bias_values

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["iter_tensors", "make_capturer", "Capturer", "StagedCapturer", "TensorCache", "DEFAULT_MEMORY_BUDGET"]

DEFAULT_MEMORY_BUDGET = 2 << 30  # bytes of captured arrays kept in memory before spilling to disk


def _sim_names(float_index: GraphIndex, sim_model: onnx.ModelProto, tensors: list[str]) -> dict[str, str]:
    """Name in the sim graph of each float-model tensor: itself, except quantized model inputs, whose
    consumers read a rewired copy (found through the first consumer node, which keeps its name)."""
    by_name = {node.name: node for node in sim_model.graph.node}
    names = {}
    for tensor in tensors:
        names[tensor] = tensor
        if tensor in float_index.graph_inputs:
            for use in float_index.uses(tensor):
                sim_node = by_name.get(use.node.name)
                if sim_node is not None and use.index >= 0:
                    names[tensor] = sim_node.input[use.index]
                    break
    return names


def _with_outputs(model: onnx.ModelProto, outputs: list[str], index: GraphIndex) -> onnx.ModelProto:
    """``model`` computing only ``outputs``: the nodes they depend on, those tensors as graph outputs (a
    capture early in the graph then costs a fraction of a pass, which per-layer algorithms repeat)."""
    nodes = list(model.graph.node)
    producer = {name: position for position, node in enumerate(nodes) for name in node.output if name}
    needed: set[int] = set()  # positions of the nodes the outputs depend on
    stack = list(outputs)
    while stack:
        position = producer.get(stack.pop())
        if position is None or position in needed:
            continue
        needed.add(position)
        stack.extend(n for n in nodes[position].input if n)
        stack.extend(subgraph_references(nodes[position]))
    pruned = copy_without_initializers(model)
    del pruned.graph.node[:]
    pruned.graph.node.extend(node for position, node in enumerate(nodes) if position in needed)
    read = referenced_names(pruned.graph) | set(outputs) | {i.name for i in model.graph.input}
    pruned.graph.initializer.extend(t for t in model.graph.initializer if t.name in read)
    del pruned.graph.output[:]
    pruned.graph.output.extend(
        helper.make_tensor_value_info(name, index.elem_type.get(name, onnx.TensorProto.FLOAT), None) for name in outputs)
    return pruned


class _SimGraph:
    """The sim graph built for capture sessions (its big weights beside it in ``external``), with what it
    was built from: the quantizer table's structure (`_structure`), each constant quantizer's key, and how
    many times each weight had been written (`layers.write_weight` counts them)."""

    def __init__(self, sim: QuantizationSimModel):
        self.external: dict[str, np.ndarray] = {}
        self.model = sim._built_sim_model(external=self.external)
        self.index = GraphIndex(self.model)
        self.source, self.written = sim._model, dict(_writes(sim))
        self.structure, self.keys = _structure(sim)
        self.positions = {t.name: i for i, t in enumerate(self.model.graph.initializer)}
        self.patches: list[str] = []  # the constants patched since the build, in order (`StagedCapturer`)
        self.bias_ops: list[tuple[onnx.NodeProto, str, int | None]] | None = None  # `biased_ops`, once needed

    def update(self, sim: QuantizationSimModel) -> bool:
        """Bring the graph up to the sim's current quantizers and weights by recomputing the constants whose
        key or values changed; False when something else changed (then the caller builds a new one)."""
        if sim._model is not self.source:
            return False
        structure, keys = _structure(sim)
        if structure != self.structure:
            return False
        writes = _writes(sim)
        rewritten = {name for name, count in writes.items() if self.written.get(name) != count}
        by_name = {q.name: q for q in sim._quantizers}
        changed = [name for name, key in keys.items()
                   if self.keys.get(name) != key or rewritten.intersection(by_name[name].tensors)]
        touched = rewritten.union(*(by_name[name].tensors for name in changed))
        for name in changed:
            q = by_name[name]
            encoding = None if q.spec.is_float else q.require_encoding()
            for tensor in q.tensors:  # what `build._SimBuilder.add_constant_quantizer` computes for it
                if not self._put(tensor, FakeValues(sim._index.constant_value(tensor), encoding)()):
                    return False
                rewritten.discard(tensor)
            self.keys[name] = keys[name]
        for tensor in rewritten:  # a weight no active quantizer reads: its own values
            if not self._put(tensor, np.array(sim._index.constant_value(tensor))):
                return False
        if touched and getattr(sim, "int32_bias", False) and not self._int32_biases(sim, touched):
            return False
        self.written = dict(writes)
        return True

    def _int32_biases(self, sim: QuantizationSimModel, touched: set[str]) -> bool:
        """Biases on the int32 grid ``s_in * s_w`` (`quantsim.sim.int32_bias`, as `build_sim_model` puts them)
        for the current weight encodings and values, of the layers whose weight or bias is in ``touched`` (the
        constants whose encoding or values changed since the last update: every other bias's value, which
        depends on its own value, its layer's weight encoding and its input's (in `_structure`), is as
        put before); only those whose value moved are put (and counted as patched)."""
        active = [q for q in sim._quantizers if q.enabled and q.is_initialized()]
        index = sim._index
        is_constant = index.initializers.__contains__
        if self.bias_ops is None:  # the prepared graph's biased layers: fixed while `source` is
            self.bias_ops = list(biased_ops(sim._model.graph, is_constant))
        ops = [op for op in self.bias_ops if op[1] in touched or op[0].input[1] in touched]
        values = sim_bias_values(sim._model.graph, active, index.constant_value, is_constant, ops) if ops else {}
        for name, value in values.items():
            current = self.external.get(name)
            if current is None and name in self.positions:
                current = numpy_helper.to_array(self.model.graph.initializer[self.positions[name]])
            if current is None or not np.array_equal(np.asarray(current), value):
                if not self._put(name, value):
                    return False
        return True

    def _put(self, tensor: str, values: np.ndarray) -> bool:
        self.patches.append(tensor)
        if tensor in self.external:
            self.external[tensor] = values
        elif tensor in self.positions:
            self.model.graph.initializer[self.positions[tensor]].CopyFrom(numpy_helper.from_array(values, tensor))
        else:
            return False
        return True


def _writes(sim: QuantizationSimModel) -> dict[str, int]:
    return vars(sim).get("_weights_written", {})


def _key(q, known: dict[str, tuple]) -> tuple:
    """`_constant_key` of ``q``, remembered in ``known`` per quantizer while its encoding object (frozen) and
    spec stay the same: the check runs for every quantizer before every capture."""
    enc, spec = q.encoding, q.spec
    kept = known.get(q.name)
    if kept is not None and kept[0] is enc and (kept[1] is spec or kept[1] == spec):
        return kept[2]
    key = _constant_key(q)
    known[q.name] = (enc, spec, key)
    return key


def _structure(sim: QuantizationSimModel) -> tuple[tuple, dict[str, tuple]]:
    """``(what the sim graph's nodes depend on, {constant quantizer: its values' key})``: every quantizer's
    tensors, flags and spec, and the encodings of those that are not on constants (which the graph holds as
    Q/DQ parameters); a constant quantizer's encoding changes only its tensors' values."""
    initializers = sim._index.initializers
    known = vars(sim).setdefault("_capture_keys", {})
    structure, keys = [], {}
    for q in sim._quantizers:
        initialized = q.is_initialized()
        state: tuple = (q.name, tuple(q.tensors), q.enabled, initialized, q.spec)
        if q.enabled and initialized:
            if q.tensors and all(t in initializers for t in q.tensors):
                keys[q.name] = _key(q, known)
            else:
                state += (_key(q, known),)
        structure.append(state)
    return tuple(structure), keys


def _sim_graph(sim: QuantizationSimModel) -> _SimGraph:
    """The kept sim graph, brought up to date or built anew (module docstring)."""
    with sim._index.cached_constants():
        sim._ensure_param_encodings()
        kept = getattr(sim, "_capture_graph", None)
        if kept is None or not kept.update(sim):
            kept = _SimGraph(sim)
            vars(sim)["_capture_graph"] = kept
    return kept


def _capture_session(sim: QuantizationSimModel, tensors: tuple[str, ...], quantized: bool):
    key = (quantized, tensors)
    cached = sim._capture_sessions.get(key)
    if cached is not None and cached[0] == sim._version:
        return cached[1], cached[2]
    index = sim.graph_index
    unknown = [t for t in tensors if t not in index.producer and t not in index.graph_inputs
               and not index.is_constant(t)]
    if unknown:
        raise InvalidArgumentError(f"cannot capture {unknown[:5]}: no such tensor in the prepared model "
                                   "(names after preparation: see sim.activation_names or sim.model)")
    weights: dict[str, np.ndarray] = {}
    if quantized:
        graph = _sim_graph(sim)
        source, weights, source_index = graph.model, graph.external, graph.index
        names = _sim_names(index, source, list(tensors))
    else:
        source, names = sim.model.model, {t: t for t in tensors}
        source_index = GraphIndex(source)
    model = _with_outputs(source, sorted(set(names.values())), source_index)
    kept = {t.name for t in model.graph.initializer}
    session = make_session(model, sim.providers, session_options_kwargs=sim._session_options_kwargs,
                           external_initializers={k: v for k, v in weights.items() if k in kept})
    sim._capture_sessions = {k: v for k, v in sim._capture_sessions.items() if v[0] == sim._version}
    sim._capture_sessions[key] = (sim._version, session, names)
    return session, names


class Capturer:
    """Captures fixed tensors of the sim or float model as it was when the capturer was made: later
    changes to the sim (new encodings, replaced weights) do not reach it."""

    def __init__(self, session, names: dict[str, str], wanted: tuple[str, ...]):
        self._session, self._wanted = session, wanted
        self._outputs = [names[t] for t in wanted]

    def __call__(self, inputs: Iterable[Mapping]) -> Iterator[dict[str, np.ndarray]]:
        """``{tensor: array}`` for each feed dict of ``inputs``."""
        for number, feed in enumerate(inputs):
            checked = check_feed(feed, self._session.get_inputs(), f"batch {number}")
            yield dict(zip(self._wanted, self._session.run(self._outputs, checked)))


def make_capturer(sim: QuantizationSimModel, tensors: Iterable[str], *, quantized: bool = True) -> Capturer:
    """A `Capturer` of ``tensors`` in the sim (``quantized=True``: the values consumers read, after their
    quantizers) or in the float model."""
    wanted = tuple(dict.fromkeys(tensors))
    if not wanted:
        raise InvalidArgumentError("no tensors to capture")
    session, names = _capture_session(sim, wanted, quantized)
    return Capturer(session, names, wanted)


def iter_tensors(sim: QuantizationSimModel, tensors: Iterable[str], inputs: Iterable[Mapping],
                 *, quantized: bool = True) -> Iterator[dict[str, np.ndarray]]:
    """For each feed dict of ``inputs``, the values of ``tensors`` in the sim (``quantized=True``) or in
    the float model, as ``{tensor: array}``."""
    return make_capturer(sim, tensors, quantized=quantized)(inputs)


class StagedCapturer:
    """Sim-side values of tensors over fixed calibration feeds, for algorithms that change the sim between
    captures in topological order (Sequential MSE: one layer's weight range after another).

    Each call computes only what changed: values captured earlier are kept per batch while no constant
    upstream of them has changed since, and the next tensors are computed from them by the part of the sim
    graph between (its nodes as they are in the whole graph, run by one small session), as aimet-onnx's
    cached layer inputs are. Values are the same as `make_capturer`'s. A change to anything but constants'
    encodings or values starts again from the model inputs. Kept values stay in memory (the tensors that
    cross the cut: a layer input, plus skip connections), as many as there are batches. Use as a context
    manager (or call `close`): closing drops the kept values and the sim graph kept for captures.
    """

    def __init__(self, sim: QuantizationSimModel, inputs: Iterable[Mapping]):
        self._sim = sim
        self._feeds = list(inputs)
        self._graph: _SimGraph | None = None
        self._kept: dict[str, tuple[list[np.ndarray], int, int]] = {}  # sim name -> (batches, upstream, patches)

    def close(self) -> None:
        """Drop the kept values and the sim's kept capture graph (a copy of every changed weight)."""
        self._kept, self._graph = {}, None
        vars(self._sim).pop("_capture_graph", None)

    def __enter__(self) -> StagedCapturer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, graph: _SimGraph) -> None:
        self._graph, self._kept = graph, {}
        nodes = graph.model.graph.node
        self._producer = {name: position for position, node in enumerate(nodes) for name in node.output if name}
        self._consumers: dict[str, list[int]] = {}
        bits = {t.name: 1 << i for i, t in enumerate(graph.model.graph.initializer)}
        self._bit = bits
        upstream: dict[str, int] = dict(bits)  # tensor -> bit mask of the constants it depends on
        for position, node in enumerate(nodes):
            mask = 0
            for name in [*node.input, *subgraph_references(node)]:
                if name:
                    mask |= upstream.get(name, 0)
                    self._consumers.setdefault(name, []).append(position)
            for name in node.output:
                upstream[name] = mask
        self._upstream = upstream

    def _current(self, name: str) -> bool:
        kept = self._kept.get(name)
        if kept is None:
            return False
        assert self._graph is not None
        changed = 0
        for tensor in self._graph.patches[kept[2]:]:
            changed |= self._bit.get(tensor, 0)
        return not changed & kept[1]

    def __call__(self, tensors: Iterable[str]) -> list[dict[str, np.ndarray]]:
        """``[{tensor: array} for each batch]`` of ``tensors`` (prepared-model names) in the sim as it is now."""
        wanted = tuple(dict.fromkeys(tensors))
        sim = self._sim
        index = sim._index
        unknown = [t for t in wanted if t not in index.producer and t not in index.graph_inputs]
        if unknown or not wanted:
            raise InvalidArgumentError(f"cannot capture {list(unknown)[:5] or 'no tensors'}: tensors computed by "
                                       "the prepared model or model inputs only")
        graph = _sim_graph(sim)
        if graph is not self._graph:
            self._start(graph)
        names = _sim_names(index, graph.model, list(wanted))
        for name in [n for n in self._kept if not self._current(n)]:
            del self._kept[name]
        outputs = sorted(set(names.values()) - set(self._kept))
        if outputs:
            self._compute(graph, outputs, set(names.values()))
        return [{t: self._kept[names[t]][0][b] for t in wanted} for b in range(len(self._feeds))]

    def _compute(self, graph: _SimGraph, outputs: list[str], wanted: set[str]) -> None:
        nodes = graph.model.graph.node
        needed: set[int] = set()
        reads: set[str] = set()  # kept values and model inputs the cut reads
        stack = list(outputs)
        while stack:
            name = stack.pop()
            position = self._producer.get(name)
            if name in self._kept or position is None:
                reads.add(name)
                continue
            if position in needed:
                continue
            needed.add(position)
            stack.extend(n for n in nodes[position].input if n)
            stack.extend(subgraph_references(nodes[position]))
        produced = {name for position in needed for name in nodes[position].output if name}
        crossing = sorted({name for name in produced if any(c not in needed for c in self._consumers.get(name, ()))}
                          | set(outputs))
        model = copy_without_initializers(graph.model)
        del model.graph.node[:]
        model.graph.node.extend(nodes[position] for position in sorted(needed))
        used = referenced_names(model.graph)
        kept_inputs = sorted(reads & set(self._kept))
        model_inputs = [i for i in graph.model.graph.input if i.name in reads and i.name not in self._kept]
        del model.graph.input[:]
        model.graph.input.extend(model_inputs)
        model.graph.input.extend(helper.make_tensor_value_info(name, graph.index.elem_type.get(
            name, onnx.TensorProto.FLOAT), None) for name in kept_inputs)
        model.graph.initializer.extend(t for t in graph.model.graph.initializer if t.name in used)
        del model.graph.output[:]
        model.graph.output.extend(helper.make_tensor_value_info(name, graph.index.elem_type.get(
            name, onnx.TensorProto.FLOAT), None) for name in crossing)
        sim = self._sim
        session = make_session(model, sim.providers, session_options_kwargs=sim._session_options_kwargs,
                               external_initializers={k: v for k, v in graph.external.items() if k in used})
        feed_inputs = [i for i in session.get_inputs() if i.name not in self._kept]
        values: list[list[np.ndarray]] = [[] for _ in crossing]
        for number, feed in enumerate(self._feeds):
            own = {k: v for k, v in feed.items() if k in {i.name for i in feed_inputs}}
            checked = check_feed(own, feed_inputs, f"batch {number}")
            checked.update({name: self._kept[name][0][number] for name in kept_inputs})
            for slot, array in zip(values, session.run(crossing, checked)):
                slot.append(array)
        consumed = [name for name in self._kept
                    if name not in wanted and all(c in needed for c in self._consumers.get(name, ()))]
        for name in consumed:  # read by nothing outside this cut: not needed again unless recomputed
            del self._kept[name]
        for name, batches in zip(crossing, values):
            self._kept[name] = (batches, self._upstream.get(name, 0), len(graph.patches))


class TensorCache:
    """Captured batches (``{name: array}`` dicts) kept in memory up to a budget, then on disk.

    Use as a context manager (or call `close`) so the spill folder is removed.
    """

    def __init__(self, memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET):
        if memory_budget_bytes < 0:
            raise InvalidArgumentError(f"memory_budget_bytes must be >= 0, got {memory_budget_bytes}")
        self.memory_budget_bytes = int(memory_budget_bytes)
        self.resident_bytes = 0
        self._batches: list[dict[str, np.ndarray] | dict[str, Path]] = []
        self._folder: Path | None = None

    def append(self, batch: Mapping[str, np.ndarray]) -> None:
        """Keep one batch (arrays are copied into memory, or written to disk past the budget)."""
        size = sum(np.asarray(v).nbytes for v in batch.values())
        if self.resident_bytes + size <= self.memory_budget_bytes:
            self._batches.append({k: np.array(v) for k, v in batch.items()})
            self.resident_bytes += size
            return
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="quantsim-capture-"))
        files = {}
        for position, (name, value) in enumerate(batch.items()):
            path = self._folder / f"{len(self._batches)}_{position}.npy"
            np.save(path, np.asarray(value))
            files[name] = path
        self._batches.append(files)

    @property
    def spilled(self) -> bool:
        """True once some batch went to disk."""
        return self._folder is not None

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, number: int) -> dict[str, np.ndarray]:
        batch = self._batches[number]
        return {k: (np.load(v, mmap_mode="r") if isinstance(v, Path) else v) for k, v in batch.items()}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self[i] for i in range(len(self)))

    def close(self) -> None:
        """Drop every batch and remove the spill folder."""
        self._batches.clear()
        self.resident_bytes = 0
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> TensorCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
