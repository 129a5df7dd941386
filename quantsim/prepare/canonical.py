"""``canonicalize_ops``: ops exporters write in a legacy or general spelling become the ops the rest of the
library knows: a two-input ``Sum`` becomes ``Add``, a matrix-product ``Einsum`` becomes ``MatMul``.

Caffe2 and early PyTorch exports write a residual connection as the variadic ``Sum``. With two inputs it is
``Add`` (both broadcast multidirectionally from opset 8; the upgrade to opset 13 runs first), but placement
rules (the ``Add -> Relu`` supergroup, which quantizes only the Relu output), the QDQ export and the integer
lowering (``QLinearAdd``) are keyed by ``Add``: a ``Sum`` gets an extra quantizer on its output and stays
float in the integer export. Rules:

* ``Sum(a, b)`` -> ``Add(a, b)``;
* ``Sum(a)`` -> ``Identity(a)`` (a copy);
* ``Sum`` of three or more inputs is left as it is (a chain of Adds would add rounding points the float
  model does not have; such a Sum stays float in the integer export).

The node keeps its name and output name, so quantizer names, encodings and user overrides keyed by tensor
name are unchanged; a config rule for op type ``Sum`` now applies as ``Add``'s. Outputs are bit-identical.
Pre: default-domain opset >= 8. Post: no one- or two-input default-domain ``Sum`` is left in the main graph.

PyTorch writes ``torch.einsum`` attention (torchvision's MaxViT) as ``Einsum``, which gets no MatMul
quantizers in the sim and no integer lowering. A two-input Einsum whose equation is one (batched) matrix
product, e.g. ``'bhid,bhjd->bhij'``, becomes ``Transpose`` + ``MatMul`` (+ ``Transpose``): the rules (the
equation decides; no sums, diagonals or ellipses; no Transpose in front of an initializer) are in
`quantsim.prepare.einsum`. The last new node writes the Einsum's output name; outputs equal the Einsum's up to
float summation order. Other Einsums are left as they are.
"""
from __future__ import annotations

import onnx

from quantsim.graph.edit import default_opset
from quantsim.prepare.einsum import rewrite_einsums

__all__ = ["canonicalize_ops"]

_MIN_OPSET = 8  # Sum and Add broadcast alike from here (Sum-6 has no broadcasting)


def canonicalize_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Rewrite one- and two-input ``Sum`` nodes as ``Identity`` / ``Add`` and matrix-product ``Einsum`` nodes
    as ``Transpose`` + ``MatMul`` (module docstring)."""
    opset = default_opset(model)
    if opset is None or opset < _MIN_OPSET:
        return model, False
    modified = False
    for node in model.graph.node:
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or len(node.input) > 2:
            continue
        inputs = [name for name in node.input if name]
        if len(inputs) != len(node.input) or not inputs:
            continue
        node.op_type = "Add" if len(inputs) == 2 else "Identity"
        modified = True
    if rewrite_einsums(model):
        modified = True
    return model, modified
