"""Give the tensors onnx's version converter renamed their names from the original model back.

Where an adapter rewrites a node (an opset-9 ``Upsample`` becoming a ``Resize``, a ``Slice`` whose
attributes become inputs, ...), the converter (1.23) names the new node's outputs ``_v_<n>`` unless they
are graph outputs, and drops the node's name. The sim's quantizers, its encodings files and the exports are
keyed by tensor names, so the Upsample output of a tf2onnx model would be ``_v_26`` there and match nothing in
the user's own model (or in another tool's files for it).

Rule (`restore_tensor_names`, subgraphs included): a node of the converted model that has the name, op type
and input / output counts of a node of the original gives each of its inputs and outputs that the
converter renamed (a name the original does not have) the original's name at the same position, provided
that name is still free in the converted model and the renaming is unambiguous. Names that nothing maps
back (the converter's own constants) stay as they are.
"""
from __future__ import annotations

import onnx

from quantsim.graph.edit import graphs_within

__all__ = ["restore_tensor_names"]


def _names(model: onnx.ModelProto) -> set[str]:
    names: set[str] = set()
    for graph in graphs_within(model.graph):
        names.update(v.name for v in [*graph.input, *graph.output, *graph.value_info])
        names.update(t.name for t in graph.initializer)
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
    names.discard("")
    return names


def restore_tensor_names(original: onnx.ModelProto, converted: onnx.ModelProto) -> int:
    """Rename, in place, the tensors of ``converted`` that the converter renamed (module docstring); returns
    how many were given their original names back."""
    before, after = _names(original), _names(converted)
    nodes = {(n.name, n.op_type, len(n.input), len(n.output)): n
             for graph in graphs_within(original.graph) for n in graph.node if n.name}
    mapping: dict[str, str] = {}
    refused: set[str] = set()
    for graph in graphs_within(converted.graph):
        for node in graph.node:
            source = nodes.get((node.name, node.op_type, len(node.input), len(node.output))) if node.name else None
            if source is None:
                continue
            pairs = [*zip(node.input, source.input), *zip(node.output, source.output)]
            for new, old in pairs:
                if not new or new == old or new in before or not old or old in after:
                    continue
                if mapping.get(new, old) != old:
                    refused.add(new)
                mapping[new] = old
    for name in refused:
        mapping.pop(name, None)
    if len(set(mapping.values())) != len(mapping):  # two renamed tensors claiming one name: keep both as they are
        counts: dict[str, int] = {}
        for old in mapping.values():
            counts[old] = counts.get(old, 0) + 1
        mapping = {new: old for new, old in mapping.items() if counts[old] == 1}
    if not mapping:
        return 0
    for graph in graphs_within(converted.graph):
        for node in graph.node:
            node.input[:] = [mapping.get(n, n) for n in node.input]
            node.output[:] = [mapping.get(n, n) for n in node.output]
        for value in [*graph.input, *graph.output, *graph.value_info]:
            value.name = mapping.get(value.name, value.name)
    return len(mapping)
