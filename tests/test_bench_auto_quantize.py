"""The auto_quantize benchmark's helpers: NNCF's validation function (no nncf needed), the target verdict and
the table rows, on a tiny built model and hand-worked rows."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_auto_quantize as B  # noqa: E402
from benchmarks.common import top1_agreement  # noqa: E402
from benchmarks.nncf_accuracy_control import _Scorer  # noqa: E402
from benchmarks.suite.cases import Case  # noqa: E402


def _linear(weight: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _case(tmp_path: Path, n_eval: int = 4) -> Case:
    path = tmp_path / "m.onnx"
    onnx.save(_linear(np.eye(3)), str(path))
    # feed i: two rows whose class is i % 3 and (i + 1) % 3
    ev = [{"x": np.eye(3, dtype=np.float32)[[i % 3, (i + 1) % 3]]} for i in range(n_eval)]
    labels = np.array([c for i in range(n_eval) for c in (i % 3, (i + 1) % 3)])

    def score(ref, q):  # like the suite's: needs every feed (the labels cover the whole split)
        a, b = np.concatenate([o[0] for o in ref]), np.concatenate([o[0] for o in q])
        return {"top-1 = FP32": top1_agreement(a, b), "accuracy": float(np.mean(b.argmax(-1) == labels))}

    return Case("tiny", path, ev[:1], ev, score, "top-1 = FP32", True, "")


def test_nncf_validation_fn_scores_subsets_against_the_whole_split(tmp_path):
    case = _case(tmp_path)
    scorer = _Scorer(case)
    items = list(enumerate(case.eval))
    assert scorer(onnx.load(str(case.model_path)), items) == (1.0, [1.0] * 4)
    # swapping classes 0 and 1 changes the argmax of rows of class 0 or 1: feed i has rows i%3, (i+1)%3
    swapped = _linear(np.eye(3)[[1, 0, 2]])
    wrong_rows = [sum(c in (0, 1) for c in (i % 3, (i + 1) % 3)) for i in range(4)]  # [2, 1, 1, 2]
    metric, per_item = scorer(swapped, items)
    assert metric == 1 - sum(wrong_rows) / 8
    assert per_item == [1 - w / 8 for w in wrong_rows]
    # a subset (as NNCF's ranking passes it): the other feeds keep their FP32 outputs
    assert scorer(swapped, items[1:2]) == (1 - 1 / 8, [1 - 1 / 8])
    assert scorer.session_score(swapped) == metric


def test_lower_is_better_metrics_are_negated(tmp_path):
    case = _case(tmp_path)
    case.higher_is_better = False
    scorer = _Scorer(case)
    swapped = _linear(np.eye(3)[[1, 0, 2]])
    assert scorer.session_score(swapped) == -(1 - 6 / 8)  # as bench_auto_quantize's rows hold it
    # what NNCF gets: shifted by 1 so that the float model's metric is not 0 (NNCF divides by it)
    assert scorer(swapped, list(enumerate(case.eval)))[0] == 1 - (1 - 6 / 8)


ROW = {"key": "m", "model": "M", "metric": "top-1 = FP32", "sign": 1.0, "float": 1.0, "w8a8": 0.95, "w16a16": 1.0,
       "auto": 0.995, "met": True, "bops": 0.2, "share": 0.25, "seconds": 100.0, "cpu_seconds": 80.0,
       "rounding_seconds": 40.0, "passes": 12.0, "cpu_passes": 10.0, "encodings": 0.995, "qdq": 0.98,
       "integer": "TargetError: 16-bit", "chosen": "amp: candidates=W8A8/W16A16"}


def test_verdict_follows_the_issues_target():
    assert B.verdict(ROW, 0.01) == "yes"
    assert B.verdict({**ROW, "met": False, "auto": 0.98}, 0.01) == "no (budget)"
    assert B.verdict({**ROW, "met": False, "auto": 0.98, "w16a16": 0.98}, 0.01) == "yes"  # W16A16 misses too
    assert B.verdict({**ROW, "share": 0.6, "passes": 31.0, "cpu_passes": 35.0}, 0.01) == "no (> 8 bits, time)"
    assert B.verdict({**ROW, "passes": 31.0, "cpu_passes": 29.0}, 0.01) == "yes"  # the load-robust count
    unfinished = {k: ROW[k] for k in ("key", "model", "metric", "sign", "float", "w8a8", "w16a16")}
    assert B.verdict(unfinished, 0.01) == "no (did not finish)"
    assert B.verdict({**unfinished, "w16a16": 0.9}, 0.01) == "n/a (W16A16 misses too)"


def test_rows_mark_exports_that_miss_the_search_score():
    line = B.render(ROW)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == B.HEADER.splitlines()[0].count("|") - 1
    assert "0.9950" in cells[11] and "(!)" not in cells[11]  # encodings deliver the search's score
    assert cells[12] == "0.9800 (!)"  # QDQ more than 0.01 away
    assert cells[13].startswith("fails (TargetError")
    lower = B.render({**ROW, "sign": -1.0, "float": -0.0, "auto": -0.02})  # CER printed as it is
    assert "| 0.0200 |" in lower
    partial = B.render({k: ROW[k] for k in ("key", "model", "metric", "sign", "float", "w8a8", "w16a16")}
                       | {"error": "search did not finish in 900 s"})
    assert "search did not finish in 900 s" in partial and "0.9500" in partial


def test_export_scores_use_codes_that_run_exactly_here_and_show_the_noise_band(tmp_path):
    """`_exports` on a tiny calibrated sim: every export scored, the codes recorded, and the row renders the
    int8-coded file and the sim's unoptimized session beside the QDQ score."""
    from quantsim import QuantizationSimModel
    from quantsim.graph.int8_kernels import uint8_int8_kernels_saturate

    case = _case(tmp_path)
    sim = QuantizationSimModel(str(case.model_path), progress=False, **B.SIM_SWITCHES)
    sim.compute_encodings(case.calib)
    out = B._exports(sim, B.CaseScore(case))
    assert out["weight_codes"] == ("uint8" if uint8_int8_kernels_saturate() else "int8")
    for name in ("sim_now", "sim_unoptimized", "encodings", "qdq", "integer"):
        assert out[name] == 1.0, (name, out[name])  # the identity keeps every argmax
    assert ("qdq_int8_codes" in out) == (out["weight_codes"] == "uint8")
    rendered = B.render({**ROW, **out, "auto": 1.0})
    assert "sim unoptimized 1.0000" in rendered
