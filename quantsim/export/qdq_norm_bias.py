"""int32 biases of norm layers in the QDQ export (AIMET's statistical bias encoding, reference §1.7).

A BatchNormalization / InstanceNormalization / LayerNormalization / GroupNormalization whose input and scale
(weight) both come from an integer DequantizeLinear gets its float bias replaced by
``DequantizeLinear(int32 codes, s)`` with the statistical scale ``s = max(|b| / 2^31, floor)``
(`quantsim.encodings.int32_bias.statistical_bias_scale`; one scale when the weight is per tensor, one per
channel when it is), zero point 0: the entry aimet-onnx's ``to_onnx_qdq(export_int32_bias=True)`` and
``encodings_to_onnx_qdq`` write, and the one a 2.0.0 encodings file names. The grid is the finest that holds
every value (``|b| / s <= 2^31``), so the values change by at most ``s / 2`` (about ``max|b| * 2.3e-10``).
Recurrent layers keep float biases: the export stores their weights dequantized (`quantsim.export.qdq`).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.encodings.int32_bias import statistical_bias_scale
from quantsim.export.qdq import initializers_to_nodes
from quantsim.graph.deferred import DeferredWeights
from quantsim.graph.index import GraphIndex

__all__ = ["quantize_norm_biases", "NORM_BIAS_OPS"]

NORM_BIAS_OPS = frozenset({"BatchNormalization", "InstanceNormalization", "LayerNormalization", "GroupNormalization"})
_INT32 = np.iinfo(np.int32)
_FLOAT8 = (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2)


def _integer_dq_scale(index: GraphIndex, name: str) -> np.ndarray | None:
    """The scale of the integer DequantizeLinear producing ``name``, or None."""
    node = index.producer_of(name)
    if node is None or node.op_type != "DequantizeLinear" or not index.is_constant(node.input[1]):
        return None
    if index.code_type(node) in _FLOAT8:
        return None
    if any(a.name == "block_size" for a in node.attribute):
        return None
    return np.asarray(index.constant_value(node.input[1]))


def quantize_norm_biases(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """Replace the float bias of each eligible norm layer with int32 codes + DequantizeLinear (module docstring)."""
    index = GraphIndex(model, weights=weights)
    replaced: dict[str, onnx.NodeProto] = {}
    for node in index.nodes:
        if node.op_type not in NORM_BIAS_OPS or len(node.input) < 3 or not node.input[2]:
            continue
        bias_name = node.input[2]
        if bias_name in replaced or not index.is_constant(bias_name) or len(index.uses(bias_name)) != 1:
            continue
        if _integer_dq_scale(index, node.input[0]) is None:
            continue
        weight_scale = _integer_dq_scale(index, node.input[1])
        if weight_scale is None:
            continue
        bias = np.asarray(index.constant_value(bias_name))
        if not np.issubdtype(bias.dtype, np.floating) or not np.isfinite(bias).all():
            continue
        per_channel = weight_scale.ndim > 0 and bias.ndim == 1 and weight_scale.size == bias.size
        scale = statistical_bias_scale(bias, per_channel).astype(bias.dtype)
        codes = np.clip(np.rint(bias.astype(np.float64) / scale.astype(np.float64)), _INT32.min, _INT32.max)
        codes_name = index.fresh_name(f"{bias_name}/int32")
        scale_name = index.fresh_name(f"{bias_name}/int32_scale")
        model.graph.initializer.extend([numpy_helper.from_array(codes.astype(np.int32).reshape(bias.shape), codes_name),
                                        numpy_helper.from_array(scale, scale_name)])
        attrs: dict = {"axis": 0} if scale.ndim else {}
        replaced[bias_name] = helper.make_node("DequantizeLinear", [codes_name, scale_name], [bias_name],
                                               name=index.fresh_name(f"{bias_name}/dequantize"), **attrs)
    initializers_to_nodes(model, replaced)
    return model
