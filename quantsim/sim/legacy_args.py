"""AIMET's deprecated QuantizationSimModel arguments, mapped onto the current keywords.

AIMET 2.x still accepts the 1.x signature (positional arguments after ``model`` or the keywords
``default_param_bw``, ``default_activation_bw``, ``use_symmetric_encodings``, ``default_data_type``,
``rounding_mode``, ``use_cuda``, ``device``) with a DeprecationWarning; so does this SDK, with AIMET's
rules: ``use_symmetric_encodings`` is ignored (the config decides), ``rounding_mode`` must be
"nearest", ``providers`` cannot be combined with ``use_cuda``/``device``, and the legacy dtype
arguments cannot be mixed with ``param_type``/``activation_type``.
"""
from __future__ import annotations

from quantsim.core.dtypes import QuantizationDataType, as_bitwidth, qtype
from quantsim.errors import InvalidStateError, InvalidTypeError, warn_at_caller

__all__ = ["LEGACY_POSITIONAL_ORDER", "LEGACY_KEYWORDS", "map_legacy_arguments"]

LEGACY_POSITIONAL_ORDER = (
    "dummy_input", "quant_scheme", "rounding_mode", "default_param_bw", "default_activation_bw",
    "use_symmetric_encodings", "use_cuda", "device", "config_file", "default_data_type",
    "user_onnx_libs", "providers", "path",
)
LEGACY_KEYWORDS = frozenset(
    {"rounding_mode", "default_param_bw", "default_activation_bw", "use_symmetric_encodings",
     "default_data_type", "use_cuda", "device"}
)


def map_legacy_arguments(args: tuple, legacy: dict, current: dict) -> dict:
    """Merge positional/legacy arguments into ``current`` (the new-style keywords); returns it."""
    if len(args) > len(LEGACY_POSITIONAL_ORDER):
        raise InvalidTypeError(f"QuantizationSimModel takes at most {len(LEGACY_POSITIONAL_ORDER) + 1} positional arguments")
    unknown = set(legacy) - LEGACY_KEYWORDS
    if unknown:
        raise InvalidTypeError(f"QuantizationSimModel got unexpected keyword argument(s) {sorted(unknown)}")
    legacy = dict(legacy)
    for name, value in zip(LEGACY_POSITIONAL_ORDER, args):
        if name in LEGACY_KEYWORDS:
            legacy[name] = value
        else:
            current[name] = value
    if not args and not legacy:
        return current
    warn_at_caller(
        "positional arguments and default_param_bw/default_activation_bw/use_symmetric_encodings/"
        "default_data_type/rounding_mode/use_cuda/device are deprecated; use param_type=, activation_type=, "
        "providers= keywords",
        DeprecationWarning
    )
    rounding = legacy.pop("rounding_mode", None)
    if rounding and rounding != "nearest":  # None (the legacy positional default) means "nearest", as in AIMET
        raise InvalidTypeError(f"rounding_mode {rounding!r} is not supported; only 'nearest'")
    if legacy.pop("use_symmetric_encodings", None) is not None:
        warn_at_caller("use_symmetric_encodings has no effect (as in aimet-onnx 2.x): the config file decides "
                       "which quantizers are symmetric (its 'is_symmetric' keys)", UserWarning)
    use_cuda, device = legacy.pop("use_cuda", None), legacy.pop("device", None)
    if use_cuda is not None or device is not None:
        if current.get("providers") is not None:
            raise InvalidStateError("providers cannot be combined with the legacy use_cuda/device arguments")
        if use_cuda:
            current["providers"] = [("CUDAExecutionProvider", {"device_id": device or 0}), "CPUExecutionProvider"]
    # like AIMET, a legacy dtype argument given as None counts as not given
    dtype_args = {key: legacy[key] for key in ("default_param_bw", "default_activation_bw", "default_data_type")
                  if legacy.get(key) is not None}
    if dtype_args:
        if current.get("param_type_given") or current.get("activation_type_given"):
            raise InvalidStateError("the legacy bitwidth/data-type arguments cannot be combined with param_type/activation_type")
        data_type = dtype_args.get("default_data_type", QuantizationDataType.int)
        current["param_type"] = qtype.from_legacy_repr(
            data_type, as_bitwidth(dtype_args.get("default_param_bw", 8), "default_param_bw"))
        current["activation_type"] = qtype.from_legacy_repr(
            data_type, as_bitwidth(dtype_args.get("default_activation_bw", 8), "default_activation_bw"))
    return current
