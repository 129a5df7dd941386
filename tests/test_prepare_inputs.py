"""A model file's content digest is remembered with the stat signatures of its files: an unchanged file with
external data is prepared from the cache without being read, and any change to the graph or its data file
(same size, even with its mtime set back) is read and hashed again. The oracle is a sim built from the
ModelProto itself."""
from __future__ import annotations

import os
import time

import numpy as np
import onnx
import pytest
from models import make_model
from onnx import TensorProto, helper, numpy_helper

import quantsim
import quantsim.sim.model as sim_model_module
from quantsim.prepare import clear_cache, prepare_file_cached
from quantsim.prepare.inputs import INPUTS_FOLDER


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))


def _model(scale: float = 1.0) -> tuple[onnx.ModelProto, list[dict]]:
    rng = np.random.default_rng(5)
    w = (scale * rng.standard_normal((32, 32)) / 6).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                        helper.make_node("Relu", ["m"], ["y"], name="relu")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])],
                       [numpy_helper.from_array(w, "w")])
    feeds = [{"x": np.random.default_rng(s).standard_normal((4, 32)).astype(np.float32)} for s in range(2)]
    return model, feeds


def _save_external(model: onnx.ModelProto, path) -> None:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save moves the data out of the model it is given
    onnx.save(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)


def _outputs(source, feeds) -> list[bytes]:
    sim = quantsim.QuantizationSimModel(source, progress=False)
    sim.compute_encodings(feeds)
    return [o.tobytes() for feed in feeds for o in sim.session.run(None, feed)]


def _count_loads(monkeypatch) -> list:
    loads: list = []
    for name in ("load_model", "load_model_mapped"):  # the sim reads a file with either
        real = getattr(sim_model_module, name)
        monkeypatch.setattr(sim_model_module, name, lambda *a, _real=real, **k: loads.append(a[0]) or _real(*a, **k))
    return loads


def test_an_unchanged_file_is_prepared_from_the_cache_without_reading_it(tmp_path, monkeypatch):
    model, feeds = _model()
    path = tmp_path / "m.onnx"
    _save_external(model, path)
    expected = _outputs(model, feeds)
    loads = _count_loads(monkeypatch)
    assert _outputs(str(path), feeds) == expected and len(loads) == 1  # read and hashed once
    assert _outputs(path, feeds) == expected and len(loads) == 1  # recalled: neither file was read
    assert (tmp_path / "cache" / "prepared" / INPUTS_FOLDER).is_dir()
    clear_cache()
    assert not (tmp_path / "cache" / "prepared" / INPUTS_FOLDER).exists()
    assert prepare_file_cached(path) is None


@pytest.mark.parametrize("changed", ["data", "graph"])
def test_a_file_changed_in_place_is_read_again(tmp_path, monkeypatch, changed):
    model, feeds = _model()
    other, _ = _model(scale=3.0)
    path = tmp_path / "m.onnx"
    _save_external(model, path)
    assert _outputs(str(path), feeds) == _outputs(model, feeds)
    loads = _count_loads(monkeypatch)
    if changed == "data":  # same size, same mtime: only the content (and ctime) differ
        data = tmp_path / "m.onnx.data"
        before = data.stat()
        time.sleep(0.01)
        data.write_bytes(numpy_helper.to_array(other.graph.initializer[0]).tobytes())
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert data.stat().st_size == before.st_size
    else:
        renamed = onnx.load(str(path), load_external_data=False)
        renamed.graph.node[1].op_type = "Sigmoid"
        path.write_bytes(renamed.SerializeToString())
    assert prepare_file_cached(path) is None
    expected = _outputs(other if changed == "data" else onnx.load(str(path)), feeds)
    del loads[:]
    assert _outputs(str(path), feeds) == expected and len(loads) == 1
