"""Large models hold their weights once: sessions read them from a memory-mapped file, 8-bit weights as
int8 codes behind DequantizeLinear, bounded constant caches, and a model read from a file let go before its
prepared copy loads. Small models exercise the large-model paths by lowering the size thresholds; the
oracle is the small-model path (fake-quantized float weights handed over in memory), which must give the
same bits."""
from __future__ import annotations

import importlib
import os
import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import make_model
from onnx import TensorProto, helper, numpy_helper

import quantsim
import quantsim.graph.index as index_module
import quantsim.graph.large_models as large_models
import quantsim.graph.session as session_module
import quantsim.sim.model as sim_model_module
from quantsim.core.numerics import fake_quantize
from quantsim.graph.file_set import wait_for_background
from quantsim.graph.index import GraphIndex
from quantsim.graph.session import file_backed_source, make_session
from quantsim.prepare import prepare, prepare_loaded
from quantsim.sim.build import build_sim_model

cache_module = importlib.import_module("quantsim.prepare.cache")  # `quantsim.prepare` is also a function


def _mlp(width: int = 48, layers: int = 3) -> tuple[onnx.ModelProto, list[dict]]:
    """MatMul + Add + Relu layers (weights of 9 KiB), then a Conv-free head: a Gemm with its own bias."""
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((width, width)) / 7).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(width)).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    inits.append(numpy_helper.from_array((rng.standard_normal((32, width)) / 7).astype(np.float32), "head"))
    nodes.append(helper.make_node("Gemm", [x, "head"], ["y"], name="gemm", transB=1))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])], inits)
    feeds = [{"x": np.random.default_rng(s).standard_normal((5, width)).astype(np.float32)} for s in range(3)]
    return model, feeds


def _outputs(sim, feeds) -> list[bytes]:
    return [o.tobytes() for feed in feeds for o in sim.session.run(None, feed)]


@pytest.mark.parametrize("param_type", ["int8", "int4"])
def test_large_model_path_gives_the_same_encodings_and_output_bits(monkeypatch, tmp_path, param_type):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path))
    model, feeds = _mlp()
    small = quantsim.QuantizationSimModel(model, param_type=param_type, progress=False)
    small.compute_encodings(feeds)
    expected = _outputs(small, feeds)
    monkeypatch.setattr(session_module, "FILE_BACKED_MIN_BYTES", 1)  # every model counts as large
    monkeypatch.setattr(sim_model_module, "INTEGER_WEIGHTS_MIN_BYTES", 1)
    monkeypatch.setattr(index_module, "CONSTANT_CACHE_BYTES", 0)
    large = quantsim.QuantizationSimModel(model, param_type=param_type, progress=False)
    assert large._integer_weights()
    large.compute_encodings(feeds)
    for q in small.quantizers:
        theirs = large.qc_quantize_op_dict[q.tensors[0]].encoding
        assert (q.encoding is None) == (theirs is None)
        if q.encoding is not None:
            np.testing.assert_array_equal(q.encoding.scale, theirs.scale)
            np.testing.assert_array_equal(q.encoding.zero_point, theirs.zero_point)
    assert _outputs(large, feeds) == expected
    files = large.session._quantsim_external_data[0]
    assert files is not None and (Path(files.name) / "weights.bin").is_file()  # the session reads a file


def test_integer_weights_are_codes_dequantized_just_before_their_layer():
    model, feeds = _mlp()
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    arrays: dict = {}
    with sim._index.cached_constants():
        built = build_sim_model(sim.model, sim.quantizers, source=sim._index, external=arrays, integer_weights=True)
    names = [n.name for n in built.graph.node]
    producers = {o: n for n in built.graph.node for o in n.output}
    constants = {t.name: t for t in built.graph.initializer}
    for weight, layer in [("w0", "matmul0"), ("w1", "matmul1"), ("w2", "matmul2"), ("head", "gemm")]:
        mul = producers[weight]
        cast = producers[mul.input[0]]
        reshape = producers[cast.input[0]]
        assert (mul.op_type, cast.op_type, reshape.op_type) == ("Mul", "Cast", "Reshape")
        codes = arrays[reshape.input[0]]
        assert codes.dtype == np.int8  # a quarter of the float weight
        # the codes times their scale are exactly the fake-quantized floats (the sim's definition of the weight)
        scale = numpy_helper.to_array(constants[mul.input[1]])
        expected = fake_quantize(sim._index.constant_value(weight), sim.qc_quantize_op_dict[weight].encoding)
        np.testing.assert_array_equal(codes.astype(np.float32) * scale, expected)
        # the new shape is computed from the layer's own data input, so it cannot run before the layer
        chain, tensor = [], reshape.input[1]
        while not chain or chain[-1] != "Shape":
            node = producers[tensor]
            chain.append(node.op_type)
            tensor = next(name for name in node.input if name not in constants)
        assert chain == ["Add", "Mul", "Gather", "Shape"]
        reader = next(n for n in built.graph.node if n.name == layer)
        assert tensor == reader.input[0]
        assert names.index(mul.name) == names.index(layer) - 1
    assert not any(a.dtype == np.float32 and a.size > 100 for a in arrays.values())  # no float weight kept


def test_integer_weights_of_an_asymmetric_grid_subtract_the_zero_point(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path))
    model, feeds = _mlp()
    config = {"defaults": {"ops": {"is_output_quantized": "True"}, "params": {"is_quantized": "True",
                                                                              "is_symmetric": "False"}},
              "params": {}, "op_type": {}, "supergroups": [], "model_input": {"is_input_quantized": "True"},
              "model_output": {}}
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(config))
    small = quantsim.QuantizationSimModel(model, config_file=str(path), param_type="int8", progress=False)
    small.compute_encodings(feeds)
    assert any(np.any(q.encoding.zero_point != 0) for q in small.quantizers if q.role == "param" and q.encoding)
    expected = _outputs(small, feeds)
    monkeypatch.setattr(session_module, "FILE_BACKED_MIN_BYTES", 1)
    monkeypatch.setattr(sim_model_module, "INTEGER_WEIGHTS_MIN_BYTES", 1)
    large = quantsim.QuantizationSimModel(model, config_file=str(path), param_type="int8", progress=False)
    large.compute_encodings(feeds)
    assert _outputs(large, feeds) == expected


def test_file_backed_session_maps_the_weights_file_instead_of_copying(monkeypatch):
    """onnxruntime reads a big set of weights from the file written once (memory-mapped where the system
    allows, checked on Linux), with the same outputs as the arrays handed over in memory."""
    model, feeds = _mlp(width=256)
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    arrays: dict = {}
    with sim._index.cached_constants():
        built = build_sim_model(sim.model, sim.quantizers, source=sim._index, external=arrays)
    in_memory = make_session(built, external_initializers=arrays)
    monkeypatch.setattr(session_module, "FILE_BACKED_MIN_BYTES", 1)
    mapped = make_session(built, external_initializers=arrays)
    folder = mapped._quantsim_external_data[0].name
    for feed in feeds:
        assert [o.tobytes() for o in mapped.run(None, feed)] == [o.tobytes() for o in in_memory.run(None, feed)]
    if os.path.exists("/proc/self/maps"):
        assert str(Path(folder) / "weights.bin") in Path("/proc/self/maps").read_text()
    del mapped
    assert not Path(folder).exists()  # the file goes with the session


def test_file_backed_source_aligns_each_weight_and_leaves_the_model_alone():
    model, _ = _mlp()
    arrays: dict = {}
    sim = quantsim.QuantizationSimModel(model, progress=False)
    with sim._index.cached_constants():
        built = build_sim_model(sim.model, sim.quantizers, source=sim._index, external=arrays)
    before = built.SerializeToString()
    path, folder = file_backed_source(built, arrays)
    assert built.SerializeToString() == before
    written = onnx.load(path)  # loads the external data back
    for tensor in written.graph.initializer:
        if tensor.name in arrays:
            np.testing.assert_array_equal(numpy_helper.to_array(tensor), arrays[tensor.name])
    light = onnx.load(path, load_external_data=False)
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in light.graph.initializer
               if t.data_location == TensorProto.EXTERNAL]
    assert len(offsets) == len(arrays) and all(offset % (1 << 16) == 0 for offset in offsets)
    folder.cleanup()


def test_constant_cache_is_bounded(monkeypatch):
    model, _ = _mlp()
    index = GraphIndex(model)
    monkeypatch.setattr(index_module, "CONSTANT_CACHE_BYTES", 10_000)  # room for one 9 KiB weight
    with index.cached_constants():
        first = index.constant_value("w0")
        assert index.constant_value("w0") is first  # cached
        second = index.constant_value("w1")
        assert index.constant_value("w1") is not second  # over the budget: converted again, same values
        np.testing.assert_array_equal(index.constant_value("w1"), second)
        assert not second.flags.writeable


def test_cache_entries_of_big_models_keep_weights_in_external_data(monkeypatch, tmp_path):
    model, _ = _mlp()
    expected = prepare(model, cache=False)
    monkeypatch.setattr(cache_module, "EXTERNAL_DATA_BYTES", 1)
    first = prepare(model, cache_dir=tmp_path)
    (entry,) = (tmp_path / "prepared").iterdir()
    wait_for_background()  # the data file's stamp follows its fsync, on a thread
    assert sorted(p.name for p in entry.iterdir()) == [".lock", ".verified", "KEY", "SHA256SUMS", "model.onnx",
                                                       "model.onnx.data"]
    again = prepare(model, cache_dir=tmp_path)  # a hit, read from the two files
    for result in (first, again):
        assert result.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


def test_prepare_loaded_lets_the_model_go_before_a_hit_and_prepares_it_in_place_on_a_miss(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path))
    model, _ = _mlp()
    expected = prepare(model, cache=False).SerializeToString(deterministic=True)
    loads: list[onnx.ModelProto] = []

    def load() -> onnx.ModelProto:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        loads.append(copy)
        return copy

    miss = prepare_loaded(load)
    assert len(loads) == 1 and miss is loads[0]  # the passes ran on the loaded model itself
    assert miss.SerializeToString(deterministic=True) == expected
    hit = prepare_loaded(load)
    assert len(loads) == 2 and hit is not loads[1]  # the cached copy, the loaded one dropped
    assert hit.SerializeToString(deterministic=True) == expected


def test_sim_from_a_file_is_the_same_as_from_a_proto(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))
    model, feeds = _mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    results = []
    for source in (model, str(path), str(path)):  # the file twice: a miss, then a hit
        sim = quantsim.QuantizationSimModel(source, progress=False)
        sim.compute_encodings(feeds)
        results.append(_outputs(sim, feeds))
    assert results[0] == results[1] == results[2]


def test_mid_sized_models_keep_float_weights_in_a_mapped_file(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path))
    model, feeds = _mlp()
    small = quantsim.QuantizationSimModel(model, progress=False)
    small.compute_encodings(feeds)
    monkeypatch.setattr(session_module, "FILE_BACKED_MIN_BYTES", 1)
    mid = quantsim.QuantizationSimModel(model, progress=False)
    mid.compute_encodings(feeds)
    assert mid._file_backed() and not mid._integer_weights()
    assert _outputs(mid, feeds) == _outputs(small, feeds)
    assert mid.session._quantsim_external_data[0] is not None  # read from the file


@pytest.mark.parametrize("types", [("int8", "int8"), ("int4", "int16")])  # int16 activations: an opset conversion
def test_a_large_model_file_keeps_its_weights_mapped_and_gives_the_same_bits(monkeypatch, tmp_path, types):
    """A model file whose cache entry has external data: the sim maps the entry's weights instead of holding
    them (miss and hit alike), gives the bits of a sim of the same ModelProto, exports the same files, and
    copies the weights in when the ModelProto itself is asked for (pickling, replace_weight)."""
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))
    model, feeds = _mlp()
    param_type, activation_type = types
    small = quantsim.QuantizationSimModel(model, param_type=param_type, activation_type=activation_type,
                                          progress=False)
    small.compute_encodings(feeds)
    expected = _outputs(small, feeds)
    small.export(tmp_path / "small", "m", qdq=True)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "mapped-cache"))  # not the small sim's entry
    monkeypatch.setattr(cache_module, "EXTERNAL_DATA_BYTES", 1)
    monkeypatch.setattr(session_module, "FILE_BACKED_MIN_BYTES", 1)
    for attempt in ("miss", "hit"):
        sim = quantsim.QuantizationSimModel(path, param_type=param_type, activation_type=activation_type,
                                            progress=False)
        assert sim._index.weights is not None, attempt  # nothing of the weights is held in the ModelProto
        assert all(t.data_location == TensorProto.EXTERNAL for t in sim._model.graph.initializer
                   if t.name.startswith("w")), attempt
        sim.compute_encodings(feeds)
        assert _outputs(sim, feeds) == expected, attempt
        assert sim.session._quantsim_external_data[0] is not None  # the session reads a file
    cache_module.clear_cache()
    sim.export(tmp_path / "mapped", "m", qdq=True)  # the entry is gone: the open data file still reads
    for name in ("m.encodings", "m.onnx", "m.qdq.onnx"):
        assert (tmp_path / "mapped" / name).read_bytes() == (tmp_path / "small" / name).read_bytes(), name
    assert sim._index.weights is not None  # exporting read the mapped weights one at a time, copied none in
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)  # the external-data form of the exports
    sim.export(tmp_path / "mapped-large", "m", qdq=True)
    assert (tmp_path / "mapped-large" / "m.onnx.data").is_file()
    for name in ("m.onnx", "m.qdq.onnx"):
        want, got = onnx.load(str(tmp_path / "small" / name)), onnx.load(str(tmp_path / "mapped-large" / name))
        assert [numpy_helper.to_array(t).tobytes() for t in want.graph.initializer] == [
            numpy_helper.to_array(t).tobytes() for t in got.graph.initializer], name
        assert want.graph.node == got.graph.node, name
    clone = pickle.loads(pickle.dumps(sim))
    assert sim._index.weights is None  # pickling asked for the whole ModelProto
    assert _outputs(clone, feeds) == _outputs(sim, feeds) == expected
    again = quantsim.QuantizationSimModel(path, param_type=param_type, progress=False)
    assert again._index.weights is not None
    doubled = 2 * again.get_weight("w0")
    again.replace_weight("w0", doubled)
    np.testing.assert_array_equal(again.get_weight("w0"), doubled)
