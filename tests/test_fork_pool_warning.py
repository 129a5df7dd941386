"""Executors whose workers are forked copies of this process are warned about (a fork of a process whose
onnxruntime sessions hold threads can deadlock); threads and spawned processes are not. No pool here ever
starts a worker: a ProcessPoolExecutor starts them at its first submit."""
from __future__ import annotations

import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from quantsim.errors import InvalidArgumentError, warn_if_forking_pool

fork_available = "fork" in multiprocessing.get_all_start_methods()


@pytest.mark.skipif(not fork_available, reason="no fork start method on this platform")
def test_a_forking_pool_is_warned_about_and_the_warning_names_the_call_and_the_remedy():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        with pytest.warns(RuntimeWarning, match=r"apply_seq_mse: .*forks its workers.*get_context\('spawn'\)"):
            warn_if_forking_pool(pool, "apply_seq_mse")


def test_threads_spawned_processes_and_other_objects_are_not_warned_about():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ThreadPoolExecutor(1) as threads, \
                ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as spawned:
            for executor in (None, threads, spawned, object()):
                warn_if_forking_pool(executor, "apply_adaround")


@pytest.mark.skipif(not fork_available, reason="no fork start method on this platform")
def test_choose_mixed_precision_warns_at_the_users_line_before_it_checks_its_arguments():
    from mixed_precision import choose_mixed_precision

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        with pytest.warns(RuntimeWarning, match="choose_mixed_precision") as caught, \
                pytest.raises(InvalidArgumentError):
            choose_mixed_precision(None, [], lambda s: 0.0, lambda s: 0.0, 0.01, "unused", True, [{}],  # type: ignore[arg-type]
                                   executor=pool)
    assert any(w.filename == __file__ for w in caught)
