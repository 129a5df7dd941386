"""AIMET's ``encodings_to_onnx_qdq``: a float model plus an encodings file -> the standard QDQ model."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import onnx

from quantsim.export.qdq_forms import check_activation_signedness

__all__ = ["encodings_to_onnx_qdq", "AS_GIVEN"]

AS_GIVEN = {"fold_batchnorm": False, "range_health": False, "depthwise_supergroups": False}
"""The sim an encodings file is applied to is the model as given, with AIMET's placement: BatchNormalization kept
(a file written by aimet-onnx names the BN scale and output), no calibrated decisions (there is no calibration:
every grid comes from the file) and a quantizer between a depthwise convolution and its activation."""


def _has_int32_entries(encodings: str | os.PathLike | Mapping[str, Any]) -> bool:
    """Whether the encodings carry 32-bit entries (the int32 biases of a 2.0.0 export)."""
    from quantsim.encodings import encodings_from_dict, read_encodings_file

    _, records = (encodings_from_dict(encodings) if isinstance(encodings, Mapping)
                  else read_encodings_file(encodings))
    return any(r.bits == 32 for r in records)


def encodings_to_onnx_qdq(model: onnx.ModelProto | str | os.PathLike, encodings: str | os.PathLike | Mapping[str, Any],
                          *, prequantize_constants: bool = False, force_activation_as: str | None = "unsigned",
                          weight_codes: str = "int8", **sim_kwargs) -> onnx.ModelProto:
    """The QDQ model of ``model`` quantized exactly as ``encodings`` (a 0.6.1 / 1.0.0 / 2.0.0 / 2.1.0 file
    or dict) says; tensors the encodings do not name stay float.

    It builds a sim of ``model`` as given (`AS_GIVEN`: no BatchNormalization fold, no calibrated decisions,
    AIMET's depthwise placement; ``sim_kwargs`` go to `QuantizationSimModel` and may override them, e.g.
    ``config_file``),
    loads the encodings non-strictly and returns `QuantizationSimModel.to_onnx_qdq`, as AIMET does: biases
    become int32 codes behind DequantizeLinear when the encodings carry int32 entries (a 2.0.0 export) and
    stay float otherwise; ``prequantize_constants`` (default False, as in AIMET: weights as fake-quantized
    floats behind QuantizeLinear -> DequantizeLinear; True: integer codes behind DequantizeLinear) and
    ``force_activation_as`` ("unsigned", "signed" or None: the storage type of activation codes) choose
    between spellings of the same values (`quantsim.export.qdq_forms`). ``weight_codes`` as in
    `QuantizationSimModel.to_onnx_qdq`.
    """
    from quantsim.encodings.transfer import load_encodings_to_sim
    from quantsim.sim.model import QuantizationSimModel

    check_activation_signedness(force_activation_as)
    int32_bias = _has_int32_entries(encodings)
    sim_kwargs.setdefault("progress", False)
    for switch, value in AS_GIVEN.items():
        sim_kwargs.setdefault(switch, value)
    sim = QuantizationSimModel(model, **sim_kwargs)
    load_encodings_to_sim(sim, encodings, strict=False)
    return sim.to_onnx_qdq(export_int32_bias=int32_bias, prequantize_constants=prequantize_constants,
                           force_activation_as=force_activation_as, weight_codes=weight_codes)
