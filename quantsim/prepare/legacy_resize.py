"""Keep what opset 7-10 ``Upsample`` and opset 10 ``Resize`` compute when onnx's version converter lifts them.

Before opset 11 these ops had no ``coordinate_transformation_mode`` or ``nearest_mode``: a pixel's source
coordinate was ``x_out / scale`` (asymmetric), and onnxruntime picks the nearest source pixel by truncating
it (``floor``) where an axis is upsampled and by ``ceil`` where it is downsampled. onnx's version converter
(1.23) turns both into ``Resize`` without these attributes, so the converted node takes opset 11's defaults,
``half_pixel`` and ``round_prefer_floor``: a bilinear 2x upsampling moves by half a pixel (1.75 on a ramp of
0..23), a nearest one by a non-integer factor picks other pixels. tf2onnx writes exactly these ops for Keras'
``UpSampling2D`` and TF1's ``resize_*`` below opset 11.

Rules (`legacy_resize_modes` reads the model before the conversion, `restore_resize_modes` writes after it;
nodes are matched by their order, which the converter keeps, not by names, which it drops; subgraphs
included; the node's name is given back):
1. every ``Upsample`` (its scales are >= 1 by definition) and every opset-10 ``Resize`` becomes
   ``coordinate_transformation_mode="asymmetric"``;
2. mode ``nearest`` also gets ``nearest_mode``: ``floor`` for an Upsample, and for a Resize whose constant
   scales are all >= 1; ``ceil`` for a Resize whose constant scales are all <= 1; a Resize that upsamples
   some axes and downsamples others cannot be one opset-11 Resize: ``PrepareError`` naming it; a Resize
   whose scales are computed gets ``floor`` (upsampling, the common case) with a ``PrepareWarning``;
3. linear and cubic modes need only rule 1 (onnxruntime's opset-10 kernels interpolate asymmetrically).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.errors import PrepareError, PrepareWarning, warn_at_caller
from quantsim.graph.edit import graphs_within

__all__ = ["legacy_resize_modes", "restore_resize_modes"]


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    for graph in graphs_within(model.graph):
        found.update((t.name, numpy_helper.to_array(t)) for t in graph.initializer)
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return found


def _nearest_mode(node: onnx.NodeProto, scales: np.ndarray | None) -> str:
    if node.op_type == "Upsample":
        return "floor"
    label = f"Resize node {node.name or node.output[0]!r}"
    if scales is None:
        warn_at_caller(f"{label} (opset 10, mode nearest) has computed scales: converted to opset 11's Resize "
                       "with nearest_mode='floor', which equals onnxruntime's opset-10 kernel when it upsamples "
                       "(if it downsamples, onnxruntime's opset-10 kernel rounds up: export at opset >= 11)",
                       PrepareWarning)
        return "floor"
    if np.all(scales >= 1):
        return "floor"
    if np.all(scales <= 1):
        return "ceil"
    raise PrepareError(f"{label} (opset 10, mode nearest) upsamples some axes and downsamples others (scales "
                       f"{scales.tolist()}): onnxruntime's opset-10 kernel rounds down on the first and up on the "
                       "others, which no single opset-11 Resize can express; export the model at opset >= 11")


def legacy_resize_modes(model: onnx.ModelProto, opset: int) -> list[tuple[str, dict[str, str]]]:
    """``(node name, attributes it needs after conversion to opset >= 11)`` for each Upsample and (at ``opset``
    10) Resize node of a model at default-domain ``opset`` < 11, in graph order (subgraphs after their node)."""
    if opset >= 11:
        return []
    constants: dict[str, np.ndarray] | None = None
    modes: list[tuple[str, dict[str, str]]] = []
    for graph in graphs_within(model.graph):
        for node in graph.node:
            if node.domain not in ("", "ai.onnx") or node.op_type not in ("Upsample", "Resize"):
                continue
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            mode = attributes.get("mode", b"nearest")
            mode = mode.decode() if isinstance(mode, bytes) else str(mode)
            wanted = {"coordinate_transformation_mode": "asymmetric"}
            if mode == "nearest":
                scales = None
                if "scales" in attributes:  # Upsample-7
                    scales = np.asarray(attributes["scales"], dtype=np.float64)
                elif len(node.input) > 1:
                    if constants is None:
                        constants = _constants(model)
                    if node.input[1] in constants:
                        scales = np.asarray(constants[node.input[1]], dtype=np.float64).reshape(-1)
                wanted["nearest_mode"] = _nearest_mode(node, scales)
            modes.append((node.name, wanted))
    return modes


def restore_resize_modes(model: onnx.ModelProto, modes: list[tuple[str, dict[str, str]]]) -> None:
    """Set the attributes of `legacy_resize_modes` on the converted model's Resize nodes (in place), and
    their names (the converter drops them, and renames outputs that are not graph outputs). The converter
    keeps the order of the nodes, so the n-th Resize is the n-th Upsample/Resize of the original."""
    if not modes:
        return
    converted = [node for graph in graphs_within(model.graph) for node in graph.node
                 if node.op_type == "Resize" and node.domain in ("", "ai.onnx")]
    if len(converted) != len(modes):  # better no model than a silently shifted one
        raise PrepareError(f"onnx's version converter turned {len(modes)} Upsample/Resize nodes into "
                           f"{len(converted)} Resize nodes, so their opset-10 coordinates cannot be kept; "
                           "export the model at opset >= 11")
    for node, (name, wanted) in zip(converted, modes):
        kept = [a for a in node.attribute if a.name not in wanted]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in sorted(wanted.items())])
        if name and not node.name:
            node.name = name
