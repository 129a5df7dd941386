"""Every python block of each guide in docs/guides runs as written, in order, in one namespace per guide
(issue 32; as tests/test_readme.py does for the README), on the README tour's small CNN saved as model.onnx."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
import pytest

from tests.test_readme import python_blocks, run_blocks, tour_model

GUIDES = sorted((Path(__file__).resolve().parent.parent / "docs" / "guides").glob("*.md"))
#: guides whose code needs an optional extra, and the module that extra brings
NEEDS = {"dask-cluster": "distributed"}


def test_there_are_guides():
    assert len(GUIDES) >= 6


@pytest.mark.parametrize("guide", GUIDES, ids=[g.stem for g in GUIDES])
def test_every_python_block_of_the_guide_runs_in_order(guide, tmp_path, monkeypatch):
    needed = NEEDS.get(guide.stem)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{guide.name} needs {needed} (the test or cluster extra)")
    blocks = python_blocks(guide.read_text())
    assert blocks, f"{guide.name} has no python block"
    onnx.save(tour_model(), str(tmp_path / "model.onnx"))
    monkeypatch.chdir(tmp_path)
    run_blocks(blocks, guide.name, "guide")
