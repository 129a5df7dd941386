"""Persistent on-disk cache of prepared models.

Key: `cache_keys.cache_key` (the input model's content, each pass's identity and source, the options, the
sources of this package and ``quantsim/graph/``, and the library versions); a pass without a stable identity
(a lambda, a closure) makes the call uncacheable (``cache_key`` returns None).

Location: ``cache_dir`` argument, else ``$QUANTSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/quantsim`` (default
``~/.cache/quantsim``); entries live in its ``prepared/`` subfolder.

Entry: a folder ``prepared/<key>/`` holding ``model.onnx`` (plus ``model.onnx.data``, ONNX external data,
for models with at least `EXTERNAL_DATA_BYTES` of initializers: loading reads those one at a time), ``KEY``
(the entry's own key: an entry copied or renamed under another key, which would run another model, is
refused) and ``SHA256SUMS`` (``sha256sum`` format) with the digest of every file. The key is itself a
digest over the input model, so ``KEY`` binds the entry to that model too.
Writing: weights a model file kept in its own external data (`graph.source_weights`) are copied file to file,
and when preparation left all its big weights as they were the data file's digest is the one the key's digest
already took (`digest`): large weights are read once for the key and copied once. The files go to a temporary
folder ``prepared/.tmp-*`` beside the entry, are fsynced (the big
data file on a thread, after publishing: `entry_sync`), and the
folder is renamed into place in one atomic step (``os.replace``); when another process published the
same key first, its entry is kept and ours dropped, so concurrent preparations both succeed. Removal
renames to ``.trash-*`` first, so a reader sees a whole entry or none.
Size limit: ``.lock`` in each entry records its last use (mtime) and carries the readers' shared locks; after
each write the cache is trimmed to its limit (default 5 GiB, ``$QUANTSIM_CACHE_MAX_SIZE``) by removing the
least recently used entries no reader holds (`eviction`).
Reading: every file is checked against ``SHA256SUMS`` and ``KEY`` against the key asked for; the files of
an entry with external data are hashed only when their stat signature (size, inode, device, mtime, ctime) differs
from the one recorded in ``.verified`` when they were last hashed (as written, or on an earlier read), so a
warm load of a large model does not read gigabytes twice while any change to a file is still caught; a corrupted,
truncated, foreign or incomplete entry (no ``SHA256SUMS``, or a file where the folder should be) is
discarded with a ``PrepareWarning`` and the caller prepares again and rewrites it. Failing to write the
cache (read-only disk, quota) only warns: the prepared model is still returned.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import onnx

from quantsim.errors import InvalidArgumentError, PrepareWarning, warn_at_caller
from quantsim.graph.file_set import fsync_directory, fsync_file
from quantsim.graph.large_models import payload_bytes, save_model, value_bytes
from quantsim.graph.loading import file_signature
from quantsim.graph.mapped import MappedWeights, is_mapped
from quantsim.graph.model_io import write_text_atomic
from quantsim.prepare.cache_keys import cache_key, key_for_digest, model_digest, pass_identities, pass_identity
from quantsim.prepare.digest import ContentDigest, mapped_layout
from quantsim.prepare.entry_sync import fresh_signatures, stamp_when_synced
from quantsim.prepare.eviction import (
    LOCK_FILE,
    cache_limit,
    entry_size,
    evict_to_limit,
    hold_while_alive,
    in_use,
    last_used,
    open_for_reading,
    release,
    try_remove,
)
from quantsim.prepare.inputs import INPUTS_FOLDER

__all__ = ["ENV_VAR", "EXTERNAL_DATA_BYTES", "CacheEntry", "cache_root", "cache_key", "model_digest", "key_for_digest",
           "pass_identities", "pass_identity", "load_cached", "load_cached_mapped",
           "store_cached", "clear_cache", "trim_cache", "cache_info", "cache_size"]

ENV_VAR = "QUANTSIM_CACHE_DIR"
EXTERNAL_DATA_BYTES = 64 << 20
"""Entries of models with at least this many bytes of initializers keep them in an external-data file."""
_MODEL, _MANIFEST, _KEY_FILE, _STAMP = "model.onnx", "SHA256SUMS", "KEY", ".verified"
_KEY = re.compile(r"[0-9a-f]{64}")
_STALE_SECONDS = 3600
_CHUNK = 1 << 20
_log = logging.getLogger(__name__)


class CacheEntry(NamedTuple):
    """One entry of the cache: its key, its bytes (with its ``fakequant/`` store), when it was written and
    last used (seconds since the epoch) and whether a reader holds it now."""

    key: str
    size_bytes: int
    mtime: float
    last_used: float = 0.0
    in_use: bool = False


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The ``prepared/`` folder under the chosen cache directory (not created)."""
    base = cache_dir or os.environ.get(ENV_VAR)
    if not base:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quantsim"
    return Path(base).expanduser() / "prepared"


def load_cached(key: str, cache_dir: str | os.PathLike | None = None) -> onnx.ModelProto | None:
    """The cached model for ``key``, or None (missing; or corrupted, foreign or incomplete: then discarded
    with a warning)."""
    loaded = _load_entry(key, cache_dir, mapped=False)
    return None if loaded is None else loaded[0]


def load_cached_mapped(key: str, cache_dir: str | os.PathLike | None = None
                       ) -> tuple[onnx.ModelProto, MappedWeights | None] | None:
    """Like `load_cached`, but an entry with external data leaves its big initializers there: the model holds
    external-data references and the `MappedWeights` over the entry's data file reads them (no copy)."""
    return _load_entry(key, cache_dir, mapped=True)


def _load_entry(key: str, cache_dir: str | os.PathLike | None, mapped: bool
                ) -> tuple[onnx.ModelProto, MappedWeights | None] | None:
    entry = cache_root(cache_dir) / key
    try:
        mode = entry.stat().st_mode  # one look: an entry evicted between two would read as "not a folder"
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISDIR(mode):
        return _discard(entry, "not a folder")
    lock = open_for_reading(entry)  # eviction leaves the entry alone while we read it (`eviction`)
    if lock is None:  # removed meanwhile
        return None
    loaded = None
    try:
        loaded = _read_entry(entry, key, mapped)
    finally:
        if loaded is not None and loaded[1] is not None:
            hold_while_alive(loaded[1], lock)  # its fakequant store and files are used while it lives
        else:
            release(lock)
    return loaded


def _read_entry(entry: Path, key: str, mapped: bool) -> tuple[onnx.ModelProto, MappedWeights | None] | None:
    try:
        expected = _read_manifest(entry / _MANIFEST)
    except FileNotFoundError:
        # entries are published whole by one rename, so a folder without a manifest is never one being written
        return _discard(entry, f"no {_MANIFEST}") if entry.exists() else None
    except (OSError, ValueError) as exc:
        return _discard(entry, f"unreadable {_MANIFEST}: {exc}")
    try:
        owner = (entry / _KEY_FILE).read_bytes()
        if hashlib.sha256(owner).hexdigest() != expected[_KEY_FILE] or owner.decode().strip() != key:
            return _discard(entry, f"it belongs to another key ({owner[:16].decode(errors='replace')}...)")
        if set(expected) == {_MODEL, _KEY_FILE}:  # small: read once, check, parse the same bytes
            data = (entry / _MODEL).read_bytes()
            if hashlib.sha256(data).hexdigest() != expected[_MODEL]:
                return _discard(entry, f"{_MODEL} does not match its sha256")
            return onnx.ModelProto.FromString(data), None
        stamp, checked = {**_read_stamp(entry), **fresh_signatures(entry)}, False
        for name, digest in expected.items():
            if name in stamp and stamp[name] == file_signature(entry / name):
                continue  # hashed when written or last read, and not changed since (module docstring)
            if _file_digest(entry / name) != digest:
                return _discard(entry, f"{name} does not match its sha256")
            checked = True
        if checked:
            _write_stamp(entry, list(expected))
        if mapped:
            model = onnx.load(str(entry / _MODEL), load_external_data=False)
            return model, MappedWeights(entry, model)
        model = onnx.load(str(entry / _MODEL))  # loads the external data into the tensors, one at a time
        for tensor in model.graph.initializer:  # as the model was before saving: no explicit default location
            if tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.DEFAULT:
                tensor.ClearField("data_location")
        return model, None
    except FileNotFoundError as exc:  # removed as a whole by another process meanwhile, or a file is missing
        return _discard(entry, f"missing {Path(exc.filename or '?').name}") if (entry / _MANIFEST).exists() else None
    except Exception as exc:  # noqa: BLE001 - anything unreadable is a corrupted entry
        return _discard(entry, str(exc))


def store_cached(key: str, model: onnx.ModelProto, cache_dir: str | os.PathLike | None = None,
                 weights: MappedWeights | None = None, content: ContentDigest | None = None,
                 unchanged: Callable[[], bool] | None = None, max_size: int | str | None = None) -> Path | None:
    """Publish ``model`` under ``key`` atomically; returns the entry folder (None if it could not be written).

    ``weights`` reads the initializers of ``model`` left in the input's files (`graph.source_weights`): their
    bytes are copied file to file. When they are all of its big weights, in the order ``content`` (the input's
    `digest.ContentDigest`) hashed them, the data file's digest is ``content.payload`` and nothing is hashed
    again; ``unchanged`` then tells whether the input's files are still as they were hashed, checked once the
    entry is written: if not, nothing is published (what the passes read or the entry copied may not be the
    bytes the key promises).

    Then the cache is trimmed to ``max_size`` (`eviction.cache_limit`: the argument, else
    ``$QUANTSIM_CACHE_MAX_SIZE``, else 5 GiB) by removing the least recently used entries other than this one.
    """
    limit = cache_limit(max_size)  # a bad limit fails before the work
    root = cache_root(cache_dir)
    entry = root / key
    mapped = [tensor for tensor in model.graph.initializer if is_mapped(tensor)] if weights is not None else []
    known = (content.payload if content is not None and content.layout is not None and mapped
             and mapped_layout(model, weights) == content.layout else None)
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=root))
        try:
            digests: dict[str, str] = {}
            big = payload_bytes(model.graph.initializer) + value_bytes(mapped) >= EXTERNAL_DATA_BYTES
            files = save_model(model, staging / _MODEL, digests,  # hashed as written, never read back
                               external=big or None, weights=weights, data_digest=known if big else None)
            if weights is not None and unchanged is not None and not unchanged():
                _log.info("prepare: the model's files changed while it was prepared; not caching it")
                return None
            (staging / _KEY_FILE).write_text(key + "\n")
            digests[_KEY_FILE] = hashlib.sha256((key + "\n").encode()).hexdigest()
            files.append(staging / _KEY_FILE)
            data_files = [path for path in files if path.name not in (_MODEL, _KEY_FILE)]
            for path in files:
                if path not in data_files:
                    fsync_file(path)
            lines = [f"{digests[path.name]}  {path.name}\n" for path in files]
            (staging / _MANIFEST).write_text("".join(lines))
            _file_digest(staging / _MANIFEST, sync=True)
            (staging / LOCK_FILE).touch()  # its mtime: the entry's last use (`eviction`)
            fsync_directory(staging)
            try:
                os.replace(staging, entry)
                if data_files:  # the data file's digest was taken as it was written: no need to read it back
                    stamp_when_synced(entry, [path.name for path in files], [entry / p.name for p in data_files], _write_stamp)
            except OSError:
                if (entry / _MANIFEST).exists():  # another process published the same key first
                    pass
                elif entry.exists() or entry.is_symlink():  # a leftover that is no entry: replace it
                    _remove(entry)
                    os.replace(staging, entry)
                else:
                    raise
            fsync_directory(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        warn_at_caller(f"could not write the prepared-model cache entry {entry}: {exc}", PrepareWarning)
        return None
    if limit is not None:
        trim_cache(limit, cache_dir, keep=(key,))
    return entry


def clear_cache(cache_dir: str | os.PathLike | None = None, older_than: float | None = None) -> int:
    """Remove every cache entry not in use by a reader now (`eviction`), or with ``older_than`` (seconds) only
    those last used longer ago than that; returns the number of entries removed. Without ``older_than`` it
    also removes the leftovers of interrupted writes and the input-file memos (`inputs`)."""
    root = cache_root(cache_dir)
    keep_after = None if older_than is None else time.time() - older_than
    removed = 0
    for child in _children(root):
        if _KEY.fullmatch(child.name):
            removed += try_remove(child, keep_after) if child.is_dir() and not child.is_symlink() else _remove(child)
        elif child.name == INPUTS_FOLDER and older_than is None:  # digests of model files, useless without entries
            shutil.rmtree(child, ignore_errors=True)
        else:
            _drop_leftover(child)
    return removed


def trim_cache(max_size: int | str | None = None, cache_dir: str | os.PathLike | None = None,
               keep: tuple[str, ...] = ()) -> list[str]:
    """Remove least recently used entries until the cache holds at most ``max_size`` bytes
    (`eviction.cache_limit`: default ``$QUANTSIM_CACHE_MAX_SIZE``, else 5 GiB). Entries in use, used in the
    last `eviction.RECENT_SECONDS`, or named in ``keep`` stay. Returns the keys removed."""
    limit = cache_limit(max_size)
    if limit is None:
        return []
    root = cache_root(cache_dir)
    entries = []
    for child in _children(root):
        if _KEY.fullmatch(child.name) and child.is_dir():
            entries.append((child, entry_size(child), last_used(child)))
        else:
            _drop_leftover(child)
    return [folder.name for folder in evict_to_limit(entries, limit, keep)]


def cache_info(cache_dir: str | os.PathLike | None = None) -> list[CacheEntry]:
    """`CacheEntry` (key, bytes with its ``fakequant/`` store, written, last used, in use) of every complete
    entry, least recently used first."""
    entries = []
    for child in _children(cache_root(cache_dir)):
        if not _KEY.fullmatch(child.name):
            continue
        try:
            written = (child / _MANIFEST).stat().st_mtime
        except OSError:  # incomplete or being removed
            continue
        entries.append(CacheEntry(child.name, entry_size(child), written, last_used(child), in_use(child)))
    return sorted(entries, key=lambda e: (e.last_used, e.key))


def cache_size(cache_dir: str | os.PathLike | None = None) -> int:
    """Total bytes of all entries."""
    return sum(entry.size_bytes for entry in cache_info(cache_dir))


# helpers ---------------------------------------------------------------------------------------
def _size_if_present(path: Path) -> int:
    """A file's size, 0 if it went away since it was listed (the `.verified` stamp's staged file is renamed
    into place by the sync thread of `entry_sync` while another thread may be listing the entry)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _file_digest(path: Path, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "r+b" if sync else "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        if sync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


def _read_stamp(entry: Path) -> dict:
    try:
        stamp = json.loads((entry / _STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _write_stamp(entry: Path, names: list[str]) -> None:
    """Record the `file_signature` of ``names`` in ``entry``, whose digests are known to match (best effort)."""
    stamp = {name: file_signature(entry / name) for name in names}
    try:
        write_text_atomic(entry / _STAMP, json.dumps(stamp))
    except OSError:
        pass


def _read_manifest(path: Path) -> dict[str, str]:
    expected = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if not _KEY.fullmatch(digest) or not name or "/" in name or "\\" in name or name.startswith("."):
            raise InvalidArgumentError(f"bad line {line!r}")
        expected[name] = digest
    missing = [name for name in (_MODEL, _KEY_FILE) if name not in expected]
    if missing:
        raise InvalidArgumentError(f"{', '.join(missing)} not listed")
    return expected


def _discard(entry: Path, why: str) -> tuple[onnx.ModelProto, MappedWeights | None] | None:
    """Warn about a corrupted entry and remove it; returns None (a cache miss)."""
    warn_at_caller(f"prepared-model cache entry {entry} is corrupted ({why}); discarding it and preparing again",
                  PrepareWarning)
    _remove(entry)
    return None


def _remove(entry: Path) -> int:
    """Rename ``entry`` out of the way, then delete it; 1 if this call removed it."""
    trash = entry.with_name(f".trash-{uuid.uuid4().hex}")
    try:
        os.replace(entry, trash)
    except OSError:
        return 0
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink(missing_ok=True)
    return 1


def _drop_leftover(child: Path) -> None:
    """Delete an interrupted removal (``.trash-*``) or an interrupted write (``.tmp-*``) older than an hour."""
    if child.name.startswith(".trash-") or (child.name.startswith(".tmp-") and _age(child) > _STALE_SECONDS):
        shutil.rmtree(child, ignore_errors=True)


def _children(root: Path) -> list[Path]:
    try:
        return list(root.iterdir())
    except OSError:
        return []


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
