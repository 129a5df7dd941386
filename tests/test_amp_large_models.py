"""AMP's cache key and bit-operation count on models of any size: the model is hashed as its skeleton plus
each weight's bytes (`quantsim.prepare.hash_model`) and shapes are inferred on the skeleton
(`quantsim.prepare.skeleton`), so neither step copies or serialises the whole model (protobuf refuses over
2 GiB). Small models (a few MB) with ONNX external data stand in for big ones: the oracle for "no whole
copy" is tracemalloc's peak against the weights' size, calibrated by the whole serialisation it replaces."""
from __future__ import annotations

import hashlib
import importlib
import os
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixed_precision import layer_costs
from mixed_precision.amp_cache import cache_key
from quantsim import QuantizationSimModel

prepare_module = importlib.import_module("quantsim.prepare")  # `quantsim.prepare` is also a function
ROOT = Path(__file__).resolve().parents[1]
WIDTH, LAYERS = 512, 4  # 1 MiB per weight, 4 MiB in all


def _mlp(width: int = WIDTH, layers: int = LAYERS, seed: int = 0) -> onnx.ModelProto:
    """x[N, width] -> (MatMul(w_i) -> Add(b_i) -> Relu) x layers; the batch dimension N is symbolic."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(width)).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _saved_with_external_data(tmp_path: Path, model: onnx.ModelProto) -> Path:
    path = tmp_path / "mlp.onnx"
    model = onnx.ModelProto.FromString(model.SerializeToString())  # onnx.save moves the weights out of `model`
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.onnx.data",
              size_threshold=1024)
    weights = sum(t.ByteSize() for t in model.graph.initializer if t.name.startswith("w"))
    assert (tmp_path / "mlp.onnx.data").stat().st_size >= weights
    return path


def _key(sim: QuantizationSimModel) -> str:
    return cache_key(sim, ["W8A8", "W4A8"], sim.quantizer_groups(), (len,))


def _digest(model: onnx.ModelProto) -> str:
    digest = hashlib.sha256()
    prepare_module.hash_model(digest, model)
    return digest.hexdigest()


def _peak_bytes(fn) -> int:
    """Peak bytes Python allocated while ``fn()`` ran (tracemalloc sees every bytes object protobuf returns)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_hash_model_follows_weights_and_graph_and_nothing_else():
    model = _mlp(width=64, layers=2)  # 16 KiB weights (hashed as bytes) and 256-byte biases (in the skeleton)
    key = _digest(model)
    assert _digest(onnx.ModelProto.FromString(model.SerializeToString())) == key == _digest(_mlp(width=64, layers=2))
    changed = {}
    for what, tensor in (("big weight", "w1"), ("small bias", "b0")):
        other = _mlp(width=64, layers=2)
        init = next(t for t in other.graph.initializer if t.name == tensor)
        values = numpy_helper.to_array(init).copy()
        values.flat[-1] += 1e-3
        init.CopyFrom(numpy_helper.from_array(values, tensor))
        changed[what] = _digest(other)
    graph_edit = _mlp(width=64, layers=2)
    graph_edit.graph.node[2].op_type = "Sigmoid"  # relu0: same weights, another graph
    changed["graph"] = _digest(graph_edit)
    opset = _mlp(width=64, layers=2)
    opset.opset_import[0].version = 18
    changed["opset"] = _digest(opset)
    assert len({key, *changed.values()}) == 1 + len(changed), changed


def test_amp_cache_key_follows_weights_and_graph_and_is_stable_across_sims(tmp_path):
    path = _saved_with_external_data(tmp_path, _mlp())
    from_file, from_proto = QuantizationSimModel(str(path), progress=False), QuantizationSimModel(_mlp(), progress=False)
    key = _key(from_file)
    assert _key(from_file) == key == _key(from_proto)
    weight = from_file.get_weight("w2")
    changed = weight.copy()
    changed[3, 5] += 0.5
    from_file.replace_weight("w2", changed)
    assert _key(from_file) != key
    from_file.replace_weight("w2", weight)
    assert _key(from_file) == key
    edited = _mlp()
    edited.graph.node[-1].op_type = "Sigmoid"  # the last Relu: the same weights and quantizer names
    assert _key(QuantizationSimModel(edited, progress=False)) != key


def test_amp_cache_key_is_the_same_in_another_process(tmp_path):
    """Another interpreter (another hash seed: no set or dict order may leak into the key) computes the
    same key, so ``clean_start=False`` resumes after a restart."""
    path = _saved_with_external_data(tmp_path, _mlp(width=64, layers=2))
    here = _key(QuantizationSimModel(str(path), progress=False))
    script = ("import sys; from quantsim import QuantizationSimModel; from mixed_precision.amp_cache import cache_key\n"
              "sim = QuantizationSimModel(sys.argv[1], progress=False)\n"
              "print(cache_key(sim, ['W8A8', 'W4A8'], sim.quantizer_groups(), (len,)))\n")
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    done = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == here


def test_amp_cache_key_never_holds_a_second_copy_of_the_weights(tmp_path):
    sim = QuantizationSimModel(str(_saved_with_external_data(tmp_path, _mlp())), progress=False)
    weights = LAYERS * WIDTH * WIDTH * 4
    whole = _peak_bytes(lambda: sim.model.SerializeToString(deterministic=True))  # what the key used to hash
    assert whole >= weights  # the measure sees a whole serialisation
    key_peak = _peak_bytes(lambda: _key(sim))
    assert key_peak <= weights / LAYERS + (256 << 10), (key_peak, weights)  # at most one weight at a time


def test_bit_operations_of_a_model_with_external_data_equal_those_in_memory(tmp_path, monkeypatch):
    path = _saved_with_external_data(tmp_path, _mlp())
    sample = {"x": np.zeros((3, WIDTH), np.float32)}
    in_memory = layer_costs(QuantizationSimModel(_mlp(), progress=False), sample)
    inferred: list[onnx.ModelProto] = []
    infer = onnx.shape_inference.infer_shapes

    def spy(model, *args, **kwargs):
        inferred.append(model)
        return infer(model, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    from_file = layer_costs(QuantizationSimModel(str(path), progress=False), sample)
    assert from_file == in_memory
    assert [c.macs for c in from_file] == [3 * WIDTH * WIDTH] * LAYERS  # N x out x in, N from the sample
    assert inferred, "the sample's shapes were not inferred"
    for model in inferred:  # the skeleton: weights as references, never their bytes
        big = [t for t in model.graph.initializer if t.name.startswith("w")]
        assert big and all(t.data_location == TensorProto.EXTERNAL and not t.raw_data for t in big)


def test_bit_operations_never_hold_a_second_copy_of_the_weights(tmp_path):
    sim = QuantizationSimModel(str(_saved_with_external_data(tmp_path, _mlp())), progress=False)
    sample = {"x": np.zeros((3, WIDTH), np.float32)}
    peak = _peak_bytes(lambda: layer_costs(sim, sample))
    assert peak <= 256 << 10, peak  # shapes from the initializers' dims: no weight read, no model copied


@pytest.mark.parametrize("name", ["skeleton", "hash_model", "save_model"])
def test_large_model_helpers_are_public_prepare_names(name):
    assert name in prepare_module.__all__ and (getattr(prepare_module, name).__doc__ or "").strip()


def test_a_pickled_sim_carries_each_weight_once_and_stays_one_model(tmp_path):
    """AMP's executors ship the pickled sim: the model goes as its skeleton plus weight bytes (protobuf pickles
    a message as one serialisation, refused over 2 GiB) and the graph index is rebuilt on arrival (pickled, its
    tensors were a second copy of every weight, detached from the model: a weight replaced in the copy did not
    reach ``copy.model``)."""
    sim = QuantizationSimModel(str(_saved_with_external_data(tmp_path, _mlp())), progress=False)
    feed = {"x": np.random.default_rng(0).standard_normal((4, WIDTH)).astype(np.float32)}
    sim.compute_encodings([feed])
    weights = LAYERS * WIDTH * WIDTH * 4
    payload = pickle.dumps(sim, protocol=pickle.HIGHEST_PROTOCOL)
    assert weights <= len(payload) < 1.1 * weights
    assert len(prepare_module.skeleton(sim.model).SerializeToString()) < 64 << 10  # what is not weight bytes
    copy = pickle.loads(payload)
    assert _digest(copy.model) == _digest(sim.model)
    assert np.array_equal(copy.session.run(None, feed)[0], sim.session.run(None, feed)[0])
    changed = copy.get_weight("w1")
    changed[0, 0] += 1.0
    copy.replace_weight("w1", changed)
    (w1,) = [t for t in copy.model.graph.initializer if t.name == "w1"]
    assert np.array_equal(numpy_helper.to_array(w1), changed)


def test_cli_writes_a_large_qdq_model_with_external_data(tmp_path, monkeypatch, capsys):
    """``quantsim quantize --write qdq`` saves through `quantsim.prepare.save_model` (``onnx.save`` serialises
    the whole model, refused over 2 GiB); the size threshold is lowered so a small model takes that path."""
    import onnxruntime as ort
    from tiny_cnn import batch, make_model

    import quantsim.graph.large_models as large_models
    from quantsim_cli.main import main

    model_path, data = tmp_path / "tiny.onnx", tmp_path / "calib"
    onnx.save(make_model(channels=64), str(model_path))  # int8 conv weight of 1.7 KiB: goes to external data
    data.mkdir()
    for i in range(2):
        np.save(data / f"batch{i}.npy", batch(i)["x"])
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1024)
    out = tmp_path / "out"
    assert main(["-q", "quantize", str(model_path), "--data", str(data), "--out", str(out), "--write", "qdq",
                 "--analysis-batches", "0"]) == 0
    capsys.readouterr()
    assert (out / "tiny.qdq.onnx.data").stat().st_size > 0 and "tiny.qdq.onnx.data" in (out / "report.md").read_text()
    session = ort.InferenceSession(str(out / "tiny.qdq.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, batch(5))[0].shape == (2, 5)


def test_a_large_sim_needing_a_newer_opset_converts_its_skeleton(tmp_path, monkeypatch):
    """16-bit activations need opset 21; the version converter serialises its input, which protobuf refuses
    over 2 GiB, so a large model's skeleton is converted and its weights are used as they are. The size
    threshold is lowered so a small opset-17 model takes that path; the small-model path is the oracle."""
    import quantsim.graph.large_models as large_models

    feeds = [{"x": np.random.default_rng(s).standard_normal((4, WIDTH)).astype(np.float32)} for s in range(2)]
    expected = QuantizationSimModel(_mlp(), activation_type="int16", progress=False)
    expected.compute_encodings(feeds)
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1024)
    converted: list[onnx.ModelProto] = []
    convert = onnx.version_converter.convert_version

    def spy(model, opset):
        converted.append(model)
        return convert(model, opset)

    monkeypatch.setattr(onnx.version_converter, "convert_version", spy)
    sim = QuantizationSimModel(_mlp(), activation_type="int16", progress=False)
    sim.compute_encodings(feeds)
    for feed in feeds:
        np.testing.assert_array_equal(sim.session.run(None, feed)[0], expected.session.run(None, feed)[0])
    assert converted and all(not t.raw_data for model in converted for t in model.graph.initializer
                             if t.name.startswith("w"))  # the skeleton, never the weights
