"""Writing a set of files (an export) so that a failure leaves the previous set intact.

Every file of the set is written into one staging folder inside the target folder, fsynced, and only then
renamed into place, one rename per file (a rename does not fail for lack of space, so a full disk, a
serialisation error or an interrupt while writing leaves every old file as it was). Staging folders are
named ``.<label>.quantsim-staging.<pid>.<random>``: one left behind by a killed process is removed by the
next write of the same label in that folder once its process is gone.

Names in the set are plain file names (`check_file_name`): a prefix such as ``"../x"``, ``"/tmp/x"`` or
``""`` never writes outside the target folder or hidden files.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from quantsim.errors import InvalidArgumentError
from quantsim.graph.deferred import WeightSource
from quantsim.graph.large_models import save_model

__all__ = ["FileSet", "check_file_name", "STAGING_MARK", "fsync_file", "fsync_directory", "in_background",
           "wait_for_background"]

STAGING_MARK = "quantsim-staging"


def check_file_name(name: str, what: str = "filename_prefix") -> str:
    """``name`` if it is a plain file name: not empty, no folder separators, not hidden, not ``.``/``..``."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"{what} must be a string, got {type(name).__name__}")
    bad = (not name or name != name.strip() or name.startswith(".") or "\0" in name
           or any(sep in name for sep in ("/", "\\", os.sep, os.altsep or "/")))
    if bad:
        raise InvalidArgumentError(
            f"{what} {name!r} is not a plain file name (no folders, not empty, not starting with '.'): "
            "put folders in the path argument"
        )
    return name


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone else's process, or unknown: leave its folder alone
    return True


def remove_stale_staging(directory: Path, label: str) -> list[Path]:
    """Remove staging folders of ``label`` in ``directory`` whose writing process is gone; returns them."""
    removed: list[Path] = []
    try:
        candidates = list(directory.glob(f".{label}.{STAGING_MARK}.*"))
    except OSError:
        return removed
    for folder in candidates:
        parts = folder.name[len(f".{label}.{STAGING_MARK}."):].split(".")
        if not parts or not parts[0].isdigit() or not folder.is_dir():
            continue
        pid = int(parts[0])
        if pid != os.getpid() and not _process_alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class FileSet:
    """Files staged for ``directory`` under the ``label`` (e.g. the export prefix); `commit` or `discard`.

    Usable as a context manager: leaving the block by an exception discards what was staged.
    """

    def __init__(self, directory: str | os.PathLike, label: str):
        self.directory = Path(directory)
        self.label = check_file_name(label)
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(self.directory, self.label)
        self.staging = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{self.label}.{STAGING_MARK}.{os.getpid()}."))
        self._files: list[tuple[Path, Path]] = []  # (staged, final)

    def _final(self, name: str) -> Path:
        return self.directory / check_file_name(name, "file name")

    def add_model(self, model: onnx.ModelProto, name: str, weights: WeightSource | None = None) -> None:
        """Stage ``model`` as ``name`` (plus ``<name>.data`` when it is too large for one protobuf); ``weights``
        reads its mapped or deferred initializers, one at a time (`large_models.save_model`)."""
        final = self._final(name)
        for file in save_model(model, self.staging / final.name, weights=weights):
            fsync_file(file)
            self._files.append((file, self.directory / file.name))

    def add_json(self, name: str, obj: Any) -> None:
        """Stage ``obj`` as JSON (``sort_keys=True, indent=4``, as AIMET writes); serialised before any write."""
        self.add_text(name, json.dumps(obj, sort_keys=True, indent=4))

    def add_text(self, name: str, text: str) -> None:
        final = self._final(name)
        staged = self.staging / final.name
        with open(staged, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        self._files.append((staged, final))

    def commit(self) -> list[Path]:
        """Rename every staged file into place (ONNX graph files last, after their data files and the
        encodings) and remove the staging folder; returns the final paths."""
        order = sorted(self._files, key=lambda pair: pair[1].suffix == ".onnx")
        for staged, final in order:
            os.replace(staged, final)
        fsync_directory(self.directory)
        self.discard()
        return [final for _, final in order]

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._files = []

    def __enter__(self) -> FileSet:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()


_BACKGROUND: list[threading.Thread] = []


def in_background(work: Callable[[], None], name: str) -> None:
    """Run ``work`` (an fsync of gigabytes and what follows it) on a thread while the caller goes on; not a
    daemon: the interpreter waits for it at exit. `wait_for_background` waits for it."""
    thread = threading.Thread(target=work, name=name)
    thread.start()
    _BACKGROUND[:] = [t for t in _BACKGROUND if t.is_alive()] + [thread]


def wait_for_background() -> None:
    """Wait until the work this process started with `in_background` is done (its files on disk)."""
    while _BACKGROUND:
        _BACKGROUND.pop().join()


def fsync_file(path: Path) -> None:
    """fsync the file at ``path`` (its data reaches the disk)."""
    with open(path, "rb") as stream:
        os.fsync(stream.fileno())


def fsync_directory(directory: Path) -> None:
    """Make the renames durable; not possible everywhere (e.g. Windows), so best effort."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
