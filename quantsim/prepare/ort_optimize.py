"""``optimize_with_ort``: onnxruntime's basic graph optimisations, applied to the model itself.

Pre: the model loads in onnxruntime. Post: the model onnxruntime writes after
``GraphOptimizationLevel.ORT_ENABLE_BASIC`` on the CPU provider (``optimized_model_filepath`` in a
temporary folder; a large model goes through external-data files both ways).
Rules (onnxruntime's, not ours): semantics-preserving rewrites only, default-domain ops only:
constant folding, redundant node elimination (Identity, Dropout, ...), Conv/BatchNorm/Add/Mul fusions,
Reshape fusion. Off by default in ``prepare``: the result depends on the installed onnxruntime
version (part of the cache key), and node names may change (``prepare`` names and infers again after).
``modified`` is True when the node list or the set of initializers changed.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from quantsim.graph.large_models import is_large, save_model

__all__ = ["optimize_with_ort"]


def optimize_with_ort(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Run onnxruntime's basic optimisations and return the model it writes (rules above)."""
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="quantsim-ort-") as folder:
        source, target = Path(folder, "model.onnx"), Path(folder, "optimized.onnx")
        save_model(model, source)
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(target)
        if is_large(model):
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                             "optimized.onnx.data")
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                             "1024")
        onnxruntime.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(target))
    return optimized, _structure(optimized) != _structure(model)


def _structure(model: onnx.ModelProto) -> tuple:
    nodes = tuple((n.op_type, tuple(n.input), tuple(n.output)) for n in model.graph.node)
    return nodes, frozenset(t.name for t in model.graph.initializer)
