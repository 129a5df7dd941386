"""Regression tests of the reliability campaign (issue 14): silently wrong results, export sets, leaks."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batch, batches, calibrated_sim, make_model, new_sim  # tests/tiny_cnn.py

from quantsim import (
    ConfigError,
    EncodingFormatError,
    EncodingMismatchError,
    InvalidArgumentError,
    InvalidStateError,
    InvalidTypeError,
    QuantizationSimModel,
    QuantsimError,
    load_encodings_to_sim,
    qtype,
)
from quantsim.graph.file_set import STAGING_MARK, FileSet


def _sqrt_model(width: int = 64) -> onnx.ModelProto:
    """y = Sqrt(x) * 1: NaN wherever x < 0, computed inside the model."""
    nodes = [helper.make_node("Sqrt", ["x"], ["s"], name="sqrt"), helper.make_node("Mul", ["s", "one"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "sqrt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
                              [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# ------------------------------------------------------------------------------------------ NaN inside the model
@pytest.mark.parametrize("seed", range(8))
def test_nan_computed_inside_the_model_never_gives_a_wrong_range(seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.5, 4.0, (8, 64)).astype(np.float32)
    clean = np.abs(rng.uniform(0.0, 1.0, (8, 64))).astype(np.float32)
    sim = QuantizationSimModel(_sqrt_model(), progress=False)
    with pytest.warns(RuntimeWarning, match=r"non-finite values \(NaN or Inf\) in 2 tensor\(s\) \(e.g. \['s', 'y'\]\)"):
        sim.compute_encodings([{"x": x}, {"x": clean}])
    enc = sim.qc_quantize_op_dict["s"].encoding
    # the batch holding NaN is ignored for 's': its range is exactly the clean batch's
    truth = float(np.sqrt(clean).max())
    assert enc is not None and float(enc.max) == pytest.approx(truth, rel=1 / 255)


def test_nan_in_every_batch_leaves_the_tensor_without_encoding_and_says_so():
    sim = QuantizationSimModel(_sqrt_model(), progress=False)
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    with pytest.warns(RuntimeWarning, match="no batch was usable"):
        sim.compute_encodings([{"x": x}])
    assert sim.qc_quantize_op_dict["s"].encoding is None


def test_statistics_graph_nan_probe_is_nan_exactly_when_a_nan_is_present():
    import onnxruntime as ort

    from quantsim.calibration.statistics_graph import add_statistics_outputs, in_graph_statistics

    model = _sqrt_model(16)
    model, outputs = add_statistics_outputs(model, ["s"], shapes={"s": ("N", 16)})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(0)
    for trial in range(20):
        x = rng.uniform(0, 1, (4, 16)).astype(np.float32)
        if trial % 2:
            x.flat[rng.integers(x.size)] = -1.0  # one NaN after Sqrt, anywhere
        values = dict(zip(names, session.run(names, {"x": x})))
        assert in_graph_statistics(values, outputs, "s")[2] == bool(trial % 2)


# ------------------------------------------------------------------------------------------ typed options
def test_config_with_an_unknown_op_type_names_the_closest_one():
    from quantsim.sim.config import CONFIG_DIR, load_config

    config = json.loads((CONFIG_DIR / "default_config.json").read_text())
    config["op_type"]["Convv"] = {"is_output_quantized": "True"}
    with pytest.raises(ConfigError, match=r"op_type\.Convv: unknown op type 'Convv'.*did you mean 'Conv'"):
        load_config(config)
    config = json.loads((CONFIG_DIR / "default_config.json").read_text())
    config["supergroups"].append({"op_list": ["Conv", "Reluu"]})
    with pytest.raises(ConfigError, match="Reluu.*'Relu'"):
        load_config(config)


@pytest.mark.parametrize("bits", [4.5, 8.7, "8", True, float("nan")])
def test_fractional_or_non_numeric_bitwidths_are_refused(bits):
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["W"]
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="bit"):
        q.set_bitwidth(bits)
    assert q.bitwidth == 8
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="default_param_bw"):
        QuantizationSimModel(make_model(), default_param_bw=bits, progress=False)


def test_integral_float_bitwidths_are_accepted():
    assert qtype.int(8.0).bits == 8
    assert qtype.int(np.int64(4)).bits == 4
    sim = QuantizationSimModel(make_model(), default_param_bw=4.0, progress=False)
    assert sim.qc_quantize_op_dict["W"].bitwidth == 4


def test_changes_to_a_frozen_quantizer_warn_and_change_nothing():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["W"]
    q.freeze_encodings()
    before = (q.spec, q.encoding)
    with pytest.warns(RuntimeWarning, match="'W' is frozen: the change .* is ignored"):
        q.set_bitwidth(4)
    with pytest.warns(RuntimeWarning, match="frozen"):
        q.use_symmetric_encodings = not q.use_symmetric_encodings
    assert (q.spec, q.encoding) == before
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q.set_bitwidth(8)  # no change asked: no warning


@pytest.mark.parametrize("bad", [(0.0, float("inf")), (float("nan"), 1.0), (0.0, "1"), (1.0,), 3.0])
def test_non_finite_or_malformed_fixed_range_is_refused_naming_the_quantizer(bad):
    sim = new_sim()
    q = sim.qc_quantize_op_dict["c" if "c" in sim.qc_quantize_op_dict else sim.activation_names[0]]
    with pytest.raises(InvalidArgumentError, match=repr(q.name)):
        q.set_fixed_encoding_range(bad)
    assert q.fixed_range is None


# ------------------------------------------------------------------------------------------ exports
def test_to_onnx_qdq_before_calibration_is_an_error():
    sim = new_sim()
    with pytest.raises(InvalidStateError, match="to_onnx_qdq: no activation quantizer has an encoding"):
        sim.to_onnx_qdq()
    sim.compute_encodings(batches())
    sim.to_onnx_qdq()  # fine once calibrated


@pytest.mark.parametrize("prefix", ["../escaped", "/tmp/anywhere", "", ".hidden", "sub/model", " model"])
def test_export_refuses_prefixes_that_are_not_plain_file_names(tmp_path, prefix):
    sim = calibrated_sim()
    target = tmp_path / "out"
    with pytest.raises(InvalidArgumentError, match="not a plain file name"):
        sim.export(str(target), prefix)
    assert not (tmp_path / "escaped.encodings").exists()
    assert not target.exists() or not any(target.iterdir())


def test_a_failure_while_writing_the_last_file_keeps_the_previous_set(tmp_path, monkeypatch):
    import quantsim.graph.file_set as file_set

    sim = calibrated_sim()
    sim.export(str(tmp_path), "model", qdq=True)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["model.encodings", "model.onnx", "model.qdq.onnx"]
    sim.qc_quantize_op_dict[sim.activation_names[-1]].set_bitwidth(16)  # the new set differs
    sim.compute_encodings(batches())
    real_save = file_set.save_model

    def disk_full_on_qdq(model, path, **options):
        if str(path).endswith(".qdq.onnx"):
            raise OSError(28, "No space left on device (simulated)")
        return real_save(model, path, **options)

    monkeypatch.setattr(file_set, "save_model", disk_full_on_qdq)
    with pytest.raises(OSError, match="No space left"):
        sim.export(str(tmp_path), "model", qdq=True)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # nothing new committed, no staging folder left


def test_staging_left_by_a_killed_export_is_removed_by_the_next_export(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from quantsim.graph.file_set import FileSet
        files = FileSet({str(tmp_path)!r}, "model")
        files.add_text("model.encodings", "{{}}")
        os.kill(os.getpid(), 9)
    """)
    subprocess.run([sys.executable, "-c", script], check=False)
    stale = list(tmp_path.glob(f".model.{STAGING_MARK}.*"))
    assert len(stale) == 1
    calibrated_sim().export(str(tmp_path), "model")
    assert not list(tmp_path.glob(f".model.{STAGING_MARK}.*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.encodings", "model.onnx"]


def test_staging_of_a_live_process_is_left_alone(tmp_path):
    live = tmp_path / f".model.{STAGING_MARK}.{os.getppid()}.abc"
    live.mkdir()
    with FileSet(tmp_path, "model") as files:
        files.add_text("model.txt", "x")
        files.commit()
    assert live.exists()


def test_integer_export_save_commits_both_files_or_neither(tmp_path, monkeypatch):
    import quantsim.graph.file_set as file_set

    sim = calibrated_sim()
    integer = sim.export_integer()
    integer.save(tmp_path / "int")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(file_set.json, "dumps", lambda *a, **k: (_ for _ in ()).throw(OSError("simulated")))
    with pytest.raises(OSError, match="simulated"):
        integer.save(tmp_path / "int")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# ------------------------------------------------------------------------------------------ encodings files
def _exported(tmp_path, version: str = "1.0.0") -> dict:
    sim = calibrated_sim()
    sim.export(str(tmp_path), "m", export_model=False, encoding_version=version)
    return json.loads((tmp_path / "m.encodings").read_text())


def test_a_32_bit_activation_entry_is_a_mismatch_not_a_silent_drop(tmp_path):
    data = _exported(tmp_path)
    entry = next(e for e in data["activation_encodings"] if e["name"] == "r")
    entry.update(bw=32, scale=[1e-6], offset=[0])
    sim = calibrated_sim()
    with pytest.raises(EncodingMismatchError, match="'?r'?: a 32-bit encoding"):
        load_encodings_to_sim(sim, copy.deepcopy(data), strict=True)
    with pytest.warns(UserWarning, match="32-bit encoding"):
        load_encodings_to_sim(sim, data, strict=False)


def test_scales_outside_float32_are_refused(tmp_path):
    for bad in (1e300, 1e-300, 1e36):
        data = _exported(tmp_path)
        data["activation_encodings"][0]["scale"] = [bad]
        with pytest.raises(EncodingFormatError, match="float32"):
            load_encodings_to_sim(calibrated_sim(), data)


def test_loading_many_unknown_entries_is_linear_with_one_summary_warning(tmp_path):
    data = _exported(tmp_path)
    template = data["activation_encodings"][0]
    timings = []
    for count in (4000, 16000):
        entries = [dict(template, name=f"unknown_{i}") for i in range(count)]
        doc = dict(data, activation_encodings=data["activation_encodings"] + entries)
        sim = calibrated_sim()
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_encodings_to_sim(sim, doc, strict=False)
        timings.append(time.perf_counter() - start)
        skipped = [w for w in caught if "skipped" in str(w.message)]
        assert len(skipped) == 1 and f"skipped {count} entries" in str(skipped[0].message)
        assert str(skipped[0].message).count("\n") <= 12
    assert timings[1] < 12 * timings[0] + 0.5  # 4x the entries: linear, not quadratic (16x)


def test_public_errors_share_one_root():
    for cls in (ConfigError, EncodingFormatError, EncodingMismatchError, InvalidArgumentError, InvalidStateError):
        assert issubclass(cls, QuantsimError)
    assert batch  # the shared helpers import cleanly


# ------------------------------------------------------------------------------------------ streamed model writes
@pytest.mark.parametrize("builder", ["conv_relu", "conv_bn_relu", "residual", "concat", "gemm", "matmul", "layernorm",
                                     "softmax", "resize", "mixed"])
def test_a_streamed_model_file_parses_to_the_same_model(tmp_path, builder):
    import hashlib

    import models  # tests/models.py

    from quantsim.graph.large_models import save_model

    model, _ = getattr(models, builder)()
    model.graph.doc_string = "kept"
    model.metadata_props.add(key="k", value="v")
    digests: dict[str, str] = {}
    (path,) = save_model(model, tmp_path / "m.onnx", digests)
    data = path.read_bytes()
    assert digests["m.onnx"] == hashlib.sha256(data).hexdigest()
    back = onnx.ModelProto.FromString(data)
    assert back.SerializeToString(deterministic=True) == model.SerializeToString(deterministic=True)
