"""Every example runs end to end on a small built model, and the examples stay self-contained."""
import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from test_adaround import _cnn, _data

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SELF_CONTAINED = {"quantsim", "adaround", "mixed_precision", "examples_common", "real_model"}


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_adaround_example(tmp_path):
    results = _load("adaround").run(_cnn(), _data(4), _data(2, seed=7), iterations=2000, out_dir=tmp_path,
                                    progress=False)
    assert results["adaround"]["SQNR dB"] > results["nearest"]["SQNR dB"]
    assert (tmp_path / "adaround.encodings").exists() and (tmp_path / "adaround.onnx").exists()


def test_seq_mse_example():
    results = _load("seq_mse").run(_cnn(), _data(4), _data(2, seed=7), iterations=200, progress=False)
    assert results["seq_mse"]["SQNR dB"] > results["nearest"]["SQNR dB"]
    assert set(results) == {"nearest", "seq_mse", "seq_mse+adaround"}


def test_ptq_example_scores_and_exports(tmp_path):
    result = _load("ptq_w8a8").run(_cnn(), _data(4), _data(2, seed=7), tmp_path, progress=False)
    assert result["SQNR dB"] > 25
    assert {p.name for p in tmp_path.iterdir()} >= {"w8a8.onnx", "w8a8.encodings", "w8a8_qdq.onnx"}


def test_per_channel_vs_per_tensor_example_runs_every_setting():
    example = _load("per_channel_vs_per_tensor")
    results = example.run(_cnn(), _data(4), _data(2, seed=7), progress=False)
    assert list(results) == [f"{c} {s}" for c, s in example.SETTINGS]
    assert all(r["SQNR dB"] > 20 for r in results.values())
    assert len({round(r["SQNR dB"], 6) for r in results.values()}) > 1  # the settings really differ


@pytest.mark.int8_kernels
def test_export_example_runs_qdq_and_integer_models_close_to_the_sim(tmp_path):
    results = _load("export_and_run").run(_cnn(), _data(4), _data(2, seed=7), tmp_path, progress=False)
    assert set(results) == {"FP32", "sim", "QDQ", "integer"}
    assert (tmp_path / "model_int8.onnx").exists() and (tmp_path / "model_int8.requant.json").exists()
    assert results["sim"]["steps from sim"] == 0
    for deployed in ("QDQ", "integer"):
        assert results[deployed]["steps from sim"] <= 3  # within a few output steps of the sim


def test_load_aimet_encodings_example_reproduces_the_exporting_sim(tmp_path):
    results = _load("load_aimet_encodings").run(_cnn(), _data(4), _data(2, seed=7), tmp_path, progress=False)
    loaded = results["all encodings loaded"]
    assert loaded["max |difference| from exporting sim"] == 0
    assert loaded["SQNR dB"] == pytest.approx(results["exporting sim"]["SQNR dB"])
    assert results["parameters frozen + calibrated"]["max |difference| from exporting sim"] < 1e-5


def test_user_data_needs_both_model_and_data(tmp_path):
    with pytest.raises(SystemExit, match="--data"):
        _load("examples_common").load_case(tmp_path / "m.onnx", None, 4)


def test_user_data_is_split_into_calibration_and_evaluation(tmp_path):
    import onnx

    onnx.save(_cnn(), str(tmp_path / "m.onnx"))
    feeds = _data(1)
    name = next(iter(feeds[0]))
    np.savez(tmp_path / "d.npz", **{name: np.concatenate([feeds[0][name]] * 6)})
    _, calibration, evaluation = _load("examples_common").load_case(tmp_path / "m.onnx", tmp_path / "d.npz",
                                                                   len(feeds[0][name]) * 2)
    assert (len(calibration), len(evaluation)) == (2, 1)


def test_default_data_are_labelled_text_lines():
    pytest.importorskip("PIL")
    feeds, labels = _load("real_model").text_line_batches(6, 4, seed=3)
    assert [f["x"].shape for f in feeds] == [(4, 3, 48, 192), (2, 3, 48, 192)]
    assert list(labels) == [0, 1, 0, 1, 0, 1]
    assert all(-1 <= f["x"].min() and f["x"].max() <= 1 for f in feeds)
    upright, flipped = feeds[0]["x"][0], feeds[0]["x"][1]
    assert upright.std() > 0.05 and flipped.std() > 0.05  # ink on paper, not blank


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_examples_import_only_the_sdk_and_their_folder(path):
    tree = ast.parse(path.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    local = {p.stem for p in EXAMPLES.glob("*.py")}
    if path.name == "demo_magika.py":  # the repository's `make demo` (benchmark helpers on purpose)
        return
    assert "benchmarks" not in imported
    assert imported & local <= SELF_CONTAINED


def test_automatic_mixed_precision_example_meets_its_budget(tmp_path):
    result = _load("automatic_mixed_precision").run(_cnn(), _data(4), _data(2, seed=7), tmp_path, drop=3.0,
                                                    progress=False)
    assert result.budget_met and result.score >= result.float_score - 3.0
    assert result.uniform_scores["W8A8"] >= result.uniform_scores["W4A8"]
    assert 0.5 <= result.bitops_ratio <= 1.0
    assert (tmp_path / "pareto.json").exists() and (tmp_path / "pareto.html").exists()


def test_auto_quantize_example_meets_its_budget_and_the_export_delivers_it(tmp_path):
    result, deployed = _load("auto_quantize").run(_cnn(), _data(4), _data(2, seed=7), tmp_path, drop=3.0,
                                                  adaround_iterations=50, progress=False)
    assert result.budget_met and result.score >= result.reference_score - 3.0
    assert abs(deployed - result.score) <= 0.5  # SQNR dB of the QDQ export in onnxruntime vs the sim
    assert {"model.encodings", "model.onnx", "model.qdq.onnx", "auto_quantize.md"} <= {p.name for p in tmp_path.iterdir()}
