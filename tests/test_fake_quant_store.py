"""Fake-quantized weights of a cached large model are kept across processes (`quantsim.graph.weight_store`):
a new sim of the same model with the same param quantizers computes none of them, with the encodings and
output bits of a sim that computed them (and of a sim holding its weights in memory, the oracle); other
settings compute their own; a torn file is discarded and written again; the store stays bounded. A new sim
in the same process stands for a new process: nothing of the first one is shared but the disk. Small models
exercise the large-model paths by lowering the size thresholds."""
from __future__ import annotations

import importlib
import os
import time

import numpy as np
from test_large_model_memory import _outputs
from test_mapped_weight_reuse import _counting, _oracle_and_mapped_file

import quantsim
from quantsim.graph.file_set import wait_for_background
from quantsim.graph.weight_store import STORE_FOLDER, FakeQuantStore

cache_module = importlib.import_module("quantsim.prepare.cache")


def _encodings(sim) -> dict[str, tuple]:
    return {q.name: (q.encoding.scale.tobytes(), q.encoding.zero_point.tobytes())
            for q in sim.quantizers if q.encoding is not None}


def _setup(monkeypatch, tmp_path):
    return _oracle_and_mapped_file(monkeypatch, tmp_path, calibrated=True)


def _calibrated(path, feeds, **kwargs):
    sim = quantsim.QuantizationSimModel(path, progress=False, **kwargs)
    sim.compute_encodings(feeds)
    wait_for_background()
    return sim


def _store_files(sim) -> list:
    return sorted((sim._weights.folder / STORE_FOLDER).glob("fq-*.bin"))


def test_a_new_sim_finds_the_fake_quantized_weights_of_an_earlier_one(monkeypatch, tmp_path):
    oracle, path, feeds = _setup(monkeypatch, tmp_path)
    calls = _counting(monkeypatch)
    first = _calibrated(path, feeds)
    weights = [q for q in first.quantizers if q.role == "param" and q.enabled]
    assert calls[0] == len(weights)  # a miss: computed, and stored
    assert len(_store_files(first)) == len(weights)
    assert not list((first._weights.folder / STORE_FOLDER).glob(".tmp-*"))  # all published
    calls[0] = 0
    second = _calibrated(path, feeds)
    assert calls[0] == 0  # a hit: nothing computed
    assert _encodings(second) == _encodings(first) == _encodings(oracle)
    assert _outputs(second, feeds) == _outputs(first, feeds) == _outputs(oracle, feeds)
    assert calls[0] == 0


def test_other_param_settings_compute_their_own_weights(monkeypatch, tmp_path):
    oracle, path, feeds = _setup(monkeypatch, tmp_path)
    first = _calibrated(path, feeds)
    stored = len(_store_files(first))
    calls = _counting(monkeypatch)
    other = quantsim.QuantizationSimModel(path, progress=False)
    other.qc_quantize_op_dict["w1"].set_bitwidth(4)
    oracle.qc_quantize_op_dict["w1"].set_bitwidth(4)
    for sim in (other, oracle):
        sim.compute_encodings(feeds)
    wait_for_background()
    assert calls[0] == 2  # w1 alone for the mapped sim (the others are found), and the oracle's own w1
    assert _encodings(other) == _encodings(oracle)
    assert _outputs(other, feeds) == _outputs(oracle, feeds)
    assert len(_store_files(first)) == stored + 1


def test_a_torn_file_is_discarded_and_written_again(monkeypatch, tmp_path):
    oracle, path, feeds = _setup(monkeypatch, tmp_path)
    first = _calibrated(path, feeds)
    torn = _store_files(first)[0]
    size = torn.stat().st_size
    with open(torn, "r+b") as file:
        file.truncate(size // 2)
    calls = _counting(monkeypatch)
    second = _calibrated(path, feeds)
    assert calls[0] == 1
    assert torn.stat().st_size == size
    assert _encodings(second) == _encodings(oracle)
    assert _outputs(second, feeds) == _outputs(oracle, feeds)


def test_the_store_keeps_its_limit_and_drops_stale_temporary_files(tmp_path):
    store = FakeQuantStore(tmp_path / "store", limit_bytes=250)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    stale = tmp_path / "store" / ".tmp-0-fq-x.bin"
    store.folder.mkdir()
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert store.usable(sessions)
    assert not stale.exists()
    for i in range(4):
        name = store.name(f"t{i}", ("key", i), (100,), np.dtype(np.uint8))
        (store.folder / name).write_bytes(bytes(100))
        os.utime(store.folder / name, (1000 + i, 1000 + i))
    store.evict()
    left = sorted(p.name for p in store.folder.glob("fq-*.bin"))
    assert left == sorted(store.name(f"t{i}", ("key", i), (100,), np.dtype(np.uint8)) for i in (2, 3))  # newest
    assert store.take(left[0], 100, sessions) and (sessions / left[0]).stat().st_size == 100
    assert not store.take(left[1], 99, sessions)  # wrong size: torn, removed
    assert not (store.folder / left[1]).exists()
    assert store.name("t", ("a",), (2,), np.dtype(np.float32)) != store.name("t", ("b",), (2,), np.dtype(np.float32))


def _counting_encodings(monkeypatch) -> list[int]:
    """Counts the constants whose encodings are computed from their values (``calls[0]``)."""
    import quantsim.sim.param_encodings as param_module

    calls = [0]
    original = param_module.encodings_for_values

    def counted(items):
        calls[0] += len(items)
        return original(items)

    monkeypatch.setattr(param_module, "encodings_for_values", counted)
    return calls


def test_weight_encodings_are_found_by_a_new_sim(monkeypatch, tmp_path):
    oracle, path, feeds = _setup(monkeypatch, tmp_path)
    calls = _counting_encodings(monkeypatch)
    for scheme in ("tf_enhanced", "min_max"):
        calls[0] = 0
        first = _calibrated(path, feeds, quant_scheme=scheme)
        computed = calls[0]
        assert computed == len([q for q in first.quantizers if q.role == "param" and q.enabled])
        calls[0] = 0
        second = _calibrated(path, feeds, quant_scheme=scheme)
        assert calls[0] == 0  # found in the store
        assert _encodings(second) == _encodings(first)
        assert _outputs(second, feeds) == _outputs(first, feeds)
        assert list((first._weights.folder / STORE_FOLDER).glob("enc-*.npz"))
    assert _encodings(second) == _encodings(oracle)  # min_max last, the oracle's scheme


def test_weight_encodings_of_replaced_or_torn_values_are_computed(monkeypatch, tmp_path):
    oracle, path, feeds = _setup(monkeypatch, tmp_path)
    _calibrated(path, feeds)
    calls = _counting_encodings(monkeypatch)
    sim = quantsim.QuantizationSimModel(path, progress=False)
    sim.replace_weight("w0", np.full((48, 48), 0.01, np.float32))
    oracle.replace_weight("w0", np.full((48, 48), 0.01, np.float32))
    for s in (sim, oracle):
        s.compute_encodings(feeds)
    assert calls[0] == 1 + len([q for q in oracle.quantizers if q.role == "param" and q.enabled])
    assert _encodings(sim) == _encodings(oracle)
    for stored in (sim._weights.folder / STORE_FOLDER).glob("enc-*.npz"):
        stored.write_bytes(stored.read_bytes()[:40])
    calls[0] = 0
    again = _calibrated(path, feeds)
    assert calls[0] == len([q for q in again.quantizers if q.role == "param" and q.enabled])
    calls[0] = 0
    assert _encodings(_calibrated(path, feeds)) == _encodings(again)
    assert calls[0] == 0  # written again whole
