"""``quantsim quantize --max-drop D --eval module:function``: the accuracy-budget search from the command line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tiny_cnn import batch, make_model

from quantsim_cli.main import main

EVAL_MODULE = """
import numpy as np
import onnxruntime as ort
from tiny_cnn import batch

_FEEDS = [batch(100 + i) for i in range(2)]
_REFERENCE = []

def relative_error(session):
    # minus the noise-to-signal power ratio of the output against the float model (0 for the float model)
    if not _REFERENCE:
        import onnx
        float_session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
        _REFERENCE.extend(float_session.run(None, f)[0] for f in _FEEDS)
    got = [session.run(None, f)[0] for f in _FEEDS]
    signal = sum(float(np.sum(r ** 2)) for r in _REFERENCE)
    noise = sum(float(np.sum((r - g) ** 2)) for r, g in zip(_REFERENCE, got))
    return -noise / signal

def not_a_number(session):
    return "good"
"""


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    model = tmp_path / "tiny.onnx"
    onnx.save(make_model(), str(model))
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.save(calib / f"batch{i}.npy", batch(i)["x"])
    (tmp_path / "user_eval.py").write_text(f"MODEL = {str(model)!r}\n" + EVAL_MODULE)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.chdir(tmp_path)
    return tmp_path, model, calib


def _score(path: Path) -> float:
    import importlib
    import sys
    sys.modules.pop("user_eval", None)
    return importlib.import_module("user_eval").relative_error(
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))


def test_max_drop_writes_the_chosen_configuration_and_its_search(setup):
    root, model, calib = setup
    out = root / "out"
    code = main(["-q", "quantize", str(model), "--data", str(calib), "--out", str(out), "--max-drop", "0.05",
                 "--eval", "user_eval:relative_error", "--candidates", "W4A8,W8A8", "--adaround", "20", "--seq-mse", "5",
                 "--write", "encodings,float,qdq"])
    assert code == 0
    search = json.loads((out / "auto_quantize.json").read_text())
    assert search["budget_met"] and search["score"] >= search["target"]
    report = (out / "report.md").read_text()
    assert "## Accuracy budget search (auto_quantize)" in report and "auto_quantize.html" in report
    assert {"tiny.encodings", "tiny.onnx", "tiny.qdq.onnx", "auto_quantize.html"} <= {p.name for p in out.iterdir()}
    # the deployed QDQ model scores what the search reported (relative error within 10% of itself)
    assert abs(_score(out / "tiny.qdq.onnx") - search["score"]) <= 0.1 * abs(search["score"])


@pytest.mark.parametrize("extra, message", [
    (["--max-drop", "1"], "--max-drop needs --eval"),
    (["--eval", "user_eval:relative_error"], "--eval: only with --max-drop"),
    (["--phase1", "callback", "--score-on", "sim"], "--phase1, --score-on: only with --max-drop"),
    (["--max-drop", "1", "--eval", "user_eval:relative_error", "--param-type", "int4"], "--param-type: with --max-drop"),
    (["--max-drop", "1", "--eval", "user_eval:missing"], "--eval user_eval:missing: module 'user_eval' has no function"),
    (["--max-drop", "1", "--eval", "user_eval:not_a_number"], "returned 'good', not a number"),
])
def test_bad_budget_options_are_named(setup, capsys, extra, message):
    root, model, calib = setup
    code = main(["quantize", str(model), "--data", str(calib), "--out", str(root / "bad"), *extra])
    assert code == 1
    assert message in capsys.readouterr().err


def test_max_drop_is_a_non_negative_number(setup, capsys):
    root, model, calib = setup
    assert main(["quantize", str(model), "--data", str(calib), "--out", str(root / "x"), "--max-drop", "-1"]) == 2
    assert "--max-drop: expected a finite number >= 0" in capsys.readouterr().err


def test_phase1_and_score_on_reach_the_search(setup, monkeypatch):
    """--phase1 / --score-on are handed to auto_quantize and named in the report's settings."""
    import mixed_precision

    root, model, calib = setup
    seen = {}
    real = mixed_precision.auto_quantize

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(mixed_precision, "auto_quantize", spy)
    out = root / "opts"
    code = main(["-q", "quantize", str(model), "--data", str(calib), "--out", str(out), "--max-drop", "1",
                 "--eval", "user_eval:relative_error", "--candidates", "W8A8", "--phase1", "callback",
                 "--score-on", "sim"])
    assert code == 0
    assert seen["phase1"] == "callback" and seen["score_on"] == "sim"
    report = (out / "report.md").read_text()
    assert "callback" in report and "| scored on | sim |" in report
