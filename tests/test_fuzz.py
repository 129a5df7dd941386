"""Fuzzed bad input: random mutations of valid encodings files, configs, models and calibration feeds give
either a correct result or a `QuantsimError` (never another exception type, a hang, or a changed sim).

Hypothesis runs derandomized (the same examples on every run, so CI never flakes); raise
``QUANTSIM_FUZZ_EXAMPLES`` to search further locally.
"""
from __future__ import annotations

import copy
import json
import os
import warnings

import numpy as np
import onnx
import pytest
from tiny_cnn import batches, calibrated_sim, make_model, new_sim  # tests/tiny_cnn.py

from quantsim import QuantizationSimModel, QuantsimError, load_encodings_to_sim

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("QUANTSIM_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# JSON-ish values a mutation may put anywhere: wrong types, extremes, non-finite numbers, nesting
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.sampled_from([0, 1, -1, 2, 4, 8, 16, 32, 33, 255]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e300, -1e300, 1e-300, 0.0, -0.0, 3.4e38]),
    st.text(max_size=8), st.sampled_from(["True", "False", "int", "float", "PER_CHANNEL", "PER_BLOCK", "", "x"]),
)
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)


def _paths(doc, prefix=()):
    """Every path (tuple of keys/indices) into a JSON document, the root excluded."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


@st.composite
def mutated(draw, document):
    """``document`` with 1-3 random edits: a value replaced, a key/item deleted, or a key added."""
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(VALUES)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(VALUES)
        else:
            parent.append(draw(VALUES))
    return doc


def _state(sim) -> list:
    """Everything a failed call must leave as it was: each quantizer's spec, encoding, flags."""
    state = []
    for q in sim.quantizers:
        enc = q.encoding
        state.append((q.name, q.spec, q.enabled, q.is_encoding_frozen(),
                      None if enc is None else (enc.scale.tobytes(), enc.zero_point.tobytes(), enc.bits)))
    return state


def _exported(version: str) -> dict:
    import tempfile

    sim = calibrated_sim()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.export(folder, "m", export_model=False, encoding_version=version)
        with open(os.path.join(folder, "m.encodings")) as handle:
            return json.load(handle)


VALID_ENCODINGS = {version: _exported(version) for version in ("0.6.1", "1.0.0", "2.0.0")}
SIM = calibrated_sim()
FEED_OK = batches(1)[0]


@pytest.mark.parametrize("version", sorted(VALID_ENCODINGS))
def test_fuzzed_encodings_load_or_fail_cleanly(version):
    @FUZZ
    @given(doc=mutated(VALID_ENCODINGS[version]), strict=st.booleans())
    def check(doc, strict):
        before = _state(SIM)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load_encodings_to_sim(SIM, doc, strict=strict)
        except QuantsimError as error:
            assert str(error), "an error must say what is wrong"
            assert _state(SIM) == before, "a failed load changed the sim"
            return
        finally:
            SIM.session.run(None, FEED_OK)  # loaded or not, the sim still runs
        # loaded: restore the reference state for the next example
        load_encodings_to_sim(SIM, VALID_ENCODINGS["1.0.0"], strict=False)

    check()


def test_fuzzed_configs_parse_or_raise_config_errors():
    from quantsim.sim.config import CONFIG_DIR, load_config

    valid = json.loads((CONFIG_DIR / "default_config_per_channel.json").read_text())

    @FUZZ
    @given(doc=mutated(valid))
    def check(doc):
        try:
            config = load_config(doc)
        except QuantsimError as error:
            assert str(error)
            return
        assert config.source  # parsed configs are usable: a sim builds from them
        try:
            QuantizationSimModel(make_model(), config_file=doc, progress=False)
        except QuantsimError:
            pass

    check()


@st.composite
def mutated_model(draw):
    """The tiny CNN with one structural edit: an input renamed, an op type or attribute changed, an
    initializer dropped or reshaped, a declared type or shape changed."""
    model = make_model()
    graph = model.graph
    kind = draw(st.sampled_from(["rename_input", "op_type", "attribute", "drop_init", "reshape_init",
                                 "elem_type", "dims", "opset", "ir"]))
    node = graph.node[draw(st.integers(0, len(graph.node) - 1))]
    if kind == "rename_input" and node.input:
        node.input[draw(st.integers(0, len(node.input) - 1))] = draw(st.sampled_from(["", "nowhere", "y", "x", "c"]))
    elif kind == "op_type":
        node.op_type = draw(st.sampled_from(["Relu", "Sigmoid", "Add", "MatMul", "Conv", "NoSuchOp", "Identity"]))
    elif kind == "attribute":
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute(draw(st.sampled_from(["pads", "axis", "strides", "bogus"])),
                                                         draw(st.sampled_from([[0, 0], [1], 3, [-1, -1, -1, -1]]))))
    elif kind == "drop_init":
        del graph.initializer[draw(st.integers(0, len(graph.initializer) - 1))]
    elif kind == "reshape_init":
        tensor = graph.initializer[draw(st.integers(0, len(graph.initializer) - 1))]
        values = onnx.numpy_helper.to_array(tensor).reshape(-1)
        size = draw(st.integers(1, values.size + 2))
        tensor.CopyFrom(onnx.numpy_helper.from_array(np.resize(values, size), tensor.name))
    elif kind == "elem_type":
        value = draw(st.sampled_from([*graph.input, *graph.output]))
        value.type.tensor_type.elem_type = draw(st.sampled_from([0, 2, 6, 7, 9, 10, 11, 16]))
    elif kind == "dims":
        value = draw(st.sampled_from([*graph.input, *graph.output]))
        dims = value.type.tensor_type.shape.dim
        dims[draw(st.integers(0, len(dims) - 1))].dim_value = draw(st.sampled_from([0, 1, 2, 7]))
    elif kind == "opset":
        model.opset_import[0].version = draw(st.sampled_from([1, 7, 11, 12, 30, 99]))
    else:
        model.ir_version = draw(st.sampled_from([1, 3, 13, 30]))
    return model


def test_fuzzed_models_build_a_working_sim_or_fail_cleanly():
    @FUZZ
    @given(model=mutated_model())
    def check(model):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sim = QuantizationSimModel(model, progress=False)
                sim.compute_encodings(batches(2))
                sim.session.run(None, FEED_OK)
        except QuantsimError as error:
            assert str(error)

    check()


FEED_VALUES = st.one_of(
    st.sampled_from([np.zeros((2, 3, 8, 8), np.float32), np.zeros((2, 3, 8, 8), np.float64),
                     np.zeros((2, 3, 8), np.float32), np.zeros((2, 4, 8, 8), np.float32),
                     np.full((2, 3, 8, 8), np.nan, np.float32), np.zeros((0, 3, 8, 8), np.float32),
                     np.zeros((2, 3, 1, 1), np.float32), np.zeros((2, 3, 8, 8), np.int64)]),
    LEAVES,
)


def test_fuzzed_calibration_feeds_calibrate_or_fail_leaving_the_sim_as_it_was():
    sim = calibrated_sim()

    @FUZZ
    @given(feeds=st.lists(st.one_of(st.fixed_dictionaries({"x": FEED_VALUES}),
                                    st.dictionaries(st.sampled_from(["x", "y", "z"]), FEED_VALUES, max_size=2),
                                    LEAVES), min_size=0, max_size=3))
    def check(feeds):
        before = _state(sim)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sim.compute_encodings(feeds)
        except QuantsimError as error:
            assert str(error)
            assert _state(sim) == before, "a failed calibration changed the sim"
            return
        sim.session.run(None, FEED_OK)

    check()


def test_the_fuzz_helpers_mutate():
    doc = {"a": [1, 2], "b": {"c": 3}}
    assert set(_paths(doc)) == {("a",), ("a", 0), ("a", 1), ("b",), ("b", "c")}
    assert new_sim() is not None
