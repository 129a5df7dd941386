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

import numpy as np
import onnx
import onnxruntime as ort

from quantsim.calibration.run import CalibrationSession, drive_calibration
from quantsim.calibration.schemes import CalibrationScheme, get_scheme
from quantsim.core.dtypes import QuantScheme, int8, qtype
from quantsim.errors import InvalidArgumentError, InvalidStateError, InvalidTypeError, PrepareError, warn_at_caller
from quantsim.graph import session as session_module
from quantsim.graph.index import GraphIndex
from quantsim.graph.large_models import model_from_parts, model_parts
from quantsim.graph.loading import load_model, load_model_mapped
from quantsim.graph.mapped import MappedWeights
from quantsim.graph.session import WeightFiles, make_session
from quantsim.graph.wrapped import as_model_proto
from quantsim.prepare import cache as prepare_cache
from quantsim.prepare import prepare, prepare_file_cached, prepare_loaded_mapped
from quantsim.sim.aimet_differences import announce_batchnorm_folds, announce_depthwise_supergroups, watch_calibrated_decisions
from quantsim.sim.aimet_surface import AimetSurface
from quantsim.sim.build import build_sim_model
from quantsim.sim.calibrate import calibration_context
from quantsim.sim.calibration_build import calibration_session
from quantsim.sim.config import load_config, warn_unapplied_config
from quantsim.sim.decisions import Decision
from quantsim.sim.legacy_args import map_legacy_arguments
from quantsim.sim.model_exports import SimExports
from quantsim.sim.model_hooks import SimHooks
from quantsim.sim.model_view import ModelView
from quantsim.sim.param_encodings import compute_constant_encodings
from quantsim.sim.placement import checked_norm_block_option, place_quantizers
from quantsim.sim.quantizer import QcQuantizeOp
from quantsim.sim.quantizer_dict import QuantizerDict
from quantsim.sim.state import SimState
from quantsim.sim.target_rules import TargetProfile, attach_target

_log = logging.getLogger(__name__)

__all__ = ["QuantizationSimModel"]

INTEGER_WEIGHTS_MIN_BYTES = 256 << 20
"""Models with at least this many bytes of initializers run their sessions with 8-bit weights as integer
codes (`build_sim_model`'s ``integer_weights``): a quarter of the memory, paid for with a dequantization per
run. Smaller models keep fake-quantized float weights (from a memory-mapped file from
`session.FILE_BACKED_MIN_BYTES` on)."""

_NOT_SPECIFIED = object()  # compute_encodings: no forward_pass_callback_args given (None is a valid value)


class QuantizationSimModel(SimHooks, SimExports, AimetSurface):
    """Quantization simulation of an ONNX model on plain onnxruntime (AIMET-compatible surface).

    Keyword arguments follow aimet_onnx 2.x: ``param_type``/``activation_type`` (qtype or alias such as
    "int8", "int4", "int16", "float16", "float8e4m3fn"), ``quant_scheme`` ("min_max"/"tf", "tf_enhanced", "percentile"),
    ``config_file`` (AIMET quantsim-config JSON path or alias; None = per-channel default), ``providers``
    (onnxruntime providers), ``path`` (working directory for artifacts). Additions: ``percentile``
    (for the percentile scheme), ``use_integer_kernels`` (run ``session`` with onnxruntime's Q/DQ
    fusion into integer kernels instead of the exact float simulation), ``progress`` (tqdm bars) and
    ``fold_batchnorm`` (default: fold, False keeps BatchNormalization as its own op, with its own quantizers and
    precision, as aimet-onnx does) and ``range_health`` (default on: after each calibration,
    untie Concats whose inputs' ranges differ by orders of magnitude and give a 16-bit grid, or float, to
    8-bit activations whose values collapse onto a few codes; see `quantsim.sim.decisions`) and
    ``linear_ops_in_norm_blocks`` (default False: a Conv/Gemm/MatMul between the statistics of decomposed
    norm layers keeps float input and output; True quantizes them so QDQ runtimes run it on integer kernels,
    ``"all"`` every op between the norm layers' own statistics: speed-for-accuracy choices,
    `quantsim.sim.placement` rule 3) and ``depthwise_supergroups`` (default: one quantizer after a depthwise / 3-D
    Conv and its activation; False: AIMET's rule, a quantizer on the convolution's output too). Left at None,
    ``fold_batchnorm``, ``range_health`` and ``depthwise_supergroups`` warn once where they differ from aimet-onnx
    (`quantsim.sim.aimet_differences`). ``int32_bias`` (default True) adds the biases of Conv/Gemm (and MatMul bias Adds) with
    quantized input and weight on the int32 grid ``s_in * s_w``, as the exports do (`quantsim.sim.int32_bias`;
    False: float biases, as aimet-onnx). Every automatic
    decision, with its reason, is in ``sim.decisions`` and ``sim.summary()``.
    AIMET's legacy positional and bitwidth keywords are accepted with a DeprecationWarning.
    Exports are in `quantsim.sim.model_exports`, the extension hooks in `quantsim.sim.model_hooks`, the rest
    of AIMET's surface in `quantsim.sim.aimet_surface`. ``target`` (a `quantsim.TargetProfile`, shipped name or
    file) keeps every precision legal on that hardware (`quantsim.sim.target_rules`).
    """

    target: TargetProfile | None

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
        fold_batchnorm: bool | None = None,
        range_health: bool | None = None,
        linear_ops_in_norm_blocks: bool | str = False,
        depthwise_supergroups: bool | None = None,
        target=None,
        int32_bias: bool = True,
        **legacy,
    ):
        options = map_legacy_arguments(args, legacy, {
            "param_type": param_type, "activation_type": activation_type, "quant_scheme": quant_scheme,
            "config_file": config_file, "dummy_input": dummy_input, "providers": providers, "path": path,
            "user_onnx_libs": user_onnx_libs, "param_type_given": param_type is not None,
            "activation_type_given": activation_type is not None,
        })
        if options.get("dummy_input") is not None:
            warn_at_caller("dummy_input has no effect: every tensor's type comes from shape inference on the prepared "
                           "model (aimet-onnx uses it only where its inference cannot type a tensor)", UserWarning)
        if options.get("user_onnx_libs"):
            raise InvalidArgumentError("user_onnx_libs is not supported: the sim only uses standard ONNX operators")
        loaded_here = isinstance(model, (str, os.PathLike))
        # an unchanged model file whose preparation is cached: nothing of the file is read
        folding = fold_batchnorm is not False
        cached = prepare_file_cached(model, fold_batchnorm=folding) if loaded_here else None
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
        warn_unapplied_config(self.config)
        self.providers = list(options["providers"] or ["CPUExecutionProvider"])
        self.path = Path(options["path"]) if options["path"] is not None else None
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
        self._session_options_kwargs = dict(session_options_kwargs or {})
        self.use_integer_kernels = bool(use_integer_kernels)
        self.progress = bool(progress)
        self.range_health = range_health is None or bool(range_health)
        self.depthwise_supergroups = depthwise_supergroups is not False
        self.linear_ops_in_norm_blocks = checked_norm_block_option(linear_ops_in_norm_blocks)
        self.int32_bias = bool(int32_bias)  # biases on the exports' int32 grid (`quantsim.sim.int32_bias`)
        folds = announce_batchnorm_folds(proto if cached is None else None, fold_batchnorm)
        try:
            if cached is not None:
                self._model, self._weights = cached
            elif loaded_here:  # the sim's own copy: preparation lets it go before loading the prepared one
                box = [proto]
                del proto
                self._model, self._weights = prepare_loaded_mapped(
                    lambda: box.pop() if box else load_model(model)[0], fold_batchnorm=folding,
                    source=(model, signatures), weights=mapped)
            else:
                self._model, self._weights = prepare(proto, fold_batchnorm=folding), None
        except PrepareError as error:  # name the model too: a script may build several sims
            raise PrepareError(f"{self._label}: {error}") from error
        self._build_quantizers(percentile)
        self._record_decisions(folds)
        watch_calibrated_decisions(self, range_health)
        announce_depthwise_supergroups(self._decisions, depthwise_supergroups)
        attach_target(self, target)

    # construction ------------------------------------------------------------------------------
    def _build_quantizers(self, percentile: float) -> None:
        self._index = GraphIndex(self._model, weights=self._weights)
        with self._index.cached_constants():  # each weight read once (finite checks, shapes)
            placement = place_quantizers(self._index, self.config, self.param_type, self.activation_type,
                                         self.linear_ops_in_norm_blocks, self.depthwise_supergroups)
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
    def model(self) -> ModelView:
        """The prepared float model, as AIMET's ``ONNXModel``: ``sim.model.model`` is the ModelProto, and the
        view forwards every ModelProto attribute (``sim.model.graph``; `quantsim.sim.model_view`). A large model
        read from a file keeps its weights in the preparation cache's data file, read through memory maps
        (`quantsim.graph.mapped`); using the ModelProto copies them in (once: from then on the sim holds them in
        memory, as for a model passed as a ModelProto)."""
        return ModelView(self._materialized_model)

    @model.setter
    def model(self, value: onnx.ModelProto | ModelView) -> None:
        """Replace the prepared float model by one with the same tensors (edited weights, say): the index is
        rebuilt and the session follows. A model without some quantized tensor is refused, naming them."""
        proto = as_model_proto(value)
        index = GraphIndex(proto)
        known = index.tensor_names()
        missing = sorted(t for q in self._quantizers for t in q.tensors if t not in known)
        if missing:
            raise InvalidArgumentError(f"sim.model = ...: the new model lacks {len(missing)} tensors the sim "
                                       f"quantizes (e.g. {missing[:3]}); build a new sim for a different graph")
        self._model, self._weights, self._index = proto, None, index
        self._weight_files = None
        self._constant_memo.clear()  # fake-quantized weights of the old model
        self._calibration_cache = None  # its key holds quantizer state, not weight values
        self._invalidate()

    def _materialized_model(self) -> onnx.ModelProto:
        if self._weights is not None:
            self._weights.materialize(self._model)
            self._weights = self._index.weights = None
            self._weight_files = None  # no longer mapped: sessions get the weights as arrays again
        return self._model

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
    def prepared_model(self) -> onnx.ModelProto:
        """The prepared float model as the sim holds it, a large model's weights still memory-mapped (read them
        through `graph_index`), where `model` brings them into memory."""
        return self._model

    @property
    def source_label(self) -> str:
        """Where the model came from (its file, or a description), as messages name it."""
        return self._label

    @property
    def version(self) -> int:
        """A counter that every change of the sim's quantizers, encodings or model increases."""
        return self._version

    def target_findings(self, changes: dict[str, qtype | str | None]) -> list[str]:
        """What the sim's target would refuse if the named quantizers took these types together (None: float32):
        the new findings, each naming its node and rule; [] without a target or when all is legal. A dry run:
        nothing changes (`quantsim.sim.target_rules.change_findings`)."""
        from quantsim.sim.target_rules import change_findings

        return change_findings(self, changes)

    @property
    def graph_index(self) -> GraphIndex:
        """The read-only index of the prepared model (producers, consumers, shapes, constants; mapped weights are
        read, never copied in) that the sim's helper modules share."""
        return self._index

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
        return calibration_session(self, observed)  # `quantsim.sim.calibration_build`

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
                    model = self.to_onnx_qdq(weight_codes="auto", target=False)  # in-process: exact kernels here
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

    def __getstate__(self) -> dict:
        """Pickling (``pickle``, ``copy.deepcopy``, shipping a sim to worker processes): the prepared model,
        the quantizer table and the settings travel; onnxruntime sessions and caches do not, and are rebuilt
        on first use. Open snapshots stay with the original."""
        if self._active_calibration is not None:
            raise InvalidStateError(f"sim {self._label}: cannot be pickled inside a calibration block")
        self._materialized_model()  # mapped weights are copied in: the pickle carries the whole model
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

    def summary(self) -> str:
        """Quantizers by tensor (role, type, granularity, enabled, frozen, range) and what stays float."""
        from quantsim.sim.summary import summarize

        return summarize(self)

    __str__ = summary
