"""Recalling the content digest of an unchanged model file, so a warm preparation reads nothing but the cache.

The prepared-model cache is keyed by the input model's content (`cache.model_digest`): hashing a large
model's weights costs as much as reading them, and loading them into a ModelProto as much again. For a model
given as a file, the digest is remembered together with the stat signature of the model file and of every
external-data file it references (size, inode, device, mtime and ctime, taken before their bytes were read
and checked unchanged after). While every signature still matches, the digest is recalled and the prepared
model comes from the cache without opening the user's files; any write to one of them changes its ctime and
the model is read and hashed again. A memo only records models that loaded and passed `load_model`'s checks.

Memos live in ``<cache root>/inputs/<sha256 of the resolved path>.json``, written atomically; an unreadable
or foreign memo is a miss. `cache.clear_cache` removes them with the entries.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from quantsim.graph.loading import file_signature
from quantsim.graph.model_io import write_text_atomic

__all__ = ["INPUTS_FOLDER", "remembered_digest", "remember_digest"]

INPUTS_FOLDER = "inputs"
_VERSION = 1


def _memo_path(path: Path, root: Path) -> Path:
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:40]
    return root / INPUTS_FOLDER / f"{name}.json"


def remembered_digest(path: str | os.PathLike, root: Path) -> str | None:
    """The digest remembered for model file ``path`` under cache root ``root``, if no file it was computed
    from has changed since; else None."""
    path = Path(path)
    try:
        memo = json.loads(_memo_path(path, root).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(memo, dict) or memo.get("version") != _VERSION or memo.get("model") != str(path.resolve()):
        return None
    files, digest = memo.get("files"), memo.get("digest")
    if not isinstance(files, dict) or not isinstance(digest, str) or str(path.resolve()) not in files:
        return None
    if any(file_signature(name) != recorded for name, recorded in files.items()):
        return None
    return digest


def remember_digest(path: str | os.PathLike, signatures: dict[str, list[int] | None], digest: str,
                    root: Path) -> None:
    """Record ``digest`` for model file ``path`` read while its files had ``signatures`` (path -> signature,
    taken before reading); nothing is recorded if one of them changed meanwhile. Best effort: a memo that
    cannot be written only costs a re-hash next time."""
    path = Path(path)
    if not signatures or any(value is None or file_signature(name) != value for name, value in signatures.items()):
        return
    target = _memo_path(path, root)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, json.dumps({"version": _VERSION, "model": str(path.resolve()),
                                              "files": signatures, "digest": digest}))
    except OSError:
        pass
