"""Model preparation: the passes that turn a user's ONNX model into the graph the sim is built on,
and the on-disk cache that makes doing it twice free.

``prepare(model)`` copies the model and runs ``default_passes()`` on the copy:

1. ``check_graph``                clear errors for cycles, dangling inputs, values written twice; topological order
2. ``upgrade_opset``              default-domain opset < 13 -> 13; above onnxruntime's Q/DQ maximum -> converted
                                  down (warning) or an error; IR above its maximum -> error
3. ``name_nodes``                 unique, stable node names
4. ``constants_to_initializers``  Constant nodes -> initializers (Paddle-style weights)
5. ``canonicalize_ops``           legacy spellings -> the ops placement and exports know (two-input Sum -> Add,
                                  matrix-product Einsum -> Transpose + MatMul)
6. ``infer_shapes``               best effort; a failure warns and goes on without shapes
7. ``fold_constants``             constant-only nodes -> initializers (optional)
8. ``fold_batchnorm``             BatchNormalization into the preceding Conv/ConvTranspose/Gemm (optional),
                                  after 7: its parameters may come from constant subgraphs (ConstantOfShape)
9. ``fold_channel_affine``        Mul/Add by a per-channel constant into the preceding layer (with 8)
10. ``fuse_activations``          decomposed HardSwish / HardSigmoid / LeakyRelu chains -> the ONNX ops
11. ``infer_shapes``              again, for what the folds created
12. ``optimize_with_ort``, ``name_nodes``, ``infer_shapes``   onnxruntime basic optimisations (optional, off)

The caller's ModelProto is never modified; outputs stay numerically the same. The result is cached on
disk (see ``cache``): a second ``prepare`` of the same model with the same passes and options loads it
instead of running the passes.

Three helpers for working on models of any size (over protobuf's 2 GiB too) without a second copy of their
weights, used by the cache and by tools built on quantsim: ``skeleton(model)`` (the model with its big
initializers as external-data references: enough for shape inference, small enough to serialise),
``hash_model(digest, model)`` (the skeleton, then each weight's bytes; the cache key takes the same parts,
`digest.content_digest`) and
``save_model(model, path)`` (one file streamed an initializer at a time; over 2 GiB, a graph file plus
``<path>.data``, as cache entries and exports are written).

A sim built from a model file with large external data prepares it without loading the weights
(`prepare_loaded_mapped` with ``weights``, `quantsim.graph.source_weights`): they are hashed once from the page
cache, read only by the passes that use them and copied file to file into the cache entry.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import onnx

from quantsim.errors import InvalidArgumentError, PrepareError, PrepareWarning, warn_at_caller
from quantsim.graph.large_models import hash_model, save_model, skeleton
from quantsim.graph.loading import file_signature
from quantsim.graph.mapped import MappedWeights, reading_from
from quantsim.graph.wrapped import as_model_proto
from quantsim.prepare.cache import (
    cache_info,
    cache_key,
    cache_root,
    cache_size,
    clear_cache,
    key_for_digest,
    load_cached,
    load_cached_mapped,
    pass_identities,
    store_cached,
    trim_cache,
)
from quantsim.prepare.digest import content_digest
from quantsim.prepare.eviction import DEFAULT_MAX_BYTES, LIMIT_ENV_VAR, cache_limit, parse_duration, parse_size
from quantsim.prepare.inputs import remember_digest, remembered_digest
from quantsim.prepare.passes import (
    canonicalize_ops,
    check_graph,
    constants_to_initializers,
    fold_batchnorm,
    fold_channel_affine,
    fold_constants,
    fuse_activations,
    infer_shapes,
    name_nodes,
    optimize_with_ort,
    upgrade_opset,
)

_log = logging.getLogger(__name__)

__all__ = [
    "prepare",
    "prepare_loaded",
    "prepare_file_cached",
    "prepare_loaded_mapped",
    "default_passes",
    "DEFAULT_PASSES",
    "PrepareError",
    "PrepareWarning",
    "clear_cache",
    "cache_info",
    "cache_size",
    "trim_cache",
    "cache_limit",
    "parse_size",
    "parse_duration",
    "DEFAULT_MAX_BYTES",
    "LIMIT_ENV_VAR",
    "cache_root",
    "check_graph",
    "name_nodes",
    "constants_to_initializers",
    "canonicalize_ops",
    "upgrade_opset",
    "infer_shapes",
    "fold_batchnorm",
    "fold_channel_affine",
    "fold_constants",
    "fuse_activations",
    "optimize_with_ort",
    "skeleton",
    "hash_model",
    "save_model",
]


def default_passes(*, fold_batchnorm: bool = True, fold_constants: bool = True, optimize: bool = False) -> tuple:
    """The pass list ``prepare`` runs for these options (see the module docstring)."""
    from quantsim.prepare import passes

    chosen = [passes.check_graph, passes.upgrade_opset, passes.name_nodes, passes.constants_to_initializers,
              passes.canonicalize_ops, passes.infer_shapes]
    if fold_constants:
        chosen.append(passes.fold_constants)
    if fold_batchnorm:  # after constant folding, which may compute the constants these nodes read
        chosen += [passes.fold_batchnorm, passes.fold_channel_affine]
    chosen.append(passes.fuse_activations)
    chosen.append(passes.infer_shapes)
    if optimize:
        chosen += [passes.optimize_with_ort, passes.name_nodes, passes.infer_shapes]
    return tuple(chosen)


DEFAULT_PASSES = default_passes()


def prepare(model: onnx.ModelProto, *, passes=None, fold_batchnorm: bool = True, fold_constants: bool = True,
            optimize: bool = False, cache: bool = True,
            cache_dir: str | os.PathLike | None = None,
            cache_max_size: int | str | None = None) -> onnx.ModelProto:
    """Return a prepared copy of ``model``; the caller's ModelProto is not modified.

    ``passes`` replaces the default list (then the three folding/optimising flags must keep their
    defaults). With ``cache`` the result is looked up in and stored to the on-disk cache under
    ``cache_dir`` (default: ``$QUANTSIM_CACHE_DIR`` or ``~/.cache/quantsim``), which a new entry then trims to
    ``cache_max_size`` (bytes or ``"5G"``-style; default ``$QUANTSIM_CACHE_MAX_SIZE``, else 5 GiB) by evicting
    the least recently used entries (`cache.trim_cache`). Raises ``PrepareError``
    for models that cannot be prepared (cycles, dangling inputs, unsupported opset, ...).
    """
    model = as_model_proto(model)  # sim.model (a view) too
    options = {"fold_batchnorm": fold_batchnorm, "fold_constants": fold_constants, "optimize": optimize}
    if passes is None:
        chosen = default_passes(**options)
    elif (fold_batchnorm, fold_constants, optimize) != (True, True, False):
        raise InvalidArgumentError("pass either `passes` or the fold_batchnorm/fold_constants/optimize flags, not both")
    else:
        chosen = tuple(passes)
    if cache_max_size is not None:
        cache_limit(cache_max_size)  # a bad value fails on a hit too
        if not cache:
            warn_at_caller("prepare: cache_max_size has no effect with cache=False (nothing is stored)",
                           PrepareWarning)
    key = cache_key(model, chosen, options) if cache else None
    if key is not None:
        cached = load_cached(key, cache_dir)
        if cached is not None:
            _log.info("prepare: cache hit %s", key[:16])
            return cached
    work = onnx.ModelProto()
    work.CopyFrom(model)
    return _prepare_work(work, chosen, key, cache_dir, cache_max_size)


def prepare_loaded(load: Callable[[], onnx.ModelProto], *, fold_batchnorm: bool = True,
                   source: tuple[str | os.PathLike, dict] | None = None) -> onnx.ModelProto:
    """``prepare(load(), fold_batchnorm=...)`` for a model nobody else keeps (``load`` reads it, e.g. from
    its file), with one copy of its weights at a time: on a cache hit the loaded model is let go before the
    cached one loads, and on a miss the passes run on it in place.

    ``source``, ``(model file, signatures)`` with the stat signatures `load_model` noted while ``load`` read
    it, lets `prepare_file_cached` find the entry next time without reading the file (`inputs`)."""
    return _prepare_loaded(load, fold_batchnorm, source, mapped=False)[0]


def prepare_loaded_mapped(load: Callable[[], onnx.ModelProto], *, fold_batchnorm: bool = True,
                          source: tuple[str | os.PathLike, dict] | None = None,
                          weights: MappedWeights | None = None) -> tuple[onnx.ModelProto, MappedWeights | None]:
    """`prepare_loaded`, but a prepared model whose cache entry keeps its weights in external data comes back
    with them left there (`cache.load_cached_mapped`): its initializers are references that the returned
    `MappedWeights` reads through memory maps, so no copy of the weights stays in memory (on a miss the
    prepared model is stored, let go and mapped back).

    ``weights`` reads the initializers that the first model ``load`` returns left in its files
    (`quantsim.graph.source_weights`, with ``source``'s signatures taken before): they are hashed from the
    page cache, read by the passes that use them (`mapped.reading_from`) and copied file to file into the
    cache entry, never loaded into a ModelProto (a later ``load`` must return a model with its weights)."""
    return _prepare_loaded(load, fold_batchnorm, source, mapped=True, weights=weights)


def _prepare_loaded(load: Callable[[], onnx.ModelProto], fold_batchnorm: bool,
                    source: tuple[str | os.PathLike, dict] | None, mapped: bool, weights: MappedWeights | None = None
                    ) -> tuple[onnx.ModelProto, MappedWeights | None]:
    options = _file_options(fold_batchnorm)
    chosen = default_passes(**options)
    model = load()
    identities = pass_identities(chosen)
    key, content = None, None
    if identities is not None:
        content = content_digest(model, weights)
        key = key_for_digest(content.digest, identities, options)
        if source is not None:
            remember_digest(source[0], source[1], content.digest, cache_root())
    if key is not None and (cache_root() / key).is_dir():  # most likely a hit: let the model go first
        del model
        cached = _load(key, mapped)
        if cached is not None:
            _log.info("prepare: cache hit %s", key[:16])
            return cached
        model, weights, content = load(), None, None
    if key is not None:
        _log.info("prepare: cache miss %s, running %d passes", key[:16], len(chosen))
    with reading_from(weights):
        prepared = _run_passes(model, chosen)
    if key is not None:
        unchanged = None if source is None else lambda: _unchanged(source[1])
        store_cached(key, prepared, None, weights=weights, content=content, unchanged=unchanged)
        if mapped:
            again = _load(key, mapped)  # the stored entry, its weights mapped: the prepared copy can go
            if again is not None and again[1] is not None:
                return again
    if weights is not None:  # not cached (or a small entry): the model takes its weights in
        weights.materialize(prepared)
    return prepared, None


def _unchanged(signatures: dict) -> bool:
    """Whether every file of ``signatures`` (path -> `file_signature` taken before it was read) is unchanged."""
    return bool(signatures) and all(value is not None and file_signature(name) == value
                                    for name, value in signatures.items())


def _load(key: str, mapped: bool) -> tuple[onnx.ModelProto, MappedWeights | None] | None:
    if mapped:
        return load_cached_mapped(key)
    cached = load_cached(key)
    return None if cached is None else (cached, None)


def prepare_file_cached(path: str | os.PathLike, *, fold_batchnorm: bool = True
                        ) -> tuple[onnx.ModelProto, MappedWeights | None] | None:
    """The cached preparation of model file ``path`` (as `prepare_loaded_mapped` makes it) when the file and
    its external data are unchanged since they were last read (`inputs`): nothing of them is read. None
    otherwise."""
    options = _file_options(fold_batchnorm)
    identities = pass_identities(default_passes(**options))
    digest = remembered_digest(path, cache_root())
    if identities is None or digest is None:
        return None
    key = key_for_digest(digest, identities, options)
    cached = load_cached_mapped(key) if (cache_root() / key).is_dir() else None
    if cached is not None:
        _log.info("prepare: cache hit %s for unchanged file %s", key[:16], path)
    return cached


def _file_options(fold_batchnorm: bool) -> dict:
    return {"fold_batchnorm": fold_batchnorm, "fold_constants": True, "optimize": False}


def _prepare_work(work: onnx.ModelProto, chosen: tuple, key: str | None,
                  cache_dir: str | os.PathLike | None, max_size: int | str | None = None) -> onnx.ModelProto:
    """Run the passes on ``work`` (modified) and store the result under ``key``."""
    if key is not None:
        _log.info("prepare: cache miss %s, running %d passes", key[:16], len(chosen))
    work = _run_passes(work, chosen)
    if key is not None:
        store_cached(key, work, cache_dir, max_size=max_size)
    return work


def _run_passes(model: onnx.ModelProto, passes) -> onnx.ModelProto:
    for run_pass in passes:
        start = time.perf_counter()
        model, modified = run_pass(model)
        _log.debug("prepare: pass %s %s in %.3f s", getattr(run_pass, "__name__", run_pass),
                   "changed the model" if modified else "changed nothing", time.perf_counter() - start)
    return model
