"""onnxruntime sessions for the sim: exact (no Q/DQ fusion) or fused into integer kernels.

Big weights reach onnxruntime without a copy of its own: ``external_initializers`` of at least
`FILE_BACKED_MIN_BYTES` in all are written once to a temporary external-data file that onnxruntime
memory-maps (page cache, shared, dropped with the session), with weight prepacking off (a prepacked weight
is a second, anonymous copy). ``SessionOptions.add_external_initializers`` copies every array into
onnxruntime's own buffers (measured with onnxruntime 1.32), so it only serves smaller sets.

Values may be `DeferredArray`: computed only when written, by two threads, each written straight to its place
in the file and let go (a large model's fake-quantized weights are never all in memory at once). With a
`WeightFiles` (the sim keeps one per large mapped model), a deferred value with a ``key`` already written
for an earlier session is not computed again: the new session's model points at the bytes written then;
one with a `weight_store.FakeQuantStore` also finds the values written by earlier processes there, and keeps
the ones it computes for later processes.

At DEBUG level, logger ``quantsim.graph.session`` records the time (wall and process CPU) of writing a
session's weights file and of onnxruntime's session creation.
"""
from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from quantsim.errors import InvalidStateError, SessionError, one_line
from quantsim.graph.deferred import DeferredArray
from quantsim.graph.model_io import IN_MEMORY_LOCATION, session_model_source
from quantsim.graph.timing import timed
from quantsim.graph.weight_store import FakeQuantStore, fake_quant_store, link_or_copy

_log = logging.getLogger(__name__)

__all__ = ["make_session", "DEFAULT_PROVIDERS", "FILE_BACKED_MIN_BYTES", "WeightFiles"]

FILE_BACKED_MIN_BYTES = 64 << 20
"""External initializers of at least this many bytes in all go to onnxruntime as a memory-mapped file
(module docstring). Read at call time, so tests can lower it."""
_ALIGNMENT = 1 << 16  # onnxruntime maps external data in place only at offsets aligned to this

_WRITERS = 2  # threads computing and writing deferred values (numpy and file writes release the GIL)

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
EXACT_SIM_DISABLED_OPTIMIZERS = ("ReluQuantRewrite", "ClipQuantRewrite")
# With the shapes preparation infers, onnxruntime's ReshapeFusion (1.32) rewrites a Reshape's computed shape
# [N, 4] of an [N, 2, 2] tensor into [0, -1], which fails when N is 0 (a detector finding no box: torchvision's
# FCOS); the user's model, without those shapes, runs. Every session the library makes leaves it out.
ALWAYS_DISABLED_OPTIMIZERS = ("ReshapeFusion",)


def make_session(
    model: onnx.ModelProto,
    providers=None,
    *,
    fuse_qdq: bool = False,
    session_options_kwargs: dict | None = None,
    external_initializers: Mapping[str, np.ndarray] | None = None,
    file_backed: bool | None = None,
    prepack: bool = False,
    weight_files: WeightFiles | None = None,
) -> ort.InferenceSession:
    """An InferenceSession over ``model``.

    ``external_initializers`` (name -> contiguous array) supply the values of initializers that ``model``
    holds as external-data placeholders (see `build_sim_model`); big sets go to onnxruntime as one
    memory-mapped file (module docstring), others as arrays it copies; ``file_backed`` decides instead of
    their size when given. A memory-mapped set is written and then removed from ``external_initializers``
    (the caller's dict), so the arrays can go before onnxruntime reads the file; with ``prepack`` onnxruntime
    then repacks weights for its kernels (runs as fast as a float session's; the packed copy replaces the
    mapped pages, which onnxruntime releases: for weights nothing else holds). The session keeps what it
    needs alive. Values may be `DeferredArray` (module docstring); ``weight_files`` lets a memory-mapped set reuse
    the keyed values written for earlier sessions and keeps the new ones for later sessions.

    ``fuse_qdq=False`` (the exact sim) sets ``session.disable_quant_qdq`` so onnxruntime runs every
    QuantizeLinear/DequantizeLinear as written: the outputs are the float fake-quantization the sim
    defines. ``fuse_qdq=True`` lets onnxruntime rewrite Q/DQ groups into integer kernels (QLinearConv,
    QGemm, ...): faster, and a few output steps from the exact sim (rounding inside the kernels).
    """
    options = ort.SessionOptions()
    for key, value in (session_options_kwargs or {}).items():
        if not hasattr(options, key):
            raise AttributeError(f"onnxruntime.SessionOptions has no attribute {key!r}")
        setattr(options, key, value)
    disabled = list(ALWAYS_DISABLED_OPTIMIZERS)
    if not fuse_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        # onnxruntime's Relu/Clip -> QuantizeLinear rewrites are only meant to drop a redundant Relu/Clip, but
        # with 4-bit zero points (ORT 1.32) ReluQuantRewrite drops a Relu that is not redundant (negative
        # values survive) and ClipQuantRewrite throws at session creation; the exact sim never needs them.
        disabled += EXACT_SIM_DISABLED_OPTIMIZERS
    else:
        if _has_float8_quantizers(model):  # the same ReluQuantRewrite fault with float8 zero points (ORT 1.32)
            disabled += EXACT_SIM_DISABLED_OPTIMIZERS
        # DQ(weight) -> MatMul may become MatMulNBits, which at its default accuracy level computes the
        # activation in 8 bits: wrong for 16-bit activations. Level 1 keeps float activations there.
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    external = dict(external_initializers or {})
    values: list = []
    source: bytes | str
    keepalive: tempfile.TemporaryDirectory | WeightFiles | None
    if file_backed is None:
        file_backed = sum(array.nbytes for array in external.values()) >= FILE_BACKED_MIN_BYTES
    if file_backed and external and not fuse_qdq:
        with timed(_log, "session: weights file"):
            source, keepalive = file_backed_source(model, external, weight_files)
        external.clear()
        if isinstance(external_initializers, dict):
            external_initializers.clear()
        if not prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        # the arena keeps what it took: with it, dequantized weights passing through raise the peak
        # (measured on a 0.8 GB MLP: 1.64 GB instead of 1.43, for runs about 1.5x faster)
        options.enable_cpu_mem_arena = False
        # keep the dequantization of integer weights as written: folding it would make a float copy
        disabled.append("ConstantFolding")
    else:
        values = [ort.OrtValue.ortvalue_from_numpy(_materialized(array)) for array in external.values()]
        if values:
            options.add_external_initializers(list(external), values)
        source, keepalive = session_model_source(model)
    try:
        with timed(_log, "session: onnxruntime's creation"):
            session = ort.InferenceSession(
                source, sess_options=options, providers=list(providers or DEFAULT_PROVIDERS),
                disabled_optimizers=disabled,
            )
        # a large model's files and the external initializers' buffers live as long as the session
        session._quantsim_external_data = (keepalive, values)
        if weight_files is not None and keepalive is weight_files:
            weight_files.tidy(keep=Path(str(source)).name)
        return session
    except Exception as error:  # noqa: BLE001 - re-raised with what to do about it
        if not fuse_qdq:
            raise SessionError(f"onnxruntime cannot load the model {model.graph.name or '<unnamed>'!r} "
                               f"({one_line(str(error))}); check that the float model runs in onnxruntime") from error
        raise InvalidStateError(
            "onnxruntime could not build integer kernels for this sim (its Q/DQ fusion supports 8-bit "
            f"activations with int8/uint8 weights): {error}. Use the exact sim session instead."
        ) from error


_FLOAT8_TYPES = frozenset({onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2})


def _has_float8_quantizers(model: onnx.ModelProto) -> bool:
    """Whether a QuantizeLinear of the main graph produces a float8 type (a float8 zero point or ``output_dtype``)."""
    float8 = {t.name for t in model.graph.initializer if t.data_type in _FLOAT8_TYPES}
    return any(node.op_type == "QuantizeLinear" and (
        (len(node.input) > 2 and node.input[2] in float8)
        or any(a.name == "output_dtype" and a.i in _FLOAT8_TYPES for a in node.attribute))
        for node in model.graph.node)


def _materialized(value) -> np.ndarray:
    return value.array() if isinstance(value, DeferredArray) else np.ascontiguousarray(value)


class WeightFiles:
    """A folder of external-data files written for sessions, and where each keyed `DeferredArray` value lies in
    them (module docstring). Sessions' models are written into the same folder, so they name the files by
    their plain names. A file stops being tracked (and is removed: an open session keeps its mapped bytes on
    Linux and macOS) once none of its values is current; when the tracked files hold more than twice the
    bytes still current, everything is forgotten and the next session writes afresh, so the folder stays
    within about two copies of the weights on disk (none in memory: the page cache can drop them). With a
    ``store``, keyed values live in files of their own, linked from the store (`weight_store`)."""

    def __init__(self, store: FakeQuantStore | None = None) -> None:
        self.store = store
        self._folder = tempfile.TemporaryDirectory(prefix="quantsim-weights-")
        self.folder = Path(self._folder.name)
        self._where: dict[Hashable, tuple[str, int, int]] = {}  # key -> (file, offset, length)
        self._names: dict[Hashable, Hashable] = {}  # tensor name -> its current key
        self._count = 0

    @classmethod
    def for_entry(cls, entry: Path | None) -> WeightFiles:
        """Weight files whose keyed values are kept in the store of preparation-cache entry ``entry``, if it is
        one (`weight_store.fake_quant_store`)."""
        return cls(fake_quant_store(entry))

    def find(self, name: str, key: Hashable) -> tuple[str, int, int] | None:
        return self._where.get(key) if self._names.get(name) == key else None

    def new_file(self) -> str:
        self._count += 1
        return f"weights-{self._count}.bin"

    def record(self, name: str, key: Hashable, place: tuple[str, int, int]) -> None:
        old = self._names.get(name)
        if old is not None and old != key:
            self._where.pop(old, None)
        self._names[name], self._where[key] = key, place

    def forget(self, name: str) -> None:
        """Drop what is recorded for tensor ``name`` (its values changed)."""
        key = self._names.pop(name, None)
        if key is not None:
            self._where.pop(key, None)

    def tidy(self, keep: str) -> None:
        """Remove files holding no current value (but ``keep``, just written, and the models, read already);
        forget everything when the files hold far more than the current values."""
        live = {place[0] for place in self._where.values()} | {keep}
        for path in [*self._data_files(), *self.folder.glob("model-*.onnx")]:
            if path.name not in live:
                try:
                    path.unlink(missing_ok=True)
                except OSError:  # mapped by a live session where that forbids removal (Windows): next time
                    pass
        held = sum(path.stat().st_size for path in self._data_files())
        if held > 2 * sum(place[2] for place in self._where.values()) + (1 << 20):
            self._where.clear()
            self._names.clear()

    def _data_files(self) -> list[Path]:
        return [*self.folder.glob("weights-*.bin"), *self.folder.glob("fq-*.bin")]

    def stored(self, name: str, value: object, writes: list[tuple[Path, str, DeferredArray]]
               ) -> tuple[str, int, int] | None:
        """Where the keyed `DeferredArray` ``value`` of tensor ``name`` lies in a file of its own taken from the
        store, or will once the write this appends to ``writes`` is done; None without a usable store."""
        store = self.store
        if (store is None or not isinstance(value, DeferredArray) or value.key is None
                or not store.usable(self.folder)):
            return None
        file = store.name(name, value.key, value.shape, value.dtype)
        if not store.take(file, value.nbytes, self.folder):
            writes.append((store.temporary(file), file, value))
        return file, 0, value.nbytes


def file_backed_source(model: onnx.ModelProto, arrays: Mapping, weight_files: WeightFiles | None = None
                       ) -> tuple[str, tempfile.TemporaryDirectory | WeightFiles]:
    """The path of a temporary copy of ``model`` whose `model_io.in_memory_placeholder` initializers point
    into an external-data file holding ``arrays`` (arrays or `DeferredArray`, each at an aligned offset), and the
    folder to keep alive as long as the session (``weight_files`` itself when given: its folder is used). ``model``
    is not modified; only the small graph is copied."""
    folder = tempfile.TemporaryDirectory(prefix="quantsim-session-") if weight_files is None else None
    root = Path(folder.name) if folder is not None else weight_files.folder  # type: ignore[union-attr]
    data_name = "weights.bin" if weight_files is None else weight_files.new_file()
    light = onnx.ModelProto()
    light.CopyFrom(model)
    jobs: list[tuple[int, object]] = []
    records: list[tuple[str, Hashable, tuple[str, int, int]]] = []  # recorded once written
    stored: list[tuple[Path, str, DeferredArray]] = []  # (temporary file in the store, final name, value)
    end = 0
    for tensor in light.graph.initializer:
        location = {e.key: e.value for e in tensor.external_data}.get("location")
        if tensor.name not in arrays or location != IN_MEMORY_LOCATION:
            continue
        value = arrays[tensor.name]
        key = value.key if isinstance(value, DeferredArray) else None
        place = weight_files.find(tensor.name, key) if weight_files is not None and key is not None else None
        if place is None and weight_files is not None:
            place = weight_files.stored(tensor.name, value, stored)
            if place is not None:
                records.append((tensor.name, key, place))
        if place is None:
            offset = -(-end // _ALIGNMENT) * _ALIGNMENT
            end = offset + value.nbytes
            place = (data_name, offset, value.nbytes)
            jobs.append((offset, value))
            if key is not None:
                records.append((tensor.name, key, place))
        del tensor.external_data[:]
        for entry_key, entry_value in zip(("location", "offset", "length"), place):
            entry = tensor.external_data.add()
            entry.key, entry.value = entry_key, str(entry_value)
    if jobs or stored:
        _write_parallel(root / data_name, end, jobs, stored, weight_files)
    if weight_files is not None:
        for name, key, place in records:
            weight_files.record(name, key, place)
    model_path = root / ("model.onnx" if weight_files is None else f"model-{data_name[:-4]}.onnx")
    model_path.write_bytes(light.SerializeToString())
    return str(model_path), folder if folder is not None else weight_files  # type: ignore[return-value]


def _write_parallel(path: Path, size: int, jobs: list[tuple[int, object]],
                    stored: list[tuple[Path, str, DeferredArray]] = (),  # type: ignore[assignment]
                    weight_files: WeightFiles | None = None) -> None:
    """Write each ``(offset, value)`` of ``jobs`` at its offset in a new file ``path`` of ``size`` bytes, and each
    ``(temporary file, name, value)`` of ``stored`` to a file of its own in ``weight_files``' store, linked into its
    folder as ``name`` and published in the store once written (`weight_store`); computing `DeferredArray`
    values on `_WRITERS` threads: at most that many are in memory at once."""
    tasks: list[Callable[[], object]] = []
    with ExitStack() as stack:
        if jobs:
            file = stack.enter_context(open(path, "wb"))
            file.truncate(size)
            tasks += [partial(_pwrite, file.fileno(), offset, value) for offset, value in jobs]
        if stored and weight_files is not None:
            tasks += [partial(_write_stored, temporary, weight_files.folder / name, value)
                      for temporary, name, value in stored]
        if len(tasks) == 1 or not any(isinstance(value, DeferredArray) for _, value in jobs) and not stored:
            done = [task() for task in tasks]
        else:
            with ThreadPoolExecutor(max_workers=_WRITERS) as pool:
                done = list(pool.map(lambda task: task(), tasks))
    if stored and weight_files is not None and weight_files.store is not None:
        written = done[len(done) - len(stored):]
        weight_files.store.publish([(temporary, name) for (temporary, name, _), ok in zip(stored, written) if ok])


def _pwrite(descriptor: int, offset: int, value: object) -> bool:
    """Write ``value`` at ``offset``: a `DeferredArray` block by block as it computes them
    (`DeferredArray.parts`: each block leaves the CPU's cache for the file only), an array at once."""
    blocks = value.parts() if isinstance(value, DeferredArray) else (np.ascontiguousarray(value),)
    for block in blocks:
        view = block.reshape(-1).view(np.uint8).data
        while view.nbytes:
            written = os.pwrite(descriptor, view, offset)
            view, offset = view[written:], offset + written
    return True


def _write_stored(temporary: Path, target: Path, value: DeferredArray) -> bool:
    """Write ``value`` to ``temporary`` (in the store) and link it as ``target``; where the store cannot be
    written (full, read-only), write ``target`` itself (computing the values again: the store's write failed
    midway): the session still gets its values. True if stored."""
    try:
        with open(temporary, "wb") as file:
            _pwrite(file.fileno(), 0, value)
        link_or_copy(temporary, target)
        return True
    except OSError:
        temporary.unlink(missing_ok=True)
    with open(target, "wb") as file:
        _pwrite(file.fileno(), 0, value)
    return False
