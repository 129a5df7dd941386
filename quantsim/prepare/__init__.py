"""Model preparation: the passes that turn a user's ONNX model into the graph the sim is built on."""
from __future__ import annotations

import onnx

from .passes import constants_to_initializers, infer_shapes, name_nodes

__all__ = ["prepare", "DEFAULT_PASSES"]

DEFAULT_PASSES = (name_nodes, constants_to_initializers, infer_shapes)


def prepare(model: onnx.ModelProto, passes=DEFAULT_PASSES) -> onnx.ModelProto:
    """Run ``passes`` in order on a copy of ``model`` and return the prepared copy.

    The caller's ModelProto is never modified.
    """
    work = onnx.ModelProto()
    work.CopyFrom(model)
    for run_pass in passes:
        work, _ = run_pass(work)
    return work
