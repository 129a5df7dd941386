"""Fast tests of the benchmark/demo helpers (no downloads; only the bench_qdq check builds a tiny sim)."""
from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common, fetch_models  # noqa: E402
from benchmarks import magika_inputs as mi  # noqa: E402

CFG = {"beg_size": 8, "mid_size": 0, "end_size": 8, "block_size": 16, "padding_token": 256,
       "use_inputs_at_offsets": False, "min_file_size_for_dl": 4, "target_labels_space": ["a", "b", "c"]}
PAD = 256


def _reference(content: bytes, cfg=CFG) -> list[int]:
    """magika 1.0.3's algorithm, transcribed with plain lists."""
    k = min(cfg["block_size"], len(content))
    beg = list(content[:k].lstrip()[: cfg["beg_size"]])
    beg += [cfg["padding_token"]] * (cfg["beg_size"] - len(beg))
    end = content[len(content) - k:].rstrip()
    end = list(end[max(0, len(end) - cfg["end_size"]):])
    end = [cfg["padding_token"]] * (cfg["end_size"] - len(end)) + end
    return beg + end


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ---- features ----------------------------------------------------------------------------

def test_features_short_file_strips_and_pads(tmp_path):
    p = _write(tmp_path, "a.txt", b" \t\n abc \r\n")
    x = mi.features([p], CFG)
    assert x.shape == (1, 16) and x.dtype == np.int32
    assert x[0, :8].tolist() == [ord("a"), ord("b"), ord("c"), ord(" "), ord("\r"), ord("\n"), PAD, PAD]
    # end: rstrip then left-pad
    assert x[0, 8:].tolist() == [PAD] + list(b" \t\n abc")
    assert x[0].tolist() == _reference(p.read_bytes())


def test_features_long_file_uses_blocks(tmp_path):
    data = b"0123456789ABCDEFGHIJ" + b"x" * 30 + b"klmnopqrstuvwxyz\n\n"
    p = _write(tmp_path, "b.bin", data)
    row = mi.features([p], CFG)[0].tolist()
    assert row[:8] == list(b"01234567")
    assert row[8:] == list(b"stuvwxyz")
    assert row == _reference(data)


def test_features_whitespace_only_first_block_is_all_padding(tmp_path):
    data = b" " * 20 + b"payload!"  # first 16-byte block is blank -> lstrip() leaves nothing
    p = _write(tmp_path, "c.txt", data)
    row = mi.features([p], CFG)[0].tolist()
    assert row[:8] == [PAD] * 8
    assert row[8:] == list(b"payload!")
    assert row == _reference(data)


def test_features_match_reference_on_random_files(tmp_path):
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b" \t\n\r\x0b\x0cab\x00\xff", np.uint8)
    paths = []
    for i in range(20):
        data = bytes(rng.choice(alphabet, size=int(rng.integers(1, 60))).tolist())
        paths.append(_write(tmp_path, f"r{i}", data))
    x = mi.features(paths, CFG)
    for p, row in zip(paths, x):
        assert row.tolist() == _reference(p.read_bytes())


def test_features_rejects_mid_features(tmp_path):
    p = _write(tmp_path, "d", b"hello world")
    with pytest.raises(NotImplementedError):
        mi.features([p], dict(CFG, mid_size=4))


def test_features_from_model_dir_config(tmp_path):
    (tmp_path / "config.min.json").write_text(json.dumps(CFG))
    p = _write(tmp_path, "e.py", b"print('hi')\n")
    assert mi.features([p], tmp_path).tolist() == mi.features([p], CFG).tolist()
    assert mi.labels(tmp_path) == ["a", "b", "c"]


def test_labels_and_input_name_from_dict():
    assert mi.labels(CFG) == ["a", "b", "c"]
    assert mi.input_name(CFG) == "bytes"


# ---- batching ----------------------------------------------------------------------------

def test_batches_split_and_key():
    x = np.arange(7 * 3, dtype=np.int32).reshape(7, 3)
    feeds = mi.batches(x, 3, "bytes")
    assert [list(f) for f in feeds] == [["bytes"]] * 3
    assert [f["bytes"].shape[0] for f in feeds] == [3, 3, 1]
    assert np.array_equal(np.concatenate([f["bytes"] for f in feeds]), x)
    assert all(f["bytes"].flags.c_contiguous and f["bytes"].dtype == np.int32 for f in feeds)
    assert mi.batches(x[:0], 4) == []
    with pytest.raises(ValueError):
        mi.batches(x, 0)


# ---- file discovery ----------------------------------------------------------------------

def test_find_real_files_deterministic_and_diverse(tmp_path):
    for ext in (".py", ".json", ".txt"):
        for i in range(5):
            _write(tmp_path, f"f{i}{ext}", b"content number %d " % i * 8)
    _write(tmp_path, "empty.py", b"")
    _write(tmp_path, "blank.txt", b" " * 200)
    _write(tmp_path, "other.xyz", b"z" * 200)
    (tmp_path / "link.py").symlink_to(tmp_path / "f0.py")
    a = mi.find_real_files(6, seed=3, roots=[tmp_path])
    b = mi.find_real_files(6, seed=3, roots=[tmp_path])
    assert a == b and len(a) == 6
    assert sorted(p.suffix for p in a) == [".json", ".json", ".py", ".py", ".txt", ".txt"]
    names = {p.name for p in mi.find_real_files(100, roots=[tmp_path])}
    assert len(names) == 15 and not names & {"empty.py", "blank.txt", "other.xyz", "link.py"}


# ---- cache dir / fetch -------------------------------------------------------------------

def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("QUANTSIM_CACHE_DIR", raising=False)
    assert fetch_models.cache_dir() == tmp_path / "home" / ".cache" / "quantsim"
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "env"))
    assert fetch_models.cache_dir() == tmp_path / "env"
    assert fetch_models.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert fetch_models.cache_dir(str(tmp_path / "arg2")) == tmp_path / "arg2"


def _no_download(*a, **k):
    raise AssertionError("must not download")


def test_fetch_magika_extracts_from_cached_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch_models.subprocess, "run", _no_download)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    prefix = f"magika/models/{fetch_models.MAGIKA_MODEL}/"
    with zipfile.ZipFile(wheels / f"magika-{fetch_models.MAGIKA_VERSION}-py3-none-any.whl", "w") as z:
        z.writestr(prefix + "model.onnx", b"ONNX")
        z.writestr(prefix + "config.min.json", json.dumps(CFG))
        z.writestr("magika/models/other/model.onnx", b"nope")
        z.writestr("magika/magika.py", "")
    d = fetch_models.fetch_magika(tmp_path)
    assert d == tmp_path / "models" / "magika"
    assert (d / "model.onnx").read_bytes() == b"ONNX"
    assert json.loads((d / "config.min.json").read_text()) == CFG
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".magika-")]  # no temp dirs left
    (wheels / f"magika-{fetch_models.MAGIKA_VERSION}-py3-none-any.whl").unlink()
    assert fetch_models.fetch_magika(tmp_path) == d  # cached: no wheel, no download needed


# ---- common ------------------------------------------------------------------------------

def test_top1_agreement_and_ratio_cell():
    a = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    b = np.array([[0.2, 0.8], [0.1, 0.9], [0.0, 1.0]])
    assert common.top1_agreement(a, b) == pytest.approx(2 / 3)
    assert common.ratio_cell(1.2, 1.5) == "1.20x ✓ (≤1.5x)"
    assert common.ratio_cell(3.5, 3) == "3.50x ✗ (≤3x)"
    assert common.ratio_cell(None) == "n/a"


def test_activation_scales_both_layouts():
    legacy = {"activation_encodings": {"y": [{"bitwidth": 8, "scale": 0.5, "offset": -128}],
                                       "z": [{"bitwidth": 8, "min": 0.0, "max": 2.55}]}}
    v1 = {"version": "1.0.0", "activation_encodings": [{"name": "y", "scale": [0.25], "offset": [0]},
                                                       {"name": "pc", "scale": [0.1, 0.2]}]}
    assert common.activation_scales(legacy) == pytest.approx({"y": 0.5, "z": 0.01})
    assert common.activation_scales(v1) == {"y": 0.25}


def test_best_of_returns_minimum():
    calls = []
    t = common.best_of(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and t >= 0


def test_interleaved_best_runs_round_robin():
    order = []
    t = common.interleaved_best({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=2, warmup=1)
    assert order == ["a", "b"] * 3 and set(t) == {"a", "b"} and min(t.values()) >= 0


def test_synthetic_models_run():
    ort = pytest.importorskip("onnxruntime")
    from benchmarks import models

    for m in (models.resnet_like(width=4), models.mobilenet_like()):
        feeds = models.random_feeds(m, 1, 2)
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        (y,) = s.run(None, feeds[0])
        assert y.shape == (2, 10) and np.isfinite(y).all()


def test_bench_qdq_agreement_counts_output_steps():
    """`bench_qdq.agreement`: max |Δ| over all outputs, steps on the output quantizer's grid, and the share
    of values within one step (hand-made differences of 0, 1 and 3 steps)."""
    from benchmarks import bench_qdq
    from tests import tiny_cnn

    sim = tiny_cnn.calibrated_sim()
    step = float(sim.qc_quantize_op_dict["y"].encoding.scale)
    out = sim.session.run(None, tiny_cnn.batch(9))[0]
    moved = out.copy()
    moved.flat[0] += step
    moved.flat[1] -= 3 * step
    same = bench_qdq.agreement(sim, [[out]], [[out]])
    assert same == {"max_abs": 0.0, "max_steps": 0.0, "within_1": 1.0}
    found = bench_qdq.agreement(sim, [[out]], [[moved]])
    assert found["max_steps"] == pytest.approx(3.0, rel=1e-4)
    assert found["within_1"] == pytest.approx((out.size - 1) / out.size)
