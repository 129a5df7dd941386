"""Which activation quantizers of the sim are identities: left out of the ``weights="fake"`` graph (the exact sim).

A quantizer whose tensor is produced by an op that only selects among its inputs' values (Reshape, Concat, MaxPool,
nearest Resize, Relu, ...), from inputs already on exactly the same grid (same float32 scale, zero point,
storage type and ``[qmin, qmax]``), would map every value to itself. ``DequantizeLinear(QuantizeLinear(v))``
returns ``v`` bit for bit for any ``v`` that a DequantizeLinear with the same parameters produced (``v / s``
is within ``2^-7`` of the code for codes below ``2^16``, so it rounds back to it, and the same
DequantizeLinear recomputes ``v``), and 0 (Relu's output) is always on the grid. Leaving those Q/DQ passes
out changes no output bit.
"""
from __future__ import annotations

import onnx

from quantsim.graph.index import GraphIndex, node_attributes

__all__ = ["SELECTING_OPS", "selects_values", "redundant_activation_quantizers"]

# value-selecting ops: every output element is an element of a data input (or 0, for Relu), so values
# already on one grid stay on it. ``None``: all inputs are data. Only the first output of MaxPool selects.
SELECTING_OPS: dict[str, tuple[int, ...] | None] = {
    "Identity": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Transpose": (0,),
    "Expand": (0,), "Tile": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,),
    "Split": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,), "Relu": (0,), "GlobalMaxPool": (0,),
    "MaxPool": (0,), "Resize": (0,), "Upsample": (0,), "Concat": None, "Max": None, "Min": None,
}


def selects_values(node: onnx.NodeProto, output: int) -> bool:
    """Whether output ``output`` of ``node`` only holds values of its data inputs (or 0 for Relu)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in SELECTING_OPS:
        return False
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in node_attributes(node).items()}
    if node.op_type == "MaxPool":
        # no window may fall entirely into padding (its output would be the lowest float)
        kernel = list(attrs.get("kernel_shape", []))
        pads = list(attrs.get("pads", [])) or [0] * (2 * len(kernel))
        return (
            output == 0 and bool(kernel) and attrs.get("ceil_mode", 0) == 0
            and all(d == 1 for d in attrs.get("dilations", []))
            and len(pads) == 2 * len(kernel) and all(p < kernel[i % len(kernel)] for i, p in enumerate(pads))
        )
    if node.op_type in ("Resize", "Upsample"):
        return attrs.get("mode", "nearest") == "nearest" and (
            attrs.get("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize"
        )
    return True


def redundant_activation_quantizers(index: GraphIndex, planned: dict[str, tuple | None]) -> set[str]:
    """Tensors in ``planned`` (tensor -> grid key of the Q/DQ the sim puts on it) whose Q/DQ is an identity.

    Walks the graph in order, tracking which tensors hold values on a grid: quantized tensors, and outputs of
    value-selecting ops whose data inputs all sit on one grid. Nodes out of topological order only make it
    miss some redundant quantizers.
    """
    on_grid: dict[str, tuple | None] = {
        name: planned[name] for name in index.graph_inputs
        if planned.get(name) is not None and name not in index.graph_outputs
    }
    redundant: set[str] = set()
    for node in index.nodes:
        carried = None
        if node.op_type in SELECTING_OPS:
            positions = SELECTING_OPS[node.op_type]
            data = [node.input[i] for i in (positions if positions is not None else range(len(node.input)))
                    if i < len(node.input)]
            keys = {on_grid.get(name) for name in data}
            if data and all(data) and len(keys) == 1 and None not in keys:
                carried = keys.pop()
        for position, name in enumerate(node.output):
            if not name:
                continue
            carries = carried is not None and selects_values(node, position)
            if name in planned:
                if carries and planned[name] == carried:
                    redundant.add(name)
                if planned[name] is not None:
                    on_grid[name] = planned[name]
            elif carries:
                on_grid[name] = carried
    return redundant
