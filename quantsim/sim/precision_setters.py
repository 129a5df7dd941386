"""AIMET's precision setters: ``sim.set_tensor_precision``, ``set_param_type`` and
``set_blockwise_quantization_for_weights`` (aimet_onnx.quantsim), over the sim's quantizer objects.

* `set_tensor_precision`: the quantizer that decides a tensor's values is the tensor's own, or, where the
  tensor has none (the output of a Reshape, a MaxPool, a Relu sharing its input's grid ...), the closest
  enabled one found by walking up through grid-preserving ops (`quantsim.graph.op_facts`), as AIMET does.
* `deciding_quantizer` (what precision overrides set): the same walk, and further: a tensor whose own
  quantizer placement disabled because its only reader is fused with its producer (Conv -> Relu, MatMul ->
  bias Add, a config supergroup: the reader is not a weighted op and its other inputs are constants or its
  producer's inputs) is decided by that reader's output grid, the one the fused op writes. AIMET's
  ``set_tensor_precision`` refuses such a tensor (no enabled quantizer upstream), and so does ours.
* `set_param_type`: the parameter quantizers (biases excepted) of the chosen nodes.
* `set_blockwise_quantization_for_weights`: the weight quantizers of the chosen op types become symmetric
  blockwise grids: one scale per output channel and block of ``block_size`` input channels.
* `set_lpbq_for_params` / `set_grouped_blockwise_quantization_for_weights`: the same blocks with LPBQ scales
  (integer block scales under one float scale per channel; `quantsim.core.lpbq`).

Every setter validates all its targets before changing any (a refused name or shape changes nothing), and
returns the quantizers it changed. Frozen quantizers keep their spec (with the quantizer's own warning).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from quantsim.core.dtypes import qtype
from quantsim.core.spec import LPBQ, PerBlock, QSpec
from quantsim.errors import InvalidArgumentError, InvalidTypeError, warn_at_caller
from quantsim.graph.op_facts import WEIGHTED_OPS, facts_of

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel
    from quantsim.sim.quantizer import QcQuantizeOp

__all__ = [
    "deciding_quantizer",
    "set_tensor_precision",
    "set_param_type",
    "set_blockwise_quantization_for_weights",
    "set_lpbq_for_params",
    "set_grouped_blockwise_quantization_for_weights",
]


def _closest_quantizer(sim: QuantizationSimModel, tensor: str) -> QcQuantizeOp | None:
    """``tensor``'s enabled quantizer, or the closest one upstream through grid-preserving ops."""
    index, seen = sim.graph_index, set()
    while tensor not in seen:
        seen.add(tensor)
        q = sim.qc_quantize_op_dict.get(tensor)
        if q is not None and q.enabled:
            return q
        producer = index.producer.get(tensor)
        if producer is None or not facts_of(producer[0].op_type).grid_preserving or not producer[0].input:
            return None
        tensor = producer[0].input[0]
    return None


def _fused_reader(sim: QuantizationSimModel, tensor: str) -> str | None:
    """The output of the op fused after ``tensor``'s producer, when placement disabled ``tensor``'s own
    quantizer for it: ``tensor``'s only reader, not a weighted op, whose other inputs are constants or inputs
    of the producer (a tensor an automatic decision left float is not fused)."""
    index = sim._index
    own = sim.qc_quantize_op_dict.get(tensor)
    producer, reader = index.producer_of(tensor), index.single_consumer(tensor)
    if own is None or own.enabled or producer is None or reader is None or not reader.output \
            or reader.op_type in WEIGHTED_OPS or any(tensor in d.tensors for d in sim.decisions):
        return None
    if not all(name == tensor or index.is_constant(name) or name in producer.input for name in reader.input if name):
        return None
    return reader.output[0]


def deciding_quantizer(sim: QuantizationSimModel, tensor: str) -> QcQuantizeOp | None:
    """The enabled quantizer that decides ``tensor``'s values in the sim (module docstring): its own, the
    closest upstream through grid-preserving ops, or, for the output of an op fused with its reader, the
    fused output's; None when the tensor stays float. An unknown tensor name is an error."""
    if tensor not in sim._index.elem_type and tensor not in sim._index.producer:
        raise InvalidArgumentError(f"{tensor!r} is not a tensor of {sim._label}")
    seen = set()
    while tensor not in seen:
        seen.add(tensor)
        q = _closest_quantizer(sim, tensor)
        if q is not None:
            return q
        fused = _fused_reader(sim, tensor)
        if fused is None:
            return None
        tensor = fused
    return None


def set_tensor_precision(sim: QuantizationSimModel, names: str | Iterable[str], precision: qtype | str, *,
                         strict: bool = True) -> list[QcQuantizeOp]:
    """Set the precision (e.g. ``"float16"``, ``int16``) of the quantizer deciding each tensor in ``names``.

    A name with no such quantizer is an error naming it with ``strict=True``, else skipped with a warning.
    """
    dtype = qtype.as_qtype(precision)
    names = [names] if isinstance(names, str) else list(names)
    chosen: dict[int, QcQuantizeOp] = {}
    missing = []
    for name in names:
        if name not in sim.graph_index.elem_type and name not in sim.graph_index.producer:
            raise InvalidArgumentError(f"set_tensor_precision: {name!r} is not a tensor of {sim._label}")
        q = _closest_quantizer(sim, name)  # AIMET's walk: a fused output (deciding_quantizer's extra) is refused
        if q is None:
            missing.append(name)
        else:
            chosen[id(q)] = q
    if missing:
        message = f"set_tensor_precision: no enabled quantizer decides {missing[:5]} (float values, or disabled)"
        if strict:
            raise InvalidArgumentError(message + "; pass strict=False to skip them")
        warn_at_caller(message + "; skipped")
    with sim.transaction():
        for q in chosen.values():
            q.set_precision(dtype)
    return list(chosen.values())


def _nodes(sim: QuantizationSimModel, op_types: Iterable[str] | None, nodes_to_include: Iterable[str] | None,
           nodes_to_exclude: Iterable[str] | None, where: str) -> list:
    graph_nodes = {node.name: node for node in sim.graph_index.nodes}  # not sim.model: that copies mapped weights in
    exclude = set(nodes_to_exclude or ())
    unknown = sorted((set(nodes_to_include or ()) | exclude) - set(graph_nodes))
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown node name(s) {unknown[:5]} in {sim._label}")
    if nodes_to_include is not None:
        picked = [graph_nodes[name] for name in nodes_to_include]
    else:
        wanted = set([op_types] if isinstance(op_types, str) else (op_types or ()))
        picked = [node for node in graph_nodes.values() if node.op_type in wanted]
    return [node for node in picked if node.name not in exclude]


def set_param_type(sim: QuantizationSimModel, param_type: qtype | str, *, op_types: Iterable[str] | None = None,
                   nodes_to_include: Iterable[str] | None = None, nodes_to_exclude: Iterable[str] | None = None,
                   strict: bool = True) -> list[QcQuantizeOp]:
    """Set the parameter quantizers (biases excepted) of the nodes given by ``op_types`` or
    ``nodes_to_include`` (minus ``nodes_to_exclude``) to ``param_type``. With ``strict``, a chosen node
    without such a quantizer is an error."""
    if (op_types is None) == (nodes_to_include is None):
        raise InvalidArgumentError("set_param_type: give exactly one of op_types and nodes_to_include")
    dtype = qtype.as_qtype(param_type)
    chosen: dict[int, QcQuantizeOp] = {}
    for node in _nodes(sim, op_types, nodes_to_include, nodes_to_exclude, "set_param_type"):
        found = [q for name in node.input if (q := sim.qc_quantize_op_dict.get(name)) is not None
                 and q.role == "param" and q.param_type != "bias"]
        if not found and strict:
            raise InvalidArgumentError(f"set_param_type: node {node.name!r} ({node.op_type}) has no parameter "
                                       "quantizer; pass strict=False to skip it")
        chosen.update((id(q), q) for q in found)
    with sim.transaction():
        for q in chosen.values():
            q.set_precision(dtype)
    return list(chosen.values())


def _block_plans(sim: QuantizationSimModel, nodes: list, block_size: int, spec_for, where: str,
                 strict: bool) -> list[tuple[QcQuantizeOp, QSpec]]:
    """(weight quantizer, new spec) of each chosen Conv/ConvTranspose/Gemm/MatMul node whose weight has a
    channel axis; ``spec_for(q, axis, block_axis)`` makes the spec. A weight whose input-channel count
    ``block_size`` does not divide is an error with ``strict``, else left as it is with a warning."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise InvalidArgumentError(f"{where}: block_size must be a positive integer, got {block_size!r}")
    plans, skipped = [], []
    for node in nodes:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        q = sim.qc_quantize_op_dict.get(node.input[1])
        if q is None or q.role != "param" or q.channel_axis is None or not q.shape:
            continue
        rank = len(q.shape)
        axis = q.channel_axis % rank
        block_axis = (1 - axis) if rank == 2 else (1 if axis == 0 else 0)
        if q.shape[block_axis] % block_size:
            skipped.append(f"{node.name!r} (weight {q.name!r}: {q.shape[block_axis]} input channels)")
            continue
        plans.append((q, spec_for(q, axis, block_axis)))
    if skipped:
        message = f"block size {block_size} does not divide the input channels of {', '.join(skipped[:5])}"
        if strict:
            raise InvalidArgumentError(f"{where}: {message}")
        warn_at_caller(f"{where}: {message}; left as they were")
    return plans


def _apply(sim: QuantizationSimModel, plans: list[tuple[QcQuantizeOp, QSpec]]) -> list[QcQuantizeOp]:
    with sim.transaction():
        for q, spec in plans:
            q.set_qspec(spec)
    return [q for q, _ in plans]


def set_blockwise_quantization_for_weights(sim: QuantizationSimModel, op_types: str | Iterable[str], bitwidth: int,
                                           symmetric: bool, block_size: int, strict: bool = False,
                                           nodes_to_exclude: Iterable[str] | None = None) -> list[QcQuantizeOp]:
    """Blockwise ``bitwidth``-bit weights for Conv/ConvTranspose/Gemm/MatMul nodes of ``op_types``: one
    scale per output channel and block of ``block_size`` input channels. A weight whose input-channel count
    ``block_size`` does not divide is an error with ``strict``, else left as it is with a warning."""
    where = "set_blockwise_quantization_for_weights"
    dtype = qtype.int(bitwidth)
    nodes = _nodes(sim, op_types, None, nodes_to_exclude, where)
    plans = _block_plans(sim, nodes, block_size, lambda q, axis, block_axis: q.spec.with_(
        dtype=dtype, symmetric=bool(symmetric), granularity=PerBlock(axis, block_axis, block_size)), where, strict)
    return _apply(sim, plans)


def _lpbq_plans(sim: QuantizationSimModel, nodes: list, bitwidth: int, block_size: int, scale_bits: int, where: str,
                strict: bool) -> list[tuple[QcQuantizeOp, QSpec]]:
    if isinstance(scale_bits, bool) or not isinstance(scale_bits, int) or not 1 <= scale_bits <= 16:
        raise InvalidArgumentError(f"{where}: the block scales need 1..16 bits, got {scale_bits!r}")
    dtype = qtype.int(bitwidth)
    return _block_plans(sim, nodes, block_size, lambda q, axis, block_axis: q.spec.with_(
        dtype=dtype, symmetric=True, strict_symmetric=False, unsigned_symmetric=False,
        granularity=LPBQ(axis, block_axis, block_size, scale_bits)), where, strict)


def set_lpbq_for_params(sim: QuantizationSimModel, bitwidth: int, block_size: int, *,
                        op_types: str | Iterable[str] | None = None, nodes_to_exclude: Iterable[str] | None = None,
                        nodes_to_include: Iterable[str] | None = None, strict: bool | None = None) -> list[QcQuantizeOp]:
    """Low-power blockwise quantization (`quantsim.core.spec.LPBQ`) of the weights of the nodes of ``op_types``
    (minus ``nodes_to_exclude``) or of ``nodes_to_include``: ``bitwidth``-bit symmetric codes in blocks of
    ``block_size`` input channels, each block's scale a ``bitwidth``-bit integer times one float scale per
    output channel (AIMET's decompressed bitwidth is ``2 * bitwidth``). As in aimet-onnx, ``nodes_to_include``
    excludes ``op_types``, ``nodes_to_exclude`` and ``strict`` (a weight ``block_size`` does not divide is then
    an error); with ``op_types`` such a weight is an error only with ``strict=True``, else left with a warning.
    Returns the quantizers changed; biases keep their quantizers (int32 bias scales are derived at export from
    the per-channel float scale)."""
    where = "set_lpbq_for_params"
    if nodes_to_exclude and nodes_to_include:
        raise InvalidArgumentError(f"{where}: give nodes_to_exclude or nodes_to_include, not both")
    if op_types and nodes_to_include:
        raise InvalidArgumentError(f"{where}: give op_types or nodes_to_include, not both")
    if op_types is None and nodes_to_include is None:
        raise InvalidArgumentError(f"{where}: give op_types or nodes_to_include")
    if nodes_to_include is not None:
        if strict is not None:
            raise InvalidTypeError(f"{where}: strict cannot be given with nodes_to_include (those nodes are always "
                                   "strict)")
        nodes = _nodes(sim, None, list(nodes_to_include), None, where)
        strict = True
    else:
        nodes = _nodes(sim, op_types, None, nodes_to_exclude, where)
    return _apply(sim, _lpbq_plans(sim, nodes, bitwidth, block_size, bitwidth, where, bool(strict)))


def set_grouped_blockwise_quantization_for_weights(sim: QuantizationSimModel, op_types: str | Iterable[str],
                                                   bitwidth: int, decompressed_bw: int, block_size: int,
                                                   strict: bool = False, nodes_to_exclude: Iterable[str] | None = None,
                                                   *, excluded_nodes: Iterable[str] | None = None) -> list[QcQuantizeOp]:
    """AIMET's older (deprecated there) form of `set_lpbq_for_params`: LPBQ weights of ``bitwidth`` bits for the
    nodes of ``op_types`` (minus ``nodes_to_exclude``) whose block scales take ``decompressed_bw - bitwidth``
    bits. ``excluded_nodes`` is the deprecated alias of ``nodes_to_exclude``. Warns with a DeprecationWarning
    pointing at `set_lpbq_for_params`, as aimet-onnx does."""
    where = "set_grouped_blockwise_quantization_for_weights"
    warn_at_caller(f"{where} is deprecated. Use 'set_lpbq_for_params' instead.", DeprecationWarning)
    if excluded_nodes is not None:
        if nodes_to_exclude is not None:
            raise InvalidArgumentError(f"{where}: give nodes_to_exclude or its deprecated alias excluded_nodes, "
                                       "not both")
        warn_at_caller(f"{where}: 'excluded_nodes' is deprecated; use 'nodes_to_exclude'", DeprecationWarning)
        nodes_to_exclude = excluded_nodes
    if isinstance(decompressed_bw, bool) or not isinstance(decompressed_bw, int):
        raise InvalidArgumentError(f"{where}: decompressed_bw must be an integer, got {decompressed_bw!r}")
    nodes = _nodes(sim, op_types, None, nodes_to_exclude, where)
    return _apply(sim, _lpbq_plans(sim, nodes, bitwidth, block_size, decompressed_bw - bitwidth, where, strict))
