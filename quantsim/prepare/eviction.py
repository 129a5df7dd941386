"""The preparation cache's size limit: last-use times, reader locks and least-recently-used eviction.

Every distinct model adds an entry about the size of its prepared form (plus its ``fakequant/`` store), so
an unbounded cache fills a disk (one sweep of ~150 models left 29 GB). After each entry is written, the
cache is trimmed to its limit by removing the entries used least recently.

- **Limit**: the ``max_size`` argument (`cache.store_cached`, ``prepare(cache_max_size=...)``,
  ``quantsim cache trim --max-size``), else ``$QUANTSIM_CACHE_MAX_SIZE``, else `DEFAULT_MAX_BYTES` (5 GiB).
  Sizes are bytes or a number with a unit (``500M``, ``5G``, ``1.5GiB``; powers of 1024); ``unlimited`` (or
  ``none``) turns eviction off. The entry just written is never evicted by its own write, so one model
  larger than the limit is still cached (alone).
- **Last use**: each entry's ``.lock`` file; its mtime is set when the entry is written and whenever a
  reader opens it (entries of older versions without one use their ``SHA256SUMS``'s mtime).
- **Readers lock**: a reader holds a shared ``flock`` on ``.lock`` while it reads the entry, and a reader
  of a memory-mapped entry (`cache.load_cached_mapped`) for as long as the `MappedWeights` it returns
  lives (its ``fakequant/`` store is written meanwhile). After taking the lock it checks that ``.lock`` is
  still the file at the entry's path, i.e. that the entry was not removed between finding and locking it.
- **Eviction** takes an exclusive, non-blocking lock on ``.lock``: an entry any process is reading (or
  has mapped) is skipped; so is one used in the last `RECENT_SECONDS` (a process that just found or wrote
  it may be about to lock it). Holding the lock it renames the entry to ``.trash-*`` in one atomic step,
  then deletes it; a reader therefore sees a whole entry or none. The cache can thus exceed its limit by
  entries in use or just used; the next write trims it again.
- Without ``fcntl`` (Windows) there are no locks: only the recent-use rule protects readers.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import time
import uuid
import weakref
from collections.abc import Iterable
from pathlib import Path

from quantsim.errors import InvalidArgumentError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LIMIT_ENV_VAR", "DEFAULT_MAX_BYTES", "RECENT_SECONDS", "LOCK_FILE", "parse_size", "parse_duration",
           "cache_limit", "UNLOCKED", "open_for_reading", "release", "hold_while_alive", "last_used", "entry_size", "in_use",
           "try_remove"]

LIMIT_ENV_VAR = "QUANTSIM_CACHE_MAX_SIZE"
DEFAULT_MAX_BYTES = 5 << 30
"""The default size limit of the preparation cache: 5 GiB, a few models' worth on a laptop's disk."""
RECENT_SECONDS = 60.0
"""Eviction by size leaves entries used in the last this many seconds (a process may be about to read them)."""
LOCK_FILE = ".lock"
_MANIFEST = "SHA256SUMS"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h|d|w)?\s*", re.IGNORECASE)
_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_log = logging.getLogger(__name__)


def parse_size(text: str | int, what: str = LIMIT_ENV_VAR) -> int | None:
    """Bytes of a size such as ``5G``, ``500MB``, ``1.5GiB`` or ``1048576`` (units are powers of 1024); None
    for ``unlimited`` / ``none``. Raises `InvalidArgumentError` naming ``what`` for anything else."""
    if isinstance(text, bool):
        raise InvalidArgumentError(f"{what}: expected a size such as 5G or 'unlimited', got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise InvalidArgumentError(f"{what}: a size cannot be negative, got {text}")
        return text
    if text.strip().lower() in ("unlimited", "none", "inf"):
        return None
    match = _SIZE.fullmatch(text)
    if match is None:
        raise InvalidArgumentError(f"{what}: expected a size such as 5G, 500M, 1048576 or 'unlimited', got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_duration(text: str) -> float:
    """Seconds of a duration such as ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (a bare number is seconds)."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise InvalidArgumentError(f"expected a duration such as 30d, 12h, 90m or 45s, got {text!r}")
    return float(match.group(1)) * _SECONDS[(match.group(2) or "s").lower()]


def cache_limit(max_size: int | str | None = None) -> int | None:
    """The size limit in bytes (None: unlimited): ``max_size``, else ``$QUANTSIM_CACHE_MAX_SIZE``, else
    `DEFAULT_MAX_BYTES`."""
    if max_size is not None:
        return parse_size(max_size, "max_size")
    value = os.environ.get(LIMIT_ENV_VAR)
    if value is not None and value.strip():
        return parse_size(value)
    return DEFAULT_MAX_BYTES


UNLOCKED = -1
"""`open_for_reading`'s answer for an entry it cannot lock (a read-only cache): read it without a lock."""


def open_for_reading(entry: Path) -> int | None:
    """Take a shared lock on ``entry`` and mark it used now; returns the lock's descriptor (give it to
    `release` or `hold_while_alive`), None when the entry is gone (removed meanwhile: a miss), or `UNLOCKED`
    when the cache is read-only (nothing can evict the entry there either)."""
    try:
        fd = os.open(entry / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:  # read-only file system or folder: lock an existing file read-only, else go without
        try:
            fd = os.open(entry / LOCK_FILE, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return UNLOCKED if entry.is_dir() else None
        except OSError:
            return UNLOCKED
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)  # an evictor holds its exclusive lock only while it renames
        if not _same_file(fd, entry / LOCK_FILE):  # renamed to .trash-* before we locked it
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    try:
        os.utime(fd)
    except OSError:  # read-only: the last use is not recorded
        pass
    return fd


def release(fd: int | None) -> None:
    """Drop a lock `open_for_reading` took."""
    if fd is not None and fd != UNLOCKED:
        os.close(fd)


def hold_while_alive(owner: object, fd: int | None) -> None:
    """Keep the lock ``fd`` until ``owner`` is garbage collected (or the process ends)."""
    if fd is not None and fd != UNLOCKED:
        weakref.finalize(owner, os.close, fd)


def last_used(entry: Path) -> float:
    """When ``entry`` was last read or written (the mtime of its ``.lock``, else of its manifest)."""
    for name in (LOCK_FILE, _MANIFEST):
        try:
            return (entry / name).stat().st_mtime
        except OSError:
            continue
    return 0.0


def entry_size(entry: Path) -> int:
    """Bytes of every file in ``entry``, its ``fakequant/`` store included."""
    total = 0
    for folder, _, files in os.walk(entry):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # removed while listing
                continue
    return total


def in_use(entry: Path) -> bool:
    """Whether some process holds a reader's lock on ``entry`` now."""
    if fcntl is None:
        return False
    try:
        fd = os.open(entry / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def try_remove(entry: Path, keep_after: float | None = None) -> bool:
    """Remove ``entry`` unless a reader holds it or it was used after the time ``keep_after``; True if this
    call removed it (renamed to ``.trash-*`` under an exclusive lock, then deleted)."""
    try:
        fd = _open_lock(entry)
    except (FileNotFoundError, NotADirectoryError):
        return False
    trash = entry.with_name(f".trash-{uuid.uuid4().hex}")
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _same_file(fd, entry / LOCK_FILE):
            return False
        if keep_after is not None and os.fstat(fd).st_mtime > keep_after:
            return False
        os.replace(entry, trash)
    except OSError:  # locked by a reader (EWOULDBLOCK), or removed by another process
        return False
    finally:
        os.close(fd)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def evict_to_limit(entries: Iterable[tuple[Path, int, float]], limit: int, keep: Iterable[str] = (),
                   now: float | None = None) -> list[Path]:
    """Remove the least recently used of ``entries`` (``(folder, bytes, last use)``) until their total is at
    most ``limit`` bytes, skipping ``keep`` (entry names), entries in use and entries used in the last
    `RECENT_SECONDS`; returns the folders removed."""
    ordered = sorted(entries, key=lambda e: (e[2], e[0].name))
    total = sum(size for _, size, _ in ordered)
    kept, removed = set(keep), []
    recent = (time.time() if now is None else now) - RECENT_SECONDS
    for folder, size, _ in ordered:
        if total <= limit:
            break
        if folder.name in kept:
            continue
        if try_remove(folder, keep_after=recent):
            removed.append(folder)
            total -= size
            _log.info("prepare: evicted cache entry %s (%d bytes) to stay under %d bytes", folder.name[:16], size,
                      limit)
    return removed


def _open_lock(entry: Path) -> int:
    """Open ``entry``'s lock file; one created here (an entry of an older version) takes the manifest's mtime
    as its last use, so creating it does not make the entry look used now."""
    try:
        fd = os.open(entry / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return os.open(entry / LOCK_FILE, os.O_RDWR)
    try:
        written = (entry / _MANIFEST).stat().st_mtime
        os.utime(fd, (written, written))
    except OSError:
        pass
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_ino, here.st_dev) == (there.st_ino, there.st_dev)
