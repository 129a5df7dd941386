"""Tests for the on-disk cache of prepared models: hits skip the passes, corrupted entries are rebuilt,
concurrent writers both succeed, and the cache folder follows argument > $QUANTSIM_CACHE_DIR > home."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantsim.graph import large_models
from quantsim.graph.file_set import wait_for_background
from quantsim.prepare import PrepareWarning, cache_info, cache_size, clear_cache, entry_sync, prepare
from quantsim.prepare import cache as cache_module
from quantsim.prepare.cache import cache_key, cache_root, load_cached, pass_identity, store_cached
from quantsim.prepare.passes import name_nodes

PACKAGE = sys.modules["quantsim.prepare"]  # the attribute quantsim.prepare is the function
CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Never touch the real home cache: the environment points into tmp_path."""
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    CALLS.clear()


def counting_pass(model):
    CALLS.append("run")
    return model, False


def model_with_bn(size=4, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {"w": rng.normal(size=(size, size, 3, 3)), "s": rng.normal(size=size), "b": rng.normal(size=size),
              "m": rng.normal(size=size), "v": rng.uniform(0.5, 2, size=size)}
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "s", "b", "m", "v"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, size, 5, 5])],
                              [helper.make_tensor_value_info("z", 1, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def entry_dir(tmp_path) -> Path:
    (entry,) = cache_info(tmp_path / "c")
    return cache_root(tmp_path / "c") / entry.key


def test_second_prepare_is_a_hit_and_skips_the_passes(tmp_path, monkeypatch):
    model = model_with_bn()
    first = prepare(model, cache_dir=tmp_path / "c")
    assert [n.op_type for n in first.graph.node] == ["Conv"]
    assert len(cache_info(tmp_path / "c")) == 1

    def no_passes(*_):
        raise AssertionError("the passes ran again")

    monkeypatch.setattr(PACKAGE, "_run_passes", no_passes)
    second = prepare(model, cache_dir=tmp_path / "c")
    assert second.SerializeToString(deterministic=True) == first.SerializeToString(deterministic=True)


def test_custom_passes_are_cached_by_identity(tmp_path):
    model = model_with_bn()
    for _ in range(3):
        prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert CALLS == ["run"]
    prepare(model, passes=[lambda m: counting_pass(m)], cache_dir=tmp_path / "c")  # no stable identity
    prepare(model, passes=[lambda m: counting_pass(m)], cache_dir=tmp_path / "c")
    assert CALLS == ["run"] * 3
    assert pass_identity(name_nodes).startswith("quantsim.prepare.naming.name_nodes@")


def test_options_model_and_cache_flag_change_the_entry(tmp_path):
    model, other = model_with_bn(), model_with_bn(seed=1)
    prepare(model, cache_dir=tmp_path / "c")
    unfolded = prepare(model, fold_batchnorm=False, cache_dir=tmp_path / "c")
    prepare(other, cache_dir=tmp_path / "c")
    assert "BatchNormalization" in [n.op_type for n in unfolded.graph.node]
    assert len(cache_info(tmp_path / "c")) == 3
    prepare(model_with_bn(seed=2), cache=False, cache_dir=tmp_path / "c")
    assert len(cache_info(tmp_path / "c")) == 3
    assert cache_key(model, [name_nodes], {}) != cache_key(model, [name_nodes], {"x": 1})


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "missing"])
def test_corrupted_entry_is_discarded_and_rebuilt(tmp_path, damage):
    model = model_with_bn()
    good = prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    entry = entry_dir(tmp_path)
    target = entry / "model.onnx"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:50])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[-3] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "manifest":
        (entry / "SHA256SUMS").write_text("garbage\n")
    else:
        target.unlink()
    with pytest.warns(PrepareWarning, match="corrupted.*discarding it"):
        again = prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert CALLS == ["run", "run"]
    assert again.SerializeToString() == good.SerializeToString()
    prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")  # the rebuilt entry is valid
    assert CALLS == ["run", "run"]
    assert not [p for p in cache_root(tmp_path / "c").iterdir() if p.name.startswith(".")]


def test_clear_and_info(tmp_path):
    assert cache_info(tmp_path / "c") == [] and clear_cache(tmp_path / "c") == 0
    prepare(model_with_bn(), cache_dir=tmp_path / "c")
    prepare(model_with_bn(seed=1), cache_dir=tmp_path / "c")
    info = cache_info(tmp_path / "c")
    assert len(info) == 2 and all(len(e.key) == 64 and e.size_bytes > 0 and e.mtime > 0 for e in info)
    key, size, mtime, used, busy = info[0]
    assert used >= mtime - 1 and not busy  # written counts as used; no reader holds it after prepare returned
    assert cache_size(tmp_path / "c") == sum(e.size_bytes for e in info)
    assert clear_cache(tmp_path / "c") == 2
    assert cache_info(tmp_path / "c") == [] and cache_size(tmp_path / "c") == 0


def test_directory_precedence_argument_env_home(tmp_path, monkeypatch):
    model = model_with_bn()
    prepare(model, cache_dir=tmp_path / "arg")
    assert (tmp_path / "arg" / "prepared").is_dir() and not (tmp_path / "env").exists()
    prepare(model)
    assert len(cache_info()) == 1 and (tmp_path / "env" / "prepared").is_dir()
    monkeypatch.delenv("QUANTSIM_CACHE_DIR")
    assert cache_root() == tmp_path / "xdg" / "quantsim" / "prepared"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == tmp_path / "home" / ".cache" / "quantsim" / "prepared"
    prepare(model)
    assert len(cache_info(tmp_path / "home" / ".cache" / "quantsim")) == 1


def test_unwritable_cache_only_warns(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(PrepareWarning, match="could not write"):
        prepared = prepare(model_with_bn(), cache_dir=blocker)
    assert [n.op_type for n in prepared.graph.node] == ["Conv"]


def test_large_model_is_stored_with_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)
    model = model_with_bn(size=16)
    first = prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert first.graph.initializer[0].HasField("raw_data")  # storing did not take the weights away
    entry = entry_dir(tmp_path)
    wait_for_background()  # the data file's fsync, then its stamp, run on a thread
    assert sorted(p.name for p in entry.iterdir()) == [".lock", ".verified", "KEY", "SHA256SUMS", "model.onnx",
                                                       "model.onnx.data"]
    assert (entry / "model.onnx.data").stat().st_size > (entry / "model.onnx").stat().st_size
    second = prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert CALLS == ["run"]
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in second.graph.initializer)
    for want, got in zip(first.graph.initializer, second.graph.initializer):
        assert numpy_helper.to_array(want).tobytes() == numpy_helper.to_array(got).tobytes()
    data = entry / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.warns(PrepareWarning, match="model.onnx.data does not match"):
        prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert CALLS == ["run", "run"]


def test_entry_files_are_rehashed_when_changed_in_place_after_being_stamped(tmp_path, monkeypatch):
    """The `.verified` stamp spares re-hashing unchanged files only: a byte flipped in place (same size, mtime set
    back) changes the ctime, and the entry is re-hashed and discarded."""
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)
    model = model_with_bn(size=16)
    prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    wait_for_background()  # stamped: the data file's fsync, then its stamp, run on a thread
    entry = entry_dir(tmp_path)
    data = entry / "model.onnx.data"
    hashed = []
    real_digest = cache_module._file_digest
    monkeypatch.setattr(cache_module, "_file_digest", lambda path, sync=False: hashed.append(path.name)
                        or real_digest(path, sync))
    prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")  # stamped when written: nothing re-read
    assert hashed == [] and CALLS == ["run"]
    before = data.stat()
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0xFF
    time.sleep(0.01)
    data.write_bytes(bytes(content))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.warns(PrepareWarning, match="model.onnx.data does not match"):
        prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert "model.onnx.data" in hashed and CALLS == ["run", "run"]


def test_data_file_is_trusted_in_process_at_once_and_elsewhere_only_once_synced(tmp_path, monkeypatch):
    """The big data file's fsync runs after publishing: this process trusts the digests it took while writing
    (no re-read), other processes only through the stamp written once the file is on disk; without it (a crash
    before the sync) a reader hashes the files and discards a torn entry."""
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)
    started = []
    monkeypatch.setattr(entry_sync, "in_background", lambda work, name: started.append(work))  # not run yet
    model = model_with_bn(size=16)
    prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    entry = entry_dir(tmp_path)
    assert len(started) == 1 and not (entry / ".verified").exists()  # not synced yet: no stamp
    hashed = []
    real_digest = cache_module._file_digest
    monkeypatch.setattr(cache_module, "_file_digest", lambda path, sync=False: hashed.append(path.name)
                        or real_digest(path, sync))
    prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert hashed == [] and CALLS == ["run"]  # this process wrote it: nothing re-read
    monkeypatch.setattr(entry_sync, "_FRESH", {})  # another process (or after a crash): no stamp to trust
    data = entry / "model.onnx.data"
    data.write_bytes(bytes(data.stat().st_size))  # the data never reached the disk
    with pytest.warns(PrepareWarning, match="model.onnx.data does not match"):
        prepare(model, passes=[counting_pass], cache_dir=tmp_path / "c")
    assert "model.onnx.data" in hashed and CALLS == ["run", "run"]
    started[0]()  # the sync of the discarded entry finishing late stamps nothing
    assert not (entry / ".verified").exists()


def test_publishing_an_existing_key_keeps_the_first_entry(tmp_path):
    first, second = model_with_bn(), model_with_bn(seed=1)
    key = "ab" * 32
    assert store_cached(key, first, tmp_path / "c") == store_cached(key, second, tmp_path / "c")
    assert load_cached(key, tmp_path / "c").SerializeToString() == first.SerializeToString(deterministic=True)
    assert [p.name for p in cache_root(tmp_path / "c").iterdir()] == [key]


def _prepare_in_child(cache_dir, barrier, results):
    barrier.wait(timeout=60)
    prepared = prepare(model_with_bn(size=8), cache_dir=cache_dir)
    results.put(prepared.SerializeToString(deterministic=True))


def test_two_processes_preparing_the_same_model_both_succeed(tmp_path):
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_prepare_in_child, args=(str(tmp_path / "c"), barrier, results))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    outputs = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert outputs[0] == outputs[1]
    assert len(cache_info(tmp_path / "c")) == 1
    assert not [p for p in cache_root(tmp_path / "c").iterdir() if p.name.startswith(".")]
    expected = prepare(model_with_bn(size=8), cache=False)
    assert outputs[0] == expected.SerializeToString(deterministic=True)


# --------------------------------------------------------------------------------------------------
# entries bound to their key; incomplete entries rebuilt (issue 14)
# --------------------------------------------------------------------------------------------------
def _two_entries(cache):
    """Prepare two different models into ``cache``; returns (model_b, key_a, key_b)."""
    model_a, model_b = model_with_bn(seed=0), model_with_bn(seed=1)
    prepare(model_a, cache_dir=cache)
    (key_a,) = [e.key for e in cache_info(cache)]
    prepare(model_b, cache_dir=cache)
    (key_b,) = [e.key for e in cache_info(cache) if e.key != key_a]
    return model_b, key_a, key_b


def test_an_entry_copied_under_another_key_is_refused_and_the_right_model_runs(tmp_path):
    import shutil

    cache = tmp_path / "c"
    model_b, key_a, key_b = _two_entries(cache)
    reference = prepare(model_b, cache=False)
    root = cache_root(cache)
    shutil.rmtree(root / key_b)
    shutil.copytree(root / key_a, root / key_b)  # model, KEY and manifest: a consistent entry of model a
    with pytest.warns(PrepareWarning, match="belongs to another key"):
        again = prepare(model_b, cache_dir=cache)
    assert [t.raw_data for t in again.graph.initializer] == [t.raw_data for t in reference.graph.initializer]
    assert load_cached(key_b, cache) is not None  # rewritten with the right model


@pytest.mark.parametrize("damage", ["manifest deleted", "folder replaced by a file"])
def test_an_incomplete_entry_is_rebuilt_once_not_missed_forever(tmp_path, damage):
    import shutil
    import warnings

    cache = tmp_path / "c"
    prepare(model_with_bn(), cache_dir=cache)
    entry = entry_dir(tmp_path)
    if damage == "manifest deleted":
        (entry / "SHA256SUMS").unlink()
    else:
        shutil.rmtree(entry)
        entry.write_text("not a folder")
    with pytest.warns(PrepareWarning, match="corrupted"):
        prepare(model_with_bn(), cache_dir=cache)
    assert entry.is_dir() and (entry / "SHA256SUMS").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(model_with_bn(), cache_dir=cache)  # a clean hit now
    assert not [p for p in cache_root(cache).iterdir() if p.name.startswith(".")]


def test_cache_info_lists_an_entry_whose_staged_stamp_is_renamed_while_listing(tmp_path, monkeypatch):
    """The sync thread renames the `.verified` stamp's staged file into place while `cache_info` may be listing
    the entry: a file gone between the listing and its stat does not hide the entry."""
    prepare(model_with_bn(), cache_dir=tmp_path / "c")
    (entry,) = cache_info(tmp_path / "c")
    real_iterdir = Path.iterdir

    def iterdir_with_a_vanished_file(self):
        yield from real_iterdir(self)
        if self.name == entry.key:
            yield self / ".verified.staged-gone"

    monkeypatch.setattr(Path, "iterdir", iterdir_with_a_vanished_file)
    assert [e.key for e in cache_info(tmp_path / "c")] == [entry.key]
