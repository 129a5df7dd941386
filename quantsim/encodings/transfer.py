"""Moving encodings between a sim and AIMET's files: export, load (with mismatch report), freeze params.

The file formats themselves live in `quantsim.encodings`; this module binds their format-independent
records to the sim's quantizers: it fills in channel axes the 0.6.1/1.0.0 formats do not store, checks
channel counts against tensor shapes, reconfigures a quantizer to what the file says, and applies
everything only after every entry has been validated, so a failed load leaves the sim unchanged.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from quantsim.core.dtypes import QuantizationDataType, float16, qtype
from quantsim.core.numerics import Encoding, grid_bounds
from quantsim.core.spec import LPBQ, PerBlock, PerChannel, PerTensor, QSpec
from quantsim.encodings import (
    TensorEncoding,
    encodings_from_dict,
    encodings_to_dict,
    read_encodings_file,
)
from quantsim.encodings.derived import derived_names, derived_records
from quantsim.encodings.fit import MSE_RATIO_LIMIT, weight_fit
from quantsim.encodings.int32_bias import int32_bias_encodings
from quantsim.errors import (
    EncodingMismatchError,
    InvalidArgumentError,
    InvalidStateError,
    QuantsimWarning,
    warn_at_caller,
)
from quantsim.graph.file_set import FileSet, check_file_name
from quantsim.sim.decisions import Decision
from quantsim.sim.quantizer import QcQuantizeOp
from quantsim.sim.ties import split_tied, tied_encodings_differ

_log = logging.getLogger(__name__)

__all__ = [
    "EncodingMismatch",
    "load_encodings_to_sim",
    "export_sim",
    "sim_records",
    "int32_bias_records",
    "set_and_freeze_param_encodings",
    "load_records",
    "REQUANT_KEY",
]



@dataclass(frozen=True)
class EncodingMismatch:
    """One difference between a quantizer's configuration and the encoding loaded onto it."""

    name: str
    field: str
    sim_value: object
    file_value: object

    def __str__(self) -> str:
        return f"{self.name}: {self.field} is {self.sim_value!r} in the sim but {self.file_value!r} in the file"



def sim_records(sim) -> list[TensorEncoding]:
    """One record per quantized tensor (tied tensors repeat their quantizer's encoding)."""
    records = []
    for q in sim.quantizers:
        if not q.enabled or not q.is_initialized():
            continue
        for tensor in q.tensors:
            shape = sim.graph_index.shape.get(tensor)
            shape = tuple(shape) if shape and all(isinstance(d, int) for d in shape) else None
            if q.spec.is_float:
                records.append(TensorEncoding.float16(tensor, q.role, shape))
            else:
                scale_bits = q.spec.granularity.scale_bits if isinstance(q.spec.granularity, LPBQ) else None
                records.append(TensorEncoding.from_encoding(tensor, q.encoding, q.role, shape, scale_bits))
    return records


def int32_bias_records(sim, records: list[TensorEncoding] | None = None) -> list[TensorEncoding]:
    """int32 bias encodings by AIMET's rules (`quantsim.encodings.int32_bias`: analytic ``s_in * s_w`` for
    Conv/ConvTranspose/Gemm/MatMul+Add, statistical ``max|b| / 2^31`` for norm and recurrent layers). The input's
    encoding is its record in ``records`` (default: the sim's, plus the derived ones: a Gemm after a Flatten
    reads the Flatten's derived grid, as in the QDQ export)."""
    if records is None:
        records = sim_records(sim)
        records = records + derived_records(sim.graph_index, records)
    quantized = {tensor for q in sim.quantizers for tensor in q.tensors}
    return int32_bias_encodings(sim.graph_index, records, quantized)


def _quantizer_args(sim) -> dict:
    flags = sim.config.to_quantizer_args_flags()
    kind, param_bits = sim.param_type.to_legacy_repr()
    return {
        "activation_bitwidth": sim.activation_type.bits,
        "dtype": kind.name,
        "is_symmetric": flags["is_symmetric"],
        "param_bitwidth": param_bits,
        "per_channel_quantization": flags["per_channel_quantization"],
        "quant_scheme": sim.quant_scheme_name,
    }


REQUANT_KEY = "quantsim_requantization"


def export_sim(sim, path: Path, prefix: str, export_model: bool, version: str, export_int32_bias, force,
               requant: dict | None = None, extra_models: dict | None = None) -> None:
    """``sim.export``: encodings file, float model and ``extra_models`` (file suffix -> ``(model, weights)``, e.g.
    the QDQ model with the `DeferredWeights` its big initializers are computed from, written one at a time),
    committed as one set. ``requant`` (the integer export's fixed-point table) goes into the file
    under `REQUANT_KEY`; AIMET's readers and ours ignore unknown top-level keys."""
    check_file_name(prefix)
    if not sim.quantizers or not any(q.enabled and q.is_initialized() for q in sim.quantizers):
        raise InvalidStateError("nothing to export: call compute_encodings (or load encodings) first")
    uncalibrated = [q.name for q in sim.quantizers if q.enabled and not q.is_initialized()]
    if uncalibrated:
        warn_at_caller(f"{len(uncalibrated)} enabled quantizer(s) have no encoding and are not exported, "
                      f"e.g. {uncalibrated[:3]}", RuntimeWarning)
    own = sim_records(sim)
    derived = derived_records(sim.graph_index, own)
    records = own + derived if version == "2.0.0" else list(own)  # AIMET's 2.0.0 lists data movement's outputs too
    if export_int32_bias if export_int32_bias is not None else version == "2.0.0":
        known = {r.name for r in records}
        records += [r for r in int32_bias_records(sim, own + derived) if r.name not in known]
    if version == "2.0.0":  # AIMET's order: parameters, then activations, then the derived entries
        derived_set = {r.name for r in derived}
        records.sort(key=lambda r: 0 if r.kind == "param" else 2 if r.name in derived_set else 1)
    data = encodings_to_dict(records, version, quantizer_args=_quantizer_args(sim), force_activation_as=force)
    if requant is not None:
        data[REQUANT_KEY] = requant
    # every file is staged before any replaces an old one: a failure leaves the previous set intact
    with FileSet(path, prefix) as files:
        files.add_json(f"{prefix}.encodings", data)
        if export_model:
            files.add_model(sim.prepared_model, f"{prefix}.onnx", weights=sim.graph_index.weights)  # mapped weights stay mapped
        for name, (model, weights) in (extra_models or {}).items():
            files.add_model(model, f"{prefix}{name}", weights=weights)
        files.commit()


def _bind(q: QcQuantizeOp, record: TensorEncoding, source: str) -> tuple[QSpec, Encoding | None]:
    """The spec and encoding that ``q`` takes on to hold ``record``."""
    if record.is_float:
        return q.spec.with_(dtype=float16, granularity=PerTensor()), None
    enc = record.encoding
    assert enc is not None  # an integer record always carries one (TensorEncoding checks it)
    where = f"{source}: tensor {record.name!r}"
    shape = q.shape
    granularity: PerTensor | PerChannel | PerBlock | LPBQ
    if enc.scale.ndim == 0:
        granularity = PerTensor()
    else:
        axis = enc.axis if enc.axis is not None else q.channel_axis
        if axis is None or not shape:
            raise InvalidArgumentError(f"{where} has {enc.scale.size} per-channel scales but is not a weight with a channel axis")
        axis %= len(shape)
        if enc.block_size is None:
            if shape[axis] != enc.scale.shape[0]:
                raise InvalidArgumentError(
                    f"{where}: wrong channel count: {enc.scale.shape[0]} scales for shape {tuple(shape)} "
                    f"(channel axis {axis} has {shape[axis]})"
                )
            granularity, enc = PerChannel(axis), replace(enc, axis=axis)
        else:
            block_axis = enc.block_axis if enc.block_axis is not None else (1 if axis != 1 else 0)
            block_axis %= len(shape)
            blocks = shape[block_axis] // enc.block_size
            if enc.scale.size != shape[axis] * blocks:
                raise InvalidArgumentError(f"{where}: {enc.scale.size} block scales do not fit shape {tuple(shape)} "
                                 f"with block size {enc.block_size}")
            granularity = PerBlock(axis, block_axis, enc.block_size)
            if record.lpbq_scale_bits is not None:
                granularity = LPBQ(axis, block_axis, enc.block_size, record.lpbq_scale_bits)
            enc = replace(enc, scale=enc.scale.reshape(shape[axis], blocks),
                          zero_point=enc.zero_point.reshape(shape[axis], blocks), axis=axis, block_axis=block_axis)
    if enc.fp8 is not None:
        return q.spec.with_(dtype=qtype.from_string(enc.fp8), granularity=granularity), enc
    if q.spec.symmetric and not enc.signed and np.all(enc.zero_point == 1 << (enc.bits - 1)):
        # a symmetric grid written unsigned (2.0.0 activations): same values on the signed grid
        qmin, qmax = grid_bounds(enc.bits, signed=True)
        enc = replace(enc, zero_point=np.zeros_like(enc.zero_point), signed=True, qmin=qmin, qmax=qmax, symmetric=True)
    strict = enc.signed and enc.qmin == -((1 << (enc.bits - 1)) - 1)
    unsigned_sym = enc.symmetric and not enc.signed
    spec = QSpec(qtype.int(enc.bits), granularity, bool(enc.symmetric), strict,
                 unsigned_sym or (q.spec.unsigned_symmetric and not strict))
    return spec, enc


def _mismatches(q: QcQuantizeOp, record: TensorEncoding, spec: QSpec, version: str) -> list[EncodingMismatch]:
    found = []
    if not q.enabled:
        found.append(EncodingMismatch(record.name, "enabled", False, True))
    fp8 = record.encoding.fp8 if record.encoding is not None else None
    file_type = QuantizationDataType.float if record.is_float or fp8 else QuantizationDataType.int
    if file_type != q.data_type:
        found.append(EncodingMismatch(record.name, "dtype", q.data_type.name, file_type.name))
    elif fp8 is not None and q.precision() != spec.dtype:
        found.append(EncodingMismatch(record.name, "dtype", str(q.precision()), fp8))
    if record.bits != q.bitwidth:
        found.append(EncodingMismatch(record.name, "bitwidth", q.bitwidth, record.bits))
    if not record.is_float and version != "2.0.0" and spec.symmetric != q.spec.symmetric:
        found.append(EncodingMismatch(record.name, "symmetric", q.spec.symmetric, spec.symmetric))
    return found


def _read(path_or_dict) -> tuple[str, list[TensorEncoding], str]:
    if isinstance(path_or_dict, (str, os.PathLike)):
        version, records = read_encodings_file(path_or_dict)
        return version, records, str(path_or_dict)
    version, records = encodings_from_dict(path_or_dict)
    return version, records, "<encodings dict>"


def load_encodings_to_sim(sim, path_or_dict, strict: bool = True, *, allow_overwrite: bool = True,
                          disable_missing_quantizers: bool = True, _only=None) -> list[EncodingMismatch]:
    """Load an encodings file (0.6.1, 1.0.0 or 2.0.0) or dict onto ``sim``'s quantizers.

    Each loaded quantizer takes the file's type, symmetry and granularity and is enabled; with
    ``allow_overwrite=False`` it is also frozen. Quantizers the file does not mention are disabled when
    ``disable_missing_quantizers``. Differences from the sim's configuration are returned; with
    ``strict=True`` they, and tensors the sim does not quantize, raise `EncodingMismatchError`. Everything
    is validated before anything changes.
    """
    version, records, source = _read(path_or_dict)
    if _only is not None:
        _check_for_model(sim, [r for r in records if r.bits <= 16], source)  # before filtering hides it
        records = [r for r in records if _only(r)]
    return load_records(sim, version, records, source, strict=strict, allow_overwrite=allow_overwrite,
                        disable_missing_quantizers=disable_missing_quantizers)


_PROBLEMS_SHOWN = 10


def _split_wide_records(sim, records: list[TensorEncoding]) -> tuple[list[TensorEncoding], list[TensorEncoding]]:
    """``(simulated, wide)``: records of more than 16 bits are not simulated. A 32-bit entry for a bias
    (a parameter, or a tensor the sim quantizes as one) is the int32 bias that exports derive: dropped
    silently. Any other wide entry (e.g. ``bw: 32`` on an activation) is returned in ``wide``."""
    simulated, wide = [], []
    for record in records:
        if record.bits <= 16:
            simulated.append(record)
            continue
        q = sim.qc_quantize_op_dict.get(record.name)
        is_param = record.kind == "param" or (q is not None and q.role == "param")
        if not is_param:
            wide.append(record)
    return simulated, wide


def _check_for_model(sim, records: list[TensorEncoding], source: str) -> list[str]:
    """Names of ``records`` that are not tensors of the sim's model; raises if that is all of them."""
    model_tensors = sim.graph_index.tensor_names()
    unknown = [r.name for r in records if r.name not in model_tensors]
    if records and len(unknown) == len(records):
        raise InvalidArgumentError(f"{source}: none of its {len(records)} tensors (e.g. {unknown[:3]}) exist in "
                                   f"{sim.source_label}; is it for another model?")
    return unknown


def _enabled(sim, name: str) -> bool:
    q = sim.qc_quantize_op_dict.get(name)
    return q is not None and q.enabled


def load_records(sim, version: str, records: list[TensorEncoding], source: str, *, strict: bool,
                 allow_overwrite: bool, disable_missing_quantizers: bool) -> list[EncodingMismatch]:
    """`load_encodings_to_sim` on records already read (``version`` says which format they came from)."""
    records, wide = _split_wide_records(sim, records)
    derived = derived_names(sim.graph_index, records)
    records = [r for r in records if r.name not in derived or _enabled(sim, r.name)]
    unknown = set(_check_for_model(sim, records, source))
    mismatches, to_float = [], []
    pending: list[tuple[QcQuantizeOp, QSpec, Encoding | None, str]] = []  # (quantizer, spec, encoding, tensor)
    problems = []
    for record in wide:  # aimet-onnx loads an int32 activation grid (practically float): the sim runs it in float
        q = sim.qc_quantize_op_dict.get(record.name)
        if q is None:
            problems.append(f"{record.name}: a {record.bits}-bit encoding for a tensor the sim does not quantize "
                            "(not loaded; it stays float)")
        elif q.is_encoding_frozen():
            problems.append(f"{record.name}: a {record.bits}-bit encoding, but the sim's quantizer is frozen "
                            "(kept as it is)")
        else:
            problems.append(f"{record.name}: a {record.bits}-bit encoding, which the sim cannot simulate: its "
                            "quantizer is disabled, so the tensor runs in float")
            mismatches.append(EncodingMismatch(record.name, "bitwidth", q.bitwidth, record.bits))
            to_float.append(q)
    for record in records:
        q = sim.qc_quantize_op_dict.get(record.name)
        if q is None:
            problems.append(f"{record.name}: " + ("not a tensor of the model" if record.name in unknown
                                                  else "the sim has no quantizer for this tensor"))
            continue
        if q.is_encoding_frozen():
            warn_at_caller(f"{source}: {record.name!r} is frozen in the sim; its encoding is kept")
            continue
        spec, enc = _bind(q, record, source)
        mismatches += _mismatches(q, record, spec, version)
        pending.append((q, spec, enc, record.name))
    if strict and (problems or mismatches):
        details = problems + [str(m) for m in mismatches]
        raise EncodingMismatchError(f"{source} does not match the sim ({len(details)} issue(s)):\n  " + "\n  ".join(details))
    if problems:  # one summarising warning: a file for another model must not print thousands of lines
        shown = "\n  ".join(problems[:_PROBLEMS_SHOWN])
        more = f"\n  ... and {len(problems) - _PROBLEMS_SHOWN} more" if len(problems) > _PROBLEMS_SHOWN else ""
        warn_at_caller(f"{source}: skipped {len(problems)} entr{'y' if len(problems) == 1 else 'ies'}:\n  {shown}{more}")
    plan = _untie_where_the_file_does(sim, pending, disable_missing_quantizers, version)
    for q, spec, enc in plan:
        q._spec = spec  # bypass set_qspec: it would drop the encoding we are about to set
        q.set_encoding(enc)
        q.enabled = True
        if not allow_overwrite:
            q.freeze_encodings()
    _warn_unfitting(sim, plan, source)
    for q in to_float:
        q.enabled = False
    if disable_missing_quantizers:
        loaded = {id(q) for q, _, _ in plan}
        # 2.0.0 has no entry for a cast-simulated float (float16): its absence from such a file says nothing, so
        # the sim's float16 quantizers stay as they are (aimet-onnx 2.42 keeps them too)
        unwritable = version == "2.0.0"
        for q in sim.quantizers:
            if id(q) not in loaded and not q.is_encoding_frozen() and not (unwritable and q.spec.is_float):
                q.enabled = False
    for m in mismatches:
        warn_at_caller(f"{source}: {m}")
    return mismatches


def _untie_where_the_file_does(sim, pending: list, disable_missing: bool, version: str) -> list:
    """``pending`` (quantizer, spec, encoding, tensor) as (quantizer, spec, encoding), after splitting every tied
    quantizer whose tensors the file gives different grids, or, when missing quantizers are disabled, grids
    for only some of them (`quantsim.sim.ties`): a sim that untied a Concat (its inputs on grids of their
    own, its output float) exports one entry per input and none for the output, and a fresh sim, which ties
    them, must reproduce that rather than let the last entry win for all three. A 2.0.0 file writes no entry
    for a float16 tensor, so there the absence of one says nothing about a float16 quantizer."""
    by_quantizer: dict[int, list] = {}
    for q, spec, enc, name in pending:
        by_quantizer.setdefault(id(q), []).append((q, spec, enc, name))
    for entries in by_quantizer.values():
        q = entries[0][0]
        if len(q.tensors) < 2:
            continue
        named = {name for *_, name in entries}
        missing = disable_missing and any(t not in named for t in q.tensors) and not (
            version == "2.0.0" and q.spec.is_float)
        if missing or tied_encodings_differ([(spec, enc) for _, spec, enc, _ in entries]):
            tensors = tuple(q.tensors)
            split_tied(sim, q)
            sim._record_decisions([Decision("encodings file", tensors, "untied",
                                            "the loaded file gives these tensors, which this sim tied to one "
                                            "quantizer, grids of their own")])
    return [(sim.qc_quantize_op_dict[name], spec, enc) for _, spec, enc, name in pending]


def _warn_unfitting(sim, plan: list, source: str) -> None:
    """One warning naming the weights whose loaded encodings do not fit their values (`fit.weight_fit`)."""
    bad = []
    for q, _, enc in plan:
        if enc is None or q.role != "param" or not sim.graph_index.is_constant(q.tensors[0]):
            continue
        fit = weight_fit(q.tensors[0], sim.get_weight(q.tensors[0]), enc)
        if not fit.fits:
            bad.append(fit)
    if not bad:
        return
    bad.sort(key=lambda f: -f.mse_ratio)
    unfolded = any(node.op_type == "BatchNormalization" for node in sim.graph_index.nodes)
    cause = ("this sim keeps BatchNormalization unfolded, so encodings computed on a sim that folded it (the "
             "default) do not fit its weights" if unfolded else
             "encodings computed with BatchNormalization unfolded (fold_batchnorm=False) do not fit a sim that "
             "folds it")
    shown = "\n  ".join(f.describe() for f in bad[:_PROBLEMS_SHOWN])
    more = f"\n  ... and {len(bad) - _PROBLEMS_SHOWN} more" if len(bad) > _PROBLEMS_SHOWN else ""
    warn_at_caller(f"{source}: the encodings of {len(bad)} weight(s) do not fit the weights they are loaded onto "
                   f"(more than {10 * np.log10(MSE_RATIO_LIMIT):.0f} dB worse than a min-max grid on them, with grids over "
                   f"twice too wide for some channels). Likely "
                   f"cause: {cause}; or the file is another model's. Compute the encodings on this sim instead:"
                   f"\n  {shown}{more}", QuantsimWarning)


def set_and_freeze_param_encodings(sim, encoding_path) -> None:
    """Load only parameter encodings from ``encoding_path`` and freeze them (AIMET semantics)."""
    param_names = set(sim.param_names)
    load_encodings_to_sim(sim, encoding_path, strict=False, allow_overwrite=False, disable_missing_quantizers=False,
                          _only=lambda r: r.kind == "param" or (r.kind is None and r.name in param_names))
