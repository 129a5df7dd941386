"""AIMET's ``encodings_to_onnx_qdq``: a float model plus an encodings file -> the standard QDQ model."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import onnx

from quantsim.errors import InvalidArgumentError

__all__ = ["encodings_to_onnx_qdq"]


def encodings_to_onnx_qdq(model: onnx.ModelProto | str | os.PathLike, encodings: str | os.PathLike | Mapping[str, Any],
                          *, prequantize_constants: bool = False, force_activation_as: str | None = "unsigned",
                          weight_codes: str = "int8", **sim_kwargs) -> onnx.ModelProto:
    """The QDQ model of ``model`` quantized exactly as ``encodings`` (a 0.6.1 / 1.0.0 / 2.0.0 / 2.1.0 file
    or dict) says; tensors the encodings do not name stay float.

    It builds a sim of ``model`` (``sim_kwargs`` go to `QuantizationSimModel`, e.g. ``config_file``),
    loads the encodings non-strictly and returns `QuantizationSimModel.to_onnx_qdq`. Weights are always
    stored as integers behind DequantizeLinear (the numbers are those of AIMET's ``prequantize_constants``
    either way); 2.0.0 activation grids written unsigned or signed are both read back as the same grid,
    so ``force_activation_as`` needs no effect and is accepted for AIMET scripts. ``weight_codes`` as in
    `QuantizationSimModel.to_onnx_qdq`.
    """
    from quantsim.encodings.transfer import load_encodings_to_sim
    from quantsim.sim.model import QuantizationSimModel

    if force_activation_as not in ("unsigned", "signed", None):
        raise InvalidArgumentError(f"force_activation_as must be 'unsigned', 'signed' or None, got {force_activation_as!r}")
    del prequantize_constants  # see the docstring
    sim_kwargs.setdefault("progress", False)
    sim = QuantizationSimModel(model, **sim_kwargs)
    load_encodings_to_sim(sim, encodings, strict=False)
    return sim.to_onnx_qdq(weight_codes=weight_codes)
