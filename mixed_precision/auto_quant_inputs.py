"""Input checks and helpers of `auto_quantize` (`mixed_precision.auto_quant`): the calibration data, the
candidates a target allows, the CLE copy it may use, and the count of a mix's configurations."""
from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import adaround
from mixed_precision.amp_space import AmpSpace, Config
from mixed_precision.presets import Precision
from quantsim import InvalidArgumentError, TargetProfile

__all__ = ["small_space", "legal_candidates", "equalized", "calibration_batches", "float_session", "CLE_TOLERANCE"]

CLE_TOLERANCE = 1e-4
"""Largest output difference (relative to the output's range) for which equalization counts as keeping the
float model."""


def small_space(space: AmpSpace, limit: int) -> list[Config] | None:
    """The distinct configurations of ``space`` (cheapest first) when there are at most ``limit``, else None.
    Counted per group (the candidates that mean something different for it) before anything is listed: a
    few hundred groups have far too many configurations to enumerate."""
    canonical = [space.canonical((c,) * len(space.groups)) for c in range(len(space.candidates))]
    choices = [sorted({config[g] for config in canonical}) for g in range(len(space.groups))]
    count = 1
    for options in choices:
        count *= len(options)
        if count > limit:
            return None
    return sorted(itertools.product(*choices), key=lambda c: (space.bops(c), c))


def float_session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def calibration_batches(data: Any) -> Callable[[], list]:
    if callable(data):
        def fresh() -> list:
            batches = list(data())
            if not batches:
                raise InvalidArgumentError("auto_quantize: the calibration_data callable returned no batch")
            return batches
        return fresh
    if isinstance(data, Mapping) or not isinstance(data, Iterable):
        raise InvalidArgumentError("auto_quantize: calibration_data must be a sequence of feed dicts "
                                   f"({{input name: array}}) or a callable returning one, got {type(data).__name__}")
    kept = list(data)
    if not kept or not all(isinstance(b, Mapping) for b in kept):
        raise InvalidArgumentError("auto_quantize: calibration_data must hold at least one feed dict "
                                   "({input name: array})")
    return lambda: kept


def equalized(model: onnx.ModelProto, first: Mapping[str, np.ndarray]) -> tuple[onnx.ModelProto | None, str]:
    """A CLE copy of ``model`` when it keeps the float outputs on ``first`` (else None and why)."""
    work = copy.deepcopy(model)
    equalized = adaround.equalize_model(work)  # looked up at call time (tests replace it)
    equalized = equalized if equalized is not None else work
    before = float_session(model).run(None, dict(first))
    after = float_session(equalized).run(None, dict(first))
    worst = max(float(np.max(np.abs(a - b))) / max(float(np.ptp(a)), 1e-12) for a, b in zip(before, after))
    if worst > CLE_TOLERANCE:
        return None, (f"CLE skipped: it changes the float model's outputs by {worst:.3g} of their range "
                      f"(> {CLE_TOLERANCE:g})")
    return equalized, ""


def legal_candidates(ladder: list[Precision], profile: TargetProfile, model: onnx.ModelProto) -> list[Precision]:
    """The candidates ``profile`` allows on every weighted op type of ``model`` (a mix of them then needs no
    precision the target lacks; what it refuses per node, a scored configuration reports)."""
    ops = {n.op_type for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul")} or {"*"}
    return [c for c in ladder if all(profile.allows(op, c.param_type, c.activation_type) for op in ops)]
