"""The content digest of a model for the preparation cache's key, in one read of its weights.

``sha256(tag, skeleton, payload)`` where the skeleton is `large_models.skeleton` serialised deterministically
(graph, attributes, small initializers, each big initializer's name, type and shape) and ``payload`` is the
sha256 of the big initializers' bytes concatenated in order: exactly the bytes of the external-data file a
cache entry stores them in (`large_models.save_model`). So when preparation leaves a model's big weights as
they were, mapped from its own files (`quantsim.graph.source_weights`), the entry's data file is the same
bytes in the same order and its digest is ``payload``, already known: the cache copies the weights file to
file and never hashes them a second time (`ContentDigest.layout` says when). A model whose weights are mapped
has the digest of the same model with them loaded.
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple

import onnx

from quantsim.graph.large_models import as_bytes, is_external_candidate, skeleton
from quantsim.graph.mapped import MappedWeights, external_info, is_mapped

__all__ = ["ContentDigest", "content_digest", "mapped_layout"]

_TAG = b"quantsim-model-digest-v2\0"


class ContentDigest(NamedTuple):
    digest: str
    """hex sha256 of the model's content (module docstring)."""
    payload: str
    """hex sha256 of the big initializers' bytes, concatenated in order."""
    layout: tuple | None
    """`mapped_layout` of the model hashed: where each big initializer's bytes were read from; None when one
    was in the model itself."""


def content_digest(model: onnx.ModelProto, weights: MappedWeights | None = None) -> ContentDigest:
    """The `ContentDigest` of ``model``, whose mapped initializers ``weights`` reads; each big weight is read
    once, a tensor at a time (from the page cache for mapped ones: no copy)."""
    payload = hashlib.sha256()
    for tensor in model.graph.initializer:
        if weights is not None and is_mapped(tensor):
            payload.update(as_bytes(weights.array(tensor)))
        elif is_external_candidate(tensor):
            payload.update(tensor.raw_data)
    digest = hashlib.sha256(_TAG)
    digest.update(skeleton(model, weights=weights).SerializeToString(deterministic=True))
    digest.update(payload.hexdigest().encode())
    return ContentDigest(digest.hexdigest(), payload.hexdigest(), mapped_layout(model, weights))


def mapped_layout(model: onnx.ModelProto, weights: MappedWeights | None) -> tuple | None:
    """``(location, offset, dims, type)`` of each big initializer in order, all mapped by ``weights``; None when
    one is not (its bytes are in the model, or there are no weights)."""
    layout = []
    for tensor in model.graph.initializer:
        if weights is not None and is_mapped(tensor):
            info = external_info(tensor)
            layout.append((info.get("location"), int(info.get("offset", 0)), tuple(tensor.dims), tensor.data_type))
        elif is_external_candidate(tensor):
            return None
    return tuple(layout) if weights is not None else None
