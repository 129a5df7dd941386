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
from onnx import helper

from quantsim.calibration.run import check_feed
from quantsim.errors import InvalidArgumentError
from quantsim.graph.edit import referenced_names
from quantsim.graph.index import GraphIndex, subgraph_references
from quantsim.graph.large_models import copy_without_initializers
from quantsim.graph.session import make_session

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["iter_tensors", "make_capturer", "Capturer", "TensorCache", "DEFAULT_MEMORY_BUDGET"]

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
        source = sim._built_sim_model(external=weights)
        names = _sim_names(index, source, list(tensors))
    else:
        source, names = sim.model.model, {t: t for t in tensors}
    model = _with_outputs(source, sorted(set(names.values())), GraphIndex(source))
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
