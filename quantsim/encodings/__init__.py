"""AIMET-compatible encodings files: readers and writers for formats 0.6.1, 1.0.0 and 2.0.0.

Every reader turns a file into a list of `TensorEncoding` records (ONNX convention `Encoding` objects);
every writer turns records back into the file's dict. AIMET's quirks (string booleans in 0.6.1, the
``offset`` sign, strict symmetric as zero point -1, forced-unsigned activations in 2.0.0) live only in
the per-version modules::

    version, records = read_encodings_file("model.encodings")
    write_json_atomic("out.encodings", encodings_to_dict(records, "2.0.0"))
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from quantsim.encodings import v0_6_1, v1_0_0, v2_0_0
from quantsim.encodings.jsonio import load_json_file, write_json_atomic
from quantsim.encodings.record import TensorEncoding
from quantsim.encodings.validate import Where, check_unique_names
from quantsim.encodings.versions import SUPPORTED_VERSIONS, layout_for_reading, layout_for_writing
from quantsim.errors import EncodingFormatError, InvalidArgumentError

__all__ = [
    "SUPPORTED_VERSIONS",
    "TensorEncoding",
    "EncodingFormatError",
    "encodings_to_dict",
    "encodings_from_dict",
    "read_encodings_file",
    "write_json_atomic",
]

_SECTION_KEYS = ("encodings", "param_encodings", "activation_encodings")
_LEGACY = {"0.6.1": v0_6_1, "1.0.0": v1_0_0}


def _producer() -> dict[str, str]:
    from quantsim import __version__  # lazy: the package root may import this package

    return {"package": "quantsim", "version": __version__}


def encodings_to_dict(
    records: Iterable[TensorEncoding],
    version: str = "1.0.0",
    *,
    quantizer_args: dict | None = None,
    force_activation_as: str | None = "unsigned",
) -> dict:
    """The JSON-ready dict of an encodings file of ``version`` describing ``records``.

    0.6.1 / 1.0.0: ``param_encodings`` (kind "param") and ``activation_encodings`` (kind "activation" or
    None), ``quantizer_args`` (as given, ``{}`` when None), ``producer``, ``version``. 2.0.0: ``encodings``,
    ``producer``, ``version`` (``quantizer_args`` is not part of it; float16 records are left out), with
    activation grids written as ``force_activation_as`` ("unsigned" or "signed") types, or None: each grid's own.
    """
    source = f"<encodings writer {version}>"
    layout = layout_for_writing(Where(source), version)
    source = f"<encodings writer {layout}>"
    if force_activation_as not in v2_0_0.FORCE_CHOICES:
        raise InvalidArgumentError(f"force_activation_as must be 'unsigned', 'signed' or None, got {force_activation_as!r}")
    records = list(records)
    for index, record in enumerate(records):
        if not isinstance(record, TensorEncoding):
            raise EncodingFormatError(source, f"records[{index}]", f"not a TensorEncoding: {record!r:.80}")
    check_unique_names(source, records)
    out: dict[str, Any] = {"version": layout, "producer": _producer()}
    if layout == v2_0_0.VERSION:
        out["encodings"] = v2_0_0.write_section(records, source, force_activation_as)
    else:
        out.update(_LEGACY[layout].write_sections(records, source))
        out["quantizer_args"] = dict(quantizer_args) if quantizer_args is not None else {}
    return out


def encodings_from_dict(data: Any, *, source: str = "<dict>") -> tuple[str, list[TensorEncoding]]:
    """``(layout version, records)`` of a parsed encodings file.

    The layout version is one of `SUPPORTED_VERSIONS` (a 2.1.0 file reads as "2.0.0"). Data without a
    ``version`` is a bare param-encodings object, guessed as AIMET's ``set_and_freeze_param_encodings``
    does: a dict is 0.6.1, a list whose entries have ``y_scale`` is 2.0.0, any other list 1.0.0; its
    records have kind "param".
    """
    source = str(source)
    where = Where(source)
    if isinstance(data, list):
        if any(isinstance(entry, dict) and "y_scale" in entry for entry in data):
            layout, records = "2.0.0", v2_0_0.read_section(data, source, "param_encodings", "param")
        else:
            layout, records = "1.0.0", v1_0_0.read_section(data, source, "param_encodings", "param")
    elif not isinstance(data, dict):
        raise where.error(f"expected a JSON object (or a bare list of param encodings), got {type(data).__name__}")
    elif "version" not in data:
        if any(key in data for key in _SECTION_KEYS):
            raise where.error("missing 'version'")
        layout, records = "0.6.1", v0_6_1.read_section(data, source, "param_encodings", "param")
    else:
        layout = layout_for_reading(where, data["version"])
        if layout == v2_0_0.VERSION:
            for key in ("param_encodings", "activation_encodings"):
                if key in data:
                    raise where.error(f"format {data['version']} has no '{key}' section (that is 0.6.1/1.0.0)")
            if "encodings" not in data:
                raise where.error("missing required section 'encodings'")
            records = v2_0_0.read_section(data["encodings"], source)
        else:
            records = _LEGACY[layout].read_sections(data, source)
    check_unique_names(source, records)
    return layout, records


def read_encodings_file(path: str | os.PathLike) -> tuple[str, list[TensorEncoding]]:
    """Read an encodings JSON file; format problems raise `EncodingFormatError` naming the path."""
    return encodings_from_dict(load_json_file(path), source=os.fspath(path))
