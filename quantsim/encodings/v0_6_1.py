"""AIMET encodings format 0.6.1 (deprecated).

Sections ``param_encodings`` / ``activation_encodings`` map a tensor name to a list with one dict per
channel (a single dict per tensor): ``bitwidth``, ``dtype`` "int", ``is_symmetric`` as the *string*
"True"/"False", ``max``, ``min``, ``offset`` (float, AIMET convention ``<= 0``) and ``scale``. ``min`` is
``scale * offset`` and ``max`` is ``scale * (offset + 2^bw - 1)``, so a strict symmetric grid reads
``max = 128 * scale`` exactly as AIMET writes it. float16 is ``[{"bitwidth": 16, "dtype": "float"}]``.
Blockwise encodings have no 0.6.1 form; a per-channel encoding of one channel reads back per tensor.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from quantsim.encodings.grids import (
    check_int_bits,
    check_writable,
    flat_offsets,
    flat_scales,
    from_aimet,
    granularity,
)
from quantsim.encodings.record import FLOAT16_BITS, TensorEncoding
from quantsim.encodings.validate import (
    Where,
    as_bool,
    as_int,
    as_number,
    as_str,
    integral,
    positive_scales,
    require,
)

__all__ = ["VERSION", "SECTIONS", "write_sections", "read_sections", "read_section"]

VERSION = "0.6.1"
SECTIONS = (("activation_encodings", "activation"), ("param_encodings", "param"))


def _write_entry(where: Where, record: TensorEncoding) -> list[dict[str, Any]]:
    if record.is_float:
        return [{"bitwidth": FLOAT16_BITS, "dtype": "float"}]
    enc = record.grid
    check_writable(where, enc)
    if granularity(where, enc) == "block":
        raise where.error("blockwise encodings cannot be written in format 0.6.1 (use 1.0.0 or 2.0.0)")
    steps = (1 << enc.bits) - 1
    flag = "True" if enc.symmetric else "False"
    channels = []
    for scale, offset in zip(flat_scales(enc), flat_offsets(enc)):
        channels.append(
            {
                "bitwidth": enc.bits,
                "dtype": "int",
                "is_symmetric": flag,
                "max": scale * (offset + steps),
                "min": scale * offset,
                "offset": offset,
                "scale": scale,
            }
        )
    return channels


def write_sections(records: list[TensorEncoding], source: str) -> dict[str, Any]:
    """``{"activation_encodings": {...}, "param_encodings": {...}}`` (kind None goes with activations)."""
    out: dict[str, Any] = {"activation_encodings": {}, "param_encodings": {}}
    for record in records:
        section = "param_encodings" if record.kind == "param" else "activation_encodings"
        out[section][record.name] = _write_entry(Where(source, f"tensor {record.name!r}"), record)
    return out


def _read_entry(where: Where, name: str, value: Any, kind: str) -> TensorEncoding:
    if not isinstance(value, list) or not value:
        raise where.error("expected a non-empty list of per-channel encoding objects")
    first = value[0]
    dtype = as_str(where, require(where, first, "dtype"), "dtype").lower()
    bits = as_int(where, require(where, first, "bitwidth"), "bitwidth")
    if dtype == "float":
        if bits != FLOAT16_BITS or len(value) != 1:
            raise where.error(f"float encodings must be a single {{bitwidth 16}} object (float16), got {value!r:.80}")
        return TensorEncoding.float16(name, kind)
    if dtype != "int":
        raise where.error(f"'dtype' must be \"int\" or \"float\", got {dtype!r}")
    check_int_bits(where, bits, "bitwidth")
    symmetric = as_bool(where, require(where, first, "is_symmetric"), "is_symmetric", allow_strings=True)
    scales, offsets = [], []
    for index, channel in enumerate(value):
        at = where if len(value) == 1 else where.at(f"{where.entry} channel {index}")
        if as_str(at, require(at, channel, "dtype"), "dtype").lower() != "int":
            raise at.error("all channels must have dtype \"int\"")
        if as_int(at, require(at, channel, "bitwidth"), "bitwidth") != bits:
            raise at.error("all channels must have the same bitwidth")
        flag = as_bool(at, require(at, channel, "is_symmetric"), "is_symmetric", allow_strings=True)
        if flag != symmetric:
            raise at.error("all channels must have the same is_symmetric")
        scales.append(as_number(at, require(at, channel, "scale"), "scale"))
        offsets.append(as_number(at, require(at, channel, "offset"), "offset"))
        for key in ("min", "max"):
            if key in channel:
                as_number(at, channel[key], key)
    scale = positive_scales(where, np.array(scales, dtype=np.float64), "scale")
    offset = integral(where, np.array(offsets, dtype=np.float64), "offset")
    if len(value) == 1:
        scale, offset = scale[0], offset[0]
    return TensorEncoding.from_encoding(name, from_aimet(where, scale, offset, bits, symmetric), kind)


def read_section(data: Any, source: str, section: str, kind: str) -> list[TensorEncoding]:
    """One ``{name: [channel dicts]}`` section (also a bare param-encodings dict)."""
    if not isinstance(data, dict):
        raise Where(source, section).error(f"expected a JSON object mapping names, got {type(data).__name__}")
    records = []
    for name, value in data.items():
        where = Where(source, f"{section} entry {name!r}")
        if not isinstance(name, str) or not name:
            raise where.error("tensor names must be non-empty strings")
        records.append(_read_entry(where, name, value, kind))
    return records


def read_sections(data: dict[str, Any], source: str) -> list[TensorEncoding]:
    """Both sections of a versioned 0.6.1 file (a missing section counts as empty, not both)."""
    if "encodings" in data:
        raise Where(source).error("format 0.6.1 has no 'encodings' section (that is 2.0.0)")
    if not any(section in data for section, _ in SECTIONS):
        raise Where(source).error("no 'activation_encodings' or 'param_encodings' section")
    records = []
    for section, kind in SECTIONS:
        records.extend(read_section(data.get(section, {}), source, section, kind))
    return records
