"""The ``quantsim`` command line, driven as a user drives it.

The happy paths and the exit-code / traceback behaviour run ``python -m quantsim`` in a subprocess; the many
bad-input paths call the same entry point (`quantsim_cli.main.main`) in-process, which is what the console
script runs, to keep the file fast.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batch, make_model

from quantsim_cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def _two_input_model() -> onnx.ModelProto:
    """a[N,4] + b[N,4] -> MatMul W[4,3] -> y[N,3]."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"], name="add"), helper.make_node("MatMul", ["s", "W"], ["y"], name="mm")],
        "two_inputs",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    paths = {"root": root, "model": root / "tiny.onnx", "two": root / "two.onnx", "calib": root / "calib",
             "npz": root / "calib.npz", "two_npz": root / "two.npz", "module": root / "user_data.py"}
    onnx.save(make_model(), str(paths["model"]))
    onnx.save(_two_input_model(), str(paths["two"]))
    paths["calib"].mkdir()
    for i in range(3):
        np.save(paths["calib"] / f"batch{i}.npy", batch(i)["x"])
    np.savez(paths["npz"], x=np.concatenate([batch(i, n=4)["x"] for i in range(3)]))  # 12 rows
    rng = np.random.default_rng(0)
    np.savez(paths["two_npz"], a=rng.standard_normal((10, 4)).astype(np.float32),
             b=rng.standard_normal((10, 4)).astype(np.float32))
    paths["module"].write_text(
        "import numpy as np\n"
        "def feeds():\n"
        "    rng = np.random.default_rng(0)\n"
        "    return [{'x': rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(3)]\n"
        "def not_iterable():\n    return 3\n"
        "def wrong_name():\n    return [{'image': np.zeros((1, 3, 8, 8), np.float32)}]\n"
        "def raises():\n    raise RuntimeError('no data today')\n"
        "VALUE = 1\n")
    bad = root / "bad_shape"
    bad.mkdir()
    np.save(bad / "b.npy", np.zeros((2, 4, 8, 8), np.float32))
    paths["bad_shape"] = bad
    np.savez(root / "bad_name.npz", image=np.zeros((2, 3, 8, 8), np.float32))
    np.save(root / "complex.npy", np.zeros((2, 3, 8, 8), np.complex64))
    (root / "not_onnx.onnx").write_text("hello")
    (root / "empty").mkdir()
    (root / "bad_overrides.json").write_text(json.dumps({"node": {"no_such_node": "FP16"}}))
    (root / "broken.json").write_text("{")
    return paths


def _cli(*args: object, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "quantsim", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def _run(capsys, *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# end to end, in subprocesses ------------------------------------------------------------------------------
@pytest.mark.int8_kernels
def test_quantize_writes_every_artefact_and_a_report(files):
    out = files["root"] / "out_all"
    result = _cli("quantize", files["model"], "--data", files["calib"], "--out", out, "--write", "all")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no progress-bar fragments or warnings when not on a terminal
    assert "output y: SQNR" in result.stdout and "top-1 agreement 100.0%" in result.stdout
    for name in ("tiny.encodings", "tiny.onnx", "tiny.qdq.onnx", "tiny.integer.onnx", "tiny.integer.requant.json",
                 "analysis.html"):
        assert (out / name).is_file(), name
    report = (out / "report.md").read_text()
    assert "[analysis.html](analysis.html)" in report and "analysis.html" in result.stdout
    page = (out / "analysis.html").read_text()
    assert "quantsim quantize: tiny.onnx" in page and "<svg" in page and "<script" not in page
    for section in ("## Settings", "## Outputs against the float model", "## Per-layer SQNR", "## What stayed float",
                    "## Timings"):
        assert section in report
    assert "| c | activation, disabled | quantized after the Relu" in report
    assert "bias: the config does not simulate biases" in report
    assert json.loads((out / "tiny.encodings").read_text())["version"] == "1.0.0"


@pytest.mark.int8_kernels
def test_inspect_and_compare_an_export(files):
    out = files["root"] / "out_all"
    if not (out / "tiny.qdq.onnx").exists():
        pytest.skip("needs test_quantize_writes_every_artefact_and_a_report")
    inspected = _cli("inspect", out, "--json")
    assert inspected.returncode == 0, inspected.stderr
    kinds = {item["file"]: item["kind"] for item in json.loads(inspected.stdout)}
    assert kinds["tiny.encodings"] == "encodings 1.0.0" and kinds["tiny.qdq.onnx"] == "QDQ ONNX model"
    assert kinds["tiny.integer.onnx"] == "integer ONNX model" and kinds["tiny.onnx"] == "float ONNX model"
    compared = _cli("compare", files["model"], out / "tiny.qdq.onnx", "--data", files["calib"], "--runs", 2, "--json",
                    "--providers", "CPUExecutionProvider")
    assert compared.returncode == 0, compared.stderr
    document = json.loads(compared.stdout)
    assert document["batches"] == 3 and document["outputs"][0]["top1_agreement"] == 1.0
    assert document["outputs"][0]["sqnr_db"] > 30 and document["latency"]["quantized_ms"] > 0


def test_usage_errors_exit_2_and_tracebacks_only_with_debug(files):
    usage = _cli("quantize", files["model"], "--data", files["calib"], "--out", files["root"] / "o", "--param-type", "int3")
    assert usage.returncode == 2 and "--param-type" in usage.stderr and "int3" in usage.stderr
    missing = _cli("quantize", files["root"] / "missing.onnx", "--data", files["calib"], "--out", files["root"] / "o")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == [f"quantsim: error: {files['root'] / 'missing.onnx'}: no such model file"]
    debug = _cli("--debug", "quantize", files["root"] / "missing.onnx", "--data", files["calib"], "--out", files["root"] / "o")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "no such model file" in debug.stderr


def test_help_version_and_console_script_entry_point():
    helped = _cli("--help")
    assert helped.returncode == 0
    for command in ("quantize", "inspect", "compare", "analyze", "cache"):
        assert command in helped.stdout
    assert main(["--version"]) == 0
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\[project\.scripts\]\nquantsim = "quantsim_cli\.main:main"$', pyproject, re.M)


# in-process: the same entry point -------------------------------------------------------------------------
def test_quantize_from_npz_module_function_and_with_improvements(files, capsys):
    out = files["root"] / "out_npz"
    code, stdout, err = _run(capsys, "quantize", files["model"], "--data", files["npz"], "--batch-size", 4, "--out", out,
                             "--param-type", "int4", "--per-tensor", "--seq-mse", 3, "--adaround", 10,
                             "--encoding-version", "0.6.1", "--prefix", "w4", "--analysis-batches", 0)
    assert code == 0, err
    assert "3 calibration batch(es)" in stdout and (out / "w4.encodings").is_file() and (out / "w4.onnx").is_file()
    report = (out / "report.md").read_text()
    assert "## Weight optimisation" in report and "| AdaRound | conv | Conv |" in report
    assert "| Sequential MSE | fc | Gemm |" in report and "## Per-layer SQNR" not in report
    assert not (out / "analysis.html").exists()  # no analysis, no page
    assert json.loads((out / "w4.encodings").read_text())["version"] == "0.6.1"

    code, stdout, err = _run(capsys, "-q", "quantize", files["model"], "--data", f"{files['module']}:feeds",
                             "--out", files["root"] / "out_fn", "--write", "qdq")
    assert code == 0 and stdout == "" and err == ""
    assert sorted(p.name for p in (files["root"] / "out_fn").iterdir()) == ["analysis.html", "report.md", "tiny.qdq.onnx"]


def test_quantize_weight_codes_option(files, capsys):
    """--weight-codes uint8 stores the 8-bit weight codes of the qdq and integer models as uint8 (exact on
    onnxruntime's kernels on every CPU); a bad value is a usage error naming the option."""
    out = files["root"] / "out_u8"
    code, _, err = _run(capsys, "-q", "quantize", files["model"], "--data", files["calib"], "--out", out,
                        "--write", "encodings,qdq,integer", "--weight-codes", "uint8", "--analysis-batches", 0)
    assert code == 0, err
    for name in ("tiny.qdq.onnx", "tiny.integer.onnx"):
        model = onnx.load(str(out / name))
        types = {t.data_type for t in model.graph.initializer}
        assert onnx.TensorProto.UINT8 in types and onnx.TensorProto.INT8 not in types, name
    assert "| weight codes | uint8 |" in (out / "report.md").read_text()
    code, _, err = _run(capsys, "quantize", files["model"], "--data", files["calib"], "--out", out, "--weight-codes", "u8")
    assert code == 2 and "--weight-codes" in err


def test_quantize_a_two_input_model_with_overrides(files, capsys):
    overrides = files["root"] / "overrides.json"
    overrides.write_text(json.dumps({"default": "W8A8", "node": {"mm": "W8A16"}}))
    out = files["root"] / "out_two"
    code, _, err = _run(capsys, "quantize", files["two"], "--data", files["two_npz"], "--out", out,
                        "--overrides", overrides, "--write", "encodings")
    assert code == 0, err
    report = (out / "report.md").read_text()
    assert "## Precision overrides" in report and "| mm | W8A16 | node 'mm' |" in report
    assert (out / "two.encodings").is_file() and not (out / "two.onnx").exists()


def test_inspect_a_model(files, capsys):
    code, stdout, err = _run(capsys, "inspect", files["model"], "--json")
    assert code == 0, err
    rows = {row["tensor"]: row for row in json.loads(stdout)["quantizers"]}
    assert rows["W"]["role"] == "param" and rows["W"]["origin"] == "original, weight of conv (Conv)"
    assert rows["r"]["origin"] == "original, output of relu (Relu)" and rows["c"]["enabled"] == "no"
    code, stdout, _ = _run(capsys, "inspect", files["model"], "--param-type", "int4", "--per-tensor")
    assert code == 0 and "int4 sym per-tensor" in stdout and "10 quantizers" in stdout


def test_analyze_prints_and_writes_the_sensitivity_report(files, capsys):
    out = files["root"] / "analysis"
    code, stdout, err = _run(capsys, "analyze", files["model"], "--data", files["calib"], "--out", out, "--top", 3)
    assert code == 0, err
    assert "most sensitive groups" in stdout and "activations, worst first" in stdout
    document = json.loads((out / "analysis.json").read_text())
    assert document["float_score"] is None  # exact: infinite SQNR is written as null
    assert {g["nodes"][0] for g in document["groups"] if g["nodes"]} == {"conv", "fc"}
    assert "# quantsim analysis: tiny.onnx" in (out / "analysis.md").read_text()
    page = (out / "analysis.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "quantsim analysis: tiny.onnx" in page
    assert page.count("<svg") >= 4 and "Sensitivity per quantizer group" in page and "analysis.html" in stdout
    worst = document["tensors"][0]["tensor"]
    assert page.index(f"<code>{worst}</code>") < page.index("<h2>Sensitivity")  # worst tensor first


def test_cache_list_and_clear(files, capsys, tmp_path):
    cache = tmp_path / "cache"
    code, _, err = _run(capsys, "inspect", files["model"], "--json")
    assert code == 0, err
    os.environ["QUANTSIM_CACHE_DIR"], saved = str(cache), os.environ["QUANTSIM_CACHE_DIR"]
    try:
        assert _run(capsys, "inspect", files["model"], "-q")[0] == 0
        code, stdout, _ = _run(capsys, "cache", "list")
        assert code == 0 and "1 prepared model(s)" in stdout
        code, stdout, _ = _run(capsys, "cache", "clear")
        assert code == 0 and "removed 1 prepared model(s)" in stdout
    finally:
        os.environ["QUANTSIM_CACHE_DIR"] = saved
    code, stdout, _ = _run(capsys, "cache", "list", "--cache-dir", cache)
    assert code == 0 and "0 prepared model(s)" in stdout


def _bad_cases(f: dict[str, Path]) -> list[tuple[list, int, str]]:
    r, model, calib, out = f["root"], f["model"], f["calib"], f["root"] / "o"
    q = ["quantize", model, "--out", out, "--data"]
    return [
        # files and data: exit 1, the message names the file, input or option at fault
        (["quantize", r / "missing.onnx", "--data", calib, "--out", out], 1, "missing.onnx: no such model file"),
        (["quantize", r / "not_onnx.onnx", "--data", calib, "--out", out], 1, "not_onnx.onnx: not a readable ONNX model"),
        ([*q, r / "nowhere"], 1, "--data " + str(r / "nowhere") + ": no such file or folder"),
        ([*q, r / "empty"], 1, "empty: the folder holds no .npy or .npz files"),
        ([*q, f["bad_shape"]], 1, "b.npy: input 'x' has shape (2, 4, 8, 8); the model expects x float32 [N, 3, H, W] "
                                  "(axis 1 must be 3)"),
        ([*q, r / "bad_name.npz"], 1, "bad_name.npz: unknown input name 'image'; the model's inputs are 'x'"),
        ([*q, r / "complex.npy"], 1, "complex.npy: input 'x' has dtype complex64; the model expects float32"),
        ([*q, r / "broken.json"], 1, "expected a folder of .npy/.npz files"),
        ([*q, "no_such_module_xyz:feeds"], 1, "cannot import module 'no_such_module_xyz'"),
        ([*q, f"{f['module']}:missing"], 1, "has no function 'missing'"),
        ([*q, f"{f['module']}:VALUE"], 1, "'VALUE' is not callable"),
        ([*q, f"{f['module']}:not_iterable"], 1, "must return an iterable of feed dicts, got int"),
        ([*q, f"{f['module']}:wrong_name"], 1, "item 0: unknown input name 'image'"),
        ([*q, f"{f['module']}:raises"], 1, "the function raised RuntimeError: no data today"),
        (["quantize", f["two"], "--out", out, "--data", calib], 1, "a .npy file holds one array but the model has 2 inputs"),
        ([*q, calib, "--config", r / "nofile.json"], 1, "nofile.json: no such file"),
        ([*q, calib, "--config", r / "broken.json"], 1, "broken.json"),
        ([*q, calib, "--overrides", r / "nofile.json"], 1, "--overrides " + str(r / "nofile.json") + ": no such file"),
        ([*q, calib, "--overrides", r / "bad_overrides.json"], 1, "no_such_node"),
        (["quantize", model, "--data", calib, "--out", r], 1, "would overwrite the input model"),
        (["quantize", model, "--data", calib, "--out", f["npz"]], 1, "exists and is not a folder"),
        (["compare", model, r / "missing.onnx", "--data", calib], 1, "missing.onnx: no such model file"),
        (["compare", model, f["two"], "--data", calib], 1, "two.onnx: has no input 'x'"),
        (["analyze", model, "--data", r / "bad_name.npz"], 1, "unknown input name 'image'"),
        (["inspect", r / "nowhere"], 1, "nowhere: no such file or folder"),
        (["inspect", r / "empty"], 1, "no .encodings, .onnx or .json files"),
        (["inspect", r / "broken.json"], 1, "broken.json: not a readable JSON file"),
        (["inspect", r / "complex.npy"], 1, "complex.npy: expected an ONNX model, an export folder or an .encodings"),
        # the command line itself: exit 2, argparse names the option
        ([*q, calib, "--param-type", "int3"], 2, "argument --param-type: invalid choice: 'int3'"),
        ([*q, calib, "--activation-type", "fp8"], 2, "argument --activation-type: invalid choice"),
        ([*q, calib, "--quant-scheme", "entropy"], 2, "argument --quant-scheme: invalid choice"),
        ([*q, calib, "--batch-size", "0"], 2, "argument --batch-size: expected a positive integer, got '0'"),
        ([*q, calib, "--adaround", "-5"], 2, "argument --adaround: expected an integer >= 0"),
        ([*q, calib, "--write", "encodings,pdf"], 2, "argument --write: unknown artefact(s) ['pdf']"),
        ([*q, calib, "--encoding-version", "3.0"], 2, "argument --encoding-version: invalid choice"),
        ([*q, calib, "--percentile", "101"], 2, "argument --percentile: expected a number in (0, 100]"),
        ([*q, calib, "--per-channel", "--config", "per_tensor"], 2, "not allowed with argument"),
        ([*q, calib, "--providers", "NoSuchExecutionProvider"], 2,
         "argument --providers: execution provider(s) ['NoSuchExecutionProvider'] not available"),
        (["compare", model, model, "--data", calib, "--providers", ","], 2, "argument --providers:"),
        (["quantize", model, "--data", calib], 2, "the following arguments are required: --out"),
        (["compile", model], 2, "invalid choice: 'compile'"),
        (["cache", "prune"], 2, "invalid choice: 'prune'"),
        (["-q", "-v", "cache", "list"], 2, "not allowed with argument"),
    ]


def test_every_bad_input_is_one_line_naming_what_is_at_fault(files, capsys):
    failures = []
    for argv, want_code, want_text in _bad_cases(files):
        code, stdout, err = _run(capsys, *argv)
        lines = err.strip().splitlines()
        message = lines[-1] if lines else ""
        ok = code == want_code and want_text in err and "Traceback" not in err
        if want_code == 1:
            ok = ok and len(lines) == 1 and message.startswith("quantsim: error: ")
        if not ok:
            failures.append(f"{[str(a) for a in argv]} -> {code}: {err!r}")
    assert not failures, "\n".join(failures)


def test_fixed_batch_models_and_batch_size_checks(files, capsys, tmp_path):
    fixed = make_model()
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    path = tmp_path / "fixed.onnx"
    onnx.save(fixed, str(path))
    code, _, err = _run(capsys, "quantize", path, "--data", files["npz"], "--batch-size", 4, "--out", tmp_path / "o")
    assert code == 1 and "--batch-size 4: the model's input 'x' has a fixed batch size of 2" in err
    code, stdout, err = _run(capsys, "quantize", path, "--data", files["npz"], "--out", tmp_path / "o",
                             "--max-batches", 5, "--analysis-batches", 1)
    assert code == 0, err
    assert "5 calibration batch(es)" in stdout  # 12 rows in batches of the model's 2, at most 5


def test_inspect_names_what_preparation_folded(tmp_path, capsys):
    from models import conv_bn_relu

    path = tmp_path / "bn.onnx"
    onnx.save(conv_bn_relu()[0], str(path))
    code, stdout, err = _run(capsys, "inspect", path, "--json")
    assert code == 0, err
    origin = {row["tensor"]: row["origin"] for row in json.loads(stdout)["quantizers"]}
    assert origin["conv.w"] == "original, weight of conv (Conv) (bn (BatchNormalization) folded in)"
    assert origin["bn.out"] == "original, was the output of bn (BatchNormalization), now of conv (Conv)"
    assert [t for t, o in origin.items() if o.startswith("made by preparation, bias of conv")]


def test_warnings_are_one_line_and_quiet_hides_them(files, capsys, tmp_path):
    data = tmp_path / "nan"
    data.mkdir()
    np.save(data / "a.npy", batch(0)["x"])
    np.save(data / "b.npy", np.full((2, 3, 8, 8), np.nan, np.float32))
    code, _, err = _run(capsys, "quantize", files["model"], "--data", data, "--out", tmp_path / "o", "--analysis-batches", 1)
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("quantsim: warning: RuntimeWarning: ")]
    assert warnings and "NaN" in warnings[0] and all(line.startswith("quantsim: ") for line in err.splitlines())
    code, stdout, err = _run(capsys, "-q", "quantize", files["model"], "--data", data, "--out", tmp_path / "o")
    assert code == 0 and stdout == "" and err == ""


def test_data_forms_and_regrouping(files, tmp_path):
    from quantsim_cli.data import model_inputs, open_data, rebatch

    feeds = [{"x": np.arange(n) + 100 * i} for i, n in enumerate([3, 1, 10, 3])]
    assert [len(b["x"]) for b in rebatch(feeds, 4)] == [4, 4, 4, 4, 1]
    assert [b["x"].tolist() for b in rebatch(feeds, 4, keep_partial=False)][-1] == [208, 209, 300, 301]

    inputs = model_inputs(files["model"])
    samples = tmp_path / "samples"  # one sample per file, no batch axis; np.savez's positional name arr_0
    samples.mkdir()
    for i in range(5):
        np.savez(samples / f"s{i}.npz", batch(i, n=1)["x"][0].astype(np.float64))
    batches = list(open_data(str(samples), inputs, batch_size=2))
    assert [b["x"].shape for b in batches] == [(2, 3, 8, 8), (2, 3, 8, 8), (1, 3, 8, 8)]
    assert all(b["x"].dtype == np.float32 for b in batches)
    single = open_data(str(files["calib"] / "batch0.npy"), inputs, batch_size=1)
    assert len(list(single)) == 2 and len(list(single)) == 2  # re-iterable
    two = tmp_path / "two"
    two.mkdir()
    np.savez(two / "b0.npz", a=np.zeros((3, 4), np.float32), b=np.ones((3, 4), np.float32))
    assert list(open_data(str(two), model_inputs(files["two"]), max_batches=1))[0]["b"].shape == (3, 4)


def test_providers_reach_the_sim_in_order(files):
    from quantsim_cli.arguments import build_parser
    from quantsim_cli.simbuild import sim_from_args

    default = build_parser().parse_args(["inspect", str(files["model"])])
    assert sim_from_args(default, str(files["model"])).providers == ["CPUExecutionProvider"]
    chosen = build_parser().parse_args(["inspect", str(files["model"]), "--providers",
                                        "AzureExecutionProvider,CPUExecutionProvider,AzureExecutionProvider"]
                                       ) if "AzureExecutionProvider" in ort.get_available_providers() else None
    if chosen is not None:
        assert chosen.providers == ["AzureExecutionProvider", "CPUExecutionProvider"]
        assert sim_from_args(chosen, str(files["model"])).providers == chosen.providers
