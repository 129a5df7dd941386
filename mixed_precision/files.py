"""Atomic text-file writes for the package's reports (HTML pages, ``pareto.json``)."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["write_text_atomic"]


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder moved into place: a failure
    leaves no partial file and an existing ``path`` as it was."""
    target = Path(path)
    data = text.encode("utf-8")
    staging = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    handle = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, unlike mkstemp
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return target
