"""AIMET encodings format 1.0.0 (AIMET's default).

Sections ``param_encodings`` / ``activation_encodings`` are lists of entries: ``name``, ``dtype``
"INT"/"FLOAT", ``bw``, ``enc_type`` PER_TENSOR / PER_CHANNEL / PER_BLOCK, ``is_sym`` (a real boolean),
``scale`` (list; one value per tensor) and ``offset`` (list of floats, AIMET convention ``<= 0``);
PER_BLOCK adds ``block_size`` with scales flattened in (channel, block) order. float16 is
``{"name", "dtype": "FLOAT", "bw": 16, "enc_type": "PER_TENSOR"}``. On reading, PER_BLOCK scales stay
flat (1-D) with ``block_size`` set and no axes: the simulator binds the axes to the tensor.
LPBQ entries (``enc_type`` "LPBQ") are read and written by `quantsim.encodings.lpbq_entries`; non-zero
``zero_point_shift`` is refused.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from quantsim.encodings import lpbq_entries
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
    as_str,
    entry_label,
    integral,
    numeric_array,
    positive_scales,
    require,
)

__all__ = ["VERSION", "SECTIONS", "ENC_TYPES", "write_sections", "read_sections", "read_section"]

VERSION = "1.0.0"
SECTIONS = (("activation_encodings", "activation"), ("param_encodings", "param"))
ENC_TYPES = {"tensor": "PER_TENSOR", "channel": "PER_CHANNEL", "block": "PER_BLOCK"}


def _write_entry(where: Where, record: TensorEncoding) -> dict[str, Any]:
    if record.is_float:
        return {"name": record.name, "dtype": "FLOAT", "bw": FLOAT16_BITS, "enc_type": "PER_TENSOR"}
    if record.lpbq_scale_bits is not None:
        return lpbq_entries.write_1_0_0(where, record)
    enc = record.grid
    check_writable(where, enc)
    kind = granularity(where, enc)
    entry = {
        "name": record.name,
        "dtype": "INT",
        "bw": enc.bits,
        "enc_type": ENC_TYPES[kind],
        "is_sym": bool(enc.symmetric),
        "scale": flat_scales(enc),
        "offset": flat_offsets(enc),
    }
    if kind == "block":
        entry["block_size"] = int(enc.block_size or 0)  # set: the layout is "block"
    return entry


def write_sections(records: list[TensorEncoding], source: str) -> dict[str, Any]:
    """``{"activation_encodings": [...], "param_encodings": [...]}`` (kind None goes with activations)."""
    out: dict[str, Any] = {"activation_encodings": [], "param_encodings": []}
    for record in records:
        section = "param_encodings" if record.kind == "param" else "activation_encodings"
        out[section].append(_write_entry(Where(source, f"tensor {record.name!r}"), record))
    return out


def _read_entry(where: Where, raw: Any, kind: str) -> TensorEncoding:
    name = as_str(where, require(where, raw, "name"), "name")
    dtype = as_str(where, require(where, raw, "dtype"), "dtype").upper()
    if dtype == "INT" and raw.get("enc_type") == "LPBQ":
        return lpbq_entries.read_1_0_0(where, raw, name, kind)
    bits = as_int(where, require(where, raw, "bw"), "bw")
    if dtype == "FLOAT":
        if bits != FLOAT16_BITS:
            raise where.error(f"only float16 is supported for dtype FLOAT, got bw {bits}")
        return TensorEncoding.float16(name, kind)
    if dtype != "INT":
        raise where.error(f"'dtype' must be \"INT\" or \"FLOAT\", got {dtype!r}")
    check_int_bits(where, bits, "bw")
    enc_type = as_str(where, require(where, raw, "enc_type"), "enc_type")
    if enc_type not in ENC_TYPES.values():
        raise where.error(f"unknown enc_type {enc_type!r} (expected PER_TENSOR, PER_CHANNEL or PER_BLOCK)")
    symmetric = as_bool(where, require(where, raw, "is_sym"), "is_sym")
    scale = positive_scales(where, numeric_array(where, require(where, raw, "scale"), "scale", ndim=1))
    offset = integral(where, numeric_array(where, require(where, raw, "offset"), "offset", ndim=1), "offset")
    if offset.shape != scale.shape:
        raise where.error(f"'offset' has {offset.size} values but 'scale' has {scale.size}")
    if "zero_point_shift" in raw:
        shift = numeric_array(where, raw["zero_point_shift"], "zero_point_shift", ndim=1)
        if np.any(shift != 0):
            raise where.error("non-zero 'zero_point_shift' is not supported")
    block_size = None
    if enc_type == "PER_TENSOR":
        if scale.size != 1:
            raise where.error(f"PER_TENSOR needs exactly one scale, got {scale.size}")
        scale, offset = scale[0], offset[0]
    elif enc_type == "PER_BLOCK":
        block_size = as_int(where, require(where, raw, "block_size"), "block_size", minimum=1)
    enc = from_aimet(where, scale, offset, bits, symmetric, block_size)
    return TensorEncoding.from_encoding(name, enc, kind)


def read_section(data: Any, source: str, section: str, kind: str) -> list[TensorEncoding]:
    """One list of entries (also a bare param-encodings list)."""
    if not isinstance(data, list):
        raise Where(source, section).error(f"expected a JSON list of entries, got {type(data).__name__}")
    return [
        _read_entry(Where(source, entry_label(section, index, raw)), raw, kind) for index, raw in enumerate(data)
    ]


def read_sections(data: dict[str, Any], source: str) -> list[TensorEncoding]:
    """Both sections of a versioned 1.0.0 file (a missing section counts as empty, not both)."""
    if "encodings" in data:
        raise Where(source).error("format 1.0.0 has no 'encodings' section (that is 2.0.0)")
    if not any(section in data for section, _ in SECTIONS):
        raise Where(source).error("no 'activation_encodings' or 'param_encodings' section")
    records = []
    for section, kind in SECTIONS:
        records.extend(read_section(data.get(section, []), source, section, kind))
    return records
