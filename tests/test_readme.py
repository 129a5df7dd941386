"""The README's python blocks run as written, in order, in one namespace (issue 15: a tour that works)."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

README = Path(__file__).resolve().parent.parent / "README.md"


def tour_model() -> onnx.ModelProto:
    """The model the README's blocks assume: input ``input``, ``conv1`` (weight ``conv1.weight``) -> ``bn1``
    -> ``relu1`` (output ``relu1_out``) -> ``conv2`` -> pooling -> ``head/fc``."""
    rng = np.random.default_rng(0)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((scale * rng.standard_normal(shape)).astype(np.float32), name)

    inits = [init("conv1.weight", 8, 3, 3, 3), init("conv1.bias", 8, scale=0.1),
             init("bn1.scale", 8, scale=0.2), init("bn1.bias", 8, scale=0.1), init("bn1.mean", 8, scale=0.1),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn1.var"),
             init("conv2.weight", 8, 8, 3, 3, scale=0.2), init("conv2.bias", 8, scale=0.1),
             init("head.weight", 10, 8), init("head.bias", 10, scale=0.1)]
    inits[2] = numpy_helper.from_array((1 + 0.2 * rng.standard_normal(8)).astype(np.float32), "bn1.scale")
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["conv1_out"], name="conv1", pads=[1] * 4),
        helper.make_node("BatchNormalization", ["conv1_out", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"],
                         ["bn1_out"], name="bn1"),
        helper.make_node("Relu", ["bn1_out"], ["relu1_out"], name="relu1"),
        helper.make_node("Conv", ["relu1_out", "conv2.weight", "conv2.bias"], ["conv2_out"], name="conv2", pads=[1] * 4),
        helper.make_node("Relu", ["conv2_out"], ["relu2_out"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["relu2_out"], ["pool_out"], name="pool"),
        helper.make_node("Flatten", ["pool_out"], ["flat_out"], name="flatten"),
        helper.make_node("Gemm", ["flat_out", "head.weight", "head.bias"], ["logits"], name="head/fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "tour", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def run_blocks(blocks: list[str], source: str, module_name: str) -> dict:
    """Run ``blocks`` in order in one namespace; a failure names the block and shows it."""
    namespace: dict = {"__name__": module_name}
    for number, block in enumerate(blocks):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                exec(compile(block, f"{source} python block {number + 1}", "exec"), namespace)
            except Exception as error:  # noqa: BLE001 - re-raised with the block that failed
                raise AssertionError(f"{source} python block {number + 1} failed: {error!r}\n{block}") from error
    return namespace


def test_every_python_block_of_the_readme_runs_in_order(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 4
    onnx.save(tour_model(), str(tmp_path / "model.onnx"))
    monkeypatch.chdir(tmp_path)
    run_blocks(blocks, "README.md", "readme")
    assert (tmp_path / "out" / "model.encodings").exists()


def test_the_aimet_parity_summary_is_the_harness_result():
    """The README's parity line is the last run of `benchmarks/parity` (its results file), not a claim."""
    summary = re.search(r"<!-- parity-summary -->\n(.*?)\n<!-- /parity-summary -->", README.read_text(), re.S)
    assert summary is not None
    results = (README.parent / "benchmarks" / "parity" / "results.md").read_text()
    assert summary.group(1).strip() in results
    rows = [line for line in results.splitlines() if line.startswith("| `")]
    agree = [sum(cell.strip().startswith("yes") for cell in row.split("|")[3:5][i:i + 1]) for i in (0, 1)
             for row in rows]
    defaults, switched = sum(agree[:len(rows)]), sum(agree[len(rows):])
    assert f"{defaults} of {len(rows)} steps agree with quantsim's defaults; {switched} of {len(rows)}" in summary.group(1)
