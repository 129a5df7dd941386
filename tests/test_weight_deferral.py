"""`quantsim.sim.deferral`: the sim builder's one way to defer a weight (a placeholder and a keyed `DeferredArray`
computed when written), for its two holders: an export's `DeferredWeights` and a session's external arrays."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from quantsim.graph.deferred import DEFERRED_LOCATION, DeferredArray, DeferredWeights
from quantsim.graph.model_io import IN_MEMORY_LOCATION
from quantsim.sim.deferral import WeightDeferral


def _source(name: str, shape: tuple[int, ...], mapped: bool) -> TensorProto:
    """An initializer of float32 ``shape``: mapped (values in an external-data file) or in the model."""
    if not mapped:
        return numpy_helper.from_array(np.zeros(shape, np.float32), name)
    tensor = TensorProto(name=name, dims=shape, data_type=TensorProto.FLOAT, data_location=TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value="weights.bin")
    return tensor


def _counted(values: np.ndarray, calls: list[int]):
    def compute() -> np.ndarray:
        calls[0] += 1
        return values
    return compute


def test_an_export_defers_every_big_weight_and_computes_it_when_read():
    weights = DeferredWeights()
    deferral = WeightDeferral(None, None, weights, {"fed"})
    calls = [0]
    codes = np.arange(64 * 32).reshape(64, 32) % 7 - 3  # int64: cast to the placeholder's type when read
    placeholder = deferral.defer("w/q", TensorProto.INT8, _source("w", (64, 32), mapped=False), ("codes",),
                              _counted(codes, calls))
    assert placeholder is not None and placeholder.data_type == TensorProto.INT8
    assert placeholder.external_data[0].value == DEFERRED_LOCATION and calls == [0]
    values = weights.array(placeholder)
    assert calls == [1] and values.dtype == np.int8
    np.testing.assert_array_equal(values, codes)
    assert deferral.defer("s", TensorProto.FLOAT, _source("s", (8,), mapped=True), (), lambda: np.ones(8)) is None
    assert deferral.defer("fed", TensorProto.FLOAT, _source("fed", (64, 32), mapped=True), (), np.ones) is None
    assert deferral.hold("w", np.ones((64, 32), np.float32)) is None  # nothing is held beside an export


@pytest.mark.parametrize("mapped", [True, False])
def test_a_session_defers_weights_of_mapped_sources_under_their_key(mapped):
    external: dict = {}
    deferral = WeightDeferral(external, None, DeferredWeights(), set())  # an export's holder is unused here
    calls = [0]
    values = np.full((64, 32), 0.5, np.float64)
    placeholder = deferral.defer("w", TensorProto.FLOAT, _source("w", (64, 32), mapped), ("quantized", 8),
                              _counted(values, calls))
    if not mapped:  # in-memory sources are computed now and shared through the memo instead
        assert placeholder is None and external == {}
        return
    assert placeholder is not None and placeholder.external_data[0].value == IN_MEMORY_LOCATION
    deferred = external["w"]
    assert isinstance(deferred, DeferredArray) and calls == [0]
    assert deferred.key == ("w", ("quantized", 8)) and deferred.shape == (64, 32) and deferred.dtype == np.float32
    np.testing.assert_array_equal(deferred.array(), values.astype(np.float32))
    assert calls == [1]


def test_a_session_with_a_memo_computes_weights_now_and_shares_them():
    memo: dict = {}
    deferral = WeightDeferral({}, memo, None, set())
    assert deferral.defer("w", TensorProto.FLOAT, _source("w", (64, 32), mapped=True), (), np.ones) is None
    first = deferral.remembered("w", ("k",), lambda: np.ones((64, 32), np.float32))
    assert deferral.remembered("w", ("k",), lambda: np.zeros((64, 32), np.float32)) is first
    assert deferral.remembered("w", ("other",), lambda: np.zeros((64, 32), np.float32)) is not first
