"""The preparation cache's big data files reach the disk after their entry is published.

A cold sim of a large model would otherwise wait seconds for the fsync of gigabytes before mapping the
entry. The entry's small files are synced before publishing; the data file's digest was taken as it was
written, so this process trusts it at once (`fresh_signatures`, guarded by the files' signatures like the
``.verified`` stamp), and other processes only through the stamp, written by a thread once the fsync is
done. A crash before that leaves no stamp: the next reader hashes the files and discards a torn entry.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from quantsim.graph.file_set import fsync_file
from quantsim.graph.loading import file_signature

__all__ = ["stamp_when_synced", "fresh_signatures", "wait_for_syncs"]

_FRESH: dict[str, dict] = {}  # entry folder -> `file_signature` of its files as this process wrote them
_SYNCS: list[threading.Thread] = []


def wait_for_syncs() -> None:
    """Wait until the data files this process stored are on disk and stamped (`stamp_when_synced`)."""
    while _SYNCS:
        _SYNCS.pop().join()


def stamp_when_synced(entry: Path, names: list[str], data_files: list[Path],
                      write_stamp: Callable[[Path, list[str]], None]) -> None:
    """Trust ``entry``'s files as written, now in this process and, once ``data_files`` are on disk, in
    others: their fsync (seconds for gigabytes) runs on a thread that writes the ``.verified`` stamp when it
    is done, while the caller goes on. A crash before that leaves no stamp, so the next reader hashes the
    files and discards a torn entry. Not a daemon thread: the interpreter waits for it at exit."""
    signatures = {name: file_signature(entry / name) for name in names}
    _FRESH[str(entry)] = signatures

    def sync() -> None:
        try:
            for path in data_files:
                fsync_file(path)
        except OSError:
            return
        if all(file_signature(entry / name) == signature for name, signature in signatures.items()):
            write_stamp(entry, names)

    thread = threading.Thread(target=sync, name="quantsim-cache-sync")
    thread.start()
    _SYNCS[:] = [t for t in _SYNCS if t.is_alive()] + [thread]


def fresh_signatures(entry: Path) -> dict:
    """``{file name: signature}`` of ``entry``'s files as this process wrote them (empty if it did not)."""
    return _FRESH.get(str(entry), {})
