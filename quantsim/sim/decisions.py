"""Automatic precision decisions, each with its reason: what the sim chose on its own, and why.

`Decision` records come from two places:

* placement (construction): masked attention scores, and fills built from constants and indices alone (a
  scatter max's identity), left float (`quantsim.graph.attention_masks`);
* calibration (`apply_calibrated_rules`, after every calibration while ``sim.range_health`` is on), from
  the calibrated statistics:

  1. **Untied Concat**: a Concat whose inputs share its output's grid (placement ties them) but whose
     calibrated ranges differ by at least ``(2**bits - 1) / FEW_CODES`` (16x at 8 bits: the narrowest input
     would fall on fewer than `FEW_CODES` codes of the shared grid) gets one quantizer per input, each
     calibrated on its own values, and its output left float. A YOLO-style head joining box coordinates in
     pixels with class probabilities keeps both. Float Concat between quantized inputs is what a QDQ model
     on onnxruntime (CPU, CUDA, TensorRT) runs as DequantizeLinear -> Concat; an integer-only target (one
     that cannot leave an op in float) can give the output a 16-bit grid instead
     (``sim.set_tensor_precision(output, "int16")`` and recalibrate). Grids below 8 bits keep their ties
     (a 4-bit grid is a deliberate choice of few codes).
  2. **Range health** (`quantsim.calibration.range_health`): an 8-bit activation whose calibration sample
     collapses onto fewer than `COLLAPSED_CODES` effective codes gets a 16-bit grid from the same statistics, or stays float
     when 16 bits collapse too (a fill of -1e9 next to values of order 1). Grids below 8 bits are an
     explicit choice of a coarse grid and are not checked; nor are frozen or fixed-range quantizers, nor
     outputs of ops with a bounded range (`BOUNDED_OUTPUT_OPS`: Softmax, Sigmoid, Tanh, ...), whose grid
     spans the function's range rather than a few outliers: a saturated 2-class Softmax puts its
     probabilities on codes 0, 1, 254, 255 and loses nothing that matters.

Decisions are listed by ``sim.summary()`` and kept in ``sim.decisions``. ``range_health=False`` (argument
or attribute) turns the calibrated rules off; what they already changed stays until the user changes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from quantsim.calibration.encode import encodings_for_stats
from quantsim.calibration.range_health import COLLAPSED_CODES, FEW_CODES, effective_codes, is_collapsed
from quantsim.calibration.run import CalibrationSession, TensorStats
from quantsim.core.dtypes import float16, int16
from quantsim.errors import TargetError, warn_at_caller
from quantsim.graph.op_facts import BOUNDED_OUTPUT_OPS
from quantsim.sim.quantizer import QcQuantizeOp
from quantsim.sim.target_rules import legal_option

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["Decision", "apply_calibrated_rules", "untie_candidates", "untie_ratio"]


@dataclass(frozen=True)
class Decision:
    """One automatic decision: the ``rule`` that made it, the ``tensors`` it concerns, what it did, and why."""

    rule: str
    tensors: tuple[str, ...]
    action: str
    reason: str

    def __str__(self) -> str:
        shown = ", ".join(self.tensors[:4]) + (f" (+{len(self.tensors) - 4} more)" if len(self.tensors) > 4 else "")
        return f"{self.rule}: {shown}: {self.action} ({self.reason})"


FLOAT16_MAX = 65504.0
"""Largest finite float16: data beyond it would turn to inf on a float16 tensor."""


def untie_ratio(bits: int) -> float:
    """Range ratio from which a shared grid leaves the narrowest input fewer than `FEW_CODES` codes."""
    return (2.0 ** bits - 1) / FEW_CODES


def _span(stats: TensorStats) -> float:
    return max(stats.max, 0.0) - min(stats.min, 0.0)  # grids always include zero


def _new_quantizer(sim: QuantizationSimModel, like: QcQuantizeOp, tensor: str) -> QcQuantizeOp:
    fresh = QcQuantizeOp(tensor, like.role, like.spec, enabled=like.enabled, tensors=(tensor,),
                         quant_scheme=like.calibration_scheme, percentile=like.percentile_value,
                         notify=sim._invalidate, fixed_range=like.fixed_range)
    fresh.guard = like.guard
    return fresh


def _concat_outputs(sim: QuantizationSimModel) -> set[str]:
    return {n.output[0] for n in sim.graph_index.nodes if n.op_type == "Concat" and n.output}


def _may_untie(q: QcQuantizeOp, concat_outputs: set[str]) -> bool:
    """An enabled, calibrated-range integer grid of 8 bits or more tying a Concat output to other tensors."""
    return (q.enabled and len(q.tensors) > 1 and q.fixed_range is None and not q.spec.is_float
            and not q.spec.is_fp8 and q.spec.dtype.bits >= 8 and any(t in concat_outputs for t in q.tensors))


def untie_candidates(sim: QuantizationSimModel, quantizers: list[QcQuantizeOp]) -> frozenset[str]:
    """The tensors of ``quantizers`` that the Concat rule may give grids of their own: calibration keeps
    per-tensor statistics for them (and only for them)."""
    concat_outputs = _concat_outputs(sim)
    return frozenset(t for q in quantizers if _may_untie(q, concat_outputs) for t in q.tensors)


def _untie_concats(sim: QuantizationSimModel, session: CalibrationSession,
                   observed: list[QcQuantizeOp]) -> tuple[list[Decision], list[QcQuantizeOp]]:
    decisions, created = [], []
    concat_outputs = _concat_outputs(sim)
    for q in observed:
        if not _may_untie(q, concat_outputs):
            continue
        outputs = [t for t in q.tensors if t in concat_outputs]
        parts = [t for t in q.tensors if t not in concat_outputs and t in session.tensor_stats]
        if len(parts) < 2:
            continue
        spans = {t: _span(session.tensor_stats[t]) for t in parts}
        narrow, wide = min(spans.values()), max(spans.values())
        ratio = wide / narrow if narrow > 0 else np.inf
        if ratio < untie_ratio(q.spec.dtype.bits):
            continue
        if not _output_may_stay_float(sim, q):
            continue
        combined, bits = session.stats.get(q.name), q.spec.dtype.bits
        position = sim._quantizers.index(q)
        kept = q.name if q.name in outputs else outputs[0]
        fresh = [_new_quantizer(sim, q, t) for t in q.tensors if t != kept]
        calibrated = [p for p in fresh if p.name in session.tensor_stats]
        items = [(p.calibration_scheme, p.encoding_request(), session.tensor_stats[p.name]) for p in calibrated]
        for p, encoding in zip(calibrated, encodings_for_stats(items)):
            p.set_encoding(encoding)
        q.tensors = (kept,)
        q.name = kept  # the quantizer is named after a tensor it covers
        q.enabled = False
        for p in fresh:
            if p.name in outputs:
                p.enabled = False
        sim._quantizers[position + 1:position + 1] = fresh
        for p in [q, *fresh]:
            sim.qc_quantize_op_dict[p.name] = p
        sim._invalidate()
        created += [p for p in fresh if p.enabled]
        decisions.append(Decision(
            "untied concat", tuple([*outputs, *parts]), "inputs untied, each on its own grid; " + _settle(sim, q, combined),
            f"input ranges differ {ratio:.3g}x (>= {untie_ratio(bits):.3g}x): on one "
            f"{bits}-bit grid the narrowest input would use fewer than {FEW_CODES} codes"))
    return decisions, created


def _output_may_stay_float(sim: QuantizationSimModel, q: QcQuantizeOp) -> bool:
    """Whether the sim's target (if any) takes a Concat output in float32 or in one of 16-bit grids; else the
    Concat keeps its tie (warned)."""
    target = getattr(sim, "target", None)
    if target is None or target.float_fallback or any(target.activation_type_allowed(t) for t in (int16, float16)):
        return True
    warn_at_caller(f"untied concat: {', '.join(q.tensors[:3])}: kept tied, target {target} has no legal "
                   "precision for its output (no float fallback, no 16-bit activations)")
    return False


def _settle(sim: QuantizationSimModel, q: QcQuantizeOp, stats: TensorStats | None) -> str:
    """The untied Concat's output (``q``, disabled): float where legal, else the first legal of int16
    (from the shared statistics) and float16. Returns the decision's words."""
    if getattr(sim, "target", None) is None:
        return "output left float"
    options = [None, q.spec.with_(dtype=int16), q.spec.with_(dtype=float16)]
    for option in legal_option(sim, q, options):
        if option is None:
            return "output left float"
        try:
            q.set_qspec(option)
        except TargetError:
            continue
        if option.dtype == int16:
            if stats is None:
                continue
            q.set_encoding(encodings_for_stats([(q.calibration_scheme, q.encoding_request(), stats)])[0])
        q.enabled = True
        return f"output on {option.dtype}, the next legal precision on target {sim.target}"
    warn_at_caller(f"untied concat: output {q.name!r} has no legal precision on target {sim.target}; left float "
                   "(exports refuse it)")
    return "output left float (no legal precision on the target)"


def _range_health(sim: QuantizationSimModel, checked: list[tuple[QcQuantizeOp, TensorStats | None]]) -> list[Decision]:
    decisions = []
    target = getattr(sim, "target", None)
    for q, stats in checked:
        bits = q.spec.dtype.bits
        if (stats is None or stats.sample is None or q.spec.is_float or q.spec.is_fp8 or not 8 <= bits < 16 or q.fixed_range
                or q.encoding is None or not q.encoding.is_per_tensor or not is_collapsed(stats.sample, q.encoding)):
            continue
        why = (f"its {bits}-bit grid over [{stats.min:.4g}, {stats.max:.4g}] keeps "
               f"{effective_codes(stats.sample, q.encoding):.3g} effective codes of data holding "
               f"{effective_codes(stats.sample):.4g} (fewer than {COLLAPSED_CODES})")
        # the next precision up, most accurate first; a target keeps only those it runs (`target_rules`)
        options = [q.spec.with_(dtype=int16), None] + ([q.spec.with_(dtype=float16)] if target is not None else [])
        legal = legal_option(sim, q, options)
        old_spec, old_encoding, collapsed16 = q.spec, q.encoding, False
        decision = None
        for option in legal:
            if option is None:
                q.enabled = False
                decision = Decision("range health", q.tensors, "left float",
                                    why + ("; a 16-bit grid collapses too" if collapsed16 else
                                           f"; the next legal precision on target {target}"))
            elif option.dtype == int16:
                q.set_qspec(option)
                encoding = encodings_for_stats([(q.calibration_scheme, q.encoding_request(), stats)])[0]
                if is_collapsed(stats.sample, encoding):
                    collapsed16 = True
                    q.set_qspec(old_spec)
                    q.set_encoding(old_encoding)
                    continue
                q.set_encoding(encoding)
                decision = Decision("range health", q.tensors, "promoted to int16",
                                    why + f"; 16 bits keep {effective_codes(stats.sample, encoding):.4g}")
            elif max(abs(stats.min), abs(stats.max)) < FLOAT16_MAX:
                q.set_qspec(option)
                decision = Decision("range health", q.tensors, "promoted to float16",
                                    why + ("; a 16-bit grid collapses too" if collapsed16 else "")
                                    + f"; the next legal precision on target {target}")
            if decision is not None:
                break
        if decision is None:
            decision = Decision("range health", q.tensors, f"kept {q.spec.dtype}",
                                why + f"; no legal precision above it on target {target} (int16, float32, float16)")
            warn_at_caller(f"range health: {', '.join(q.tensors[:3])}: {decision.reason}")
        decisions.append(decision)
    return decisions


def apply_calibrated_rules(sim: QuantizationSimModel, session: CalibrationSession,
                           observed: list[QcQuantizeOp]) -> list[Decision]:
    """Untie heterogeneous Concats, then fix collapsed grids (module docstring); the decisions taken.

    ``observed`` are the quantizers this calibration computed encodings for (already set)."""
    decisions, created = _untie_concats(sim, session, observed)
    index = sim.graph_index

    def bounded(q: QcQuantizeOp) -> bool:
        producers = [index.producer_of(t) for t in q.tensors]
        return all(p is not None and p.op_type in BOUNDED_OUTPUT_OPS for p in producers)

    checked = [(q, session.stats.get(q.name)) for q in observed if q.enabled and not bounded(q)]
    checked += [(q, session.tensor_stats.get(q.name)) for q in created if not bounded(q)]
    return decisions + _range_health(sim, checked)
