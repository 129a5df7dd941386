"""`QuantizationSimModel`: AIMET's facade over the modules that do the work.

Construction prepares the model (`prepare`), plans quantizers (`placement`) and creates the quantizer
objects; `compute_encodings` streams calibration data (`calibration`) and turns statistics into
encodings (`encode`); `session` is an onnxruntime session of the graph `simulate` builds, rebuilt
lazily when a quantizer changed; exports and loads go through `sim_encodings` and `encodings`.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import overload

import numpy as np
import onnx
import onnxruntime as ort

from quantsim.calibration.run import (
    CALIBRATION_EXECUTION_ORDER,
    RANGE_SAMPLE,
    CalibrationSession,
    drive_calibration,
)
from quantsim.calibration.schemes import CalibrationScheme, get_scheme
from quantsim.calibration.statistics_graph import add_statistics_outputs
from quantsim.core.dtypes import QuantScheme, int8, qtype
from quantsim.core.numerics import Encoding
from quantsim.errors import InvalidArgumentError, InvalidStateError, InvalidTypeError, PrepareError, warn_at_caller
from quantsim.graph import session as session_module
from quantsim.graph.file_set import FileSet
from quantsim.graph.index import GraphIndex
from quantsim.graph.large_models import model_from_parts, model_parts
from quantsim.graph.loading import load_model, load_model_mapped
from quantsim.graph.mapped import MappedWeights
from quantsim.graph.session import WeightFiles, make_session
from quantsim.graph.tensor_roles import find_nonnegative_tensors
from quantsim.prepare import cache as prepare_cache
from quantsim.prepare import prepare, prepare_file_cached, prepare_loaded_mapped
from quantsim.sim.build import build_sim_model
from quantsim.sim.calibrate import calibration_context
from quantsim.sim.capture import Capturer, iter_tensors, make_capturer
from quantsim.sim.config import load_config
from quantsim.sim.decisions import Decision, untie_candidates
from quantsim.sim.groups import QuantizerGroup, find_quantizer_groups
from quantsim.sim.layers import WeightedLayer, find_weighted_layers, read_weight, write_weight
from quantsim.sim.legacy_args import map_legacy_arguments
from quantsim.sim.param_encodings import compute_constant_encodings
from quantsim.sim.placement import checked_norm_block_option, place_quantizers
from quantsim.sim.quantizer import QcQuantizeOp
from quantsim.sim.quantizer_dict import QuantizerDict
from quantsim.sim.state import SimState, record_weight, restore, snapshot, temporary_state, transaction

_log = logging.getLogger(__name__)

__all__ = ["QuantizationSimModel"]

INTEGER_WEIGHTS_MIN_BYTES = 256 << 20
"""Models with at least this many bytes of initializers run their sessions with 8-bit weights as integer
codes (`build_sim_model`'s ``integer_weights``): a quarter of the memory, paid for with a dequantization per
run. Smaller models keep fake-quantized float weights (from a memory-mapped file from
`session.FILE_BACKED_MIN_BYTES` on)."""

_NOT_SPECIFIED = object()  # compute_encodings: no forward_pass_callback_args given (None is a valid value)


def _constant_state(q: QcQuantizeOp) -> tuple:
    """What the calibration graph bakes in for a weight/constant quantizer (its cache key)."""
    enc = q.encoding
    grid = None if enc is None else (enc.scale.tobytes(), enc.zero_point.tobytes(), enc.qmin, enc.qmax, enc.axis,
                                     enc.block_axis, enc.block_size)
    return q.name, q.enabled, q.spec, grid


class QuantizationSimModel:
    """Quantization simulation of an ONNX model on plain onnxruntime (AIMET-compatible surface).

    Keyword arguments follow aimet_onnx 2.x: ``param_type``/``activation_type`` (qtype or alias such as
    "int8", "int4", "int16", "float16", "float8e4m3fn"), ``quant_scheme`` ("min_max"/"tf", "tf_enhanced", "percentile"),
    ``config_file`` (AIMET quantsim-config JSON path or alias; None = per-channel default), ``providers``
    (onnxruntime providers), ``path`` (working directory for artifacts). Additions: ``percentile``
    (for the percentile scheme), ``use_integer_kernels`` (run ``session`` with onnxruntime's Q/DQ
    fusion into integer kernels instead of the exact float simulation), ``progress`` (tqdm bars) and
    ``fold_batchnorm`` (False keeps BatchNormalization as its own op, with its own quantizers and precision,
    as AIMET's mixed-precision recipe needs) and ``range_health`` (default True: after each calibration,
    untie Concats whose inputs' ranges differ by orders of magnitude and give a 16-bit grid, or float, to
    8-bit activations whose values collapse onto a few codes; see `quantsim.sim.decisions`) and
    ``linear_ops_in_norm_blocks`` (default False: a Conv/Gemm/MatMul between the statistics of decomposed
    norm layers keeps float input and output; True quantizes them so QDQ runtimes run it on integer kernels,
    ``"all"`` every op between the norm layers' own statistics: speed-for-accuracy choices,
    `quantsim.sim.placement` rule 3) and ``int32_bias`` (default True: the biases of Conv/Gemm with quantized
    input and weight are added on the int32 grid ``s_in * s_w``, as the QDQ and integer exports add them, so
    the sim computes what its unfused QDQ export computes; False keeps float biases, as AIMET does). Every automatic
    decision, with its reason, is in ``sim.decisions`` and ``sim.summary()``.
    AIMET's legacy positional and bitwidth keywords are accepted with a DeprecationWarning.
    """

    def __init__(
        self,
        model,
        *args,
        param_type: qtype | str | None = None,
        activation_type: qtype | str | None = None,
        quant_scheme: QuantScheme | str | CalibrationScheme = QuantScheme.min_max,
        config_file=None,
        dummy_input=None,
        user_onnx_libs=None,
        providers=None,
        path=None,
        session_options_kwargs: dict | None = None,
        percentile: float = 100.0,
        use_integer_kernels: bool = False,
        progress: bool = True,
        fold_batchnorm: bool = True,
        range_health: bool = True,
        linear_ops_in_norm_blocks: bool | str = False,
        int32_bias: bool = True,
        **legacy,
    ):
        options = map_legacy_arguments(args, legacy, {
            "param_type": param_type, "activation_type": activation_type, "quant_scheme": quant_scheme,
            "config_file": config_file, "dummy_input": dummy_input, "providers": providers, "path": path,
            "user_onnx_libs": user_onnx_libs, "param_type_given": param_type is not None,
            "activation_type_given": activation_type is not None,
        })
        if options.get("user_onnx_libs"):
            raise InvalidArgumentError("user_onnx_libs is not supported: the sim only uses standard ONNX operators")
        loaded_here = isinstance(model, (str, os.PathLike))
        # an unchanged model file whose preparation is cached: nothing of the file is read
        cached = prepare_file_cached(model, fold_batchnorm=fold_batchnorm) if loaded_here else None
        self._weights: MappedWeights | None = None
        signatures: dict[str, list[int] | None] = {}
        if cached is None:  # a file's big weights stay in it, mapped, until the cache entry copies them
            proto, self._label, mapped = load_model_mapped(model, signatures, prepare_cache.EXTERNAL_DATA_BYTES)
        else:
            self._label = str(Path(model))
        self.param_type = qtype.as_qtype(options["param_type"] or int8)
        self.activation_type = qtype.as_qtype(options["activation_type"] or int8)
        self._quant_scheme = get_scheme(options["quant_scheme"])
        self.config = load_config(options["config_file"])
        ignored = [p for p in self.config.supergroup_pass_list if p != "MatmulAdd"]
        if ignored or self.config.hw_version:
            warn_at_caller(f"config {self.config.source}: "
                          + (f"supergroup passes {ignored} are not applied; " if ignored else "")
                          + (f"hw_version {self.config.hw_version!r} exception rules are not applied" if
                             self.config.hw_version else ""), UserWarning)
        self.providers = list(options["providers"] or ["CPUExecutionProvider"])
        self.path = Path(options["path"]) if options["path"] is not None else None
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
        self._session_options_kwargs = dict(session_options_kwargs or {})
        self.use_integer_kernels = bool(use_integer_kernels)
        self.progress = bool(progress)
        self.range_health = bool(range_health)
        self.linear_ops_in_norm_blocks = checked_norm_block_option(linear_ops_in_norm_blocks)
        self.int32_bias = bool(int32_bias)  # biases on the exports' int32 grid (`quantsim.sim.int32_bias`)
        try:
            if cached is not None:
                self._model, self._weights = cached
            elif loaded_here:  # the sim's own copy: preparation lets it go before loading the prepared one
                box = [proto]
                del proto
                self._model, self._weights = prepare_loaded_mapped(
                    lambda: box.pop() if box else load_model(model)[0], fold_batchnorm=fold_batchnorm,
                    source=(model, signatures), weights=mapped)
            else:
                self.model = prepare(proto, fold_batchnorm=fold_batchnorm)
        except PrepareError as error:  # name the model too: a script may build several sims
            raise PrepareError(f"{self._label}: {error}") from error
        self._build_quantizers(percentile)

    # construction ------------------------------------------------------------------------------
    def _build_quantizers(self, percentile: float) -> None:
        self._index = GraphIndex(self._model, weights=self._weights)
        with self._index.cached_constants():  # each weight read once (finite checks, shapes)
            placement = place_quantizers(self._index, self.config, self.param_type, self.activation_type,
                                         self.linear_ops_in_norm_blocks)
        self.left_in_float = placement.left_in_float
        self._decisions: list[Decision] = list(placement.decisions)
        self._version = 0
        self._session = None
        self._session_version = -1
        self._fused: tuple | None = None
        self._calibration_cache: tuple | None = None
        self._active_calibration: CalibrationSession | None = None  # inside `compute_encodings(sim)`
        self._constant_memo: dict[str, tuple] = {}  # shared fake-quantized weights (build_sim_model memo)
        self._weight_files: WeightFiles | None = None  # the same for mapped weights, on disk (`_session_files`)
        self._capture_sessions: dict[tuple, tuple] = {}
        self._open_states: list[SimState] = []
        self.qc_quantize_op_dict: dict[str, QcQuantizeOp] = QuantizerDict()
        self._quantizers: list[QcQuantizeOp] = []
        for plan in placement.plans:
            quantizer = QcQuantizeOp(
                plan.name, plan.role, plan.spec, enabled=plan.enabled, tensors=tuple(plan.tensors),
                shape=plan.shape, channel_axis=plan.channel_axis, quant_scheme=self._quant_scheme,
                percentile=percentile, notify=self._invalidate, param_type=plan.param_type,
                fixed_range=plan.fixed_range,
            )
            self._quantizers.append(quantizer)
            for tensor in plan.tensors:
                self.qc_quantize_op_dict[tensor] = quantizer
        self.param_names = [t for q in self._quantizers if q.role == "param" for t in q.tensors]
        self.activation_names = [t for q in self._quantizers if q.role == "activation" for t in q.tensors]

    @property
    def model(self) -> onnx.ModelProto:
        """The prepared model. A large model read from a file keeps its weights in the preparation cache's data
        file, read through memory maps (`quantsim.graph.mapped`); asking for the ModelProto copies them in
        (once: from then on the sim holds them in memory, as for a model passed as a ModelProto)."""
        if self._weights is not None:
            self._weights.materialize(self._model)
            self._weights = self._index.weights = None
            self._weight_files = None  # no longer mapped: sessions get the weights as arrays again
        return self._model

    @model.setter
    def model(self, value: onnx.ModelProto) -> None:
        self._model, self._weights = value, None
        self._weight_files = None

    def _invalidate(self) -> None:
        self._version += 1

    @property
    def quant_scheme_name(self) -> str:
        """The sim's default calibration scheme, by AIMET's enum name where it has one."""
        scheme = self._quant_scheme
        return scheme.quant_scheme.name if scheme.quant_scheme is not None else scheme.name

    @property
    def decisions(self) -> list[Decision]:
        """Every automatic decision (masked attention left float, untied Concats, range-health promotions),
        each with its rule, tensors, action and reason, in the order they were taken."""
        return list(self._decisions)

    def _record_decisions(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if decision not in self._decisions:
                self._decisions.append(decision)
                _log.info("sim %s: %s", self._label, decision)

    @property
    def quantizers(self) -> list[QcQuantizeOp]:
        """Every distinct quantizer object (tied tensors share one)."""
        return list(self._quantizers)

    def set_tensor_precision(self, names, precision, *, strict: bool = True) -> list[QcQuantizeOp]:
        """AIMET's ``sim.set_tensor_precision``: set the precision of the quantizer deciding each tensor
        (its own, or the closest upstream through grid-preserving ops); see `quantsim.sim.precision_setters`."""
        from quantsim.sim.precision_setters import set_tensor_precision

        return set_tensor_precision(self, names, precision, strict=strict)

    def get_all_quantizers(self) -> tuple[list[QcQuantizeOp], list[QcQuantizeOp]]:
        """``(param quantizers, activation quantizers)``, like AIMET."""
        return ([q for q in self._quantizers if q.role == "param"],
                [q for q in self._quantizers if q.role == "activation"])

    def get_qc_quantize_op(self) -> dict[str, QcQuantizeOp]:
        return self.qc_quantize_op_dict

    def set_percentile_value(self, percentile: float) -> None:
        """Percentile for every quantizer (used by the percentile scheme)."""
        for q in self._quantizers:
            q.set_percentile_value(percentile)

    # encodings from data -------------------------------------------------------------------------
    def _is_constant_quantizer(self, q: QcQuantizeOp) -> bool:
        return all(self._index.is_constant(t) for t in q.tensors)

    def _constant_values(self, q: QcQuantizeOp) -> np.ndarray:
        values = [self._index.constant_value(t) for t in q.tensors]
        return values[0] if len(values) == 1 else np.concatenate([v.reshape(-1) for v in values])

    def _compute_constant_encodings(self, only_missing: bool) -> None:
        compute_constant_encodings(self, only_missing)  # `quantsim.sim.param_encodings`

    def compute_encodings(self, inputs=None, forward_pass_callback_args=_NOT_SPECIFIED, *, forward_pass_callback=None):
        """Calibrate: weight encodings from the initializers, activation encodings from streamed data.

        Call forms: ``compute_encodings(iterable_of_feed_dicts)``, ``compute_encodings(callback)`` (called as
        ``callback(session)``) and the legacy ``compute_encodings(callback, args)``. Frozen encodings are
        never touched; if anything fails, every encoding is left as it was.
        """
        data = inputs if inputs is not None else forward_pass_callback
        if data is None:
            raise InvalidTypeError("compute_encodings needs calibration inputs or a forward-pass callback")
        if forward_pass_callback_args is not _NOT_SPECIFIED:
            # AIMET calls callback(session, args) whenever args are given, even None
            if not callable(data):
                raise InvalidTypeError("forward_pass_callback_args is only valid with a callback")
            callback, callback_args = data, forward_pass_callback_args
            data = lambda session: callback(session, callback_args)  # noqa: E731
        with calibration_context(self) as session:
            drive_calibration(session, data, progress=self.progress)

    def _calibration_session(self, observed: list[QcQuantizeOp]) -> CalibrationSession:
        histograms = frozenset(q.name for q in observed if q.calibration_scheme.needs_histogram)
        sampled = bool(histograms) or self.range_health
        groups = {t: q.name for q in observed for t in q.tensors if not self._index.is_constant(t)}
        constants = [q for q in self._quantizers if q.role == "param" or self._is_constant_quantizer(q)]
        small = {t for t, name in groups.items() if name not in histograms}  # range-health samples only
        key = (tuple(_constant_state(q) for q in constants), tuple(sorted(groups)), sampled, tuple(sorted(small)))
        if self._calibration_cache is None or self._calibration_cache[0] != key:
            weights: dict[str, np.ndarray] = {}
            model = build_sim_model(self._model, [q for q in constants if q.enabled], source=self._index,
                                    external=weights, memo=self._session_memo(),
                                    integer_weights=self._integer_weights())
            shapes = self._index.shape
            model, outputs = add_statistics_outputs(
                model, list(groups), list(groups) if sampled else [], nonnegative=find_nonnegative_tensors(self._index),
                shapes={t: shapes[t] for t in groups if shapes.get(t) is not None},
                elem_types={t: self._index.elem_type[t] for t in groups if t in self._index.elem_type},
                sample_sizes=dict.fromkeys(small, RANGE_SAMPLE),
            )
            options = {"execution_order": CALIBRATION_EXECUTION_ORDER, **(self._session_options_kwargs or {})}
            session = make_session(model, self.providers, session_options_kwargs=options, external_initializers=weights,
                                   file_backed=self._file_backed(), prepack=self._weights is not None,
                                   weight_files=self._session_files())
            self._calibration_cache = (key, session, outputs)
        _, session, outputs = self._calibration_cache
        samples = frozenset(q.name for q in observed) if self.range_health else frozenset()
        per_tensor = untie_candidates(self, observed) if self.range_health else frozenset()
        return CalibrationSession(session, outputs, groups, histograms=histograms, range_samples=samples,
                                  per_tensor=per_tensor)

    # the simulation ------------------------------------------------------------------------------
    def _integer_weights(self) -> bool:
        """Whether sessions hold big 8-bit weights as integer codes dequantized just before their layer (same
        outputs, a quarter of the memory; see `build_sim_model`): models of `INTEGER_WEIGHTS_MIN_BYTES` whose
        weights are in memory. Mapped weights (`model`) need no such saving: the sim holds none of them, and
        onnxruntime gets fake-quantized float weights, which run as fast as the float model."""
        return self._weights is None and self._index.initializer_bytes() >= INTEGER_WEIGHTS_MIN_BYTES

    def _session_memo(self) -> dict[str, tuple] | None:
        """The memo that lets the calibration and sim sessions share fake-quantized weights; None for mapped
        weights, whose sessions get them through a file (kept, they would be a second copy)."""
        return None if self._weights is not None else self._constant_memo

    def _session_files(self) -> WeightFiles | None:
        """For mapped weights with file-backed sessions: the files their fake-quantized weights were written
        to, kept for the next session (calibration, then the sim, then each AdaRound or AMP rebuild) and, in
        the cache entry, for later processes (`weight_store`): only weights whose quantizer or values changed
        are computed. Disk, not memory: the page cache holds them while a session reads them (`WeightFiles`)."""
        if self._weights is None or not self._file_backed():
            return None
        if self._weight_files is None:
            self._weight_files = WeightFiles.for_entry(self._weights.folder)
        return self._weight_files

    def _file_backed(self) -> bool:
        """Whether sessions get the weights as a memory-mapped file (`session.make_session`)."""
        return self._index.initializer_bytes() >= session_module.FILE_BACKED_MIN_BYTES

    def _ensure_param_encodings(self) -> None:
        self._compute_constant_encodings(only_missing=True)

    def sim_model(self) -> onnx.ModelProto:
        """The sim graph as a ModelProto (uncalibrated activation quantizers pass data through)."""
        return self._built_sim_model()

    def _built_sim_model(self, external: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
        with self._index.cached_constants():
            self._ensure_param_encodings()
            return build_sim_model(self._model, self._quantizers, source=self._index, external=external,
                                   int32_bias=self.int32_bias)

    @property
    def session(self) -> ort.InferenceSession:
        """onnxruntime session of the sim; rebuilt on first use after any quantizer change. Inside AIMET's
        ``with compute_encodings(sim):`` block it is the calibration session, which collects statistics."""
        if self._active_calibration is not None:
            return self._active_calibration
        if self._session is None or self._session_version != self._version:
            start = time.perf_counter()
            weights: dict[str, np.ndarray] = {}
            with self._index.cached_constants():
                self._ensure_param_encodings()
                if self.use_integer_kernels:
                    model = self.to_onnx_qdq(weight_codes="auto")  # in-process: exact kernels on this CPU
                else:
                    model = build_sim_model(self._model, self._quantizers, source=self._index, external=weights,
                                            memo=self._session_memo(), integer_weights=self._integer_weights(),
                                            int32_bias=self.int32_bias)
            self._session = None  # the old session's weights go before the new one's arrive
            self._session = make_session(model, self.providers, fuse_qdq=self.use_integer_kernels,
                                         session_options_kwargs=self._session_options_kwargs,
                                         external_initializers=weights, file_backed=self._file_backed(),
                                         prepack=self._weights is not None, weight_files=self._session_files())
            self._session_version = self._version
            _log.debug("sim %s: session rebuilt in %.3f s (version %d)", self._label, time.perf_counter() - start,
                       self._version)
        return self._session

    def fused_session(self, *, weight_codes: str = "auto") -> ort.InferenceSession:
        """A session of the QDQ export with onnxruntime's integer kernels: faster; its fixed-point requantization
        makes outputs differ from the exact sim by a few output steps (3 on the benchmark CNNs).
        ``weight_codes`` as in `to_onnx_qdq`; ``"auto"`` (default) stores 8-bit weight codes as uint8 exactly
        when this machine's uint8 x int8 kernels saturate (AVX2 without VNNI), so the session is exact here."""
        from quantsim.export.weight_codes import resolve_weight_codes

        codes = resolve_weight_codes(weight_codes, self.providers, warn_as="fused_session")
        self._ensure_param_encodings()
        if self._fused is None or self._fused[0] != self._version or self._fused[2] != codes:
            session = make_session(self.to_onnx_qdq(weight_codes=codes), self.providers, fuse_qdq=True,
                                   session_options_kwargs=self._session_options_kwargs)
            self._fused = (self._version, session, codes)
        return self._fused[1]

    @overload
    def to_onnx_qdq(self, *, int32_bias: bool = True, path: None = None,
                    weight_codes: str = "int8") -> onnx.ModelProto: ...

    @overload
    def to_onnx_qdq(self, *, int32_bias: bool = True, path: str | os.PathLike,
                    weight_codes: str = "int8") -> None: ...

    def to_onnx_qdq(self, *, int32_bias: bool = True, path: str | os.PathLike | None = None,
                    weight_codes: str = "int8") -> onnx.ModelProto | None:
        """Standard QDQ model: integer weights + DequantizeLinear, activation Q/DQ pairs, int32 biases
        (scale ``s_in * s_w``); within one output step of the sim (the sim keeps float biases). With ``path``
        the model is written there instead (plus ``<path>.data`` when over protobuf's 2 GiB), each big weight
        computed and written one at a time, the files staged and renamed into place; nothing is returned.
        ``weight_codes``: storage of the 8-bit weight codes of Conv/MatMul/Gemm, ``"int8"`` (default),
        ``"uint8"`` (code + 128 and zero point + 128: the same values, run exactly by onnxruntime's U8U8
        kernels on CPUs without VNNI) or ``"auto"`` (uint8 where this machine's U8S8 kernels saturate); see
        `quantsim.export.weight_codes`. The encodings files are unaffected."""
        from quantsim.export.qdq import qdq_skeleton

        skeleton, weights = qdq_skeleton(self, int32_bias, weight_codes)
        if path is None:
            return weights.materialize(skeleton)
        target = Path(path)
        with FileSet(target.parent, target.name) as files:
            files.add_model(skeleton, target.name, weights=weights)
            files.commit()
        return None

    def export_integer(self, *, integer_io: bool = False, opset: int | None = None,
                       input_shapes: dict[str, list[int]] | None = None, weight_codes: str = "int8",
                       exact: bool = False):
        """Fully integer ONNX model (QLinear*/QGemm kernels, lookup tables for other activations) and its
        fixed-point requantization table; see `quantsim.export.integer.export`. ``.save(prefix)`` writes both.
        ``input_shapes`` (``{input: dims}``) exports for those input shapes only, folding shape arithmetic
        (a detector's anchors and strides) into constants so that it runs on integer kernels too.
        ``weight_codes`` (``"int8"``, ``"uint8"``, ``"auto"``) as in `to_onnx_qdq`; ``exact=True``: no accepted
        approximation (HardSwish/HardSigmoid as exact tables, not kernel chains within one step)."""
        from quantsim.export.integer.export import export_integer
        from quantsim.export.weight_codes import resolve_weight_codes

        codes = resolve_weight_codes(weight_codes, self.providers, warn_as="export_integer")
        self._ensure_param_encodings()
        return export_integer(self, integer_io=integer_io, opset=opset, input_shapes=input_shapes, weight_codes=codes,
                              exact=exact)

    # extension hooks (what adaround/ and mixed_precision/ build on) -------------------------------
    def weighted_layers(self) -> list[WeightedLayer]:
        """Conv/ConvTranspose/Gemm/MatMul nodes with a constant weight, in topological order, with their
        tensors, weight quantizer and following activation (see `quantsim.sim.layers`)."""
        return find_weighted_layers(self)

    def get_weight(self, name: str) -> np.ndarray:
        """A float copy of constant ``name`` of the prepared model (before fake quantization)."""
        return read_weight(self, name)

    def replace_weight(self, name: str, values: np.ndarray, *, encoding: Encoding | None = None,
                       freeze: bool = False) -> None:
        """Replace constant ``name``'s values (same shape); optionally install ``encoding`` on its quantizer
        and freeze it. Sessions that depend on it are rebuilt on next use; open snapshots can undo it."""
        old = read_weight(self, name)
        q = self.qc_quantize_op_dict.get(name)
        if (encoding is not None or freeze) and q is None:
            raise InvalidArgumentError(f"{name!r} has no quantizer to take an encoding or be frozen")
        if encoding is not None and q is not None and q.is_encoding_frozen():
            raise InvalidStateError(f"quantizer {q.name!r} is frozen: its encoding cannot change")
        record_weight(self, name, old)
        self._write_weight(name, values)
        if encoding is not None and q is not None:
            q.set_encoding(encoding)
        if freeze and q is not None:
            q.freeze_encodings()

    def _write_weight(self, name: str, values: np.ndarray) -> None:
        write_weight(self, name, values)
        self._constant_memo.clear()
        if self._weight_files is not None:
            self._weight_files.forget(name)
        self._calibration_cache = None  # its key holds quantizer state, not weight values
        self._invalidate()

    def capture(self, tensors, inputs, *, quantized: bool = True):
        """Yield ``{tensor: array}`` per feed dict of ``inputs``: the values of ``tensors`` in the sim
        (after their quantizers) or, with ``quantized=False``, in the float model. Streamed: nothing is
        kept between batches (keep what you need, e.g. in a `quantsim.TensorCache`)."""
        return iter_tensors(self, tensors, inputs, quantized=quantized)

    def capturer(self, tensors, *, quantized: bool = True) -> Capturer:
        """A callable ``capturer(inputs)`` like `capture`, bound to the sim (or float model) as it is now:
        later changes to the sim do not reach it (e.g. float targets while weights are being replaced)."""
        return make_capturer(self, tensors, quantized=quantized)

    def quantizer_groups(self) -> list[QuantizerGroup]:
        """Each weighted op's parameter quantizers with the activation quantizers it reads; every enabled
        quantizer in exactly one group (see `quantsim.sim.groups`)."""
        return find_quantizer_groups(self)

    def snapshot(self) -> SimState:
        """The sim's state (quantizers, replaced weights, sessions), for `restore`."""
        return snapshot(self)

    def restore(self, state: SimState) -> None:
        """Put the sim back exactly into a `snapshot` (no session rebuild when nothing else changed)."""
        restore(self, state)

    def temporary_state(self):
        """Context manager: change quantizers or weights inside it; on exit the sim is restored exactly."""
        return temporary_state(self)

    def transaction(self):
        """Context manager: changes inside it stay if the block completes; an exception (KeyboardInterrupt
        included) restores the sim exactly as it was."""
        return transaction(self)

    def compute_param_encodings(self) -> None:
        """Encodings of enabled parameter quantizers that have none yet, from the weights (no data needed)."""
        with self._index.cached_constants():
            self._ensure_param_encodings()

    def __getstate__(self) -> dict:
        """Pickling (``pickle``, ``copy.deepcopy``, shipping a sim to worker processes): the prepared model,
        the quantizer table and the settings travel; onnxruntime sessions and caches do not, and are rebuilt
        on first use. Open snapshots stay with the original."""
        if self._active_calibration is not None:
            raise InvalidStateError(f"sim {self._label}: cannot be pickled inside a calibration block")
        self.model  # noqa: B018 - mapped weights are copied in: the pickle carries the whole model
        state = dict(self.__dict__)
        state.update(_session=None, _session_version=-1, _fused=None, _calibration_cache=None,
                     _capture_sessions={}, _open_states=[], _constant_memo={}, _weight_files=None)
        # the index is rebuilt from the model (its tensors would pickle as a second copy of every weight), and
        # the model travels as its skeleton plus weight bytes (protobuf pickles nothing over 2 GiB)
        del state["_index"]
        state["_model"] = model_parts(self._model)
        return state

    def __setstate__(self, state: dict) -> None:
        """Unpickling: the model put back together and its index rebuilt (see `__getstate__`)."""
        state = dict(state)
        state["_model"] = model_from_parts(*state["_model"])
        self.__dict__.update(state)
        self._index = GraphIndex(self._model)

    # files ---------------------------------------------------------------------------------------
    def export(self, path, filename_prefix: str, export_model: bool = True, *, encoding_version: str = "1.0.0",
               export_int32_bias: bool | None = None, force_activation_as: str = "unsigned",
               qdq: bool = False, requant_table: bool = False, weight_codes: str = "int8") -> None:
        """Write ``<path>/<prefix>.encodings`` (AIMET 0.6.1 / 1.0.0 / 2.0.0) and ``<prefix>.onnx`` (float
        model); with ``qdq=True`` also ``<prefix>.qdq.onnx``, the standard QDQ model of `to_onnx_qdq`; with
        ``requant_table=True`` the encodings file also carries the integer export's fixed-point
        requantization table (key ``quantsim_requantization``). ``weight_codes`` is the storage type of the QDQ
        model's 8-bit weight codes (see `to_onnx_qdq`); the encodings file keeps int8 symmetric semantics."""
        from quantsim.encodings.transfer import export_sim
        from quantsim.export.qdq import qdq_skeleton
        from quantsim.export.weight_codes import check_weight_codes
        from quantsim.graph.file_set import check_file_name

        check_file_name(filename_prefix)
        check_weight_codes(weight_codes)
        requant = self.export_integer().requant_document() if requant_table else None
        extra = {".qdq.onnx": qdq_skeleton(self, weight_codes=weight_codes)} if qdq else None
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

    def summary(self) -> str:
        """Quantizers by tensor (role, type, granularity, enabled, frozen, range) and what stays float."""
        from quantsim.sim.summary import summarize

        return summarize(self)

    __str__ = summary
