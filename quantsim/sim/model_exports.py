"""What `QuantizationSimModel` writes and reads, as a mixin: the QDQ model (``to_onnx_qdq``), the fused session
over it, the fully integer model, AIMET's encodings files (``export``, ``set_and_freeze_param_encodings``) and
the QDQ import (``from_onnx_qdq``). Each method delegates to `quantsim.export` or `quantsim.encodings`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import onnx
import onnxruntime as ort

from quantsim.errors import InvalidArgumentError
from quantsim.export.qdq_forms import check_activation_signedness
from quantsim.graph.file_set import FileSet
from quantsim.graph.session import make_session
from quantsim.sim.target_rules import check_export

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["SimExports"]


def _int32_bias_choice(export_int32_bias: bool | None, int32_bias: bool | None) -> bool:
    """AIMET's ``export_int32_bias``, or quantsim's earlier spelling ``int32_bias`` (an alias); default True."""
    if int32_bias is not None and export_int32_bias is not None and bool(int32_bias) != bool(export_int32_bias):
        raise InvalidArgumentError(f"to_onnx_qdq: export_int32_bias={export_int32_bias!r} and its alias "
                                   f"int32_bias={int32_bias!r} disagree; give one")
    chosen = export_int32_bias if export_int32_bias is not None else int32_bias
    return True if chosen is None else bool(chosen)


class SimExports:
    """Exports and imports of `QuantizationSimModel` (see the module docstring)."""

    if TYPE_CHECKING:
        providers: list
        _version: int
        _fused: tuple | None
        _session_options_kwargs: dict

        def _ensure_param_encodings(self) -> None: ...

    def fused_session(self, *, weight_codes: str = "auto") -> ort.InferenceSession:
        """A session of the QDQ export with onnxruntime's integer kernels: faster; its fixed-point requantization
        makes outputs differ from the exact sim by a few output steps (3 on the benchmark CNNs).
        ``weight_codes`` as in `to_onnx_qdq`; ``"auto"`` (default) stores 8-bit weight codes as uint8 exactly
        when this machine's uint8 x int8 kernels saturate (AVX2 without VNNI), so the session is exact here."""
        from quantsim.export.weight_codes import resolve_weight_codes

        codes = resolve_weight_codes(weight_codes, self.providers, warn_as="fused_session")
        self._ensure_param_encodings()
        if self._fused is None or self._fused[0] != self._version or self._fused[2] != codes:
            session = make_session(self.to_onnx_qdq(weight_codes=codes, target=False), self.providers, fuse_qdq=True,
                                   session_options_kwargs=self._session_options_kwargs)
            self._fused = (self._version, session, codes)
        return self._fused[1]

    @overload
    def to_onnx_qdq(self, *, export_int32_bias: bool | None = None, prequantize_constants: bool = True,
                    force_activation_as: str | None = "unsigned", path: None = None, weight_codes: str = "int8",
                    int32_bias: bool | None = None, target=None) -> onnx.ModelProto: ...

    @overload
    def to_onnx_qdq(self, *, export_int32_bias: bool | None = None, prequantize_constants: bool = True,
                    force_activation_as: str | None = "unsigned", path: str | os.PathLike, weight_codes: str = "int8",
                    int32_bias: bool | None = None, target=None) -> None: ...

    def to_onnx_qdq(self, *, export_int32_bias: bool | None = None, prequantize_constants: bool = True,
                    force_activation_as: str | None = "unsigned", path: str | os.PathLike | None = None,
                    weight_codes: str = "int8", int32_bias: bool | None = None, target=None) -> onnx.ModelProto | None:
        """Standard QDQ model: integer weights + DequantizeLinear, activation Q/DQ pairs, int32 biases
        (scale ``s_in * s_w``): run without Q/DQ fusion it computes what the sim computes (the sim adds the same
        int32 biases; with ``QuantizationSimModel(..., int32_bias=False)`` it keeps float biases, one output step
        away on near-ties).

        AIMET's keywords: ``export_int32_bias`` (default True here, False in AIMET: the int32 biases are what
        integer runtimes fuse; False keeps the float biases, as a sim built with ``int32_bias=False`` computes
        them; ``int32_bias`` is an alias, quantsim's earlier name), ``prequantize_constants`` (default True here:
        weights as integer codes behind DequantizeLinear; False stores their fake-quantized float values behind QuantizeLinear ->
        DequantizeLinear, AIMET's default; the same values) and ``force_activation_as`` ("unsigned", the
        default, "signed" or None: the storage type of activation codes, the same values; see
        `quantsim.export.qdq_forms`). With ``path`` the model is written there instead (plus ``<path>.data``
        when over protobuf's 2 GiB), each big weight computed and written one at a time, the files staged and
        renamed into place; nothing is returned. ``weight_codes``: storage of the 8-bit weight codes of
        Conv/MatMul/Gemm, ``"int8"`` (default), ``"uint8"`` (code + 128 and zero point + 128: the same values,
        run exactly by onnxruntime's U8U8 kernels on CPUs without VNNI) or ``"auto"`` (uint8 where this
        machine's U8S8 kernels saturate); see `quantsim.export.weight_codes`. The encodings files are
        unaffected. ``target`` (default: the sim's; False: none) is checked first: `ExportLegalityError` names
        every spot it cannot run (`quantsim.sim.target_rules`)."""
        from quantsim.export.qdq import qdq_skeleton

        check_export(self, target, "to_onnx_qdq")

        bias = _int32_bias_choice(export_int32_bias, int32_bias)
        skeleton, weights = qdq_skeleton(self, bias, weight_codes, check_activation_signedness(force_activation_as),
                                         bool(prequantize_constants))
        if path is None:
            return weights.materialize(skeleton)
        target = Path(path)
        with FileSet(target.parent, target.name) as files:
            files.add_model(skeleton, target.name, weights=weights)
            files.commit()
        return None

    def export_integer(self, *, integer_io: bool = False, opset: int | None = None,
                       input_shapes: dict[str, list[int]] | None = None, weight_codes: str = "int8", target=None,
                       exact: bool = True):
        """Fully integer ONNX model (QLinear*/QGemm kernels, lookup tables for other activations) and its
        fixed-point requantization table; see `quantsim.export.integer.export`. ``.save(prefix)`` writes both.
        ``input_shapes`` (``{input: dims}``) exports for those input shapes only, folding shape arithmetic
        (a detector's anchors and strides) into constants so that it runs on integer kernels too.
        ``weight_codes`` (``"int8"``, ``"uint8"``, ``"auto"``) and ``target`` as in `to_onnx_qdq`. ``exact=True``
        (default): no accepted approximation, so the integer model computes what the sim computes (HardSwish /
        HardSigmoid as exact tables unless a kernel chain reproduces the table on all 256 codes);
        ``exact=False``: their kernel chains within one output step (faster, but the steps grow downstream)."""
        from quantsim.export.integer.export import export_integer
        from quantsim.export.weight_codes import resolve_weight_codes

        check_export(self, target, "export_integer")

        codes = resolve_weight_codes(weight_codes, self.providers, warn_as="export_integer")
        self._ensure_param_encodings()
        return export_integer(self, integer_io=integer_io, opset=opset, input_shapes=input_shapes, weight_codes=codes,
                              exact=exact)

    def export(self, path, filename_prefix: str, export_model: bool = True, *, encoding_version: str = "1.0.0",
               export_int32_bias: bool | None = None, force_activation_as: str | None = "unsigned",
               qdq: bool = False, requant_table: bool = False, weight_codes: str = "int8", target=None) -> None:
        """Write ``<path>/<prefix>.encodings`` (AIMET 0.6.1 / 1.0.0 / 2.0.0) and ``<prefix>.onnx`` (float
        model); with ``qdq=True`` also ``<prefix>.qdq.onnx``, the standard QDQ model of `to_onnx_qdq` (its
        activations stored as ``force_activation_as`` says); with ``requant_table=True`` the encodings file
        also carries the integer export's fixed-point requantization table (key ``quantsim_requantization``).
        ``weight_codes`` is the storage type of the QDQ model's 8-bit weight codes (see `to_onnx_qdq`); the
        encodings file keeps int8 symmetric semantics. ``target`` as in `to_onnx_qdq`."""
        from quantsim.encodings.transfer import export_sim
        from quantsim.export.qdq import qdq_skeleton
        from quantsim.export.weight_codes import check_weight_codes
        from quantsim.graph.file_set import check_file_name

        check_file_name(filename_prefix)
        check_weight_codes(weight_codes)
        check_activation_signedness(force_activation_as)
        check_export(self, target, "export")
        requant = self.export_integer(target=False).requant_document() if requant_table else None
        extra: dict[str, Any] | None = None
        if qdq:
            extra = {".qdq.onnx": qdq_skeleton(self, weight_codes=weight_codes, activations_as=force_activation_as)}
        export_sim(self, Path(path), filename_prefix, export_model, encoding_version, export_int32_bias,
                   force_activation_as, requant, extra)

    def set_and_freeze_param_encodings(self, encoding_path) -> None:
        """Load the parameter encodings of a file and freeze them (other quantizers are left alone)."""
        from quantsim.encodings.transfer import set_and_freeze_param_encodings

        set_and_freeze_param_encodings(self, encoding_path)

    @classmethod
    def from_onnx_qdq(cls, model, strict: bool = False, **init_kwargs) -> QuantizationSimModel:
        """Build a sim from a QDQ model: Q/DQ pairs become encodings of the float model's tensors."""
        from quantsim.export.qdq_import import sim_from_qdq

        return sim_from_qdq(cls, model, strict=strict, **init_kwargs)
