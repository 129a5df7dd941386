"""Readable text summary of a sim: quantizers by tensor, the automatic decisions and what stays in float,
and why, and what still separates it from its deployed models (`deployment_gap`)."""
from __future__ import annotations

import numpy as np

from quantsim.sim.deployment_gap import deployment_differences

__all__ = ["summarize"]


def _range(q) -> str:
    enc = q.encoding
    if q.spec.is_float:
        return "fp16 cast"
    if enc is None:
        return "uncalibrated"
    lo, hi = np.min(enc.min), np.max(enc.max)
    return f"[{lo:.6g}, {hi:.6g}]" + (f" over {enc.scale.size} scales" if enc.scale.size > 1 else "")


def summarize(sim) -> str:
    """One line per quantized tensor (role, spec, enabled, frozen, range), each automatic decision with its
    reason, and the float leftovers."""
    rows = [("tensor", "role", "spec", "enabled", "frozen", "range")]
    for q in sim.quantizers:
        for tensor in q.tensors:
            tied = "" if tensor == q.name else f" (tied to {q.name})"
            rows.append((tensor + tied, q.role, q.spec.describe(), "yes" if q.enabled else "no",
                         "yes" if q.is_encoding_frozen() else "no", _range(q)))
    widths = [min(max(len(r[i]) for r in rows), 60) for i in range(len(rows[0]))]
    lines = [f"QuantizationSimModel of {sim.source_label}: {len(sim.quantizers)} quantizers "
             f"({sum(q.enabled for q in sim.quantizers)} enabled), param {sim.param_type}, "
             f"activation {sim.activation_type}, scheme {sim.quant_scheme_name}, config {sim.config.source}"]
    lines += ["  ".join(cell[:60].ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if sim.decisions:
        lines.append("automatic decisions:")
        lines += [f"  {decision}" for decision in sim.decisions]
    if sim.left_in_float:
        lines.append("left in float:")
        lines += [f"  {what}: {why}" for what, why in sim.left_in_float]
    gap = deployment_differences(sim)
    if gap:
        lines.append("sim vs deployed (QDQ / integer exports on onnxruntime's integer kernels):")
        lines += [f"  {line}" for line in gap]
    return "\n".join(lines)
