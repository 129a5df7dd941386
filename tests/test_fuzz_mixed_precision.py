"""Fuzzed mixed-precision input, in `test_fuzz`'s manner: random mutations of a valid precision-overrides
document (as a mapping and as JSON text) and of a valid AMP score cache give either a correct result or a
`QuantsimError`, leaving the sim as it was."""
from __future__ import annotations

import json
import math
import warnings

import pytest
from amp_models import feeds, new_sim, score
from test_fuzz import FUZZ, _state, mutated
from tiny_cnn import new_sim as new_cnn

from mixed_precision import (
    apply_precision_overrides,
    choose_mixed_precision,
    layer_costs,
    preset,
    simulated_bit_operations,
)
from mixed_precision.amp_cache import CACHE_FILE, ScoreCache
from quantsim import QuantsimError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

VALID_OVERRIDES = {"default": "W8A8", "op_type": {"Gemm": "W8A16", "Conv": "W4A8"}, "regex": {"^re": "FP16"},
                   "node": {"conv": "W16A16", "fc": "W8A8"}}


def _check_applied(sim, chosen) -> None:
    """What a successful call reports is what the sim has: each chosen node's weights at its preset's type
    (the tiny CNN's weights are not shared, so no other rule can decide them)."""
    table = sim.qc_quantize_op_dict
    nodes = {n.name: n for n in sim.model.graph.node}
    for node, name, _ in chosen:
        for tensor in nodes[node].input:
            q = table.get(tensor)
            if q is not None and q.role == "param" and q.param_type != "bias":
                assert q.precision() == preset(name).param_type, (node, name)


def _apply_or_fail(sim, overrides) -> None:
    before, state = _state(sim), sim.snapshot()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chosen = apply_precision_overrides(sim, overrides)
    except QuantsimError as error:
        assert str(error), "an error must say what is wrong"
        assert _state(sim) == before, "a refused override changed the sim"
        return
    _check_applied(sim, chosen)
    sim.restore(state)


def test_fuzzed_override_documents_apply_or_fail_cleanly():
    sim = new_cnn()

    @FUZZ
    @given(doc=mutated(VALID_OVERRIDES))
    def check(doc):
        _apply_or_fail(sim, doc)

    check()


def test_fuzzed_override_files_apply_or_fail_cleanly(tmp_path):
    sim = new_cnn()
    text = json.dumps(VALID_OVERRIDES)
    path = tmp_path / "precision.json"

    @FUZZ
    @given(cut=st.integers(0, len(text)), repeat=st.sampled_from(['"conv": "W8A8", ', '"default": "FP16", ', '']),
           where=st.sampled_from(["{", '"node": {', '"op_type": {']))
    def check(cut, repeat, where):
        edited = text.replace(where, where + repeat, 1)  # a key given twice, or not
        path.write_text(edited[:cut] if cut < len(text) else edited)
        _apply_or_fail(sim, path)

    check()


@pytest.fixture(scope="module")
def amp_run(tmp_path_factory):
    """A finished AMP run (its results folder and cache document) on the three-layer MLP."""
    folder = tmp_path_factory.mktemp("amp")
    result = choose_mixed_precision(new_sim(), ["W8A8", "W4A8"], score, score, 0.02, folder, True, feeds())
    return folder, json.loads((folder / CACHE_FILE).read_text()), result


def test_fuzzed_score_caches_load_or_fail_cleanly(amp_run, tmp_path):
    _, valid, _ = amp_run
    path = tmp_path / CACHE_FILE
    path.parent.mkdir(parents=True)

    @FUZZ
    @given(doc=mutated(valid))
    def check(doc):
        path.write_text(json.dumps(doc))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache = ScoreCache(tmp_path, valid["key"], clean_start=False)
        except QuantsimError as error:
            assert str(path) in str(error), "the error names the cache file"
            return
        assert all(isinstance(v, float) and math.isfinite(v) for v in cache.scores.values())
        assert all(o.bops >= 0 and math.isfinite(o.bops) for o in cache.observed.values())

    check()


def test_fuzzed_score_caches_resume_truthfully_or_leave_the_sim_as_it_was(amp_run, tmp_path):
    """Whole resumed runs on a few mutations: a refused cache leaves the sim as it was; a resumed run leaves
    the sim calibrated in the chosen configuration and reports the cost the sim really has."""
    folder, valid, _ = amp_run
    reference = new_sim()
    reference.compute_encodings(feeds())
    baseline = simulated_bit_operations(reference, layer_costs(reference))  # W8A8 everywhere: the baseline
    path = tmp_path / CACHE_FILE
    path.parent.mkdir(parents=True)

    @settings(FUZZ, max_examples=min(FUZZ.max_examples, 8))
    @given(doc=mutated(valid))
    def check(doc):
        path.write_text(json.dumps(doc))
        sim = new_sim()
        sim.compute_encodings(feeds())
        before = _state(sim)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = choose_mixed_precision(sim, ["W8A8", "W4A8"], score, score, 0.02, tmp_path, False, feeds())
        except QuantsimError as error:
            assert str(error)
            assert _state(sim) == before, "a refused resume changed the sim"
            return
        assert result.bitops_ratio == pytest.approx(simulated_bit_operations(sim, layer_costs(sim)) / baseline)
        assert math.isfinite(score(sim.session))

    check()
