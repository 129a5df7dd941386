"""Fake-quantized weights of a cached large model, kept on disk across processes.

A sim of a large model whose prepared form lives in the preparation cache (`quantsim.prepare.cache`, its
weights memory-mapped from the entry) gives onnxruntime fake-quantized weights through a file
(`session.WeightFiles`). Computing and writing them costs about as much CPU as creating the session itself
(2-4 s per GB here), and every new process (each calibration script, each benchmark step) did it again. A
`FakeQuantStore` keeps them in the entry's ``fakequant/`` folder: one file per weight, named by a digest of
what its values depend on (the tensor's name, shape and type, the quantizer's spec and encoding, and the
source of the numerics), so a later process with the same param quantizers finds them and computes nothing,
and one with other settings writes its own. The entry's name is a digest of the prepared model's content,
so the weights' float values are implied by the folder.

Writing: a value is written to a ``.tmp-*`` file in the store, which the writing process's session uses at
once; a thread (`file_set.in_background`) fsyncs it and renames it to its final
name, so other processes only ever see complete files; a crash leaves only a ``.tmp-*`` file, removed once
it is an hour old. A file whose size is not its value's is discarded and written again. Sessions read the
store's files through hard links in their own folder (onnxruntime reads external data only inside the model's
folder), or copies where the store lies on another file system. The store keeps at most `STORE_FACTOR` times
the entry's own data (least recently used files go first); ``clear_cache`` removes it with the entry.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Hashable
from pathlib import Path

import numpy as np

from quantsim.core.numerics import Encoding
from quantsim.graph.file_set import fsync_file, in_background

__all__ = ["FakeQuantStore", "STORE_FACTOR", "STORE_FOLDER", "fake_quant_store", "link_or_copy"]

STORE_FOLDER = "fakequant"
STORE_FACTOR = 2
"""The store keeps at most this many times the bytes of its entry's data files."""
_FORMAT = b"quantsim-fakequant-store-v1"
_STALE_SECONDS = 3600


@functools.cache
def _code_digest(*packages: str) -> bytes:
    """What stored values depend on besides their key: the version and the sources of ``packages``' modules
    (folders under ``quantsim/``, or one module's file)."""
    import quantsim

    digest = hashlib.sha256(_FORMAT)
    digest.update(quantsim.__version__.encode())
    root = Path(quantsim.__file__).parent
    for package in packages:
        path = root / package
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]:
            digest.update(str(source.relative_to(root)).encode())
            digest.update(source.read_bytes())
    return digest.digest()


class FakeQuantStore:
    """The ``fakequant/`` folder of one preparation-cache entry (module docstring), which also keeps the
    encodings computed from the entry's constants (`quantsim.sim.param_encodings`)."""

    def __init__(self, folder: Path, limit_bytes: int):
        self.folder = folder
        self.limit_bytes = limit_bytes
        self._salt = _code_digest("core/numerics")
        self._usable: bool | None = None
        self._in_use: set[str] = set()  # final names this process's sessions read: never evicted by it

    def name(self, tensor: str, key: Hashable, shape: tuple, dtype: np.dtype) -> str:
        """The file name of the values of ``tensor`` under ``key`` (module docstring)."""
        digest = hashlib.sha256(self._salt)
        digest.update(repr((tensor, key, tuple(int(d) for d in shape), np.dtype(dtype).str)).encode())
        return f"fq-{digest.hexdigest()[:40]}.bin"

    def encoding_name(self, key: Hashable) -> str:
        """The file name of a constant's encoding under ``key`` (what its computation depends on besides the
        values, which the entry implies, and the calibration and numerics code)."""
        digest = hashlib.sha256(_code_digest("calibration", "core"))
        digest.update(repr(key).encode())
        return f"enc-{digest.hexdigest()[:40]}.npz"

    def load_encoding(self, name: str) -> Encoding | None:
        """The encoding stored as ``name``; None if missing or unreadable (then removed)."""
        path = self.folder / name
        try:
            with np.load(path, allow_pickle=False) as stored:
                fields = json.loads(str(stored["fields"]))
                return Encoding(scale=stored["scale"], zero_point=stored["zero_point"], **fields)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a torn or foreign file is a miss
            path.unlink(missing_ok=True)
            return None

    def save_encoding(self, name: str, encoding: Encoding) -> None:
        """Store ``encoding`` as ``name`` (whole or not at all; a store that cannot be written is skipped)."""
        fields = {f.name: getattr(encoding, f.name) for f in dataclasses.fields(encoding)
                  if f.name not in ("scale", "zero_point")}
        temporary = self.folder / f".tmp-{uuid.uuid4().hex}-{name}"
        try:
            self.folder.mkdir(exist_ok=True)
            with open(temporary, "wb") as file:
                np.savez(file, scale=encoding.scale, zero_point=encoding.zero_point,
                         fields=np.array(json.dumps(fields, default=lambda value: value.item())))
            os.replace(temporary, self.folder / name)
        except OSError:
            temporary.unlink(missing_ok=True)

    def usable(self, sessions_folder: Path) -> bool:
        """Whether the store can be written (checked once); removes stale temporary files on the way."""
        if self._usable is None:
            try:
                self.folder.mkdir(exist_ok=True)
                probe = self.folder / f".tmp-{uuid.uuid4().hex}-probe"
                probe.write_bytes(b"")
                probe.unlink()
                for path in self.folder.glob(".tmp-*"):
                    if time.time() - path.stat().st_mtime > _STALE_SECONDS:
                        path.unlink(missing_ok=True)
                self._usable = sessions_folder.is_dir()
            except OSError:
                self._usable = False
        return self._usable

    def take(self, name: str, nbytes: int, into: Path) -> bool:
        """Put the stored file ``name`` into folder ``into`` (a hard link, else a copy) if it holds ``nbytes``;
        False if it is missing, or torn (then removed)."""
        path = self.folder / name
        try:
            if path.stat().st_size != nbytes:
                path.unlink(missing_ok=True)  # torn: written again by the caller
                return False
            link_or_copy(path, into / name)
            os.utime(path)  # recently used: evicted last
        except OSError:
            return False
        self._in_use.add(name)
        return True

    def temporary(self, name: str) -> Path:
        """Where to write the values of ``name`` before `publish` gives it its final name."""
        return self.folder / f".tmp-{uuid.uuid4().hex}-{name}"

    def publish(self, written: list[tuple[Path, str]]) -> None:
        """On a thread: fsync each ``(temporary file, final name)`` and rename it into place; then evict."""
        self._in_use.update(name for _, name in written)

        def run() -> None:
            for path, name in written:
                try:
                    fsync_file(path)
                    os.replace(path, self.folder / name)
                except OSError:
                    try:
                        path.unlink(missing_ok=True)
                    except OSError:
                        pass
            self.evict()

        in_background(run, "quantsim-fakequant-publish")

    def evict(self) -> None:
        """Remove the least recently used files beyond `limit_bytes` (not those this process's sessions use)."""
        try:
            files = [(path.stat().st_mtime, path.stat().st_size, path) for path in self.folder.glob("fq-*.bin")]
        except OSError:
            return
        held = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if held <= self.limit_bytes:
                break
            if path.name in self._in_use:
                continue
            try:
                path.unlink(missing_ok=True)
            except OSError:
                continue
            held -= size


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (a copy across file systems); kept if it exists already."""
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def fake_quant_store(entry: Path | None) -> FakeQuantStore | None:
    """The store of the preparation-cache entry folder ``entry`` (None if ``entry`` is not one: it has no
    ``KEY`` file)."""
    if entry is None or not (entry / "KEY").is_file():
        return None
    try:
        data = sum(path.stat().st_size for path in entry.iterdir() if path.is_file())
    except OSError:
        return None
    return FakeQuantStore(entry / STORE_FOLDER, STORE_FACTOR * data)
