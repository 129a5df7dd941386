"""Atomic text-file writes for the package's reports (HTML pages, ``pareto.json``), and strict JSON reads for
its input files (a key given twice is an error, as in a quantsim config: `quantsim.load_config`)."""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from quantsim import ConfigError

__all__ = ["write_text_atomic", "read_json_strict"]


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def read_json_strict(path: str | os.PathLike, what: str) -> Any:
    """The JSON document in ``path``; unreadable files, invalid JSON and a key given twice in one object
    (JSON parsers keep the last in silence) raise `quantsim.ConfigError` naming the file, ``what`` it should
    be, and the key."""
    label = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{label}: cannot read {what}: {error}") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as error:
        raise ConfigError(f"{label}: duplicate key {error.args[0]!r} in {what} (JSON would keep only the last "
                          "one): give each key once") from None
    except RecursionError:
        raise ConfigError(f"{label}: JSON nested too deeply to be {what}") from None
    except ValueError as error:
        raise ConfigError(f"{label}: cannot read {what}: {error}") from None


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
