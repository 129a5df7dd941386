"""The AdaRound and Sequential MSE examples run end to end on a small built model."""
import importlib.util
from pathlib import Path

import pytest
from test_adaround import _cnn, _data

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


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


def test_user_data_needs_both_model_and_data(tmp_path):
    with pytest.raises(SystemExit, match="--data"):
        _load("examples_common").load_case(tmp_path / "m.onnx", None, 4)
