"""The preparation cache's size limit (issue 28): least-recently-used eviction, the limit from the argument,
``$QUANTSIM_CACHE_MAX_SIZE`` or the default, ``clear --older-than``, ``quantsim cache list|clear|trim``, and
safety under concurrent processes (an entry a reader holds is never removed under it)."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantsim import InvalidArgumentError
from quantsim.prepare import DEFAULT_PASSES, PrepareWarning, cache_info, clear_cache, eviction, prepare, trim_cache
from quantsim.prepare import cache as cache_module
from quantsim.prepare.cache import cache_key, cache_root, load_cached, load_cached_mapped
from quantsim_cli.main import main

HOUR = 3600.0


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.delenv(eviction.LIMIT_ENV_VAR, raising=False)


def conv_model(seed: int, size: int = 8) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(size=(size, size, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", 1, [1, size, 5, 5])],
                              [helper.make_tensor_value_info("y", 1, None)], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fill(cache: Path, count: int, ages_hours: list[float] | None = None) -> list[str]:
    """``count`` entries, the i-th last used ``ages_hours[i]`` hours ago (default: count-i hours ago)."""
    keys = []
    for i in range(count):
        model = conv_model(i)
        prepare(model, cache_dir=cache, cache_max_size="unlimited")
        keys.append(cache_key(model, DEFAULT_PASSES,
                              {"fold_batchnorm": True, "fold_constants": True, "optimize": False}))
    for i, key in enumerate(keys):
        age = (ages_hours[i] if ages_hours else count - i) * HOUR
        stamp = time.time() - age
        os.utime(cache_root(cache) / key / eviction.LOCK_FILE, (stamp, stamp))
    return keys


def keys_in(cache: Path) -> set[str]:
    return {e.key for e in cache_info(cache)}


@pytest.mark.parametrize("text, expected", [("5G", 5 << 30), ("500M", 500 << 20), ("1.5GiB", 3 << 29),
                                            ("2048", 2048), ("10kb", 10240), (" 3 g ", 3 << 30),
                                            ("unlimited", None), ("none", None), (0, 0)])
def test_sizes_parse(text, expected):
    assert eviction.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "5X", "-1G", "G", "lots", True, -3])
def test_bad_sizes_name_the_setting(text):
    with pytest.raises(InvalidArgumentError, match="QUANTSIM_CACHE_MAX_SIZE"):
        eviction.parse_size(text)


@pytest.mark.parametrize("text, seconds", [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45),
                                           ("2w", 14 * 86400), ("10", 10), ("1.5h", 5400)])
def test_durations_parse(text, seconds):
    assert eviction.parse_duration(text) == seconds


def test_limit_precedence_argument_env_default(monkeypatch):
    assert eviction.cache_limit() == eviction.DEFAULT_MAX_BYTES == 5 << 30
    monkeypatch.setenv(eviction.LIMIT_ENV_VAR, "2G")
    assert eviction.cache_limit() == 2 << 30
    assert eviction.cache_limit("100M") == 100 << 20
    monkeypatch.setenv(eviction.LIMIT_ENV_VAR, "unlimited")
    assert eviction.cache_limit() is None
    monkeypatch.setenv(eviction.LIMIT_ENV_VAR, "huge")
    with pytest.raises(InvalidArgumentError, match="QUANTSIM_CACHE_MAX_SIZE.*'huge'"):
        prepare(conv_model(0))


def test_trim_removes_least_recently_used_first_and_a_read_counts_as_use(tmp_path):
    cache = tmp_path / "c"
    keys = fill(cache, 4)  # keys[0] oldest ... keys[3] newest
    sizes = {e.key: e.size_bytes for e in cache_info(cache)}
    assert load_cached(keys[0], cache) is not None  # used now: the most recent
    assert cache_info(cache)[-1].key == keys[0]  # listed least recently used first
    limit = sizes[keys[0]] + sizes[keys[3]] + 10
    removed = trim_cache(limit, cache)
    assert removed == [keys[1], keys[2]]
    assert keys_in(cache) == {keys[0], keys[3]}
    assert sum(e.size_bytes for e in cache_info(cache)) <= limit
    assert not [p for p in cache_root(cache).iterdir() if p.name.startswith(".trash-")]


def test_each_write_trims_to_the_argument_or_env_limit_keeping_the_new_entry(tmp_path, monkeypatch):
    cache = tmp_path / "c"
    keys = fill(cache, 3)
    one = max(e.size_bytes for e in cache_info(cache))
    monkeypatch.setenv(eviction.LIMIT_ENV_VAR, str(2 * one + 10))
    prepare(conv_model(10), cache_dir=cache)  # env: room for two, the new one and the most recent old one
    assert len(keys_in(cache)) == 2 and keys[2] in keys_in(cache)
    prepare(conv_model(11), cache_dir=cache, cache_max_size=0)  # argument wins: only the new entry stays...
    info = cache_info(cache)
    assert len(info) == 2  # ...and the entry written a moment ago (conv_model(10)): recently used, kept
    for entry in info:
        os.utime(cache_root(cache) / entry.key / eviction.LOCK_FILE, (1.0, 1.0))
    prepare(conv_model(12), cache_dir=cache, cache_max_size=0)
    assert len(cache_info(cache)) == 1  # larger than its limit, the entry just written still stays alone
    assert load_cached(cache_info(cache)[0].key, cache) is not None


def test_limit_argument_without_cache_warns_and_bad_argument_fails():
    with pytest.warns(PrepareWarning, match="cache_max_size has no effect"):
        prepare(conv_model(0), cache=False, cache_max_size="1G")
    with pytest.raises(InvalidArgumentError, match="max_size"):
        prepare(conv_model(0), cache_max_size="1 gigantic")


def test_size_counts_the_fakequant_store(tmp_path):
    cache = tmp_path / "c"
    (key,) = fill(cache, 1)
    before = cache_info(cache)[0].size_bytes
    store = cache_root(cache) / key / "fakequant"
    store.mkdir()
    (store / "w.bin").write_bytes(b"\0" * 5000)
    assert cache_info(cache)[0].size_bytes == before + 5000


def test_clear_older_than_keeps_recent_entries(tmp_path):
    cache = tmp_path / "c"
    keys = fill(cache, 3, ages_hours=[50, 30, 1])
    assert clear_cache(cache, older_than=48 * HOUR) == 1 and keys_in(cache) == set(keys[1:])
    assert clear_cache(cache, older_than=2 * HOUR) == 1 and keys_in(cache) == {keys[2]}
    assert clear_cache(cache) == 1 and keys_in(cache) == set()


def test_an_entry_of_an_older_version_without_a_lock_file_keeps_its_age(tmp_path):
    cache = tmp_path / "c"
    (key,) = fill(cache, 1)
    entry = cache_root(cache) / key
    (entry / eviction.LOCK_FILE).unlink()
    old = time.time() - 10 * HOUR
    os.utime(entry / "SHA256SUMS", (old, old))
    assert abs(cache_info(cache)[0].last_used - old) < 1
    assert clear_cache(cache, older_than=HOUR) == 1  # creating its lock file did not make it look used now


# --- concurrent processes -----------------------------------------------------------------------------
_HOLDER = """
import sys
from quantsim.prepare.cache import load_cached_mapped
loaded = load_cached_mapped(sys.argv[1], sys.argv[2])
assert loaded is not None and loaded[1] is not None
print("holding", flush=True)
sys.stdin.readline()  # the parent evicts meanwhile
model, weights = loaded
print(float(weights.array(model.graph.initializer[0]).sum()), flush=True)
"""


def test_an_entry_another_process_has_mapped_is_never_evicted(tmp_path, monkeypatch):
    cache = tmp_path / "c"
    monkeypatch.setattr(cache_module, "EXTERNAL_DATA_BYTES", 1)  # entries keep their weights in a data file
    keys = fill(cache, 3)
    expected = float(numpy_helper.to_array(conv_model(1).graph.initializer[0]).sum())
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, keys[1], str(cache)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "holding"
        os.utime(cache_root(cache) / keys[1] / eviction.LOCK_FILE, (1.0, 1.0))  # oldest, yet held
        busy = {e.key: e.in_use for e in cache_info(cache)}
        assert busy == {keys[0]: False, keys[1]: True, keys[2]: False}
        assert trim_cache(0, cache) == [keys[0], keys[2]]  # keys[1] is the least recently used, but held
        assert clear_cache(cache) == 0 and keys_in(cache) == {keys[1]}
        assert main(["cache", "clear", "--cache-dir", str(cache), "-q"]) == 0 and keys_in(cache) == {keys[1]}
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert float(holder.stdout.readline()) == pytest.approx(expected, rel=1e-6)  # its files were all there
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
    assert clear_cache(cache) == 1 and keys_in(cache) == set()  # released when the reader ended


def _reader_and_writer(cache: str, seed: int, rounds: int, barrier, results) -> None:
    """One process: prepare models seed, seed+2, ... in turn under a tiny limit (so every write evicts the
    other process's entries) and read each back; every result must be the model's own preparation."""
    os.environ[eviction.LIMIT_ENV_VAR] = "1"
    eviction.RECENT_SECONDS = 0.0  # evict even what was used a moment ago: only the locks protect readers
    barrier.wait(timeout=60)
    problems = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(rounds):
            model = conv_model(seed + 2 * (i % 3))
            got = prepare(model, cache_dir=cache)
            want = prepare(model, cache=False)
            if got.SerializeToString(deterministic=True) != want.SerializeToString(deterministic=True):
                problems.append(f"round {i}: wrong model")
            key = cache_key(model, DEFAULT_PASSES,
                            {"fold_batchnorm": True, "fold_constants": True, "optimize": False})
            mapped = load_cached_mapped(key, cache)  # may be evicted already (a miss), never torn
            if mapped is not None and mapped[0].graph.node[0].op_type != "Conv":
                problems.append(f"round {i}: torn entry")
    problems += [str(w.message) for w in caught]
    results.put(problems)


def test_two_processes_writing_and_evicting_concurrently_never_see_a_torn_entry(tmp_path):
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_reader_and_writer, args=(str(tmp_path / "c"), seed, 12, barrier, results))
               for seed in (0, 1)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert outcomes == [[], []]  # no wrong model, no torn entry, no "corrupted entry" warning
    root = cache_root(tmp_path / "c")
    assert len(cache_info(tmp_path / "c")) <= 2  # each process's last entry at most
    assert not [p for p in root.iterdir() if p.name.startswith(".trash-")]


# --- command line -------------------------------------------------------------------------------------
def test_cli_list_shows_size_last_use_and_clear_older_than(tmp_path, capsys):
    cache = tmp_path / "c"
    keys = fill(cache, 3, ages_hours=[72, 30, 0.5])
    assert main(["cache", "list", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "3 prepared model(s)" in out and "limit 5.0 GB" in out
    lines = [line for line in out.splitlines() if line.strip().startswith(tuple(k[:16] for k in keys))]
    assert [line.split()[0] for line in lines] == [keys[2][:16], keys[1][:16], keys[0][:16]]  # recent first
    assert "30 min ago" in lines[0] and "30 h ago" in lines[1] and "3 d ago" in lines[2] and "KB" in lines[0]
    assert main(["cache", "clear", "--older-than", "2d", "--cache-dir", str(cache)]) == 0
    assert "removed 1 prepared model(s) unused for 2 d or more" in capsys.readouterr().out
    assert keys_in(cache) == set(keys[1:])
    assert main(["cache", "trim", "--max-size", "1", "--cache-dir", str(cache)]) == 0
    assert "evicted 2 prepared model(s)" in capsys.readouterr().out and keys_in(cache) == set()


@pytest.mark.parametrize("argv, message", [
    (["cache", "clear", "--older-than", "soon"], "expected a duration"),
    (["cache", "trim", "--max-size", "big"], "--max-size: expected a size"),
])
def test_cli_bad_values_are_usage_errors(argv, message, capsys):
    assert main(argv) == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["cache", "list", "--older-than", "1d"], "--older-than applies to 'cache clear'"),
    (["cache", "clear", "--max-size", "1G"], "--max-size applies to 'cache trim'"),
])
def test_cli_options_of_another_action_are_refused(argv, message, capsys):
    assert main(argv) == 1 and message in capsys.readouterr().err


def test_a_read_only_cache_is_read_without_locks(tmp_path, monkeypatch):
    """Where the lock file cannot be created (a read-only cache shared by a team), entries are still read."""
    cache = tmp_path / "c"
    (key,) = fill(cache, 1)
    (cache_root(cache) / key / eviction.LOCK_FILE).unlink()
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise PermissionError(30, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(eviction.os, "open", read_only)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "corrupted entry" warning, no exception
        assert load_cached(key, cache) is not None
        assert load_cached_mapped(key, cache) is not None
