"""Calibration and evaluation data for the command line: ``--data PATH`` to a re-iterable stream of feed dicts.

Three forms:

* a folder of ``.npy`` / ``.npz`` files, read one at a time in name order: a ``.npy`` holds the one input of a
  single-input model, a ``.npz`` one array per input name; each file is a batch (or one sample, when its
  arrays have one axis less than the model input);
* one ``.npz`` file with one array per model input, all with the same number of rows (or one ``.npy`` for a
  single-input model), split into batches (``--batch-size``, default 16; with a folder, ``--batch-size``
  regroups the files' rows);
* ``module:function`` (or ``path/to/file.py:function``): the function is called with no arguments once per
  pass over the data and returns an iterable of ``{input name: array}`` dicts.

Every feed is checked against the model's inputs (names, rank, fixed dimensions, dtype kind) and an error
names the file (or item), the input and what the model expects. Floats are cast to the model's float type;
nothing is kept between batches except when ``--batch-size`` regroups rows.
"""
from __future__ import annotations

import importlib
import importlib.util
import itertools
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from quantsim import InvalidArgumentError, InvalidTypeError

__all__ = ["InputSpec", "CalibrationData", "model_inputs", "open_data", "check_feed", "DEFAULT_NPZ_BATCH"]

_log = logging.getLogger(__name__)

DEFAULT_NPZ_BATCH = 16
_FUNCTION_SPEC = re.compile(r"^(?P<module>[\w.]+|.+\.py):(?P<function>[A-Za-z_]\w*)$")


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, numpy dtype and shape (ints for fixed dimensions, names or None for free ones)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    def describe(self) -> str:
        """``x float32 [N, 3, 224, 224]``."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name} {self.dtype} [{dims}]"


def model_inputs(path: str | Path) -> list[InputSpec]:
    """The graph inputs of an ONNX file that are not initializers (external weights are not read)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # noqa: BLE001 - any decoding failure means "not an ONNX file"
        raise InvalidArgumentError(f"{path}: not a readable ONNX model ({type(error).__name__})") from None
    if not model.graph.node:
        raise InvalidArgumentError(f"{path}: not an ONNX model (no graph nodes)")
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        except (KeyError, TypeError, ValueError):
            raise InvalidArgumentError(f"{path}: input {value.name!r} is not a plain tensor") from None
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, dtype, shape))
    return specs


def _cast(array: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    if array.dtype == spec.dtype:
        return array
    kind, want = array.dtype.kind, spec.dtype.kind
    if (want == "f" and kind in "fiub") or (want in "iu" and kind in "iub") or (want == "b" and kind == "b"):
        return array.astype(spec.dtype)
    raise InvalidArgumentError(f"{where}: input {spec.name!r} has dtype {array.dtype}; the model expects {spec.dtype}")


def check_feed(feed: object, inputs: list[InputSpec], where: str, *, any_rows: bool = False) -> dict[str, np.ndarray]:
    """A feed dict with exactly the model's inputs, cast to their dtypes, batch axis added to single samples
    (``any_rows``: the first axis may differ from a fixed batch size; the rows are regrouped later)."""
    if not isinstance(feed, Mapping):
        raise InvalidTypeError(f"{where}: expected a dict of {{input name: array}}, got {type(feed).__name__}")
    by_name = {spec.name: spec for spec in inputs}
    unknown = [str(name) for name in feed if name not in by_name]
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown input name {unknown[0]!r}; the model's inputs are "
                                   f"{', '.join(repr(n) for n in by_name)}")
    missing = [name for name in by_name if name not in feed]
    if missing:
        raise InvalidArgumentError(f"{where}: no array for model input {missing[0]!r}")
    result = {}
    for name, spec in by_name.items():
        try:
            array = np.asarray(feed[name])
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(f"{where}: input {name!r} is not an array ({error})") from None
        if spec.shape and array.ndim == len(spec.shape) - 1:
            array = array[np.newaxis]  # one sample
        if spec.shape and array.ndim != len(spec.shape):
            raise InvalidArgumentError(f"{where}: input {name!r} has shape {tuple(array.shape)}; the model expects "
                                       f"{len(spec.shape)} axes {spec.describe()}")
        for axis, (got, want) in enumerate(zip(array.shape, spec.shape)):
            if isinstance(want, int) and want > 0 and got != want and not (any_rows and axis == 0):
                raise InvalidArgumentError(f"{where}: input {name!r} has shape {tuple(array.shape)}; the model "
                                           f"expects {spec.describe()} (axis {axis} must be {want})")
        result[name] = _cast(array, spec, where)
    rows = {len(a) for a in result.values() if a.ndim}
    if len(rows) > 1:
        raise InvalidArgumentError(f"{where}: the inputs have different numbers of rows {sorted(rows)}")
    return result


_NPY_MAGIC, _ZIP_MAGICS = b"\x93NUMPY", (b"PK\x03\x04", b"PK\x05\x06")


def _signature(path: Path, wanted: tuple[bytes, ...], what: str) -> None:
    """Refuse a file that does not start like ``what`` before numpy reads it (numpy would try to unpickle it
    and say so, which names neither the file nor the problem)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as error:
        raise InvalidArgumentError(f"{path}: cannot read ({error.strerror or error})") from None
    if not head:
        raise InvalidArgumentError(f"{path}: empty file, not {what}")
    if not head.startswith(wanted):
        raise InvalidArgumentError(f"{path}: not {what} (corrupted, or another format under that name)")


def _reason(error: BaseException) -> str:
    """A one-line reason for a numpy / zipfile failure."""
    text = " ".join(str(error).split())
    if "pickle" in text:
        return "it holds Python objects (an object array), which are not read; save plain numeric arrays"
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    _signature(path, _ZIP_MAGICS, "an .npz archive (numpy.savez writes a zip file)")
    try:  # our own handle: numpy leaks the one it opens when the zip directory is unreadable
        with open(path, "rb") as handle, np.load(handle, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise InvalidArgumentError(f"{path}: expected an .npz archive of named arrays")
            arrays = {}
            for name in archive.files:
                try:
                    arrays[name] = archive[name]
                except Exception as error:  # noqa: BLE001 - any failure of one member: name it
                    raise InvalidArgumentError(f"{path}: cannot read array {name!r} ({_reason(error)})") from None
            return arrays
    except InvalidArgumentError:
        raise
    except Exception as error:  # noqa: BLE001 - zipfile/zlib/numpy header errors of a corrupted archive
        raise InvalidArgumentError(f"{path}: cannot read arrays ({_reason(error)})") from None


def _read_npy(path: Path) -> np.ndarray:
    _signature(path, (_NPY_MAGIC,), "a .npy file (numpy.save writes one)")
    try:
        with open(path, "rb") as handle:
            return np.load(handle, allow_pickle=False)
    except Exception as error:  # noqa: BLE001 - a corrupted header or truncated data
        raise InvalidArgumentError(f"{path}: cannot read array ({_reason(error)})") from None


def _named(arrays: dict[str, np.ndarray], inputs: list[InputSpec], path: Path) -> dict[str, np.ndarray]:
    """``np.savez(path, array)`` stores ``arr_0``: fine for a single-input model."""
    if len(inputs) == 1 and list(arrays) == ["arr_0"]:
        return {inputs[0].name: arrays["arr_0"]}
    return arrays


def _read_file(path: Path, inputs: list[InputSpec]) -> dict[str, np.ndarray]:
    if path.suffix == ".npy":
        if len(inputs) != 1:
            raise InvalidArgumentError(f"{path}: a .npy file holds one array but the model has {len(inputs)} inputs "
                                       f"({', '.join(s.name for s in inputs)}); use .npz files with one array per input")
        return {inputs[0].name: _read_npy(path)}
    return _named(_read_npz(path), inputs, path)


def _rows(feed: dict[str, np.ndarray]) -> int:
    return len(next(iter(feed.values())))


def rebatch(feeds: Iterable[dict[str, np.ndarray]], size: int, keep_partial: bool = True) -> Iterator[dict]:
    """Regroup feeds into batches of ``size`` rows (the last one shorter unless ``keep_partial`` is False)."""
    pending: list[dict[str, np.ndarray]] = []
    count = 0
    for feed in feeds:
        pending.append(feed)
        count += _rows(feed)
        if count < size:
            continue
        merged = pending[0] if len(pending) == 1 else {k: np.concatenate([f[k] for f in pending]) for k in pending[0]}
        start = 0
        while count - start >= size:
            yield {k: v[start:start + size] for k, v in merged.items()}
            start += size
        count -= start
        pending = [{k: v[start:] for k, v in merged.items()}] if count else []
    if pending and keep_partial:
        yield {k: np.concatenate([f[k] for f in pending]) for k in pending[0]}
    elif pending:
        _log.info("dropped the last %d row(s): the model's batch size is fixed at %d", count, size)


class CalibrationData:
    """A re-iterable stream of checked feed dicts (each pass reads the files, or calls the function, again)."""

    def __init__(self, description: str, produce: Callable[[], Iterable[tuple[str, object]]], inputs: list[InputSpec],
                 batch_size: int | None, max_batches: int | None, *, regroup: bool = True):
        self.description = description
        self._produce = produce
        self.inputs = inputs
        self.batch_size = batch_size
        self.max_batches = max_batches
        self._regroup = regroup and batch_size is not None
        self._keep_partial = _fixed_batch(inputs) is None

    def _checked(self) -> Iterator[dict[str, np.ndarray]]:
        for where, feed in self._produce():
            checked = check_feed(feed, self.inputs, where, any_rows=self._regroup)
            if self._regroup and checked and any(a.ndim == 0 for a in checked.values()):
                raise InvalidArgumentError(f"{where}: --batch-size needs arrays with a batch axis")
            yield checked

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        feeds: Iterable[dict[str, np.ndarray]] = self._checked()
        if self._regroup and self.batch_size is not None:
            feeds = rebatch(feeds, self.batch_size, keep_partial=self._keep_partial)
        count = 0
        for feed in itertools.islice(feeds, self.max_batches):
            count += 1
            yield feed
        if count == 0:
            raise InvalidArgumentError(f"--data {self.description}: no batches")

    def first(self, count: int) -> list[dict[str, np.ndarray]]:
        """The first ``count`` batches as a list (for analyses that go over their data several times)."""
        return list(itertools.islice(iter(self), count))


def _folder(path: Path, inputs: list[InputSpec]) -> tuple[str, Callable]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".npz") and p.is_file())
    if not files:
        raise InvalidArgumentError(f"{path}: the folder holds no .npy or .npz files")
    ignored = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix not in (".npy", ".npz"))
    if ignored:
        _log.info("%s: ignoring %d file(s) that are not .npy/.npz, e.g. %s", path, len(ignored), ignored[0])

    def produce():
        for file in files:
            yield str(file), _read_file(file, inputs)
    return f"{path} ({len(files)} files)", produce


def _split(path: Path, arrays: dict[str, np.ndarray], inputs: list[InputSpec], size: int) -> tuple[str, Callable]:
    arrays = check_feed(arrays, inputs, str(path), any_rows=True)
    if any(a.ndim == 0 for a in arrays.values()):
        raise InvalidArgumentError(f"{path}: the arrays need a batch axis to be split into batches")
    rows = _rows(arrays)
    keep_partial = _fixed_batch(inputs) is None

    def produce():
        for start in range(0, rows, size):
            if start + size > rows and not keep_partial:
                _log.info("dropped the last %d row(s): the model's batch size is fixed at %d", rows - start, size)
                return
            yield f"{path} rows {start}-{min(start + size, rows) - 1}", {k: v[start:start + size] for k, v in arrays.items()}
    return f"{path} ({rows} rows)", produce


def _fixed_batch(inputs: list[InputSpec]) -> int | None:
    first = inputs[0].shape[0] if inputs and inputs[0].shape else None
    return first if isinstance(first, int) and first > 0 else None


def load_function(spec: str, option: str = "--data") -> Callable[..., object]:
    """The function ``module:function`` (or ``path/to/file.py:function``) names; errors name ``option``."""
    match = _FUNCTION_SPEC.match(spec)
    if match is None:
        raise InvalidArgumentError(f"{option} {spec}: " + ("no such file or folder, and not module:function"
                                                          if option == "--data" else "not module:function"))
    module_name, function_name = match["module"], match["function"]
    try:
        if module_name.endswith(".py"):
            file = Path(module_name)
            if not file.is_file():
                raise InvalidArgumentError(f"{option} {spec}: no such file {file}")
            loader = importlib.util.spec_from_file_location(file.stem, file)
            if loader is None or loader.loader is None:
                raise InvalidArgumentError(f"{option} {spec}: cannot load {file}")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # the user's modules beside them, as `python -m` would
            module = importlib.import_module(module_name)
    except InvalidArgumentError:
        raise
    except ModuleNotFoundError as error:
        raise InvalidArgumentError(f"{option} {spec}: cannot import module {module_name!r} ({error})") from None
    except Exception as error:  # noqa: BLE001 - the user's module failed while importing
        raise InvalidArgumentError(f"{option} {spec}: importing {module_name!r} failed: "
                                   f"{type(error).__name__}: {error}") from None
    function = getattr(module, function_name, None)
    if function is None:
        raise InvalidArgumentError(f"{option} {spec}: module {module_name!r} has no function {function_name!r}")
    if not callable(function):
        raise InvalidArgumentError(f"{option} {spec}: {function_name!r} is not callable")
    return function


def _call(spec: str, function: Callable[[], object]) -> Iterator[tuple[str, object]]:
    try:
        result = function()
    except Exception as error:  # noqa: BLE001 - the user's function failed
        raise InvalidArgumentError(f"--data {spec}: the function raised {type(error).__name__}: {error}") from None
    if isinstance(result, Mapping) or not isinstance(result, Iterable):
        raise InvalidTypeError(f"--data {spec}: the function must return an iterable of feed dicts, "
                               f"got {type(result).__name__}")
    for index, feed in enumerate(result):
        yield f"--data {spec}: item {index}", feed


def open_data(text: str, inputs: list[InputSpec], batch_size: int | None = None,
              max_batches: int | None = None) -> CalibrationData:
    """The data ``--data text`` names, checked lazily against ``inputs`` (file errors are raised here)."""
    fixed = _fixed_batch(inputs)
    if batch_size is not None and fixed is not None and batch_size != fixed:
        raise InvalidArgumentError(f"--batch-size {batch_size}: the model's input {inputs[0].name!r} has a fixed "
                                   f"batch size of {fixed}")
    batch_size = batch_size or fixed
    path = Path(text)
    regroup = True
    if path.is_dir():
        description, produce = _folder(path, inputs)
    elif path.is_file():
        if path.suffix not in (".npz", ".npy"):
            raise InvalidArgumentError(f"--data {path}: expected a folder of .npy/.npz files, an .npz file or "
                                       "module:function")
        batch_size = batch_size or DEFAULT_NPZ_BATCH
        description, produce = _split(path, _read_file(path, inputs), inputs, batch_size)
        regroup = False
    elif _FUNCTION_SPEC.match(text) and not text.endswith((".npz", ".npy")):
        function = load_function(text)
        description, produce = text, (lambda: _call(text, function))
    else:
        raise InvalidArgumentError(f"--data {text}: no such file or folder")
    return CalibrationData(description, produce, inputs, batch_size, max_batches, regroup=regroup)
