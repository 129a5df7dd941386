"""Two-input ``Einsum`` nodes that are a (batched) matrix product -> ``Transpose`` + ``MatMul`` (+ ``Transpose``).

PyTorch exports attention written with ``torch.einsum`` (torchvision's MaxViT: ``'B G H I D, B G H J D ->
B G H I J'``) as ``Einsum``: the sim gives it no MatMul quantizers and the integer export has no lowering for
it. The same product as ``MatMul`` gets the placement, QDQ export and ``QLinearMatMul`` lowering of any other
MatMul of two activations.

The equation alone decides (`plan_einsum`). Whitespace is ignored; it needs two operands, an explicit
``->``, letters only (no ``...``), no letter twice in one operand or in the output. Each letter is

* batch: in both operands and the output;
* left / right: in the first / second operand and the output only;
* contracted: in both operands, not in the output.

A letter in one operand only and not in the output (a sum over it) refuses the rewrite, and there must be
exactly one contracted letter and one left and one right letter (one matrix product, no Reshape). Then ``A``
is transposed to ``batch + left + contracted``, ``B`` to ``batch + contracted + right`` (batch letters in the
output's order in both, since MatMul broadcasts leading dimensions by position), ``MatMul`` gives ``batch +
left + right`` and a last ``Transpose`` the output's order; a Transpose that would not move anything is left
out. Without batch letters one operand may have more left (right) letters: all but the last in the output's
order become leading dimensions that MatMul broadcasts the other, 2-D operand over (``'btd,de->bte'``, an
Einsum-written linear layer). `matmul_nodes` builds the nodes; `rewrite_einsums` rewrites a model's main
graph. An Einsum is also left as it is when an operand that needs a Transpose is an initializer (the
Transpose would hide the weight from the weight quantizer) or when its type is known and not one MatMul
computes (e.g. int8).

The last new node writes the Einsum's output, so quantizers, encodings and overrides keyed by that tensor
name stay; the new nodes and intermediate tensors take fresh names derived from the Einsum's name and take
its place in the node order. Outputs equal the Einsum's up to float summation order.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from quantsim.graph.index import GraphIndex

__all__ = ["EinsumPlan", "plan_einsum", "matmul_nodes", "rewrite_einsums"]

_MATMUL_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE,
                           TensorProto.INT32, TensorProto.INT64, TensorProto.UINT32, TensorProto.UINT64})
"""Element types MatMul (opset 13) computes; Einsum takes every numeric type."""


@dataclass(frozen=True)
class EinsumPlan:
    """The Transpose permutations around the MatMul; None where no Transpose is needed."""

    perm_a: tuple[int, ...] | None
    perm_b: tuple[int, ...] | None
    perm_out: tuple[int, ...] | None


def _terms(equation: str) -> tuple[list[str], str] | None:
    """``([operand letters...], output letters)``, or None for an equation outside the rules."""
    text = "".join(equation.split())
    if text.count("->") != 1:
        return None
    inputs, output = text.split("->")
    terms = inputs.split(",")
    for term in (*terms, output):
        if not all(c.isascii() and c.isalpha() for c in term) or len(set(term)) != len(term):
            return None
    return terms, output


def _permutation(source: str, order: str) -> tuple[int, ...] | None:
    """The Transpose ``perm`` taking axes labelled ``source`` to ``order``; None for the identity."""
    perm = tuple(source.index(c) for c in order)
    return None if perm == tuple(range(len(perm))) else perm


def plan_einsum(equation: str) -> EinsumPlan | None:
    """How Einsum ``equation`` becomes Transpose + MatMul + Transpose (module docstring); None: it does not."""
    parsed = _terms(equation)
    if parsed is None or len(parsed[0]) != 2:
        return None
    (a, b), out = parsed
    if any(c not in a and c not in b for c in out):
        return None
    if any(c not in out and c not in (b if c in a else a) for c in a + b):
        return None  # a letter summed over within one operand
    batch = "".join(c for c in out if c in a and c in b)
    left = "".join(c for c in out if c in a and c not in b)
    right = "".join(c for c in out if c in b and c not in a)
    contracted = "".join(c for c in a if c in b and c not in out)
    if len(contracted) != 1 or not left or not right:
        return None
    if (batch and (len(left) > 1 or len(right) > 1)) or (len(left) > 1 and len(right) > 1):
        return None  # extra letters would need an Unsqueeze to broadcast by position
    product = batch + left[:-1] + right[:-1] + left[-1] + right[-1]
    return EinsumPlan(_permutation(a, batch + left + contracted),
                      _permutation(b, batch + right[:-1] + contracted + right[-1]), _permutation(product, out))


def matmul_nodes(node: onnx.NodeProto, plan: EinsumPlan, index: GraphIndex) -> list[onnx.NodeProto]:
    """The nodes replacing Einsum ``node`` under ``plan``, in order; names come from ``index.fresh_name``."""
    base = node.name or node.output[0]
    nodes: list[onnx.NodeProto] = []
    operands = []
    for slot, perm in (("a", plan.perm_a), ("b", plan.perm_b)):
        operand = node.input[0 if slot == "a" else 1]
        if perm is not None:
            moved = index.fresh_name(f"{base}/transpose_{slot}")
            nodes.append(helper.make_node("Transpose", [operand], [moved], name=moved, perm=list(perm)))
            operand = moved
        operands.append(operand)
    if plan.perm_out is None:
        nodes.append(helper.make_node("MatMul", operands, [node.output[0]], name=index.fresh_name(f"{base}/matmul")))
        return nodes
    product = index.fresh_name(f"{base}/matmul")
    nodes.append(helper.make_node("MatMul", operands, [product], name=product))
    nodes.append(helper.make_node("Transpose", [product], [node.output[0]],
                                  name=index.fresh_name(f"{base}/transpose_out"), perm=list(plan.perm_out)))
    return nodes


def _plan_for(node: onnx.NodeProto, index: GraphIndex) -> EinsumPlan | None:
    """`plan_einsum` of a default-domain two-input Einsum node that may be rewritten, else None."""
    if (node.op_type != "Einsum" or node.domain not in ("", "ai.onnx") or len(node.input) != 2
            or not all(node.input) or len(node.output) != 1):
        return None
    equation = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "equation"), None)
    if not isinstance(equation, bytes):
        return None
    plan = plan_einsum(equation.decode("utf-8", errors="replace"))
    if plan is None:
        return None
    for name, perm in zip(node.input, (plan.perm_a, plan.perm_b)):
        if perm is not None and index.is_constant(name):
            return None
    types = {index.elem_type.get(name) for name in (*node.input, node.output[0])} - {None}
    return plan if types <= _MATMUL_TYPES else None


def rewrite_einsums(model: onnx.ModelProto) -> bool:
    """Replace each matrix-product ``Einsum`` of the main graph by Transpose/MatMul nodes in place; True
    when one was replaced."""
    if not any(node.op_type == "Einsum" for node in model.graph.node):
        return False
    index = GraphIndex(model)
    nodes: list[onnx.NodeProto] = []
    modified = False
    for node in model.graph.node:
        plan = _plan_for(node, index)
        if plan is None:
            nodes.append(node)
            continue
        nodes.extend(matmul_nodes(node, plan, index))
        modified = True
    if modified:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return modified
