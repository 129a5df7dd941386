"""int32 bias encodings of an export (AIMET's rules, reference §1.7): which biases get one, and its scale.

A bias gets an int32 encoding when its layer's weight and its input have integer encodings (the input's is the
record of the tensor itself or, for a data-movement output, the derived one) and the bias has none of its own:

* analytic, ``s_in * s_w``, for Conv / ConvTranspose / Gemm and MatMul + constant Add (the accumulator grid of
  an integer kernel), per output channel when the weight is per channel along its output axis (blockwise
  weights: the largest scale over each channel's blocks; LPBQ weights: their per-channel float scale);
* statistical, ``max(|b| / 2^31, floor)``, for the biases of norm layers (BatchNormalization, Instance/Layer/
  GroupNormalization) and recurrent layers, and for a linear layer whose weight is per channel along an axis
  that is not its output axis: the finest grid that holds every value, ``floor = max(0.01 / (2^32 - 1),
  smallest normal of the bias dtype)``; per channel when the weight is, otherwise the largest over channels.

The encoding is signed, symmetric, zero point 0, codes ``-2^31 .. 2^31 - 1``. PURE: reads the graph index and
the records only.
"""
from __future__ import annotations

import numpy as np
import onnx

from quantsim.core.bias import bias_scale
from quantsim.core.lpbq import decompose_block_scales
from quantsim.core.numerics import Encoding, grid_bounds
from quantsim.encodings.record import TensorEncoding
from quantsim.graph.index import GraphIndex
from quantsim.graph.op_facts import BIAS_SLOT

__all__ = ["int32_bias_encodings", "INT32_MINIMUM_SCALE", "statistical_bias_scale"]

INT32_MINIMUM_SCALE = 0.01 / (2**32 - 1)
"""The smallest statistical bias scale (AIMET's ``_get_minimum_scale(2^32 - 1)``)."""

_STATISTICAL_BIAS = {"BatchNormalization": 2, "InstanceNormalization": 2, "LayerNormalization": 2,
                     "GroupNormalization": 2, "LSTM": 3, "GRU": 3, "RNN": 3}
_ANALYTIC = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def statistical_bias_scale(bias: np.ndarray, per_channel: bool) -> np.ndarray:
    """``max(|b| / 2^31, floor)`` per element, or its largest value when ``per_channel`` is False."""
    values = np.asarray(bias)
    tiny = float(np.finfo(values.dtype).tiny) if np.issubdtype(values.dtype, np.floating) else 0.0
    scale = np.maximum(np.abs(values.astype(np.float64)) / 2**31, max(INT32_MINIMUM_SCALE, tiny))
    return scale.reshape(-1) if per_channel else np.asarray(scale.max(initial=INT32_MINIMUM_SCALE))


def _output_axis(node: onnx.NodeProto, weight_rank: int) -> int:
    """The weight axis that indexes output channels (AIMET's ``_get_quantization_axes``)."""
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    if node.op_type == "MatMul":
        return weight_rank - 1
    return 0


def _bias_of(index: GraphIndex, node: onnx.NodeProto) -> str | None:
    if node.op_type == "MatMul":
        pair = index.bias_add(node.output[0]) if node.output else None
        return pair[1] if pair is not None else None
    slot = BIAS_SLOT.get(node.op_type, _STATISTICAL_BIAS.get(node.op_type))
    if slot is None or len(node.input) <= slot or not node.input[slot] or not index.is_constant(node.input[slot]):
        return None
    return node.input[slot]


def int32_bias_encodings(index: GraphIndex, records: list[TensorEncoding], quantized: set[str]) -> list[TensorEncoding]:
    """The int32 bias records of the layers whose input and weight have integer records in ``records``.
    ``quantized`` names the tensors the sim has a quantizer for (a bias without one gets none, as in AIMET);
    biases already in ``records`` keep their own encoding."""
    by_name = {r.name: r.encoding for r in records if not r.is_float and r.encoding is not None}
    lpbq_bits = {r.name: r.lpbq_scale_bits for r in records if r.lpbq_scale_bits is not None}
    qmin, qmax = grid_bounds(32, signed=True)
    out: list[TensorEncoding] = []
    done: set[str] = set()
    for node in index.nodes:
        if node.op_type not in _ANALYTIC and node.op_type not in _STATISTICAL_BIAS:
            continue
        bias = _bias_of(index, node)
        if bias is None or bias in by_name or bias in done or bias not in quantized or len(node.input) < 2:
            continue
        enc_in, enc_w = by_name.get(node.input[0]), by_name.get(node.input[1])
        if enc_in is None or enc_w is None or enc_in.fp8 is not None or enc_w.fp8 is not None:
            continue  # float (incl. float8) inputs or weights have no integer accumulator: the bias stays float
        w_axis = enc_w.axis
        per_channel = w_axis is not None
        scale = None
        if node.op_type in _ANALYTIC and enc_in.is_per_tensor:
            rank = len(index.shape.get(node.input[1]) or ())
            if w_axis is None or (rank and w_axis % rank == _output_axis(node, rank)):
                weight_scale = np.asarray(enc_w.scale)
                if node.input[1] in lpbq_bits:  # LPBQ: the per-channel float scale, as in aimet-onnx
                    weight_scale = decompose_block_scales(enc_w.scale, lpbq_bits[node.input[1]])[1]
                elif enc_w.block_size is not None and weight_scale.ndim == 2:
                    weight_scale = weight_scale.max(axis=1)
                scale = bias_scale(enc_in.scale, weight_scale).astype(np.float64)  # what the QDQ model uses
        if scale is None:
            scale = statistical_bias_scale(index.constant_value(bias), per_channel)
        shape = index.shape.get(bias)
        if scale.ndim and (not shape or int(np.prod(shape)) != scale.size):
            continue  # a bias that does not hold one value per output channel has no per-channel grid
        enc = Encoding(scale, np.zeros(scale.shape, np.int64), 32, True, qmin, qmax, True, 0 if scale.ndim else None)
        out.append(TensorEncoding.from_encoding(bias, enc, "param", tuple(shape) if shape else None))
        done.add(bias)
    return out
