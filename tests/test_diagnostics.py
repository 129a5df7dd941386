"""Warnings point at the caller's line; diagnostics go through logging."""
import logging
import warnings

import numpy as np
from tiny_cnn import batches, make_model, new_sim

import quantsim


def test_calibration_warning_points_at_the_callers_line():
    sim = new_sim()
    bad = [{"x": np.full((1, 3, 8, 8), np.nan, np.float32)}] + batches(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.compute_encodings(bad)
    (warning,) = [w for w in caught if "NaN/Inf" in str(w.message)]
    assert warning.filename == __file__


def test_legacy_argument_warning_points_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantsim.QuantizationSimModel(make_model(), default_param_bw=8, progress=False)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert deprecations and all(w.filename == __file__ for w in deprecations)


def test_warn_at_caller_skips_every_library_frame():
    def library_like():  # a frame of this test module is outside the library: it is the caller
        quantsim.errors.warn_at_caller("hello")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library_like()
    assert caught[0].filename == __file__ and issubclass(caught[0].category, quantsim.QuantsimWarning)


def test_cache_hits_misses_and_session_rebuilds_are_logged(caplog, tmp_path):
    with caplog.at_level(logging.DEBUG, logger="quantsim"):
        quantsim.prepare(make_model(seed=11), cache_dir=tmp_path)
        quantsim.prepare(make_model(seed=11), cache_dir=tmp_path)
        sim = new_sim()
        sim.compute_encodings(batches(2))
        _ = sim.session
    messages = [r.getMessage() for r in caplog.records]
    assert any("cache miss" in m for m in messages) and any("cache hit" in m for m in messages)
    assert any("pass check_graph" in m for m in messages)
    assert any("session rebuilt" in m for m in messages)
