"""Fuzzed command-line data (issue 28, 28.5's neighbour): ``--data`` folders and files with mutated bytes
(flipped, truncated, appended, zeroed), wrong array names, shapes and dtypes give either the right feeds or a
`QuantsimError` whose message is one line naming the file; ``quantsim quantize`` on them exits 0 with its
artefacts or 1 with one ``quantsim: error:`` line, leaving the output folder as it was (nothing half-written).

Hypothesis runs derandomized, like tests/test_fuzz.py; ``QUANTSIM_FUZZ_EXAMPLES`` raises the count locally.
"""
from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from tiny_cnn import batch, make_model

from quantsim import QuantsimError
from quantsim_cli.data import model_inputs, open_data
from quantsim_cli.main import main

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("QUANTSIM_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CLI_FUZZ = settings(FUZZ, max_examples=max(6, EXAMPLES // 8))  # each example is a whole quantize run


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(make_model(), str(path))  # x[N, 3, H, W]
    return path


def _bytes(kind: str, seed: int) -> bytes:
    """A valid file of ``kind`` (npy, npz, npz_compressed) holding a batch of the tiny model's input."""
    buffer, x = io.BytesIO(), batch(seed, n=2)["x"]
    {"npy": lambda: np.save(buffer, x), "npz": lambda: np.savez(buffer, x=x),
     "npz_compressed": lambda: np.savez_compressed(buffer, x=x)}[kind]()
    return buffer.getvalue()


@st.composite
def mutated_bytes(draw, data: bytes) -> bytes:
    """``data`` with 1-3 edits: bytes flipped, truncated, garbage appended or a run zeroed."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        if not out:
            break
        action = draw(st.sampled_from(["flip", "truncate", "append", "zero"]))
        at = draw(st.integers(0, len(out) - 1))
        if action == "flip":
            out[at] ^= draw(st.integers(1, 255))
        elif action == "truncate":
            del out[at:]
        elif action == "append":
            out += draw(st.binary(min_size=1, max_size=40))
        else:
            out[at:at + draw(st.integers(1, 64))] = bytes(min(64, len(out) - at))
    return bytes(out)


def _read_all(path: Path, inputs) -> list[dict]:
    return list(open_data(str(path), inputs))


def _one_line_naming(error: QuantsimError, path: Path) -> None:
    message = str(error)
    assert "\n" not in message and str(path) in message, message
    assert "pickle" not in message.lower() or "Python objects" in message, message  # numpy's own text never


# --- the data layer --------------------------------------------------------------------------------------
@FUZZ
@given(kind=st.sampled_from(["npy", "npz", "npz_compressed"]), data=st.data())
def test_mutated_files_in_a_folder_read_or_fail_with_one_line_naming_the_file(tmp_path_factory, model_file, kind,
                                                                             data):
    folder = tmp_path_factory.mktemp("data")
    suffix = ".npy" if kind == "npy" else ".npz"
    (folder / f"a{suffix}").write_bytes(_bytes(kind, 0))
    bad = folder / f"b{suffix}"
    bad.write_bytes(data.draw(mutated_bytes(_bytes(kind, 1))))
    inputs = model_inputs(model_file)
    try:
        feeds = _read_all(folder, inputs)
    except QuantsimError as error:
        _one_line_naming(error, bad)
        return
    assert len(feeds) == 2 and all(f["x"].dtype == np.float32 and f["x"].shape[1] == 3 for f in feeds)


@FUZZ
@given(kind=st.sampled_from(["npy", "npz"]), data=st.data())
def test_a_single_mutated_file_reads_or_fails_with_one_line(tmp_path_factory, model_file, kind, data):
    path = tmp_path_factory.mktemp("single") / f"calib.{kind}"
    path.write_bytes(data.draw(mutated_bytes(_bytes(kind, 2))))
    try:
        feeds = _read_all(path, model_inputs(model_file))
    except QuantsimError as error:
        _one_line_naming(error, path)
        return
    assert feeds and all(f["x"].ndim == 4 and f["x"].shape[1] == 3 for f in feeds)


DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int64", "bool", "complex64", "U3", "object"]


@FUZZ
@given(names=st.lists(st.sampled_from(["x", "arr_0", "y", "image", "X"]), min_size=1, max_size=2, unique=True),
       shape=st.lists(st.integers(1, 5), min_size=1, max_size=5), dtype=st.sampled_from(DTYPES),
       npy=st.booleans())
def test_wrong_names_shapes_and_dtypes_are_named(tmp_path_factory, model_file, names, shape, dtype, npy):
    folder = tmp_path_factory.mktemp("named")
    array = np.ones(shape).astype(dtype)
    path = folder / ("b.npy" if npy else "b.npz")
    if npy:
        np.save(path, array)  # object arrays are pickled by numpy.save
    else:
        np.savez(path, **{name: array for name in names})
    rank_ok = (len(shape) == 4 and shape[1] == 3) or (len(shape) == 3 and shape[0] == 3)
    names_ok = npy or names in (["x"], ["arr_0"])
    expected_ok = rank_ok and names_ok and np.dtype(dtype).kind in "fiub"
    try:
        feeds = _read_all(folder, model_inputs(model_file))
    except QuantsimError as error:
        assert not expected_ok, error
        _one_line_naming(error, path)
        return
    assert expected_ok, (names, shape, dtype)
    (feed,) = feeds
    assert feed["x"].dtype == np.float32 and feed["x"].ndim == 4
    np.testing.assert_array_equal(feed["x"], np.ones(shape, np.float32).reshape(feed["x"].shape))


@pytest.mark.parametrize("content, says", [
    (b"\x80\x04\x95" + b"\0" * 30, "not an .npz archive"),  # a pickle: numpy would talk about allow_pickle
    (b"", "empty file"),
    (b"PK\x03\x04" + b"\0" * 40, "cannot read arrays"),
    (b"hello, world", "not an .npz archive"),
])
def test_a_corrupt_npz_gets_a_clear_error_naming_the_file(tmp_path, model_file, content, says, capsys):
    path = tmp_path / "calib.npz"
    path.write_bytes(content)
    with pytest.raises(QuantsimError) as raised:
        _read_all(path, model_inputs(model_file))
    assert says in str(raised.value)
    _one_line_naming(raised.value, path)
    code = main(["quantize", str(model_file), "--data", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"quantsim: error: {path}: ") and says in err
    assert not (tmp_path / "out").exists()


# --- the command line -------------------------------------------------------------------------------------
def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


@CLI_FUZZ
@given(kind=st.sampled_from(["npy", "npz", "npz_compressed"]), data=st.data())
def test_quantize_on_mutated_data_succeeds_or_exits_1_leaving_the_output_as_it_was(tmp_path_factory, model_file,
                                                                                    kind, data, capsys,
                                                                                    monkeypatch):
    root = tmp_path_factory.mktemp("cli")
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(root / "cache"))
    folder, out = root / "data", root / "out"
    folder.mkdir()
    suffix = ".npy" if kind == "npy" else ".npz"
    (folder / f"a{suffix}").write_bytes(_bytes(kind, 0))
    (folder / f"b{suffix}").write_bytes(data.draw(mutated_bytes(_bytes(kind, 1))))
    out.mkdir()
    (out / "tiny.encodings").write_text("an earlier run's file")
    before = _snapshot(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["quantize", str(model_file), "--data", str(folder), "--out", str(out), "--analysis-batches", "1",
                     "-q"])
    err = capsys.readouterr().err
    if code == 0:
        assert (out / "tiny.encodings").read_text() != "an earlier run's file" and (out / "report.md").is_file()
        return
    assert code == 1 and err.count("\n") == 1 and err.startswith("quantsim: error: "), err
    assert _snapshot(out) == before  # the earlier run's files untouched, nothing new
