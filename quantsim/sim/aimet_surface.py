"""The rest of aimet-onnx 2.42's ``QuantizationSimModel`` surface, as a mixin of `QuantizationSimModel`, and
AIMET's module function `clamp_activation_encodings`.

aimet-onnx's sim is a ModelProto with a ``QcQuantizeOp`` custom node per quantized tensor; quantsim's is the
prepared float model plus a table of quantizers, built into plain Q/DQ for each session. What the AIMET calls
mean here:

* ``get_supported_kernels()``: the config's ``supported_kernels``, as AIMET returns them
  (``{"defaults": [...] or {}, "<OpType>": [...]}``).
* ``fold_param_quantizers()``: each enabled integer parameter quantizer (<= 16 bits) bakes its fake-quantized
  values into the weights, as AIMET does; the quantizer stays enabled (its encoding is still exported, and
  re-quantizing values already on the grid changes nothing) and is frozen, so a later calibration keeps the grid
  the weights were folded on. AIMET removes the quantizer's node; quantsim's sessions use precomputed weights
  anyway, so nothing is left to remove. Undone by `snapshot`/`restore` like any weight replacement.
* ``remove_quantizers(model)``: AIMET's ``QcQuantizeOp`` nodes removed and their tensors rewired, in place; on
  ``sim.model`` (a `ModelView`: the float model, which holds no quantizer nodes) it returns the ModelProto.
* ``get_op_quantizers(op)``: an op is named by its node name (or anything with a ``.name``: an ONNX node,
  AIMET's connected-graph op); no ConnectedGraph exists here.
* ``set_quantizers({tensor: quantizer})``: ties ``tensor`` to one of this sim's quantizers.
* ``save_model_graph(prefix)``: the sim's graph (Q/DQ form) as ``<path>/<prefix>.onnx``.
* ``build_session`` (deprecated in AIMET), ``input_quantizers_name``, ``activation_dtypes``, ``quant_args``,
  ``input_name_to_nodes``, ``output_name_to_node`` (of the prepared float model);
  ``connected_graph`` raises `NotSupportedError` naming what to use.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from quantsim.core.spec import PerTensor
from quantsim.errors import (
    InvalidArgumentError,
    InvalidStateError,
    InvalidTypeError,
    NotSupportedError,
    warn_at_caller,
)
from quantsim.sim.fake_values import fake_values
from quantsim.sim.model_view import as_model_proto
from quantsim.sim.quantizer import QcQuantizeOp
from quantsim.sim.quantizer_dict import closest_names

if TYPE_CHECKING:
    from quantsim.graph.index import GraphIndex
    from quantsim.sim.config import QuantsimConfig
    from quantsim.sim.model import QuantizationSimModel
    from quantsim.sim.state import SimState

__all__ = ["AimetSurface", "clamp_activation_encodings"]

_log = logging.getLogger(__name__)

FOLDABLE_BITS = 16  # AIMET folds sub-int32 integer parameter quantizers


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph (If/Loop/Scan bodies), outermost first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    yield from _graphs(sub)


class AimetSurface:
    """AIMET ``QuantizationSimModel`` methods beyond quantsim's own (module docstring)."""

    if TYPE_CHECKING:
        config: QuantsimConfig
        path: Path | None
        providers: list
        param_names: list[str]
        activation_names: list[str]
        qc_quantize_op_dict: dict[str, QcQuantizeOp]
        _quantizers: list[QcQuantizeOp]
        _index: GraphIndex

        def _invalidate(self) -> None: ...
        def compute_param_encodings(self) -> None: ...
        def get_weight(self, name: str) -> np.ndarray: ...
        def replace_weight(self, name: str, values: np.ndarray, *, encoding: Any = None, freeze: bool = False) -> None: ...
        def transaction(self) -> Any: ...
        def sim_model(self) -> onnx.ModelProto: ...
        def snapshot(self) -> SimState: ...

    def get_supported_kernels(self) -> dict:
        """The config's ``supported_kernels`` in AIMET's shape: ``{"defaults": [kernel, ...] or {}, "<OpType>":
        [kernel, ...]}``, each kernel ``{"activation": {"bitwidth", "dtype"}, "param": {...}}`` (plain dicts)."""
        def plain(kernels) -> list[dict]:
            return [{side: dict(values) for side, values in kernel.items()} for kernel in kernels]

        found: dict[str, Any] = {"defaults": plain(self.config.supported_kernels) if self.config.supported_kernels
                                 else {}}
        for op_type, rule in self.config.op_types.items():
            if rule.supported_kernels:
                found[op_type] = plain(rule.supported_kernels)
        return found

    def fold_param_quantizers(self) -> list[str]:
        """Bake each enabled integer parameter quantizer's fake-quantized values into its weights and freeze its
        encoding (module docstring); returns the folded tensors (AIMET returns None). Sessions get the folded
        weights on next use; `snapshot`/`restore` can undo it."""
        self.compute_param_encodings()
        folded: list[str] = []
        with self.transaction():  # all or nothing
            for q in self._quantizers:
                enc = q.encoding
                if (q.role != "param" or not q.enabled or q.spec.is_float or enc is None or enc.bits > FOLDABLE_BITS
                        or not all(self._index.is_constant(t) for t in q.tensors)):
                    continue
                for tensor in q.tensors:
                    values = self.get_weight(tensor)
                    self.replace_weight(tensor, fake_values(values, enc).astype(values.dtype, copy=False))
                    folded.append(tensor)
                if not q.is_encoding_frozen():
                    q.freeze_encodings()
        _log.info("folded %d parameter quantizers into their weights", len(folded))
        return folded

    @classmethod
    def remove_quantizers(cls, model) -> onnx.ModelProto:
        """AIMET's ``QcQuantizeOp`` nodes removed from ``model`` (a ModelProto, in place, or ``sim.model``) and
        their readers rewired to the unquantized tensors; returns the ModelProto. ``sim.model`` is quantsim's
        float model: it holds no quantizer nodes and comes back as it is. QuantizeLinear/DequantizeLinear
        nodes are not quantsim's quantizers and stay (warned)."""
        proto = as_model_proto(model)
        if not isinstance(proto, onnx.ModelProto):
            raise InvalidTypeError(f"remove_quantizers takes an onnx.ModelProto or sim.model, got {type(model).__name__}")
        renamed = {node.output[0]: node.input[0] for graph in _graphs(proto.graph) for node in graph.node
                   if node.op_type == "QcQuantizeOp" and node.input and node.output}
        for graph in _graphs(proto.graph):
            kept = [node for node in graph.node if node.op_type != "QcQuantizeOp"]
            if len(kept) != len(graph.node):
                del graph.node[:]
                graph.node.extend(kept)
            for node in graph.node:
                for i, name in enumerate(node.input):
                    node.input[i] = renamed.get(name, name)
                for i, name in enumerate(node.output):
                    node.output[i] = renamed.get(name, name)
            for output in graph.output:
                output.name = renamed.get(output.name, output.name)
        if not renamed and any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node):
            warn_at_caller("remove_quantizers: QuantizeLinear/DequantizeLinear nodes are left in place (only AIMET's "
                           "QcQuantizeOp nodes are removed); a sim's float model is sim.model.model, and "
                           "QuantizationSimModel.from_onnx_qdq(model) reads a QDQ model's float model and encodings",
                           UserWarning)
        return proto

    def _node_named(self, op) -> onnx.NodeProto:
        name = op if isinstance(op, str) else getattr(op, "name", None)
        node = next((n for n in self._index.nodes if n.name == name), None) if isinstance(name, str) else None
        if node is None:
            close = closest_names(str(name), [n.name for n in self._index.nodes])
            raise InvalidArgumentError(f"no node {name!r} in the prepared model (ops are named by their ONNX node "
                                       f"name{'; closest: ' + ', '.join(map(repr, close)) if close else ''})")
        return node

    def get_op_quantizers(self, op) -> tuple[list[QcQuantizeOp], list[QcQuantizeOp], dict[str, QcQuantizeOp]]:
        """``(input quantizers, output quantizers, {param type: quantizer})`` of the node named ``op`` (a name,
        or anything with a ``.name``). Input quantizers are those of inputs no node produces that are not
        parameters (graph inputs, constants of elementwise ops), as in AIMET; disabled ones included."""
        node = self._node_named(op)
        table = self.qc_quantize_op_dict
        inputs = [table[t] for t in node.input if t in table and table[t].role != "param"
                  and self._index.producer_of(t) is None]
        outputs = [table[t] for t in node.output if t in table]
        params = {table[t].param_type or "weight": table[t] for t in node.input if t in table and table[t].role == "param"}
        return inputs, outputs, params

    def set_quantizers(self, quantizer_dict: Mapping[str, QcQuantizeOp]) -> None:
        """Tie each ``tensor`` to ``quantizer``, one of this sim's quantizers of the same role and shape (AIMET's
        way of sharing one quantizer between tensors). Checked first: on an error nothing changes. A tie is
        structure, not quantizer state: `snapshot`/`restore` do not undo it."""
        known = {id(q) for q in self._quantizers}
        for tensor, quantizer in quantizer_dict.items():
            if not isinstance(quantizer, QcQuantizeOp):
                raise InvalidTypeError(f"set_quantizers: {tensor!r} -> {type(quantizer).__name__}, not a QcQuantizeOp")
            if id(quantizer) not in known:
                raise InvalidArgumentError(f"set_quantizers: the quantizer for {tensor!r} is not one of this sim's "
                                           "(tie tensors to this sim's quantizers; to copy settings from another "
                                           "sim use set_qspec / load_encodings)")
            current = self.qc_quantize_op_dict[tensor]  # an unknown tensor: UnknownQuantizerError
            per_tensor = isinstance(quantizer.spec.granularity, PerTensor)
            if current.role != quantizer.role or (current.shape != quantizer.shape and not per_tensor):
                raise InvalidArgumentError(f"set_quantizers: {tensor!r} ({current.role}, shape {current.shape}) cannot "
                                           f"share quantizer {quantizer.name!r} ({quantizer.role}, shape {quantizer.shape})")
        for tensor, quantizer in quantizer_dict.items():
            current = self.qc_quantize_op_dict[tensor]
            if current is quantizer:
                continue
            current.tensors = tuple(t for t in current.tensors if t != tensor)
            if not current.tensors:
                self._quantizers.remove(current)
            quantizer.tensors = (*quantizer.tensors, tensor)
            self.qc_quantize_op_dict[tensor] = quantizer
        self._invalidate()

    def save_model_graph(self, filename_prefix: str) -> None:
        """Write the sim's graph (Q/DQ form, `sim_model`) to ``<path>/<filename_prefix>.onnx``; needs ``path``."""
        from quantsim.graph.file_set import check_file_name
        from quantsim.graph.model_io import save_model_atomic

        if self.path is None:
            raise InvalidStateError("save_model_graph needs the sim's path: QuantizationSimModel(..., path=folder)")
        check_file_name(filename_prefix)
        save_model_atomic(self.sim_model(), Path(self.path) / f"{filename_prefix}.onnx")

    @staticmethod
    def build_session(model, providers, user_onnx_libs=None, path=None):
        """Deprecated in AIMET: an onnxruntime session of ``model`` (a ModelProto or ``sim.model``)."""
        from quantsim.graph.session import make_session

        warn_at_caller("QuantizationSimModel.build_session is deprecated (as in AIMET): use sim.session, or "
                       "onnxruntime.InferenceSession(model.SerializeToString())", DeprecationWarning)
        if user_onnx_libs:
            raise InvalidArgumentError("user_onnx_libs is not supported: quantsim uses standard ONNX operators only")
        if path is not None:
            warn_at_caller("build_session(path=...) has no effect: the session is built in memory", UserWarning)
        return make_session(as_model_proto(model), providers)

    @property
    def input_quantizers_name(self) -> list[str]:
        """Constants quantized as activations (AIMET's input quantizers: node inputs no node produces that are
        not parameters, e.g. the constant of ``Add(x, c)``)."""
        return [t for t in self.activation_names if self._index.is_constant(t)]

    @property
    def activation_dtypes(self) -> dict[str, np.dtype]:
        """``{tensor: numpy dtype}`` of every quantized tensor (parameters included, as in AIMET)."""
        types = self._index.elem_type
        return {t: np.dtype(helper.tensor_dtype_to_np_dtype(types[t]))
                for t in [*self.param_names, *self.activation_names] if t in types}

    @property
    def input_name_to_nodes(self) -> dict[str, list[onnx.NodeProto]]:
        """``{tensor: nodes reading it}`` of the prepared model (AIMET: of its sim graph)."""
        return {name: [use.node for use in uses] for name, uses in self._index.consumers.items()}

    @property
    def output_name_to_node(self) -> dict[str, onnx.NodeProto]:
        """``{tensor: the node writing it}`` of the prepared model (AIMET: of its sim graph)."""
        return {name: node for node in self._index.nodes for name in node.output if name}

    @property
    def quant_args(self) -> dict:
        """What AIMET writes as ``quantizer_args`` in 0.6.1/1.0.0 files (scheme, bitwidths, dtype, symmetry,
        per-channel)."""
        from quantsim.encodings.transfer import _quantizer_args

        return _quantizer_args(self)

    @property
    def connected_graph(self):
        raise NotSupportedError("quantsim has no ConnectedGraph: the graph is sim.model.model (an onnx.ModelProto); "
                                "sim.weighted_layers() lists the Conv/Gemm/MatMul layers with their quantizers and "
                                "sim.get_op_quantizers(node_name) gives an op's quantizers")


def clamp_activation_encodings(quant_sim: QuantizationSimModel, clamp_val: float) -> list[str]:
    """AIMET's ``aimet_onnx.quantsim.clamp_activation_encodings``: every enabled, unfrozen activation encoding
    whose range reaches outside ``[-clamp_val, clamp_val]`` is clamped to it and its grid recomputed
    (`QcQuantizeOp.clip_and_recompute_encodings`). Returns the clamped tensors (AIMET returns None)."""
    if not isinstance(quant_sim, AimetSurface):
        raise InvalidTypeError(f"clamp_activation_encodings takes a QuantizationSimModel, got {type(quant_sim).__name__}")
    clamped, seen = [], set()
    for name in quant_sim.activation_names:
        quantizer = quant_sim.qc_quantize_op_dict[name]
        if id(quantizer) in seen:
            continue
        seen.add(id(quantizer))
        if quantizer.clip_and_recompute_encodings(clamp_val):
            _log.info("Clamped tensor %s", name)
            clamped.append(name)
    return clamped
