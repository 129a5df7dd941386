"""The catalogue of preparation passes, one module each. Every pass takes a ModelProto it may modify
(``prepare`` hands it a private copy) and returns ``(model, modified)``; each keeps the model's outputs
unchanged (up to float rounding where it computes: BatchNorm, affine and constant folding). The rules and
pre/post-conditions of each pass are in its module's docstring.
"""
from __future__ import annotations

from quantsim.prepare.activations import fuse_activations
from quantsim.prepare.batchnorm import fold_batchnorm, fold_channel_affine
from quantsim.prepare.canonical import canonicalize_ops
from quantsim.prepare.constants import constants_to_initializers
from quantsim.prepare.folding import fold_constants
from quantsim.prepare.naming import check_graph, name_nodes
from quantsim.prepare.opset import upgrade_opset
from quantsim.prepare.ort_optimize import optimize_with_ort
from quantsim.prepare.shapes import infer_shapes

__all__ = [
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
]
