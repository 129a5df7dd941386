"""onnxruntime's outputs of small graphs over the 256 uint8 codes, evaluated in few sessions.

The integer lowering asks onnxruntime for the result of many tiny graphs whose one input is the 256 codes
of an 8-bit grid: each lookup table (`lut.lut_table`: DequantizeLinear -> f -> QuantizeLinear, Q/DQ fusion
off) and each set of candidate kernel chains (`piecewise`: QLinear kernels, Q/DQ fusion on). One session
per graph (a few ms of CPU each, more wall time on a loaded machine) was a quarter to nearly half of the
export's CPU time on models with many activations (the PicoDet layout detector with 96 HardSwish asked for
193 graphs, PP-OCR rec for 170). So:

1. while *planning* (`prefetch`'s dry run of the rules), `CodeGraphs.evaluate` records each graph and
   answers zeros (the dry run's result is thrown away; which graphs are asked for depends on the grids,
   not on the answers);
2. `CodeGraphs.compute` runs every recorded graph at once: graphs with the same session options and opset
   imports are merged into one graph (each one's nodes and constants copied unchanged, names prefixed
   apart, the code input shared, one output per output), so one session per kind (two or three: tables,
   tables needing a newer opset such as HardSwish's, kernel probes) computes them all;
3. the lowering reads the answers; a graph the dry run did not record is evaluated alone then.

Exactness: the merged graphs are independent chains from the shared input, so onnxruntime computes each
output as it does in a session of its own (same kernels, same optimizations per chain): the tables stay the
sim's values (tests compare them with one session per table and with an independent oracle). A merged graph
onnxruntime refuses is split in halves until each failing graph stands alone; that graph is then built and
run alone, exactly as one session per graph would, and its error is raised to the rule that reads it (which
reports the node it could not lower).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from quantsim.graph.session import make_session

__all__ = ["CodeGraphs", "CODES"]

#: the 256 input codes every graph is evaluated on
CODES = np.arange(256, dtype=np.uint8)

_Key = tuple[bool, bytes]


class CodeGraphs:
    """Evaluations of one-input graphs over `CODES` (module docstring); ``planning`` records instead."""

    def __init__(self, planning: bool = False):
        self.planning = planning
        self.sessions = 0  # sessions built so far (diagnostics and tests)
        self._pending: dict[_Key, onnx.ModelProto] = {}
        self._results: dict[_Key, list[np.ndarray] | Exception] = {}

    @property
    def pending(self) -> int:
        """How many distinct graphs the planning pass recorded and `compute` has not run yet."""
        return len(self._pending)

    def evaluate(self, model: onnx.ModelProto, fuse_qdq: bool = False) -> list[np.ndarray]:
        """The outputs of ``model`` (one graph input: the 256 uint8 codes) for `CODES`, as a session of its
        own over ``model`` computes them (`make_session` with ``fuse_qdq``); raises what that session raises.
        While planning: records ``model`` and returns zeros."""
        key = (fuse_qdq, model.SerializeToString())
        if key not in self._results:
            if self.planning:
                self._pending.setdefault(key, model)
                return [np.zeros(256, np.uint8) for _ in model.graph.output]
            self._results[key] = self._alone(model, fuse_qdq)
        result = self._results[key]
        if isinstance(result, Exception):
            raise result
        return list(result)

    def compute(self) -> None:
        """Run every recorded graph (one merged session per session kind and opset imports; module
        docstring) and leave planning: later `evaluate` calls read the answers."""
        groups: dict[tuple, list[_Key]] = {}
        for key, model in self._pending.items():
            if _mergeable(model):
                kind = (key[0], tuple(sorted((o.domain, o.version) for o in model.opset_import)))
                groups.setdefault(kind, []).append(key)
            else:
                self._results[key] = self._alone(model, key[0])
        for (fuse_qdq, _), keys in groups.items():
            self._merged(keys, fuse_qdq)
        self._pending.clear()
        self.planning = False

    def _merged(self, keys: list[_Key], fuse_qdq: bool) -> None:
        """Outputs of the graphs ``keys`` from one session over their merge; halves when it fails."""
        if len(keys) == 1:
            self._results[keys[0]] = self._alone(self._pending[keys[0]], fuse_qdq)
            return
        models = [self._pending[key] for key in keys]
        try:
            self.sessions += 1
            outputs = make_session(_merge(models), fuse_qdq=fuse_qdq).run(None, {"codes": CODES})
        except Exception:  # noqa: BLE001 - some graph onnxruntime refuses: find it (it fails alone, as before)
            half = len(keys) // 2
            self._merged(keys[:half], fuse_qdq)
            self._merged(keys[half:], fuse_qdq)
            return
        start = 0
        for key, model in zip(keys, models):
            count = len(model.graph.output)
            self._results[key] = [_read_only(a) for a in outputs[start:start + count]]
            start += count

    def _alone(self, model: onnx.ModelProto, fuse_qdq: bool) -> list[np.ndarray] | Exception:
        try:
            self.sessions += 1
            outputs = make_session(model, fuse_qdq=fuse_qdq).run(None, {model.graph.input[0].name: CODES})
        except Exception as error:  # noqa: BLE001 - handed to the rule that reads it
            return error
        return [_read_only(a) for a in outputs]


def _read_only(array) -> np.ndarray:
    array = np.asarray(array)
    array.setflags(write=False)
    return array


def _mergeable(model: onnx.ModelProto) -> bool:
    """One graph input and no subgraphs (whose outer-scope names the merge would not rename)."""
    return len(model.graph.input) == 1 and not any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in model.graph.node for a in n.attribute)


def _merge(models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """One model computing every output of ``models`` (same opset imports) from one input ``codes``."""
    nodes, initializers, outputs = [], [], []
    for i, model in enumerate(models):
        graph, prefix = model.graph, f"g{i}/"
        source = graph.input[0].name

        def rename(name: str, source=source, prefix=prefix) -> str:
            return "codes" if name == source else (prefix + name if name else "")

        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename(n) for n in node.input]
            copy.output[:] = [rename(n) for n in node.output]
            if copy.name:
                copy.name = prefix + copy.name
            nodes.append(copy)
        for tensor in graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            copy.name = rename(tensor.name)
            initializers.append(copy)
        for info in graph.output:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(info)
            copy.name = rename(info.name)
            outputs.append(copy)
    first = models[0]
    merged = helper.make_graph(nodes, "code_graphs", [first.graph.input[0]], outputs, initializers)
    merged.input[0].name = "codes"
    model = helper.make_model(merged, opset_imports=list(first.opset_import))
    model.ir_version = max(m.ir_version for m in models)
    return model
