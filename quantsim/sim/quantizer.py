"""The user-facing quantizer of ``sim.qc_quantize_op_dict``: AIMET's QcQuantizeOp surface over plain data.

A quantizer holds exactly four pieces of state: its `QSpec`, its `Encoding` (or None), ``enabled`` and
``frozen``. Every change notifies the owning sim, which rebuilds its session lazily. There are no mode
flags: calibration is a function of the sim, not a state of the quantizer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from quantsim.calibration.schemes import CalibrationScheme, EncodingRequest, get_scheme
from quantsim.core.dtypes import QuantizationDataType, QuantScheme, float16, qtype
from quantsim.core.fp8_encodings import fp8_encoding_from_scale
from quantsim.core.lpbq import compress_block_scales
from quantsim.core.numerics import Encoding, aimet_offset, encoding_from_aimet
from quantsim.core.spec import LPBQ, PerBlock, PerChannel, PerTensor, QSpec
from quantsim.errors import InvalidArgumentError, InvalidStateError, warn_at_caller
from quantsim.sim.quantizer_aimet import QuantizerAimetSurface

__all__ = ["QcQuantizeOp", "TfEncoding"]


@dataclass
class TfEncoding:
    """AIMET's per-channel encoding record (``libpymo.TfEncoding``): offset ``<= 0`` on an unsigned grid."""

    min: float
    max: float
    delta: float
    offset: float
    bw: int


class QcQuantizeOp(QuantizerAimetSurface):
    """One quantizer, shared by all tensors tied to it (``tensors``).

    ``role`` is "param" (weights, biases and other initializers) or "activation". The rest of AIMET's
    surface (``op_mode``, ``reset_encoding_stats``, ``quantize_dequantize``, ...) is in
    `quantsim.sim.quantizer_aimet`.
    """

    def __init__(
        self,
        name: str,
        role: str,
        spec: QSpec,
        *,
        enabled: bool,
        tensors: tuple[str, ...],
        shape: tuple | None = None,
        channel_axis: int | None = None,
        quant_scheme: QuantScheme | str | CalibrationScheme = QuantScheme.min_max,
        percentile: float = 100.0,
        notify: Callable[[], None] | None = None,
        param_type: str | None = None,
        fixed_range: tuple[float | None, float | None] | None = None,
    ):
        self.name = name
        self.role = role
        self.tensors = tensors
        self.shape = shape
        self.channel_axis = channel_axis
        self.param_type = param_type  # "weight", "bias", ... for parameters (AIMET's param type names)
        self.fixed_range = fixed_range  # (min | None, max | None) used instead of observed values
        self._spec = spec
        self._enabled = bool(enabled)
        self._encoding: Encoding | None = None
        self._frozen = False
        self._scheme = get_scheme(quant_scheme)
        self._percentile = float(percentile)
        self._notify = notify or (lambda: None)
        self.guard: Callable[[QcQuantizeOp, QSpec], None] | None = None  # the sim's target (`sim.target_rules`)
        self._validate_spec(spec)

    # core state ---------------------------------------------------------------------------------
    @property
    def spec(self) -> QSpec:
        return self._spec

    @property
    def encoding(self) -> Encoding | None:
        """The current `Encoding` (None before calibration and for float16)."""
        return self._encoding

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if bool(value) != self._enabled:
            self._enabled = bool(value)
            self._notify()

    def is_encoding_frozen(self) -> bool:
        return self._frozen

    def freeze_encodings(self) -> None:
        """Keep the current encoding through later calibrations (there is no unfreeze, as in AIMET)."""
        if not self._spec.is_float and self._encoding is None:
            raise InvalidStateError(f"quantizer {self.name!r} has no encoding to freeze; calibrate or load one first")
        self._frozen = True

    def _shape(self) -> tuple:
        """The tensor shape, which per-channel and per-block specs need (validated when they are set)."""
        if self.shape is None:
            raise InvalidStateError(f"quantizer {self.name!r} has no known tensor shape")
        return self.shape

    def require_encoding(self) -> Encoding:
        """The encoding, which the caller needs: an error naming the quantizer when there is none."""
        if self._encoding is None:
            raise InvalidStateError(f"quantizer {self.name!r} has no encoding; calibrate or load one first")
        return self._encoding

    def is_initialized(self) -> bool:
        return self._encoding is not None or self._spec.is_float  # the cheap test first (asked per capture)

    def set_qspec(self, spec: QSpec) -> None:
        """Replace the spec; the encoding is dropped (recomputed at the next calibration). A frozen quantizer
        keeps its spec and encoding: a change is ignored with a warning (AIMET ignores it silently)."""
        if self._frozen:
            if spec != self._spec:
                warn_at_caller(f"quantizer {self.name!r} is frozen: the change to {spec.describe()} is ignored "
                               f"(it stays {self._spec.describe()})", RuntimeWarning)
            return
        self._validate_spec(spec)
        if spec != self._spec:
            if self.guard is not None:
                self.guard(self, spec)  # raises TargetError, changing nothing, where the target cannot run it
            self._spec = spec
            self._encoding = None
            self._notify()

    def set_encoding(self, encoding: Encoding | None) -> None:
        """Install an encoding computed or loaded elsewhere (checked against the spec and shape). With an
        `LPBQ` spec the block scales are moved onto the LPBQ grid first (`quantsim.core.lpbq`; a no-op
        for scales already on it), as AIMET's ``load_encodings`` does."""
        if self._frozen:
            raise InvalidStateError(f"quantizer {self.name!r} is frozen: its encoding cannot change")
        if encoding is not None:
            self._check_encoding(encoding, self._spec)
            encoding = self._on_lpbq_grid(encoding, self._spec)
        self._encoding = encoding
        self._notify()

    # AIMET surface -------------------------------------------------------------------------------
    @property
    def bitwidth(self) -> int:
        return self._spec.dtype.bits

    @bitwidth.setter
    def bitwidth(self, bits: int) -> None:
        if self._frozen:
            raise InvalidStateError(f"quantizer {self.name!r} is frozen: its bitwidth cannot change")
        self.set_bitwidth(bits)

    def set_bitwidth(self, bits: int) -> None:
        if self._spec.dtype.is_fp8 and bits == 8:
            return  # already 8 bits: keep the float8 format (AIMET's legacy (float, 8) means float8e4m3fn)
        if self._spec.dtype.is_float:
            self.set_precision(qtype.from_legacy_repr(QuantizationDataType.float, bits))
        else:
            self.set_precision(qtype.int(bits))

    @property
    def data_type(self) -> QuantizationDataType:
        return QuantizationDataType.float if self._spec.dtype.is_float else QuantizationDataType.int

    @data_type.setter
    def data_type(self, value: QuantizationDataType) -> None:
        if isinstance(value, str):
            value = QuantizationDataType[value]
        if value == self.data_type:
            return
        self.set_precision(float16 if value == QuantizationDataType.float else qtype.int(8))

    def precision(self) -> qtype:
        return self._spec.dtype

    def set_precision(self, dtype: qtype | str) -> None:
        """Switch to another data type (e.g. int4, int16, float16, float8e4m3fn); the encoding is dropped."""
        dtype = qtype.as_qtype(dtype)
        if dtype.is_float and dtype.bits not in (8, 16):
            raise InvalidArgumentError(f"{dtype} simulation is not supported; disable the quantizer to keep float32")
        self.set_qspec(self._spec.with_(dtype=dtype))

    @property
    def use_symmetric_encodings(self) -> bool:
        return self._spec.symmetric

    @use_symmetric_encodings.setter
    def use_symmetric_encodings(self, value: bool) -> None:
        self.set_qspec(self._spec.with_(symmetric=bool(value)))

    @property
    def use_strict_symmetric(self) -> bool:
        return self._spec.strict_symmetric

    @use_strict_symmetric.setter
    def use_strict_symmetric(self, value: bool) -> None:
        self.set_qspec(self._spec.with_(strict_symmetric=bool(value)))

    @property
    def use_unsigned_symmetric(self) -> bool:
        return self._spec.unsigned_symmetric

    @use_unsigned_symmetric.setter
    def use_unsigned_symmetric(self, value: bool) -> None:
        self.set_qspec(self._spec.with_(unsigned_symmetric=bool(value)))

    def enable_per_channel_quantization(self, enable: bool = True) -> None:
        """Per-channel along the tensor's channel axis (weights only), or back to per-tensor."""
        if not enable:
            self.set_qspec(self._spec.with_(granularity=PerTensor()))
            return
        if self.channel_axis is None:
            raise InvalidArgumentError(f"quantizer {self.name!r} has no channel axis (only weights can be per-channel)")
        self.set_qspec(self._spec.with_(granularity=PerChannel(self.channel_axis)))

    def set_fixed_encoding_range(self, fixed_range: tuple[float | None, float | None] | None) -> None:
        """Calibrate with this ``(min, max)`` instead of the observed one (None keeps that side observed);
        ``None`` clears it. AIMET's config ``encoding_constraints`` set the same thing."""
        if fixed_range is not None:
            if not isinstance(fixed_range, (tuple, list)) or len(fixed_range) != 2:
                raise InvalidArgumentError(f"quantizer {self.name!r}: fixed range must be (min, max), got {fixed_range!r}")
            for side, value in zip(("min", "max"), fixed_range):
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.number))
                                          or not np.isfinite(value)):
                    raise InvalidArgumentError(f"quantizer {self.name!r}: fixed range {side} must be a finite "
                                               f"number or None, got {value!r}")
            lo, hi = fixed_range
            if lo is not None and hi is not None and lo > hi:
                raise InvalidArgumentError(f"quantizer {self.name!r}: fixed range min {lo} > max {hi}")
        self.fixed_range = None if fixed_range is None else (fixed_range[0], fixed_range[1])

    @property
    def quant_scheme(self) -> QuantScheme | str:
        """AIMET's enum member for the built-in schemes; the registered name for others."""
        return self._scheme.quant_scheme or self._scheme.name

    @property
    def calibration_scheme(self) -> CalibrationScheme:
        """The registered scheme that turns this quantizer's statistics into encodings."""
        return self._scheme

    def set_quant_scheme(self, scheme: QuantScheme | str | CalibrationScheme) -> None:
        """Any registered scheme: an AIMET enum member, a name or alias, or a `CalibrationScheme`."""
        self._scheme = get_scheme(scheme)

    def encoding_request(self) -> EncodingRequest:
        """What calibration needs to know to compute this quantizer's encoding (plain data)."""
        spec, granularity = self._spec, self._spec.granularity
        axis = getattr(granularity, "axis", None)
        return EncodingRequest(
            spec.dtype.bits, spec.symmetric, spec.strict_symmetric, spec.unsigned_symmetric, axis=axis,
            block_axis=getattr(granularity, "block_axis", None), block_size=getattr(granularity, "block_size", None),
            parameters={"percentile": self._percentile}, fixed_range=self.fixed_range,
            fp8=spec.dtype.onnx_name if spec.is_fp8 else None,
        )

    @property
    def percentile_value(self) -> float:
        return self._percentile

    def set_percentile_value(self, percentile: float) -> None:
        """Percentile used by the percentile scheme (0 < p <= 100)."""
        if not 0 < float(percentile) <= 100:
            raise InvalidArgumentError(f"percentile must be in (0, 100], got {percentile}")
        self._percentile = float(percentile)

    def get_encodings(self) -> list[TfEncoding] | None:
        """AIMET-style list of per-channel (or one) `TfEncoding`; None if uncalibrated or float."""
        enc = self._encoding
        if enc is None:
            return None
        offsets = aimet_offset(enc).reshape(-1)
        return [
            TfEncoding(float(lo), float(hi), float(s), float(o), enc.bits)
            for lo, hi, s, o in zip(enc.min.reshape(-1), enc.max.reshape(-1), enc.scale.reshape(-1), offsets)
        ]

    def load_encodings(self, encodings: list[TfEncoding]) -> None:
        """Install encodings given in AIMET's form (one per channel, or one)."""
        if self._spec.is_float:
            raise InvalidStateError(f"quantizer {self.name!r} simulates {self._spec.dtype}: it has no encodings")
        if self._frozen:
            raise InvalidStateError(f"quantizer {self.name!r} is frozen")
        if isinstance(encodings, TfEncoding):
            encodings = [encodings]
        bits = {int(e.bw) for e in encodings}
        if len(bits) != 1:
            raise InvalidArgumentError(f"quantizer {self.name!r}: encodings with mixed bitwidths {sorted(bits)}")
        scales = np.array([e.delta for e in encodings], dtype=np.float64)
        offsets = np.array([e.offset for e in encodings], dtype=np.float64)
        granularity = self._spec.granularity
        axis = getattr(granularity, "axis", None)
        if len(encodings) == 1 and isinstance(granularity, PerTensor):
            scales, offsets = scales[0], offsets[0]
        if self._spec.is_fp8:  # the scale (delta) is the whole encoding; AIMET's offset is 0
            if bits.pop() != 8 or np.any(offsets != 0):
                raise InvalidArgumentError(f"quantizer {self.name!r} is {self._spec.dtype}: its encodings need "
                                           "bw 8 and offset 0")
            fp8 = fp8_encoding_from_scale(scales, self._spec.dtype.onnx_name, axis=axis)
            self._check_encoding(fp8, self._spec)
            self.set_encoding(fp8)
            return
        block = granularity if isinstance(granularity, PerBlock) else None
        rows = self._shape()[block.axis] if block is not None else 0
        enc = encoding_from_aimet(
            scales if block is None else scales.reshape(rows, -1),
            offsets if block is None else offsets.reshape(rows, -1),
            bits.pop(),
            symmetric=self._spec.symmetric,
            axis=axis,
            block_axis=block.block_axis if block else None,
            block_size=block.block_size if block else None,
        )
        spec = self._spec if enc.bits == self.bitwidth else self._spec.with_(dtype=qtype.int(enc.bits))
        self._check_encoding(enc, spec)  # validate before changing anything
        self._spec = spec
        self.set_encoding(enc)

    def _on_lpbq_grid(self, enc: Encoding, spec: QSpec) -> Encoding:
        """``enc`` with its block scales quantized to ``spec``'s LPBQ grid; ``enc`` itself for other specs."""
        granularity = spec.granularity
        if not isinstance(granularity, LPBQ):
            return enc
        if not enc.signed or np.any(enc.zero_point != 0):
            raise InvalidArgumentError(f"quantizer {self.name!r} is LPBQ: it needs a symmetric signed grid with "
                                       "zero point 0")
        return replace(enc, scale=compress_block_scales(enc.scale, granularity.scale_bits))

    # checks --------------------------------------------------------------------------------------
    def _validate_spec(self, spec: QSpec) -> None:
        granularity = spec.granularity
        if spec.is_fp8 and isinstance(granularity, PerBlock):
            raise InvalidArgumentError(f"quantizer {self.name!r}: {spec.dtype} is per tensor or per channel, "
                                       "not per block")
        if isinstance(granularity, PerTensor) or spec.is_float:
            return
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            raise InvalidArgumentError(f"quantizer {self.name!r}: {granularity.describe()} needs a tensor of known shape")
        rank = len(self.shape)
        if not -rank <= granularity.axis < rank:
            raise InvalidArgumentError(f"quantizer {self.name!r}: axis {granularity.axis} out of range for shape {self.shape}")
        if isinstance(granularity, PerBlock):
            length = self.shape[granularity.block_axis % rank]
            if length % granularity.block_size:
                raise InvalidArgumentError(
                    f"quantizer {self.name!r}: dimension {granularity.block_axis} of size {length} is not "
                    f"divisible by block size {granularity.block_size}"
                )

    def _check_encoding(self, enc: Encoding, spec: QSpec) -> None:
        if spec.is_float:
            raise InvalidArgumentError(f"quantizer {self.name!r} simulates {spec.dtype}: it takes no integer encoding")
        if enc.bits != spec.dtype.bits:
            raise InvalidArgumentError(f"encoding for {self.name!r} is {enc.bits}-bit but the quantizer is {spec.dtype}")
        if enc.fp8 != (spec.dtype.onnx_name if spec.is_fp8 else None):
            raise InvalidArgumentError(f"encoding for {self.name!r} is {enc.fp8 or 'an integer grid'} but the "
                                       f"quantizer is {spec.dtype}")
        granularity = spec.granularity
        expected: tuple = ()
        if isinstance(granularity, PerChannel):
            expected = (self._shape()[granularity.axis],)
        elif isinstance(granularity, PerBlock):
            shape = self._shape()
            expected = (shape[granularity.axis], shape[granularity.block_axis] // granularity.block_size)
        if enc.scale.shape != expected:
            raise InvalidArgumentError(
                f"encoding for {self.name!r} has {enc.scale.size} scale(s) of shape {enc.scale.shape}; "
                f"the quantizer ({granularity.describe()} on shape {self.shape}) needs shape {expected}"
            )

    def __repr__(self) -> str:
        state = "enabled" if self._enabled else "disabled"
        frozen = ", frozen" if self._frozen else ""
        return f"QcQuantizeOp({self.name!r}, {self.role}, {self._spec.describe()}, {state}{frozen})"
