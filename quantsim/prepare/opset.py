"""``upgrade_opset``: bring the model to a default-domain opset the sim supports, or say why not.

Pre: nodes in topological order (``check_graph``). Post: default-domain opset >= 13 and <= what the
installed onnxruntime loads; IR version loadable by onnxruntime.
Rules:
1. default-domain opset below ``MIN_OPSET`` (13: per-channel QuantizeLinear/DequantizeLinear) is
   converted with ``onnx.version_converter``; the IR version is raised to the minimum that opset needs
   (from below IR 4, initializers are dropped from the graph inputs, where that IR had to list them,
   so they stay constants rather than becoming overridable inputs). A conversion failure is a
   ``PrepareError`` naming the model's opset. Upsample (opset 7-9) and opset-10 Resize keep their
   asymmetric coordinates and onnxruntime's rounding (`quantsim.prepare.legacy_resize`: the converter
   alone gives them opset 11's half-pixel defaults), and a Hardmax keeps working on the flattened trailing
   block (`quantsim.prepare.legacy_hardmax`: the converter adapts Softmax and LogSoftmax, not Hardmax);
   tensors the converter renamed get their names back (`quantsim.prepare.converted_names`);
2. an opset above onnxruntime's maximum (the newest at which it loads QuantizeLinear/DequantizeLinear,
   found once per process by asking onnxruntime to load one-node models: there is no public API) is
   converted down to that maximum with ``onnx.version_converter``, with a ``PrepareWarning`` (models
   from the newest exporters, whose ops did not change since); where the converter cannot (an unknown
   opset, an op whose meaning changed without an adapter), a ``PrepareError`` states the maximum. An IR
   version above onnxruntime's maximum is a ``PrepareError`` stating it;
3. a model without a default-domain opset import gets one at ``MIN_OPSET`` (nothing to convert: the
   sim's Q/DQ need the domain); one already within range is left unchanged;
4. other domains (``com.microsoft``, custom) are not touched.
"""
from __future__ import annotations

import functools

import onnx
from onnx import helper

from quantsim.errors import PrepareError, PrepareWarning, one_line, warn_at_caller
from quantsim.graph.edit import default_opset
from quantsim.prepare.converted_names import restore_tensor_names
from quantsim.prepare.legacy_hardmax import flatten_legacy_hardmax
from quantsim.prepare.legacy_resize import legacy_resize_modes, restore_resize_modes

__all__ = ["MIN_OPSET", "upgrade_opset", "runtime_limits"]

MIN_OPSET = 13


def upgrade_opset(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Check the model against onnxruntime's limits and convert it to opset 13 if it is older."""
    version = default_opset(model)
    if version is None:  # no default-domain node (only ai.onnx.ml ops, say): import the domain the sim's Q/DQ need
        model.opset_import.add(domain="", version=MIN_OPSET)
        model.ir_version = max(model.ir_version, helper.find_min_ir_version_for([helper.make_opsetid("", MIN_OPSET)]))
        return model, True
    max_opset, max_ir = runtime_limits()
    import onnxruntime

    if version > max_opset:
        try:
            model = onnx.version_converter.convert_version(model, max_opset)
        except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors
            raise PrepareError(f"the model uses default-domain opset {version}, but onnxruntime "
                               f"{onnxruntime.__version__} supports at most opset {max_opset} and onnx's "
                               f"version converter cannot take it there ({one_line(str(exc))[:200]}); export the model at "
                               f"opset {MIN_OPSET}..{max_opset}") from exc
        warn_at_caller(f"the model uses default-domain opset {version}, newer than onnxruntime "
                       f"{onnxruntime.__version__}'s QuantizeLinear/DequantizeLinear (opset {max_opset}): "
                       f"converted down to opset {max_opset} with onnx's version converter", PrepareWarning)
        if model.ir_version > max_ir:
            model.ir_version = max(max_ir, helper.find_min_ir_version_for([helper.make_opsetid("", max_opset)]))
        return model, True
    if model.ir_version > max_ir:
        raise PrepareError(f"the model has IR version {model.ir_version}, but onnxruntime "
                           f"{onnxruntime.__version__} loads at most IR version {max_ir}; set "
                           f"model.ir_version (e.g. to {max_ir}) when building it")
    if version >= MIN_OPSET:
        return model, False
    resize_modes = legacy_resize_modes(model, version)
    model = flatten_legacy_hardmax(model, version)
    try:
        converted = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors
        raise PrepareError(f"the model uses default-domain opset {version}; converting it to opset {MIN_OPSET} "
                           f"with onnx.version_converter failed: {exc}. Export the model at opset "
                           f">= {MIN_OPSET} instead") from exc
    restore_resize_modes(converted, resize_modes)
    restore_tensor_names(model, converted)
    needed = helper.find_min_ir_version_for([helper.make_opsetid("", MIN_OPSET)])
    if converted.ir_version < 4:
        initializers = {t.name for t in converted.graph.initializer}
        inputs = [i for i in converted.graph.input if i.name not in initializers]
        del converted.graph.input[:]
        converted.graph.input.extend(inputs)
    converted.ir_version = max(converted.ir_version, needed)
    return converted, True


@functools.cache
def runtime_limits() -> tuple[int, int]:
    """``(max default-domain opset, max IR version)`` the installed onnxruntime loads."""
    max_opset = _highest(lambda v: _loads(v, 8), MIN_OPSET, onnx.defs.onnx_opset_version() + 8)
    max_ir = _highest(lambda v: _loads(MIN_OPSET, v), 7, onnx.IR_VERSION + 8)
    return max_opset, max_ir


def _highest(accepts, low: int, high: int) -> int:
    """Largest value in [low, high] that ``accepts`` (monotone: true up to some point); ``low`` if none."""
    while low < high:
        middle = (low + high + 1) // 2
        if accepts(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _loads(opset: int, ir_version: int) -> bool:
    import onnxruntime

    # the ops the sim itself adds (QuantizeLinear/DequantizeLinear at the model's opset), not just one op:
    # onnxruntime may load an opset whose Q/DQ kernels it does not implement yet
    value = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("QuantizeLinear", ["i", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    constants = [helper.make_tensor("s", onnx.TensorProto.FLOAT, [], [0.1]),
                 helper.make_tensor("z", onnx.TensorProto.UINT8, [], [128])]
    graph = helper.make_graph(nodes, "probe", [value], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
                              constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    try:
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal means "not supported"
        return False
    return True
