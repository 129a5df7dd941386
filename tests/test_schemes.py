"""Calibration schemes are registered in one place; a new scheme is one registration."""
import numpy as np
import pytest
from tiny_cnn import batches, new_sim

import quantsim
from quantsim import QuantScheme
from quantsim.calibration.schemes import (
    CalibrationScheme,
    EncodingRequest,
    get_scheme,
    register_scheme,
    registered_schemes,
)
from quantsim.core.numerics import encoding_from_range


def _half_range(request: EncodingRequest, stats) -> quantsim.Encoding:
    """A toy scheme: half the observed range (clips the top half of the values)."""
    return encoding_from_range(stats.min / 2, stats.max / 2, request.bits, **request.grid_flags)


HALF = register_scheme(CalibrationScheme("half_range_for_tests", _half_range, description="test scheme"))


def test_built_in_schemes_are_registered_with_aimets_names():
    names = {s.name for s in registered_schemes()}
    assert {"min_max", "tf_enhanced", "percentile"} <= names
    assert get_scheme("tf") is get_scheme(QuantScheme.min_max)
    assert get_scheme("post_training_tf_enhanced").needs_histogram
    assert get_scheme(QuantScheme.post_training_percentile).parameters == {"percentile": 100.0}


def test_a_registered_scheme_calibrates_a_sim_by_name():
    reference, custom = new_sim(), new_sim(quant_scheme="half_range_for_tests")
    reference.compute_encodings(batches())
    custom.compute_encodings(batches())
    q_ref, q_custom = reference.qc_quantize_op_dict["r"], custom.qc_quantize_op_dict["r"]
    assert q_custom.quant_scheme == "half_range_for_tests"
    np.testing.assert_allclose(q_custom.encoding.max, q_ref.encoding.max / 2, rtol=0.02)
    # weights use the scheme's from_values (default: min-max), unchanged
    assert custom.qc_quantize_op_dict["W"].encoding.same_as(reference.qc_quantize_op_dict["W"].encoding)


def test_a_quantizer_can_switch_scheme():
    sim = new_sim()
    q = sim.qc_quantize_op_dict["r"]
    q.set_quant_scheme(HALF)
    assert q.calibration_scheme is HALF
    q.set_quant_scheme("percentile")
    assert q.quant_scheme is QuantScheme.post_training_percentile


def test_unknown_scheme_lists_the_registered_ones():
    with pytest.raises(quantsim.InvalidArgumentError, match="registered: .*min_max"):
        new_sim(quant_scheme="no_such_scheme")


def test_a_name_cannot_be_taken_twice():
    with pytest.raises(quantsim.InvalidArgumentError, match="already taken"):
        register_scheme(CalibrationScheme("other_for_tests", _half_range, aliases=("tf",)))
    with pytest.raises(quantsim.InvalidArgumentError, match="unknown"):
        get_scheme("other_for_tests")  # nothing of a refused registration stays behind
