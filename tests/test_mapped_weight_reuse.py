"""Sessions of a sim whose weights are mapped from the preparation cache (large models) reuse the
fake-quantized weights written for earlier sessions: calibration, then the sim session, then each rebuild
after a change computes only the weights whose quantizer or values changed, with the bits of a sim that
holds its weights in memory (the oracle), and the files stay bounded on disk. Small models exercise the
large-model paths by lowering the size thresholds."""
from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import onnx
from test_large_model_memory import _mlp, _outputs

import quantsim
import quantsim.graph.session as session_module
import quantsim.sim.fake_values as fake_values_module
from quantsim.graph.deferred import DeferredArray

cache_module = importlib.import_module("quantsim.prepare.cache")


def _counting(monkeypatch) -> list[int]:
    """Counts the weights fake-quantized for sessions (``calls[0]``): whole, or in blocks of rows for a weight
    file (`fake_values.FakeValues`)."""
    calls = [0]
    for name in ("fake_quantize", "fake_quantize_parts"):
        original = getattr(fake_values_module, name)

        def counted(values, enc, original=original):
            calls[0] += 1
            return original(values, enc)

        monkeypatch.setattr(fake_values_module, name, counted)
    return calls


def _oracle_and_mapped_file(monkeypatch, tmp_path, calibrated: bool = False
                            ) -> tuple[quantsim.QuantizationSimModel, Path, list[dict]]:
    """A sim of the MLP held in memory (the oracle; ``calibrated``: on the feeds, before anything is patched),
    the MLP's file, and its feeds; a sim of that file made after this call keeps its weights mapped from its
    cache entry and writes every session weight to a file."""
    model, feeds = _mlp()
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "memory-cache"))
    oracle = quantsim.QuantizationSimModel(model, progress=False)
    if calibrated:
        oracle.compute_encodings(feeds)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_module, "EXTERNAL_DATA_BYTES", 1)
    monkeypatch.setattr(session_module, "FILE_BACKED_MIN_BYTES", 1)
    return oracle, path, feeds


def test_sessions_of_mapped_weights_compute_only_what_changed(monkeypatch, tmp_path):
    oracle, path, feeds = _oracle_and_mapped_file(monkeypatch, tmp_path)
    sim = quantsim.QuantizationSimModel(path, progress=False)
    assert sim._index.weights is not None  # mapped
    weights = [q for q in sim.quantizers if q.role == "param" and q.enabled]
    calls = _counting(monkeypatch)
    for s in (oracle, sim):
        s.compute_encodings(feeds)
    assert calls[0] == 2 * len(weights)  # the oracle's calibration session, then the mapped sim's
    oracle_outputs = _outputs(oracle, feeds)
    calls[0] = 0
    assert _outputs(sim, feeds) == oracle_outputs
    assert calls[0] == 0  # the sim session reads the weights its calibration session wrote

    for s in (oracle, sim):  # one weight's grid changes: that weight alone is computed again
        s.qc_quantize_op_dict["w1"].set_bitwidth(4)
    _outputs(oracle, feeds)
    calls[0] = 0
    assert _outputs(sim, feeds) == _outputs(oracle, feeds)
    assert calls[0] == 1

    new = np.full((48, 48), 0.01, np.float32)  # a replaced weight: computed from its new values
    for s in (oracle, sim):
        s.replace_weight("w0", new)
    assert _outputs(sim, feeds) == _outputs(oracle, feeds)
    for bits in (8, 4, 8, 4, 8):  # flipping back and forth keeps the files within two copies of the weights
        for s in (oracle, sim):
            s.qc_quantize_op_dict["w2"].set_bitwidth(bits)
        assert _outputs(sim, feeds) == _outputs(oracle, feeds)
    files = sim._weight_files
    assert files is not None
    held = sum(p.stat().st_size for p in files.folder.glob("weights-*.bin"))
    mapped = sum(sim.get_weight(n).nbytes for n in ("w1", "w2", "head"))
    assert held <= 2 * mapped + 8 * (1 << 16) + (1 << 20)  # aligned offsets pad each weight to 64 KiB


def test_deferred_values_are_written_by_worker_threads_to_their_offsets(tmp_path):
    """`file_backed_source` computes `DeferredArray` values while writing: the file holds each at its offset."""
    from onnx import TensorProto, helper

    from quantsim.graph.model_io import in_memory_placeholder

    arrays = {f"t{i}": np.arange(300 * (i + 1), dtype=np.float32) * (i + 1) for i in range(4)}
    values = {name: DeferredArray(a.shape, a.dtype, lambda a=a: a, key=(name,)) for name, a in arrays.items()}
    values["t3"] = arrays["t3"]  # a plain array among them
    graph = helper.make_graph([], "g", [], [], [in_memory_placeholder(n, a) for n, a in arrays.items()])
    model = helper.make_model(graph)
    files = session_module.WeightFiles()
    source, keep = session_module.file_backed_source(model, values, files)
    assert keep is files
    written = onnx.load(source, load_external_data=False)
    for tensor in written.graph.initializer:
        assert tensor.data_location == TensorProto.EXTERNAL
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor, base_dir=str(files.folder)), arrays[tensor.name])
    again, _ = session_module.file_backed_source(model, values, files)  # keyed values are found, not written
    places = {t.name: {e.key: e.value for e in t.external_data}
              for t in onnx.load(again, load_external_data=False).graph.initializer}
    assert places["t0"] == {e.key: e.value for e in written.graph.initializer[0].external_data}
    assert places["t3"]["location"] != places["t0"]["location"]  # the plain array is written afresh


class _Rows:
    """A `deferred.RowParts`: ``values`` whole, or in blocks of ``step`` rows (counted in ``blocks``)."""

    def __init__(self, values: np.ndarray, step: int, reshape: tuple | None = None):
        self.values, self.step, self.reshape, self.blocks = values, step, reshape, 0

    def __call__(self) -> np.ndarray:
        return self.values

    def parts(self):
        for start in range(0, len(self.values), self.step):
            self.blocks += 1
            block = self.values[start:start + self.step]
            yield block.reshape(self.reshape) if self.reshape else block


def test_deferred_values_in_blocks_of_rows_are_written_block_by_block(tmp_path):
    """A `DeferredArray` whose compute function makes its values in blocks of rows is written block by block
    (the same bytes as whole), and a block of another row shape is refused."""
    import pytest
    from onnx import helper

    from quantsim.errors import InvalidStateError
    from quantsim.graph.model_io import in_memory_placeholder

    array = np.arange(70 * 50, dtype=np.float32).reshape(70, 50) - 3.5
    rows = _Rows(array, 30)
    model = helper.make_model(helper.make_graph([], "g", [], [], [in_memory_placeholder("w", array)]))
    source, _ = session_module.file_backed_source(model, {"w": DeferredArray(array.shape, array.dtype, rows)})
    tensor = onnx.load(source, load_external_data=False).graph.initializer[0]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor, base_dir=str(Path(source).parent)), array)
    assert rows.blocks == 3
    assert [len(part) for part in DeferredArray(array.shape, array.dtype, rows).parts()] == [30, 30, 10]
    with pytest.raises(InvalidStateError, match="block"):
        list(DeferredArray(array.shape, array.dtype, _Rows(array, 30, reshape=(-1,))).parts())
    with pytest.raises(InvalidStateError, match="rows"):
        list(DeferredArray((71, 50), array.dtype, _Rows(array, 30)).parts())


def test_mapped_weights_written_in_blocks_of_rows_hold_the_fake_quantized_bits(monkeypatch, tmp_path, caplog):
    """With weights fake-quantized in several blocks of rows each (`numerics.fake_quantize_parts`), the mapped
    sim's weight files hold `fake_quantize`'s bits and its outputs are the in-memory sim's; at DEBUG level the
    calibration's steps are timed in the log."""
    import logging

    import quantsim.core.numerics as numerics
    from quantsim.core.numerics import fake_quantize

    oracle, path, feeds = _oracle_and_mapped_file(monkeypatch, tmp_path)
    monkeypatch.setattr(numerics, "FAKE_QUANTIZE_BLOCK", 100)  # 48x48 weights: blocks of 2 rows
    sim = quantsim.QuantizationSimModel(path, progress=False)
    oracle.compute_encodings(feeds)
    with caplog.at_level(logging.DEBUG, logger="quantsim"):
        sim.compute_encodings(feeds)
    logged = " | ".join(r.getMessage() for r in caplog.records)
    for step in ("calibration: weight encodings", "calibration: session", "session: weights file",
                 "session: onnxruntime's creation", "calibration: batches", "calibration: activation encodings"):
        assert step in logged
    assert _outputs(sim, feeds) == _outputs(oracle, feeds)
    for mine, theirs in zip(sim.quantizers, oracle.quantizers):
        assert (mine.encoding is None) == (theirs.encoding is None)
        if mine.encoding is not None:
            np.testing.assert_array_equal(mine.encoding.scale, theirs.encoding.scale)
    written = {p.read_bytes() for p in sim._weight_files.folder.glob("fq-*.bin")}
    checked = 0
    for q in sim.quantizers:
        if q.role == "param" and q.enabled and len(q.tensors) == 1:
            weight = oracle._index.constant_value(q.tensors[0])
            if weight.size > 100:
                assert fake_quantize(weight, q.encoding).tobytes() in written
                checked += 1
    assert checked >= 3
