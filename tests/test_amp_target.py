"""AMP on a sim with a target profile: each group's candidates are the ones the target runs (issue: AMP used
to try an illegal candidate and stop with the target's error in the middle of the search)."""
import warnings

import pytest
from amp_models import feeds, new_sim, score

from mixed_precision import choose_mixed_precision
from quantsim import TargetError, int16, legality_report


def _quiet_sim(target):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return new_sim(target=target)


def test_illegal_candidates_are_filtered_per_group(tmp_path):
    """gpu-qdq has no 16-bit integer activations: W8A16 is dropped for every group with activations, the
    search runs to its end, and the chosen configuration is legal on the target."""
    sim = _quiet_sim("gpu-qdq")
    assert sim.target_findings({"h0": "int16"})  # the probe sees the illegal type, and changes nothing
    assert sim.qc_quantize_op_dict["h0"].precision() != int16
    result = choose_mixed_precision(sim, ["W8A8", "W8A16", "FP16"], score, score, 0.001, tmp_path, True, feeds())
    assert result.chosen is not None
    assert all("W8A16" != p for point in result.points for p in point.precisions)
    assert not any(q.enabled and q.precision() == int16 for q in sim.quantizers)
    assert not legality_report(sim).errors


def test_a_group_without_a_legal_candidate_is_named(tmp_path):
    sim = _quiet_sim("gpu-qdq")
    with pytest.raises(TargetError, match=r"quantizer group fc\d.*gpu-qdq.*int16"):
        choose_mixed_precision(sim, ["W8A16", "W16A16"], score, score, 0.01, tmp_path, True, feeds())


def test_without_a_target_nothing_is_filtered(tmp_path):
    """The same call on a sim without a target keeps W8A16 available (it is the filter, not the search,
    that removed it above)."""
    sim = new_sim()
    assert sim.target_findings({"h0": "int16"}) == []
    result = choose_mixed_precision(sim, ["W8A8", "W8A16", "FP16"], score, score, 0.001, tmp_path, True, feeds())
    assert "W8A16" in result.uniform_scores
    # "W8A16 everywhere" is W8A16 in every group here; on gpu-qdq its groups took FP16 instead, so it costs more
    filtered = choose_mixed_precision(_quiet_sim("gpu-qdq"), ["W8A8", "W8A16", "FP16"], score, score, 0.001,
                                      tmp_path / "gpu", True, feeds())
    assert result.uniform_bitops["W8A16"] < filtered.uniform_bitops["W8A16"]


def test_an_illegal_graph_input_precision_is_refused_when_set():
    """The target's rules for graph inputs apply when a precision is set, not only at export."""
    sim = _quiet_sim("gpu-qdq")
    with pytest.raises(TargetError, match="'x' is int16"):
        sim.qc_quantize_op_dict["x"].set_precision("int16")
    assert sim.qc_quantize_op_dict["x"].precision() != int16
