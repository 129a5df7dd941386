"""AMP's speed features change no result: phase 1's saturation rule (`mixed_precision.amp_phases`) against
the search that scores every (group, candidate), against the brute force over every configuration, and on
an executor against the local run."""
import itertools
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from amp_models import COARSE_STEP, coarse_score, feeds, new_sim, score

from mixed_precision import AMPSearchAlgo, choose_mixed_precision

CANDIDATES = ["W8A16", "W8A8", "W4A8"]


def _run(tmp_path, saturation, drop=0.005, **kwargs):
    sim = new_sim()
    result = choose_mixed_precision(sim, CANDIDATES, kwargs.pop("phase1", coarse_score), coarse_score, drop,
                                    tmp_path, True, feeds(), phase1_saturation=saturation, progress=False, **kwargs)
    return sim, result


def _alone_scores(tmp_path):
    """Every (group, candidate) alone, scored with the rule off (AIMET's phase 1)."""
    return _run(tmp_path, False, drop=None)[1].phase1_scores


def test_the_model_has_groups_that_saturate_and_groups_that_do_not(tmp_path):
    """The premise of the tests below, checked rather than assumed: with 4-bit weights alone, the middle
    layer (a small outlier) and the output's group lose less than one step (they score the float model's 0),
    the other two lose more; every score is a whole number of steps."""
    alone = _alone_scores(tmp_path)
    saturated = {g for (g, c), s in alone.items() if c == "W4A8" and s >= 0}
    assert saturated == {1, 3}
    assert all(s <= 0 and math.isclose(s / COARSE_STEP, round(s / COARSE_STEP), abs_tol=1e-9) for s in alone.values())


@pytest.mark.parametrize("drop", [0.005, 0.02, 0.2, None])
@pytest.mark.parametrize("algo", [AMPSearchAlgo.Binary, AMPSearchAlgo.BruteForce])
def test_saturation_skips_evaluations_and_changes_nothing(tmp_path, drop, algo):
    sim_on, on = _run(tmp_path / "on", True, drop, amp_search_algo=algo)
    sim_off, off = _run(tmp_path / "off", False, drop, amp_search_algo=algo)
    assert on.phase1_inferred == 2 and on.phase1_evaluations == off.phase1_evaluations - 2
    assert off.phase1_inferred == 0
    assert on.phase1_scores == off.phase1_scores  # the two inferred scores are the ones AIMET's phase 1 computes
    assert on.points == off.points and on.chosen == off.chosen and on.budget_met == off.budget_met
    assert {q.name: (q.precision(), q.enabled) for q in sim_on.quantizers} == \
        {q.name: (q.precision(), q.enabled) for q in sim_off.quantizers}


def test_the_chosen_configuration_is_the_brute_force_cheapest_on_the_path(tmp_path):
    """Every configuration of the three weighted groups and the output's, scored by brute force: the
    configuration the rule's search chose meets the target, and the search with every phase-1 evaluation
    chooses the same one."""
    drop = 0.02
    _, on = _run(tmp_path / "on", True, drop)
    _, off = _run(tmp_path / "off", False, drop)
    assert on.configuration == off.configuration
    sim = new_sim()
    from mixed_precision.amp_space import AmpSpace
    from mixed_precision.presets import candidate
    space = AmpSpace.build(sim, [candidate(c) for c in CANDIDATES])
    truth = {}
    for config in itertools.product(range(3), repeat=len(space.groups)):
        space.calibrated(config, feeds(), lambda: None)
        truth[tuple(CANDIDATES[c] for c in config)] = coarse_score(sim.session)
    target = on.float_score - drop
    assert truth[on.chosen.precisions] == on.score >= target


def test_an_executor_gives_the_local_result_with_the_rule(tmp_path):
    _, local = _run(tmp_path / "local", True, 0.02)
    with ThreadPoolExecutor(2) as pool:
        _, threaded = _run(tmp_path / "threads", True, 0.02, executor=pool, executor_chunks=3)
    assert threaded.phase1_scores == local.phase1_scores and threaded.phase1_inferred == local.phase1_inferred == 2
    assert threaded.points == local.points and threaded.chosen == local.chosen


def test_a_separate_phase1_callback_is_scored_on_the_float_model_once(tmp_path):
    """With its own phase-1 callback the ceiling costs one evaluation (the float model), counted in phase 1."""
    def phase1(session):
        return coarse_score(session)

    _, result = _run(tmp_path / "sep", True, 0.02, phase1=phase1)
    _, off = _run(tmp_path / "off", False, 0.02, phase1=phase1)
    assert result.phase1_inferred == 2 and result.phase1_evaluations == off.phase1_evaluations - 2 + 1
    assert result.chosen == off.chosen


def test_a_float_score_that_is_not_finite_turns_the_rule_off(tmp_path):
    """An SQNR-like phase-1 callback scores the float model inf: no group can reach it, nothing is inferred
    and nothing fails."""
    def sqnr_like(session):
        mse = -score(session)
        return math.inf if mse == 0 else -math.log10(mse)

    _, on = _run(tmp_path / "on", True, 0.02, phase1=sqnr_like)
    _, off = _run(tmp_path / "off", False, 0.02, phase1=sqnr_like)
    assert on.phase1_inferred == 0 and on.phase1_evaluations == off.phase1_evaluations + 1
    assert on.phase1_scores == off.phase1_scores and on.chosen == off.chosen


def test_two_candidates_cost_nothing_extra(tmp_path):
    """With two candidates each group has one flip: the rule evaluates nothing more (not even the ceiling)."""
    sim = new_sim()
    on = choose_mixed_precision(sim, ["W8A8", "W4A8"], coarse_score, coarse_score, 0.005, tmp_path / "on", True,
                                feeds(), phase1_saturation=True)
    off = choose_mixed_precision(new_sim(), ["W8A8", "W4A8"], coarse_score, coarse_score, 0.005, tmp_path / "off",
                                 True, feeds(), phase1_saturation=False)
    assert on.phase1_evaluations == off.phase1_evaluations and on.phase1_inferred == 0 and on.chosen == off.chosen


def _exact_sqnr(session) -> float:
    """SQNR (dB) of the MLP's output against the float model's: ``inf`` when exact (the CLI's convention)."""
    mse = -score(session)
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def test_group_sensitivity_on_an_executor_equals_the_local_run():
    """Every evaluation of the analysis page's group sensitivity on a thread pool: the scores a local run
    gives, the float model's ``inf`` included, and the sim left as it was (a frozen quantizer included)."""
    from concurrent.futures import ThreadPoolExecutor

    from tiny_cnn import snapshot

    from mixed_precision import group_sensitivity

    sim = new_sim()
    sim.compute_encodings(feeds())
    sim.qc_quantize_op_dict["W1"].freeze_encodings()
    before = snapshot(sim)
    local = group_sensitivity(sim, _exact_sqnr)
    with ThreadPoolExecutor(2) as pool:
        remote = group_sensitivity(sim, _exact_sqnr, executor=pool, chunks=3)
    assert remote == local and local[0] == math.inf and len(local[2]) == 4
    assert all(math.isfinite(g.alone) and math.isfinite(g.without) for g in local[2])
    assert snapshot(sim) == before


def test_the_rule_with_every_phase1_evaluation_calibrated_for_itself(tmp_path):
    """AIMET's phase1_optimize=False (a calibration pass per evaluation): the rule saves those passes too."""
    _, on = _run(tmp_path / "on", True, 0.02, phase1_optimize=False)
    _, off = _run(tmp_path / "off", False, 0.02, phase1_optimize=False)
    assert on.phase1_inferred == 2 and on.calibration_passes == off.calibration_passes - 2
    assert on.phase1_scores == off.phase1_scores and on.points == off.points and on.chosen == off.chosen
