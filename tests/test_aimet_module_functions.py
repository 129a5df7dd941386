"""AIMET's module-level functions: ``with compute_encodings(sim)`` and ``encodings_to_onnx_qdq``."""
from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from tiny_cnn import batch, batches, calibrated_sim, make_model, new_sim  # tests/tiny_cnn.py

from quantsim import compute_encodings, encodings_to_onnx_qdq


def _encodings(sim):
    return {q.name: (None if q.encoding is None else (q.encoding.scale.tobytes(), q.encoding.zero_point.tobytes()))
            for q in sim.quantizers}


def test_the_with_block_calibrates_like_compute_encodings():
    reference = calibrated_sim()
    sim = new_sim()
    with compute_encodings(sim):
        for feed in batches():
            sim.session.run(None, feed)  # inside the block sim.session collects statistics
    assert _encodings(sim) == _encodings(reference)
    assert np.array_equal(sim.session.run(None, batch(7))[0], reference.session.run(None, batch(7))[0])


def test_an_exception_inside_the_block_leaves_the_encodings_and_nesting_is_a_no_op():
    sim = calibrated_sim()
    before = _encodings(sim)
    with pytest.raises(KeyboardInterrupt):
        with compute_encodings(sim):
            sim.session.run(None, batch(0, scale=50.0))
            raise KeyboardInterrupt
    assert _encodings(sim) == before
    with compute_encodings(sim):
        with compute_encodings(sim):  # nested: the outer block calibrates once
            sim.session.run(None, batch(0, scale=3.0))
        sim.session.run(None, batch(1, scale=3.0))
    assert _encodings(sim) != before
    assert isinstance(sim.session, ort.InferenceSession)  # outside the block: the sim's own session


def test_encodings_to_onnx_qdq_equals_the_sims_qdq_export(tmp_path):
    sim = calibrated_sim()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.export(str(tmp_path), "m", export_model=False, encoding_version="2.0.0")
    from_file = encodings_to_onnx_qdq(make_model(), str(tmp_path / "m.encodings"))
    feed = batch(5)
    got = ort.InferenceSession(from_file.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    want = ort.InferenceSession(sim.to_onnx_qdq().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="force_activation_as"):
        encodings_to_onnx_qdq(make_model(), str(tmp_path / "m.encodings"), force_activation_as="both")
