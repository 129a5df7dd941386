"""Where a sim built by an AIMET script differs from aimet-onnx 2.42 on purpose, and the one warning that says so.

The sim keeps AIMET's placement (config rules, supergroups that never start at a depthwise or 3-D
convolution, `quantsim.sim.placement`) except for three defaults that are better for accuracy and that an AIMET
script cannot ask for by name. Each is announced once per sim, with the switch that gives AIMET's behaviour,
and only when the user left that switch at its default (``None``):

1. **BatchNormalization folding** (``fold_batchnorm``): preparation folds every BatchNormalization it can into
   the layer before it. AIMET's ``QuantizationSimModel`` keeps them (with quantizers on the layer output, the
   BatchNormalization ``scale`` and output) unless the script calls
   ``fold_all_batch_norms_to_weight(model)`` first, which AIMET itself asks for (its sim logs "Model contains
   unfolded BatchNormalization layers"): folding is what AIMET recommends and what deployment runtimes do,
   so the sim does it, and warns. ``fold_batchnorm=False`` keeps them, as AIMET does;
   ``quantsim.batch_norm_fold.fold_all_batch_norms_to_weight`` gives AIMET's folded names (preparation's own fold
   gives the folded layer the BatchNormalization's output name, which the rest of quantsim's name tracking uses;
   AIMET's fold keeps the layer's).
   The warning is raised where the original model is read: a model file whose preparation is already cached
   (a later run) is not read again, and not warned about again.
2. **Calibrated decisions** (``range_health``): after a calibration, Concats whose inputs' ranges differ by
   orders of magnitude are untied and 8-bit activations that collapse onto a few codes get 16 bits or float
   (`quantsim.sim.decisions`). AIMET has neither. ``range_health=False`` turns them off.
3. **Depthwise supergroups** (``depthwise_supergroups``): AIMET never starts a supergroup at a depthwise or 3-D
   convolution, so its output gets a quantizer of its own before the activation; here the convolution and its
   activation share one quantizer after the activation, as for every other convolution (the depthwise output's
   long negative tail is not put on a grid of its own: more accurate on MobileNet-style nets).
   ``depthwise_supergroups=False`` gives AIMET's placement.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

import onnx

from quantsim.errors import AimetDifferenceWarning, warn_at_caller
from quantsim.prepare.batchnorm import find_batchnorm_folds
from quantsim.sim.decisions import Decision

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["announce_batchnorm_folds", "announce_calibrated_decisions",
           "watch_calibrated_decisions", "announce_depthwise_supergroups"]

_SHOWN = 4
_WATCHED: weakref.WeakSet = weakref.WeakSet()  # sims whose first calibrated decisions are still to be announced


def _listed(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else "")


def announce_batchnorm_folds(model: onnx.ModelProto | None, fold_batchnorm: bool | None) -> list[Decision]:
    """The BatchNormalization folds preparation will make in ``model`` (``fold_batchnorm`` None or True), as
    decisions; warns once (`AimetDifferenceWarning`) when ``fold_batchnorm`` was left at None."""
    if model is None or fold_batchnorm is False:
        return []
    folds = [f for f in find_batchnorm_folds(model) if f.reason is None]
    if not folds:
        return []
    if fold_batchnorm is None:
        warn_at_caller(
            f"{len(folds)} BatchNormalization node(s) are folded into the layer before them "
            f"({_listed([f'{f.batchnorm} -> {f.layer}' for f in folds])}); aimet-onnx's QuantizationSimModel keeps "
            "them, with quantizers on the layer output and on the BatchNormalization's scale and output, unless the "
            "script folds them first. Pass fold_batchnorm=False for AIMET's placement, fold the model first with "
            "quantsim.fold_all_batch_norms_to_weight(model) for AIMET's folded names (the layer keeps its output "
            "name; here it takes the BatchNormalization's), or fold_batchnorm=True to keep this fold without this "
            "warning.", AimetDifferenceWarning)
    return [Decision("batchnorm fold", tuple(f.batchnorm for f in folds), "folded into the layer before it",
                     "runtimes fold BatchNormalization too; fold_batchnorm=False keeps it, as aimet-onnx does")]


def watch_calibrated_decisions(sim: QuantizationSimModel, range_health: bool | None) -> None:
    """Announce the first calibrated decisions of ``sim`` when ``range_health`` was left at None."""
    if range_health is None:
        _WATCHED.add(sim)


def announce_calibrated_decisions(sim: QuantizationSimModel, decisions: Iterable[Decision]) -> None:
    """Warn once per watched sim (`watch_calibrated_decisions`) when calibration took ``decisions``."""
    decisions = list(decisions)
    if not decisions or sim not in _WATCHED:
        return
    _WATCHED.discard(sim)
    warn_at_caller(
        f"calibration took {len(decisions)} automatic decision(s) aimet-onnx does not take "
        f"({_listed([str(d) for d in decisions])}); sim.decisions lists them. Pass range_health=False for "
        "AIMET's quantizers, or range_health=True to keep them without this warning.", AimetDifferenceWarning)


def announce_depthwise_supergroups(decisions: Iterable[Decision], depthwise_supergroups: bool | None) -> None:
    """Warn once (`AimetDifferenceWarning`) when placement fused depthwise / 3-D convolutions with their
    activation and ``depthwise_supergroups`` was left at None."""
    fused = [t for d in decisions if d.rule == "depthwise supergroup" for t in d.tensors]
    if depthwise_supergroups is not None or not fused:
        return
    warn_at_caller(
        f"{len(fused)} depthwise/3-D convolution output(s) share one quantizer with the activation after them "
        f"({_listed(fused)}); aimet-onnx quantizes a depthwise convolution's output separately. Pass "
        "depthwise_supergroups=False for AIMET's placement, or depthwise_supergroups=True to keep this (more "
        "accurate) placement without this warning.", AimetDifferenceWarning)
