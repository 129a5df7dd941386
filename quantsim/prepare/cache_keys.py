"""The prepared-model cache's keys: what a prepared model depends on, as one sha256 (`quantsim.prepare.cache`).

A key covers a format tag, the input model's content (`model_digest`), each pass's identity (module,
qualified name and a digest of its source file), the preparation options, a digest of this package's and
`quantsim.graph`'s sources, and the onnx / onnxruntime / quantsim versions: any change to one of them is a
new key, so a stale entry is never read.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

import onnx

from quantsim.graph.mapped import MappedWeights
from quantsim.prepare.digest import content_digest

__all__ = ["cache_key", "model_digest", "key_for_digest", "pass_identities", "pass_identity"]

_FORMAT = b"quantsim-prepared-cache-v3"


def cache_key(model: onnx.ModelProto, passes, options: dict) -> str | None:
    """Hex sha256 naming the prepared form of ``model``; None when a pass has no stable identity."""
    identities = pass_identities(passes)
    if identities is None:
        return None
    return key_for_digest(model_digest(model), identities, options)


def model_digest(model: onnx.ModelProto, weights: MappedWeights | None = None) -> str:
    """Hex sha256 of ``model``'s content (`digest.content_digest`: its skeleton and its big weights' bytes,
    those ``weights`` maps read from their files): the part of the cache key that `inputs.remembered_digest`
    can recall for an unchanged file without reading it."""
    return content_digest(model, weights).digest


def key_for_digest(content: str, identities: list, options: dict) -> str:
    """The cache key of a model whose `model_digest` is ``content``, for passes of these identities."""
    import onnxruntime

    import quantsim

    digest = hashlib.sha256(_FORMAT)
    digest.update(content.encode())
    header = {"passes": identities, "options": options, "code": _code_digest(), "onnx": onnx.__version__,
              "onnxruntime": onnxruntime.__version__, "quantsim": quantsim.__version__}
    digest.update(json.dumps(header, sort_keys=True, default=repr).encode())
    return digest.hexdigest()


def pass_identities(passes) -> list[str] | None:
    """`pass_identity` of each pass; None when one has no stable identity (the call is uncacheable)."""
    identities = [pass_identity(run_pass) for run_pass in passes]
    return None if None in identities else identities  # type: ignore[return-value]


def pass_identity(run_pass) -> str | None:
    """``module.qualname@source-digest`` of a pass (with the arguments of a ``functools.partial``)."""
    if isinstance(run_pass, functools.partial):
        inner = pass_identity(run_pass.func)
        return None if inner is None else f"{inner}{run_pass.args!r}{sorted(run_pass.keywords.items())!r}"
    module, name = getattr(run_pass, "__module__", None), getattr(run_pass, "__qualname__", None)
    if not module or not name or "<" in name:
        return None
    source = getattr(sys.modules.get(module), "__file__", None)
    return f"{module}.{name}@{_source_digest(source) if source else ''}"


@functools.cache
def _source_digest_cached(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _code_digest() -> str:
    here = Path(__file__).parent
    return "".join(_source_digest(str(path)) for path in [*sorted(here.glob("*.py")),
                                                          *sorted((here.parent / "graph").glob("*.py"))])


def _source_digest(path: str) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return ""
    return _source_digest_cached(path, info.st_mtime_ns, info.st_size)
