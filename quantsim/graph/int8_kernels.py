"""Whether onnxruntime's uint8 x int8 integer kernels are exact on this CPU.

On x86-64 CPUs with AVX2 but without AVX-512 VNNI / AVX-VNNI, onnxruntime's MLAS multiplies uint8
activations by int8 weights with ``vpmaddubsw``, which adds two ``u8 * s8`` products into a *saturating*
int16: ``255 * 127 * 2`` does not fit, so QLinearConv, QLinearMatMul, MatMulInteger and the fused Q/DQ
kernels can return wrong sums when activation codes and weight codes are both large (onnxruntime's
quantization guide documents this and suggests 7-bit weights, ``reduce_range``). The exact sim never runs
those kernels; the QDQ and integer exports and `QuantizationSimModel.fused_session` do, so on such a CPU
they may differ from the sim by far more than the one output step that fixed-point requantization costs.

The exports' ``weight_codes="uint8"`` (`quantsim.export.weight_codes`) stores the same weights as uint8
codes, which onnxruntime multiplies exactly on such CPUs; ``"auto"`` chooses it from this probe.

`uint8_int8_kernels_saturate` runs one tiny MatMulInteger whose exact result needs more than int16 pair sums
and compares it with the exact value; the answer is computed once per process.
"""
from __future__ import annotations

import functools
import logging

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

__all__ = ["uint8_int8_kernels_saturate", "warn_if_int8_kernels_saturate", "SATURATION_NOTE"]

_log = logging.getLogger(__name__)

SATURATION_NOTE = ("onnxruntime's uint8 x int8 kernels saturate on this CPU (AVX2 without VNNI: two products "
                   "are summed in int16), so integer kernels can differ from the sim by many output steps "
                   "here; a CPU with VNNI (or ARM) runs them exactly, uint8 weight codes (the same values: "
                   "weight_codes='uint8' of to_onnx_qdq / export_integer / export) run exactly here, and 7-bit "
                   "weights (param_type=qtype.int(7)) stay below the overflow")

_DEPTH = 64  # one dot product of 64 products 255 * 127: exact 2,072,640, with saturated pairs 32 * 32,767


def _probe_model() -> onnx.ModelProto:
    weights = np.full((_DEPTH, 4), 127, np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "int8_kernel_probe",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, _DEPTH])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 4])],
                              [numpy_helper.from_array(weights, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@functools.cache
def uint8_int8_kernels_saturate(provider: str = "CPUExecutionProvider") -> bool:
    """True when ``provider``'s uint8 x int8 integer kernels return a saturated sum on this machine (module
    docstring); False when they are exact or the probe cannot run on that provider."""
    try:
        session = ort.InferenceSession(_probe_model().SerializeToString(), providers=[provider])
        result = session.run(None, {"a": np.full((4, _DEPTH), 255, np.uint8)})[0]
    except Exception as exc:  # noqa: BLE001 - a provider that cannot run the probe is not known to saturate
        _log.debug("int8 kernel probe did not run on %s: %s", provider, exc)
        return False
    return bool(np.any(result != _DEPTH * 255 * 127))


def warn_if_int8_kernels_saturate(what: str, providers=None) -> None:
    """Log a warning naming ``what`` (an export or session), once per process, when the first of
    ``providers`` (default: the CPU provider) saturates uint8 x int8 sums on this machine."""
    first = providers[0] if providers else "CPUExecutionProvider"
    provider = first[0] if isinstance(first, tuple) else first
    if provider not in _warned and uint8_int8_kernels_saturate(provider):
        _warned.add(provider)
        _log.warning("%s: %s", what, SATURATION_NOTE)


_warned: set[str] = set()
