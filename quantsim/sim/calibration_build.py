"""The sim's calibration session: the float graph with weight quantizers applied, plus statistics.

`calibration_session` is what ``sim._calibration_session`` returns: a `CalibrationSession` whose onnxruntime
session is made for the first batch's shapes (`quantsim.calibration.whole_tensors`: small tensors fetched
whole, the others reduced in-graph, sampled with constant steps while the batches keep their sizes). The
`CalibrationSessions` behind it is cached on the sim (``_calibration_cache``), keyed by the weight
quantizers' state and the observed tensors, so a later calibration of an unchanged sim reuses its session.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import onnx

from quantsim.calibration.run import CALIBRATION_SESSION_OPTIONS, RANGE_SAMPLE, CalibrationSession
from quantsim.calibration.statistics_graph import add_statistics_outputs
from quantsim.calibration.whole_tensors import CalibrationSessions
from quantsim.graph.session import make_session
from quantsim.graph.tensor_roles import find_nonnegative_tensors
from quantsim.sim.build import build_sim_model
from quantsim.sim.decisions import untie_candidates
from quantsim.sim.quantizer import QcQuantizeOp

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["calibration_session"]


def _constant_state(q: QcQuantizeOp) -> tuple:
    """What the calibration graph bakes in for a weight/constant quantizer (its cache key)."""
    enc = q.encoding
    grid = None if enc is None else (enc.scale.tobytes(), enc.zero_point.tobytes(), enc.qmin, enc.qmax, enc.axis,
                                     enc.block_axis, enc.block_size)
    return q.name, q.enabled, q.spec, grid


def calibration_session(sim: QuantizationSimModel, observed: list[QcQuantizeOp]) -> CalibrationSession:
    """The calibration session of ``observed`` (module docstring)."""
    index = sim._index
    histograms = frozenset(q.name for q in observed if q.calibration_scheme.needs_histogram)
    sampled = bool(histograms) or sim.range_health
    groups = {t: q.name for q in observed for t in q.tensors if not index.is_constant(t)}
    constants = [q for q in sim._quantizers if q.role == "param" or sim._is_constant_quantizer(q)]
    small = {t for t, name in groups.items() if name not in histograms}  # range-health samples only
    key = (tuple(_constant_state(q) for q in constants), tuple(sorted(groups)), sampled, tuple(sorted(small)))
    if sim._calibration_cache is None or sim._calibration_cache[0] != key:
        enabled = [q for q in constants if q.enabled]

        def graph() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
            weights: dict[str, np.ndarray] = {}
            model = build_sim_model(sim._model, enabled, source=index, external=weights, memo=sim._session_memo(),
                                    integer_weights=sim._integer_weights())
            return model, weights

        first = [graph()]  # the first session takes the graph shape inference reads; later ones build their own
        shapes = index.shape
        nonnegative = find_nonnegative_tensors(index)

        def build(whole: frozenset[str], counts: Mapping[str, int] | None):
            model, weights = first.pop() if first else graph()
            model, outputs = add_statistics_outputs(
                model, list(groups), list(groups) if sampled else [], nonnegative=nonnegative,
                shapes={t: shapes[t] for t in groups if shapes.get(t) is not None},
                elem_types={t: index.elem_type[t] for t in groups if t in index.elem_type},
                sample_sizes=dict.fromkeys(small, RANGE_SAMPLE), whole=whole, counts=counts,
            )
            options = {**CALIBRATION_SESSION_OPTIONS, **(sim._session_options_kwargs or {})}
            session = make_session(model, sim.providers, session_options_kwargs=options, external_initializers=weights,
                                   file_backed=sim._file_backed(), prepack=sim._weights is not None,
                                   weight_files=sim._session_files())
            return session, outputs

        sim._calibration_cache = (key, CalibrationSessions(first[0][0], list(groups), build))
    sessions = sim._calibration_cache[1]
    samples = frozenset(q.name for q in observed) if sim.range_health else frozenset()
    per_tensor = untie_candidates(sim, observed) if sim.range_health else frozenset()
    return CalibrationSession(None, None, groups, histograms=histograms, range_samples=samples,
                              per_tensor=per_tensor, sessions=sessions)
