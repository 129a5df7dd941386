"""A model file's big external weights stay in its files while the sim prepares it (`graph.source_weights`):
hashed once for the cache key, read only by the passes that use them, copied file to file into the cache entry.
Oracles: the same preparation with the weights loaded by ``onnx.load`` (the entry must be byte for byte the
same), ``hashlib`` over the written files, and a sim built from the loaded ModelProto."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantsim
import quantsim.graph.large_models as large_models
import quantsim.graph.loading as loading_module
from quantsim.graph.file_set import wait_for_background
from quantsim.graph.loading import load_model, load_model_mapped
from quantsim.graph.mapped import MappedWeights, is_mapped
from quantsim.graph.source_weights import load_mapped, map_external
from quantsim.prepare import cache as cache_module
from quantsim.prepare import prepare_loaded_mapped
from quantsim.prepare.cache import cache_root
from quantsim.prepare.digest import content_digest

PACKAGE = sys.modules["quantsim.prepare"]  # the attribute quantsim.prepare is the function


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_module, "EXTERNAL_DATA_BYTES", 1)  # entries of these small models use external data


def _folding_model() -> onnx.ModelProto:
    """Conv -> BN (folded: reads the conv weight), a Transpose of a weight (constant-folded: reads it), a weight
    no pass touches and a bias under 1 KiB (loaded, not mapped)."""
    rng = np.random.default_rng(3)
    arrays = {"cw": rng.standard_normal((8, 4, 3, 3)), "s": rng.uniform(0.5, 2, 8), "b": rng.standard_normal(8),
              "m": rng.standard_normal(8), "v": rng.uniform(0.5, 2, 8), "wt": rng.standard_normal((16, 288)) / 9,
              "bias": rng.standard_normal(16), "w2": rng.standard_normal((16, 32)) / 4}
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Transpose", ["wt"], ["w"], name="t"),
             helper.make_node("MatMul", ["f", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "bias"], ["a"], name="add"),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _folding_model_opset11() -> onnx.ModelProto:
    """The same at opset 11: preparation converts it to opset 13 with its weights still mapped."""
    model = _folding_model()
    model.opset_import[0].version, model.ir_version = 11, 6
    return model


def _mlp() -> onnx.ModelProto:
    """MatMul -> Add -> Relu -> MatMul: nothing for the passes to change."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / 5).astype(np.float32), n)
             for n, s in (("w0", (32, 64)), ("b0", (64,)), ("w1", (64, 32)))]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m"], name="mm0"),
             helper.make_node("Add", ["m", "b0"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w1"], ["y"], name="mm1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save moves the data out of the model it is given
    onnx.save(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)
    return path


def _entry_files(cache: Path) -> dict[str, bytes]:
    wait_for_background()
    (entry,) = [e for e in cache_root(cache).iterdir() if len(e.name) == 64]
    return {f.name: f.read_bytes() for f in sorted(entry.iterdir()) if not f.name.startswith(".")}


def _prepare(path: Path, cache: Path, mapped: bool, monkeypatch) -> tuple:
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(cache))
    signatures: dict = {}
    if mapped:
        proto, _, weights = load_model_mapped(path, signatures, 1)
        assert weights is not None
    else:
        (proto, _), weights = load_model(path, signatures), None
    box = [proto]
    return prepare_loaded_mapped(lambda: box.pop() if box else load_model(path)[0], source=(path, signatures),
                                 weights=weights)


def _outputs(source, feeds) -> list[bytes]:
    sim = quantsim.QuantizationSimModel(source, progress=False)
    sim.compute_encodings(feeds)
    return [o.tobytes() for feed in feeds for o in sim.session.run(None, feed)]


@pytest.mark.parametrize("build", [_folding_model, _folding_model_opset11, _mlp])
def test_the_entry_is_byte_for_byte_the_one_of_the_loaded_model(tmp_path, monkeypatch, build):
    path = _save(build(), tmp_path / "m.onnx")
    _prepare(path, tmp_path / "loaded", False, monkeypatch)
    model, weights = _prepare(path, tmp_path / "mapped", True, monkeypatch)
    expected = _entry_files(tmp_path / "loaded")
    assert _entry_files(tmp_path / "mapped") == expected and "model.onnx.data" in expected
    assert weights is not None and any(is_mapped(t) for t in model.graph.initializer)  # from the entry
    sums = dict(line.split("  ")[::-1] for line in expected["SHA256SUMS"].decode().splitlines())
    assert all(hashlib.sha256(data).hexdigest() == sums[name] for name, data in expected.items() if name in sums)


def test_a_sim_of_the_file_computes_what_a_sim_of_the_loaded_model_computes(tmp_path, monkeypatch):
    path = _save(_folding_model(), tmp_path / "m.onnx")
    feeds = [{"x": np.random.default_rng(s).standard_normal((2, 4, 6, 6)).astype(np.float32)} for s in range(2)]
    expected = _outputs(onnx.load(str(path)), feeds)
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "file-cache"))
    mapped: list = []
    real = loading_module.map_external
    monkeypatch.setattr(loading_module, "map_external", lambda *a: mapped.append(real(*a)) or mapped[-1])
    assert _outputs(path, feeds) == expected  # cold: the weights stay in the file
    assert len(mapped) == 1 and mapped[0] is not None
    assert _outputs(path, feeds) == expected and len(mapped) == 1  # warm: the file is not read


def test_unchanged_weights_are_hashed_once_and_copied(tmp_path, monkeypatch):
    path = _save(_mlp(), tmp_path / "m.onnx")
    copies: list[str] = []
    real = MappedWeights.copy_into
    monkeypatch.setattr(MappedWeights, "copy_into", lambda self, t, *a: copies.append(t.name) or real(self, t, *a))
    _prepare(path, tmp_path / "c", True, monkeypatch)
    files = _entry_files(tmp_path / "c")
    loaded = onnx.load(str(path))
    payload = b"".join(t.raw_data for t in loaded.graph.initializer if len(t.raw_data) >= 1024)  # not b0
    sums = dict(line.split("  ")[::-1] for line in files["SHA256SUMS"].decode().splitlines())
    assert files["model.onnx.data"] == payload and sums["model.onnx.data"] == hashlib.sha256(payload).hexdigest()
    assert copies == ["w0", "w1"]
    mapped, weights = load_mapped(path, 1)
    assert content_digest(mapped, weights) == content_digest(loaded)._replace(layout=content_digest(mapped, weights).layout)
    assert content_digest(mapped, weights).payload == hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize("how", ["small buffer", "no preadv"])
def test_the_copy_is_the_same_in_pieces_and_through_the_map(tmp_path, monkeypatch, how):
    path = _save(_mlp(), tmp_path / "m.onnx")
    _prepare(path, tmp_path / "whole", True, monkeypatch)
    if how == "small buffer":  # pieces that end inside a tensor
        monkeypatch.setattr(large_models, "COPY_BUFFER_BYTES", 1000)
    else:  # platforms without it write from the memory map
        monkeypatch.delattr(os, "preadv", raising=False)
    _prepare(path, tmp_path / "pieces", True, monkeypatch)
    assert _entry_files(tmp_path / "pieces") == _entry_files(tmp_path / "whole")


def test_a_file_changed_while_it_is_prepared_is_not_cached(tmp_path, monkeypatch):
    path = _save(_mlp(), tmp_path / "m.onnx")
    real = PACKAGE.file_signature
    monkeypatch.setattr(PACKAGE, "file_signature", lambda name: [-1] if str(name).endswith(".data") else real(name))
    model, weights = _prepare(path, tmp_path / "c", True, monkeypatch)
    assert not [e for e in cache_root(tmp_path / "c").iterdir() if len(e.name) == 64]
    assert weights is None and not any(is_mapped(t) for t in model.graph.initializer)  # weights taken in
    loaded = onnx.load(str(path))
    assert {t.name: t.raw_data for t in model.graph.initializer} == {t.name: t.raw_data for t in loaded.graph.initializer}


def test_only_tensors_read_exactly_as_onnx_load_reads_them_stay_mapped(tmp_path):
    path = _save(_folding_model(), tmp_path / "m.onnx")
    graph_only = onnx.load(str(path), load_external_data=False)
    for tensor in graph_only.graph.initializer:
        if tensor.name == "cw":  # no length: onnx reads to the end of the file
            kept = [(e.key, e.value) for e in tensor.external_data if e.key != "length"]
            del tensor.external_data[:]
            for key, value in kept:
                tensor.external_data.add(key=key, value=value)
    (tmp_path / "m.onnx").write_bytes(graph_only.SerializeToString())
    expected = {t.name: t for t in onnx.load(str(path)).graph.initializer}
    model, weights = load_mapped(path, 1)
    assert weights is not None
    mapped = {t.name for t in model.graph.initializer if is_mapped(t)}
    assert mapped == {"wt", "w2"}  # not the small ones (s, b, m, v, bias) nor the one without length
    for tensor in model.graph.initializer:
        if tensor.name in mapped:
            assert weights.array(tensor).tobytes() == expected[tensor.name].raw_data
            assert [f.name for f, _ in tensor.ListFields()] == ["dims", "data_type", "name", "external_data",
                                                                "data_location"]
        else:
            assert tensor.SerializeToString() == expected[tensor.name].SerializeToString()
    everything, none = load_mapped(path, 10**9)  # under the caller's threshold: onnx.load's model
    assert none is None and everything.SerializeToString() == onnx.load(str(path)).SerializeToString()
    again = onnx.load(str(path), load_external_data=False)
    assert map_external(again, tmp_path, 0) is not None
