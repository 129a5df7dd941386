"""AIMET's exception rules for norm layers' parameter quantizers (reference §1.3 step 8), as one pure rule and as
a pass over a live sim.

An integer parameter quantizer of BatchNormalization, LayerNormalization, GroupNormalization,
InstanceNormalization or RMSNormalization keeps at least 8 bits. BatchNormalization / LayerNormalization
parameters are symmetric only at 16 bits or more (BN's gamma is all positive: an asymmetric 8-bit grid spends
every code on its range where a signed symmetric one wastes half). Group / Instance / RMS normalization
parameters take the symmetry of the op's enabled output quantizer (asymmetric without one) and, when that
output is an integer one, its bitwidth.

Placement applies `norm_param_rule` when it plans the quantizers; `apply_exception_rules` re-applies it to a
sim whose precisions were changed afterwards (aimet-onnx's mixed-precision search does so at every point it
evaluates, so a norm scale never drops to 4 bits with the weights around it).
"""
from __future__ import annotations

from typing import Any

from quantsim.core.dtypes import qtype

__all__ = ["NORM_PARAM_RULE_OPS", "norm_param_rule", "apply_exception_rules"]

NORM_PARAM_RULE_OPS = frozenset({"BatchNormalization", "LayerNormalization", "GroupNormalization",
                                 "InstanceNormalization", "RMSNormalization"})
_OUTPUT_FOLLOWING = frozenset({"GroupNormalization", "InstanceNormalization", "RMSNormalization"})


def norm_param_rule(op_type: str, dtype: qtype, output: tuple[qtype, bool] | None) -> tuple[qtype, bool] | None:
    """``(dtype, symmetric)`` an integer parameter quantizer of a ``op_type`` norm layer takes, given its own
    ``dtype`` and the op's enabled output quantizer ``(dtype, symmetric)`` (None when it has none); None when
    the rule does not apply (another op type, a float parameter)."""
    if op_type not in NORM_PARAM_RULE_OPS or dtype.is_float:
        return None
    bits = max(dtype.bits, 8)
    if op_type in _OUTPUT_FOLLOWING:
        if output is None:
            return qtype.int(bits), False
        out_dtype, out_symmetric = output
        return qtype.int(out_dtype.bits if not out_dtype.is_float else bits), bool(out_symmetric)
    return qtype.int(bits), bits >= 16


def apply_exception_rules(sim: Any) -> list[str]:
    """Re-apply `norm_param_rule` to every enabled integer parameter quantizer of the sim's norm layers (after
    precisions were changed, e.g. by a mixed-precision candidate); returns the names of the quantizers changed
    (their encodings are dropped: calibrate again)."""
    quantizers = sim.qc_quantize_op_dict
    changed: list[str] = []
    for node in sim.graph_index.nodes:
        if node.op_type not in NORM_PARAM_RULE_OPS or not node.output:
            continue
        out = quantizers.get(node.output[0])
        output = (out.precision(), out.use_symmetric_encodings) if out is not None and out.enabled else None
        for name in node.input[1:]:
            q = quantizers.get(name)
            if q is None or q.role != "param" or not q.enabled:
                continue
            rule = norm_param_rule(node.op_type, q.precision(), output)
            if rule is None or rule == (q.precision(), q.use_symmetric_encodings):
                continue
            if q.precision() != rule[0]:
                q.set_precision(rule[0])
            if q.use_symmetric_encodings != rule[1]:
                q.use_symmetric_encodings = rule[1]
            changed.append(name)
    return changed
