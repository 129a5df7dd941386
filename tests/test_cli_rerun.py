"""``quantsim quantize`` into a folder an earlier run wrote (issue 28.5): the earlier run's artefacts with the same
prefix are removed, the folder holds only this run's files, and report.md lists exactly those (read back from
the folder) and what was removed. The input model is never removed."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from tiny_cnn import batch, make_model

from quantsim_cli.main import main


@pytest.fixture()
def setup(tmp_path, monkeypatch) -> dict[str, Path]:
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tmp_path / "tiny.onnx", tmp_path / "calib"
    onnx.save(make_model(), str(model))
    data.mkdir()
    for i in range(2):
        np.save(data / f"batch{i}.npy", batch(i)["x"])
    return {"root": tmp_path, "model": model, "data": data}


def _quantize(capsys, setup, out: Path, *extra: object) -> tuple[int, str]:
    code = main(["quantize", str(setup["model"]), "--data", str(setup["data"]), "--out", str(out), *map(str, extra)])
    return code, capsys.readouterr().err


def _listed(report: str) -> list[str]:
    section = report.split("## Files", 1)[1].split("## Timings", 1)[0]
    return re.findall(r"^- `([^`]+)`$", section, re.M)


def test_a_second_run_with_other_artefacts_removes_the_first_runs_files(setup, capsys):
    out = setup["root"] / "out"
    code, err = _quantize(capsys, setup, out, "--write", "all")
    assert code == 0, err
    first = {p.name for p in out.iterdir()}
    assert {"tiny.qdq.onnx", "tiny.integer.onnx", "tiny.integer.requant.json", "analysis.html"} <= first
    (out / "tiny.qdq.onnx.data").write_bytes(b"left by a run of a model over 2 GB")
    (out / "notes.txt").write_text("mine")  # not an artefact: kept
    (out / "other.qdq.onnx").write_text("another prefix")  # kept
    code, err = _quantize(capsys, setup, out, "--write", "encodings", "--param-type", "int4", "--analysis-batches", 0)
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["notes.txt", "other.qdq.onnx", "report.md", "tiny.encodings"]
    encodings = json.loads((out / "tiny.encodings").read_text())
    assert {e["bw"] for e in encodings["param_encodings"]} == {4}
    report = (out / "report.md").read_text()
    assert _listed(report) == ["tiny.encodings"]  # exactly this run's artefacts
    removed = report.split("Removed (left in this folder by an earlier run with the same prefix): ", 1)[1]
    for name in ("tiny.onnx", "tiny.qdq.onnx", "tiny.qdq.onnx.data", "tiny.integer.onnx",
                 "tiny.integer.requant.json", "analysis.html"):
        assert f"`{name}`" in removed.split("\n")[0], name
    assert "removed" in err and "tiny.qdq.onnx" in err and "of an earlier run" in err  # one warning line


def test_a_rerun_with_the_same_artefacts_lists_them_and_removes_nothing_else(setup, capsys):
    out = setup["root"] / "out"
    for _ in range(2):
        code, err = _quantize(capsys, setup, out, "--write", "encodings,qdq", "--analysis-batches", 0)
        assert code == 0, err
    report = (out / "report.md").read_text()
    assert _listed(report) == ["tiny.encodings", "tiny.qdq.onnx"]
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "tiny.encodings", "tiny.qdq.onnx"]


def test_the_input_model_in_the_output_folder_is_never_removed(setup, capsys):
    out = setup["root"]  # the model's own folder, prefix = its stem: tiny.onnx is "the float artefact"
    before = setup["model"].read_bytes()
    code, err = _quantize(capsys, setup, out, "--write", "qdq", "--analysis-batches", 0)
    assert code == 0, err
    assert setup["model"].read_bytes() == before
    assert _listed((out / "report.md").read_text()) == ["tiny.qdq.onnx"]
    code, err = _quantize(capsys, setup, out, "--write", "encodings,float")
    assert code == 1 and "would overwrite the input model" in err
    assert setup["model"].read_bytes() == before and (out / "tiny.qdq.onnx").is_file()  # refused: nothing removed
