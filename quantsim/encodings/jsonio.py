"""JSON file I/O: crash-safe writes and strict reads (duplicate keys and non-JSON are errors)."""
from __future__ import annotations

import json
import os
from typing import Any

from quantsim.errors import EncodingFormatError
from quantsim.graph.file_set import FileSet

__all__ = ["write_json_atomic", "load_json_file"]


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON (``sort_keys=True, indent=4``, as AIMET does) without ever leaving a torn file.

    The text is serialised first (a serialisation error touches nothing), written to a staging file in
    the target's folder, fsynced and moved over the target (`quantsim.graph.file_set.FileSet`). On any
    failure the staged file is removed and an existing target is left as it was.
    """
    directory, base = os.path.split(os.path.abspath(os.fspath(path)))
    with FileSet(directory, base) as files:
        files.add_json(base, obj)
        files.commit()


def _no_duplicate_keys(source: str):
    def hook(pairs):
        obj = {}
        for key, value in pairs:
            if key in obj:
                raise EncodingFormatError(source, f"key {key!r}", "duplicate key in a JSON object")
            obj[key] = value
        return obj

    return hook


def load_json_file(path: str | os.PathLike) -> Any:
    """Parse a JSON file; malformed text, bad UTF-8 and duplicate object keys raise `EncodingFormatError`.

    A missing or unreadable file raises the usual `OSError`.
    """
    source = os.fspath(path)
    with open(source, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise EncodingFormatError(source, None, f"not a UTF-8 text file ({exc.reason})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys(source))
    except json.JSONDecodeError as exc:
        raise EncodingFormatError(
            source, None, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise EncodingFormatError(source, None, "JSON nested too deeply to be an encodings file") from None
