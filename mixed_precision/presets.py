"""Named precisions: a weight type and an activation type (AIMET's ``(param_type, activation_type)``), and
AMP candidates in AIMET's ``((act_bw, act_dtype), (param_bw, param_dtype))`` form."""
from __future__ import annotations

from dataclasses import dataclass

from quantsim import InvalidArgumentError, QuantizationDataType, float16, int4, int8, int16, qtype

__all__ = ["Precision", "PRESETS", "preset", "candidate"]


@dataclass(frozen=True)
class Precision:
    """What a node's parameters and output activations are simulated in."""

    name: str
    param_type: qtype
    activation_type: qtype


#: the named precisions, by name: W8A8, W4A8, W8A16, W16A16 and FP16 (parameters / output activations)
PRESETS: dict[str, Precision] = {p.name: p for p in (
    Precision("W8A8", int8, int8),
    Precision("W4A8", int4, int8),
    Precision("W8A16", int8, int16),
    Precision("W16A16", int16, int16),
    Precision("FP16", float16, float16),
)}


def preset(name: str | Precision) -> Precision:
    """The preset called ``name`` (case-insensitive); an error lists the known ones."""
    if isinstance(name, Precision):
        return name
    found = PRESETS.get(str(name).strip().upper())
    if found is None:
        raise InvalidArgumentError(f"unknown precision {name!r}; presets: {', '.join(PRESETS)}")
    return found


def _type_name(dtype: qtype) -> str:
    if dtype.is_float and dtype.bits == 8:
        return "F8" if "e4m3" in str(dtype) else "F8" + str(dtype).removeprefix("float8").upper()
    return f"F{dtype.bits}" if dtype.is_float else str(dtype.bits)


def candidate(value: str | Precision | tuple) -> Precision:
    """An AMP candidate: a preset (name or `Precision`) or AIMET's ``((act_bw, act_dtype), (param_bw,
    param_dtype))`` with ``QuantizationDataType`` (or "int"/"float") dtypes; a tuple matching a preset takes
    its name, others are named ``W<param>A<act>`` (``F16`` for float16, ``F8`` for float8e4m3fn, ``F8E5M2``).
    A type with no simulation (float32, int1, ...) is an error."""
    if isinstance(value, (str, Precision)):
        return preset(value)
    try:
        (act_bw, act_dtype), (param_bw, param_dtype) = value
        activation = qtype.from_legacy_repr(QuantizationDataType[act_dtype] if isinstance(act_dtype, str)
                                            else act_dtype, act_bw)
        param = qtype.from_legacy_repr(QuantizationDataType[param_dtype] if isinstance(param_dtype, str)
                                       else param_dtype, param_bw)
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"AMP candidate {value!r}: {error}") from None
    except (TypeError, ValueError, KeyError) as error:
        raise InvalidArgumentError(f"AMP candidate {value!r} is neither a preset ({', '.join(PRESETS)}) nor "
                                   f"((act_bw, act_dtype), (param_bw, param_dtype)): {error}") from None
    for dtype in (activation, param):
        if dtype.is_float and dtype.bits not in (8, 16):
            raise InvalidArgumentError(f"AMP candidate {value!r}: {dtype} has no simulation (a float32 tensor is "
                                       "an unquantized one; leave those quantizers disabled instead)")
    for known in PRESETS.values():
        if (known.param_type, known.activation_type) == (param, activation):
            return known
    return Precision(f"W{_type_name(param)}A{_type_name(activation)}", param, activation)
