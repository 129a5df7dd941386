"""The preparation cache's big data files reach the disk after their entry is published.

A cold sim of a large model would otherwise wait seconds for the fsync of gigabytes before mapping the
entry. The entry's small files are synced before publishing; the data file's digest was taken as it was
written, so this process trusts it at once (`fresh_signatures`, guarded by the files' signatures like the
``.verified`` stamp), and other processes only through the stamp, written by a thread once the fsync is
done. A crash before that leaves no stamp: the next reader hashes the files and discards a torn entry.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from quantsim.graph.file_set import fsync_file, in_background
from quantsim.graph.loading import file_signature

__all__ = ["stamp_when_synced", "fresh_signatures"]

_FRESH: dict[str, dict] = {}  # entry folder -> `file_signature` of its files as this process wrote them


def stamp_when_synced(entry: Path, names: list[str], data_files: list[Path],
                      write_stamp: Callable[[Path, list[str]], None]) -> None:
    """Trust ``entry``'s files as written, now in this process and, once ``data_files`` are on disk, in
    others: their fsync (seconds for gigabytes) runs on a thread that writes the ``.verified`` stamp when it
    is done, while the caller goes on. A crash before that leaves no stamp, so the next reader hashes the
    files and discards a torn entry (`quantsim.graph.file_set.in_background`)."""
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

    in_background(sync, "quantsim-cache-sync")


def fresh_signatures(entry: Path) -> dict:
    """``{file name: signature}`` of ``entry``'s files as this process wrote them (empty if it did not)."""
    return _FRESH.get(str(entry), {})
