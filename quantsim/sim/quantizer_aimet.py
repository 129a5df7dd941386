"""The rest of aimet-onnx 2.42's ``QcQuantizeOp`` surface, as a mixin of `quantsim.sim.quantizer.QcQuantizeOp`.

AIMET's quantizer is a C++ tensor quantizer with a mode (``op_mode``: collecting statistics, one-shot
quantizing, quantizing, passing through) and statistics of its own. quantsim's quantizer has no mode and keeps
no statistics (calibration is a function of the sim); ``op_mode`` is a view of its ``enabled`` flag and
encoding, and a mode written is translated into those:

========================== ===================================== =========================================
``OpMode``                 read when                             writing it
========================== ===================================== =========================================
passThrough                the quantizer is disabled             disables it
quantizeDequantize         enabled with an encoding (or FP16)    enables it (an activation needs an encoding)
oneShotQuantizeDequantize  an enabled parameter, no encoding yet enables it; drops its encoding, recomputed
                                                                 from the weights on next use
updateStats                an enabled activation, no encoding    enables it; drops its encoding, computed at
                                                                 the next calibration (until then the
                                                                 tensor passes through, as in AIMET)
========================== ===================================== =========================================

AIMET keeps the last mode of a disabled quantizer; here a disabled quantizer reads passThrough.
Per-quantizer statistics (``update_encoding_stats``, ``compute_encodings``, ``get_stats_histogram``) and
zero-point shift have no counterpart: they raise `NotSupportedError` naming what to use.
"""
from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from quantsim.core.dtypes import QuantizationDataType, qtype
from quantsim.core.numerics import Encoding, encoding_from_range
from quantsim.errors import InvalidArgumentError, InvalidStateError, NotSupportedError, warn_at_caller
from quantsim.sim.fake_values import fake_values

if TYPE_CHECKING:
    from quantsim.core.spec import QSpec
    from quantsim.sim.quantizer import TfEncoding

__all__ = ["OpMode", "QuantizerAimetSurface"]

_log = logging.getLogger(__name__)


class OpMode(enum.IntEnum):
    """AIMET's ``aimet_onnx.qc_quantize_op.OpMode`` (``libpymo.TensorQuantizerOpMode``), same names and values."""

    updateStats = 0
    oneShotQuantizeDequantize = 1
    quantizeDequantize = 2
    passThrough = 3


_NO_STATISTICS = ("quantsim keeps no statistics per quantizer (calibration streams them through the sim): "
                  "calibrate with sim.compute_encodings(data) or `with quantsim.compute_encodings(sim): ...`")


def _finite_positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{what} must be a finite positive number, got {value!r}")
    return float(value)


class QuantizerAimetSurface:
    """AIMET ``QcQuantizeOp`` methods beyond the core state (module docstring)."""

    if TYPE_CHECKING:
        name: str
        role: str
        shape: tuple | None
        _encoding: Encoding | None
        _frozen: bool
        _spec: QSpec

        @property
        def enabled(self) -> bool: ...
        @enabled.setter
        def enabled(self, value: bool) -> None: ...
        @property
        def bitwidth(self) -> int: ...
        def set_encoding(self, encoding: Encoding | None) -> None: ...
        def get_encodings(self) -> list[TfEncoding] | None: ...
        def load_encodings(self, encodings: list[TfEncoding]) -> None: ...
        def set_precision(self, dtype: qtype | str) -> None: ...
        def set_qspec(self, spec: QSpec) -> None: ...

    # modes ----------------------------------------------------------------------------------------
    @property
    def op_mode(self) -> OpMode:
        """AIMET's mode, read from ``enabled`` and the encoding (module docstring)."""
        if not self.enabled:
            return OpMode.passThrough
        if self._encoding is not None or self._spec.is_float:
            return OpMode.quantizeDequantize
        return OpMode.oneShotQuantizeDequantize if self.role == "param" else OpMode.updateStats

    @op_mode.setter
    def op_mode(self, mode: OpMode | int) -> None:
        try:
            mode = OpMode(int(mode))
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"quantizer {self.name!r}: op_mode must be one of "
                                       f"{[m.name for m in OpMode]}, got {mode!r}") from None
        if mode == OpMode.passThrough:
            self.enabled = False
            return
        if mode == OpMode.quantizeDequantize:
            if self._encoding is None and not self._spec.is_float and self.role != "param":
                raise InvalidStateError(f"quantizer {self.name!r} has no encoding to quantize with: calibrate "
                                        "(sim.compute_encodings) or load one first")
        elif self._frozen:
            warn_at_caller(f"quantizer {self.name!r} is frozen: op_mode {mode.name} keeps its encoding",
                           RuntimeWarning)
        else:
            self.reset_encoding_stats()
        self.enabled = True

    def reset_encoding_stats(self) -> None:
        """Forget the encoding (unless frozen): the next calibration computes it afresh (parameters: the next
        use, from the weights). AIMET also clears the statistics; quantsim keeps none between calibrations."""
        if not self._frozen and self._encoding is not None:
            self.set_encoding(None)

    @property
    def rounding_mode(self) -> str:
        """Always ``"nearest"`` (AIMET 2.42 supports no other; ties round to even, as ONNX QuantizeLinear)."""
        return "nearest"

    # encodings ------------------------------------------------------------------------------------
    @property
    def encodings(self) -> list[TfEncoding] | None:
        """Deprecated in AIMET: `get_encodings`."""
        return self.get_encodings()

    @encodings.setter
    def encodings(self, value: list[TfEncoding] | None) -> None:
        if value is None:
            self.reset_encoding_stats()
        else:
            self.load_encodings(value)

    def quantize_dequantize(self, input_tensor: np.ndarray) -> np.ndarray:
        """``input_tensor`` fake-quantized with this quantizer's encoding (FP16: the float16 round trip), in its
        own dtype; whether the quantizer is enabled does not matter (as in AIMET)."""
        values = np.asarray(input_tensor)
        enc = None if self._spec.is_float else self._encoding
        if enc is None and not self._spec.is_float:
            raise InvalidStateError(f"quantizer {self.name!r} has no encoding; calibrate or load one first")
        return fake_values(values, enc).astype(values.dtype, copy=False)

    def clip_and_recompute_encodings(self, clamp_val: float) -> bool | None:
        """Clamp the encoding's range to ``[-clamp_val, clamp_val]`` where it reaches outside (by more than half a
        step: see below), and recompute the grid from the clamped range (AIMET's min-max rule, this quantizer's
        symmetry). Returns whether anything was clamped; None (nothing done) when disabled, frozen or without an
        encoding, as in AIMET."""
        clamp = _finite_positive(clamp_val, "clamp_val")
        enc = self._encoding
        if enc is None or not self.enabled or self._frozen:
            return None
        lo, hi = enc.min, enc.max
        # a grid's ends are whole steps from its zero point, so the grid of a clamped range may reach past
        # clamp_val by up to half a step: that is already clamped (AIMET keeps the clamped min/max themselves),
        # and clamping twice changes nothing
        slack = np.asarray(enc.scale) / 2
        outside = (lo < -clamp - slack) | (hi > clamp + slack)
        if not np.any(outside):
            return False
        spec = self._spec
        fresh = encoding_from_range(np.clip(lo, -clamp, clamp), np.clip(hi, -clamp, clamp), enc.bits,
                                    symmetric=spec.symmetric, strict=spec.strict_symmetric,
                                    unsigned_symmetric=spec.unsigned_symmetric, axis=enc.axis,
                                    block_axis=enc.block_axis, block_size=enc.block_size)
        if (fresh.signed, fresh.qmin, fresh.qmax) == (enc.signed, enc.qmin, enc.qmax) and np.ndim(outside):
            # channels inside the range keep their grid exactly
            fresh = Encoding(np.where(outside, fresh.scale, enc.scale), np.where(outside, fresh.zero_point,
                             enc.zero_point), enc.bits, enc.signed, enc.qmin, enc.qmax, enc.symmetric, enc.axis,
                             enc.block_axis, enc.block_size)
        self.set_encoding(fresh)
        return True

    def update_quantizer_and_load_encodings(self, encoding: list[TfEncoding], is_symmetric: bool | None,
                                            is_strict_symmetric: bool | None, is_unsigned_symmetric: bool | None,
                                            data_type: QuantizationDataType) -> None:
        """AIMET's loader step: enable the quantizer, take the data type, bitwidth and symmetry flags of an
        encoding, then the encoding itself. A frozen quantizer is left as it is (as in AIMET)."""
        if self._frozen:
            return
        if isinstance(data_type, str):
            data_type = QuantizationDataType[data_type]
        if not encoding:
            raise InvalidArgumentError(f"quantizer {self.name!r}: no encoding given")
        before = (self._spec, self._encoding)
        try:
            self.set_precision(qtype.from_legacy_repr(data_type, int(encoding[0].bw)))
            if data_type == QuantizationDataType.int:
                flags = {"symmetric": is_symmetric, "strict_symmetric": is_strict_symmetric,
                         "unsigned_symmetric": is_unsigned_symmetric}
                self.set_qspec(self._spec.with_(**{k: bool(v) for k, v in flags.items() if v is not None}))
                self.load_encodings(encoding)
        except Exception:  # a failed call leaves the quantizer as it was
            self._spec, self._encoding = before
            raise
        self.enabled = True

    def export_encodings(self, encoding_version: str = "0.6.1") -> Any:
        """This quantizer's entry in an encodings file of ``encoding_version`` ("0.6.1": the list of
        per-channel dicts; "1.0.0" / "2.0.0": the entry's dict without its name); None when disabled or
        uncalibrated, as in AIMET."""
        from quantsim.encodings import TensorEncoding, encodings_to_dict

        if not self.enabled or (self._encoding is None and not self._spec.is_float):
            return None
        kind = "param" if self.role == "param" else "activation"
        if self._spec.is_float:
            record = TensorEncoding(self.name, kind, self._spec.dtype.bits, True, None, self.shape)
        else:
            assert self._encoding is not None
            record = TensorEncoding.from_encoding(self.name, self._encoding, kind, self.shape)
        document = encodings_to_dict([record], encoding_version)
        for section in ("encodings", f"{kind}_encodings"):
            entries = document.get(section)
            if isinstance(entries, dict) and self.name in entries:
                return entries[self.name]
            if isinstance(entries, list):
                for entry in entries:
                    if entry.get("name") == self.name:
                        return {k: v for k, v in entry.items() if k != "name"}
        return None

    # what has no counterpart ---------------------------------------------------------------------
    def update_encoding_stats(self, tensor: np.ndarray) -> None:
        raise NotSupportedError(f"quantizer {self.name!r}: update_encoding_stats: {_NO_STATISTICS}")

    def compute_encodings(self):
        raise NotSupportedError(f"quantizer {self.name!r}: compute_encodings: {_NO_STATISTICS}; or install an "
                                "encoding from a range with set_encoding(quantsim.encoding_from_range(...))")

    def get_stats_histogram(self):
        raise NotSupportedError(f"quantizer {self.name!r}: get_stats_histogram: {_NO_STATISTICS}; "
                                "mixed_precision's range analysis reports per-tensor ranges")

    def get_zero_point_shift(self) -> float:
        """Always 0.0: zero-point shift is not supported."""
        return 0.0

    def set_zero_point_shift(self, zero_point_shift: float = 0.5) -> None:
        if zero_point_shift != 0:
            raise NotSupportedError(f"quantizer {self.name!r}: zero-point shift is not supported (grids always "
                                    "include zero exactly); use a symmetric or asymmetric quantizer instead")

    @property
    def quant_info(self):
        raise NotSupportedError(f"quantizer {self.name!r}: quant_info is AIMET's C++ state; the quantizer's state "
                                "is .spec, .encoding, .enabled and .is_encoding_frozen()")

    @property
    def tensor_quantizer_params(self):
        raise NotSupportedError(f"quantizer {self.name!r}: tensor_quantizer_params is AIMET's C++ state; the "
                                "tensor's shape and channel axis are .shape and .channel_axis")
