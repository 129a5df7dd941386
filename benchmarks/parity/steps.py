"""The research-script steps, each written once against an ``api`` namespace (`benchmarks.parity.apis`).

A step gets the api, a fresh copy of the float model, the calibration batches and a scratch folder, and
returns what a user would look at: ``out`` (probe logits, compared in output steps), and any other keys
(compared for equality). Steps only use calls aimet-onnx 2.42 documents.
"""
from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from benchmarks.parity import fixtures as fx

Step = Callable[..., dict]
STEPS: dict[str, Step] = {}


def step(name: str) -> Callable[[Step], Step]:
    def register(fn: Step) -> Step:
        STEPS[name] = fn
        return fn
    return register


def _calibrated(api, model, data, **kwargs):
    sim = api.QuantizationSimModel(model, **kwargs)
    sim.compute_encodings(data)
    return sim


def _output_step(sim) -> float | None:
    """The delta of the quantizer on the model output (None when it has none)."""
    for name in ("logits",):
        q = sim.qc_quantize_op_dict.get(name)
        if q is not None and q.enabled:
            enc = q.get_encodings()
            if enc:
                return float(enc[0].delta)
    return None


def _export_summary(sim, folder: Path, version: str, **kwargs) -> dict:
    sim.export(str(folder), f"m{version.replace('.', '')}", encoding_version=version, **kwargs)
    return fx.read_encodings(folder / f"m{version.replace('.', '')}.encodings")


def _result(sim, **extra) -> dict:
    return {"out": fx.sim_outputs(sim), "step": _output_step(sim), **extra}


# ------------------------------------------------------------------------------------------- the sim


@step("constructor, defaults (W8A8, min-max, per-channel)")
def ctor_default(api, model, data, tmp):
    sim = _calibrated(api, model, data)
    return _result(sim)


@step("constructor, param_type=int4 / activation_type=int16")
def ctor_types(api, model, data, tmp):
    sim = _calibrated(api, model, data, param_type=api.int4, activation_type=api.int16)
    return _result(sim)


@step("constructor, quant_scheme='tf_enhanced'")
def ctor_tf_enhanced(api, model, data, tmp):
    sim = _calibrated(api, model, data, quant_scheme="tf_enhanced")
    return _result(sim)


@step("constructor, legacy default_param_bw=4, default_activation_bw=16")
def ctor_legacy(api, model, data, tmp):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = _calibrated(api, model, data, default_param_bw=4, default_activation_bw=16)
    return _result(sim)


@step("compute_encodings(callback)")
def ce_callback(api, model, data, tmp):
    sim = api.QuantizationSimModel(model)
    sim.compute_encodings(lambda session: [session.run(None, d) for d in data])
    return _result(sim)


@step("compute_encodings(callback, args)")
def ce_callback_args(api, model, data, tmp):
    import warnings
    sim = api.QuantizationSimModel(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.compute_encodings(lambda session, batches: [session.run(None, d) for d in batches], data)
    return _result(sim)


@step("with compute_encodings(sim): ...")
def ce_context(api, model, data, tmp):
    sim = api.QuantizationSimModel(model)
    with api.compute_encodings(sim):
        for d in data:
            sim.session.run(None, d)
    return _result(sim)


@step("quantizer edits (set_bitwidth, symmetric, per-tensor, enabled)")
def quantizer_edits(api, model, data, tmp):
    sim = api.QuantizationSimModel(model)
    q = sim.qc_quantize_op_dict["fc.weight"]
    q.set_bitwidth(4)
    q.enable_per_channel_quantization(False)
    sim.qc_quantize_op_dict["relu3_out"].use_symmetric_encodings = True
    sim.qc_quantize_op_dict["short.weight"].enabled = False
    sim.compute_encodings(data)
    enc = q.get_encodings()
    return _result(sim, fc_weight=(len(enc), int(enc[0].bw)))


@step("set_param_type(sim, int4, op_types='Gemm')")
def param_type(api, model, data, tmp):
    sim = api.QuantizationSimModel(model)
    api.set_param_type(sim, api.int4, op_types="Gemm")
    sim.compute_encodings(data)
    return _result(sim, fc_bw=int(sim.qc_quantize_op_dict["fc.weight"].bitwidth))


@step("blockwise W4 (set_blockwise_quantization_for_weights)")
def blockwise(api, model, data, tmp):
    sim = api.QuantizationSimModel(model)
    api.set_blockwise_quantization_for_weights(sim, ["Gemm"], 4, True, 8)
    sim.compute_encodings(data)
    return _result(sim, fc_encodings=len(sim.qc_quantize_op_dict["fc.weight"].get_encodings()))


@step("LPBQ W4 (set_lpbq_for_params)")
def lpbq(api, model, data, tmp):
    sim = api.QuantizationSimModel(model)
    api.set_lpbq_for_params(sim, 4, 8, op_types=["Gemm"])
    sim.compute_encodings(data)
    summary = _export_summary(sim, tmp, "2.0.0")
    return _result(sim, fc_entry=summary["encodings"].get("fc.weight"))


@step("FP8 activations (activation_type=float8e4m3fn)")
def fp8(api, model, data, tmp):
    sim = _calibrated(api, model, data, activation_type=api.float8e4m3fn)
    return _result(sim, step=None)


@step("set_tensor_precision(..., int16)")
def tensor_precision(api, model, data, tmp):
    sim = api.QuantizationSimModel(model)
    sim.set_tensor_precision(["relu3_out"], api.int16)
    sim.compute_encodings(data)
    return _result(sim, bw=int(sim.qc_quantize_op_dict["relu3_out"].bitwidth))


@step("clamp_activation_encodings(sim, 2.0)")
def clamp(api, model, data, tmp):
    sim = _calibrated(api, model, data)
    api.clamp_activation_encodings(sim, 2.0)
    return _result(sim)


# ------------------------------------------------------------------------------------------- BatchNorm, CLE


@step("fold_all_batch_norms_to_weight(model), then the sim")
def bn_fold(api, model, data, tmp):
    pairs = api.fold_all_batch_norms_to_weight(model)
    bn_left = sum(n.op_type == "BatchNormalization" for n in model.graph.node)
    sim = _calibrated(api, model, data)
    return _result(sim, bn_left=bn_left, n_pairs=len(pairs[0]) if isinstance(pairs, tuple) else len(pairs))


@step("exported encodings names, BN kept (1.0.0)")
def bn_kept_names(api, model, data, tmp):
    sim = _calibrated(api, model, data)
    summary = _export_summary(sim, tmp, "1.0.0")
    return {"activations": sorted(summary["activation_encodings"]), "params": sorted(summary["param_encodings"])}


@step("equalize_model(model) in place, then the sim")
def cle(api, model, data, tmp):
    before = fx.float_outputs(model)
    api.equalize_model(model)
    after = fx.float_outputs(model)
    sim = _calibrated(api, model, data)
    return _result(sim, float_kept=bool(np.allclose(before, after, atol=1e-4)))


# ------------------------------------------------------------------------------------------- weight rounding


def _w4(api, model, data):
    return _calibrated(api, model, data, param_type=api.int4, quant_scheme="min_max")


@step("apply_seq_mse(sim, inputs, num_candidates=20)")
def seq_mse(api, model, data, tmp):
    sim = _w4(api, model, data)
    api.apply_seq_mse(sim, data, num_candidates=20)
    sim.compute_encodings(data)
    return _result(sim)


@step("apply_adaround(sim, inputs, num_iterations=200)")
def adaround_fn(api, model, data, tmp):
    sim = _w4(api, model, data)
    api.apply_adaround(sim, data, num_iterations=200)
    sim.compute_encodings(data)
    return _result(sim)


@step("Adaround.apply_adaround(sim, inputs, num_iterations=200)")
def adaround_cls(api, model, data, tmp):
    sim = _w4(api, model, data)
    api.Adaround.apply_adaround(sim, data, num_iterations=200)
    sim.compute_encodings(data)
    return _result(sim)


# ------------------------------------------------------------------------------------------- mixed precision


def _top1_eval(fp32: np.ndarray):
    def evaluate(session) -> float:
        out = session.run(None, fx.probe())[0]
        return float(np.mean(out.argmax(1) == fp32.argmax(1)))
    return evaluate


def _sqnr_eval(fp32: np.ndarray):
    def evaluate(session) -> float:
        out = session.run(None, fx.probe())[0]
        return float(10 * np.log10(np.sum(fp32 ** 2) / max(np.sum((out - fp32) ** 2), 1e-30)))
    return evaluate


@step("analyze_per_layer_sensitivity(sim, eval_fn)")
def per_layer_sensitivity(api, model, data, tmp):
    fp32 = fx.float_outputs(model)
    sim = _calibrated(api, model, data)
    scores = api.analyze_per_layer_sensitivity(sim, _sqnr_eval(fp32))
    return {"type": type(scores).__name__, "layers": sorted(scores) if isinstance(scores, dict) else None}


@step("flip_layers_to_higher_precision(sim, sensitivity, 30, int16)")
def lite_mp(api, model, data, tmp):
    fp32 = fx.float_outputs(model)
    sim = _calibrated(api, model, data)
    scores = api.analyze_per_layer_sensitivity(sim, _sqnr_eval(fp32))
    api.flip_layers_to_higher_precision(sim, scores, 30.0, api.int16)
    sim.compute_encodings(data)
    sixteen = sorted(n for n, q in sim.qc_quantize_op_dict.items() if q.enabled and q.bitwidth == 16)
    return _result(sim, sixteen=sixteen)


@step("choose_mixed_precision(...) return value")
def amp(api, model, data, tmp):
    """A budget the search never needs: top-1 on the probe drops by less than 0.2 at every candidate, so aimet-onnx
    exits early and returns None; quantsim returns an empty `AmpResult` (falsy, list-like, but ``is None`` is
    False: a real difference for scripts that test ``is None``)."""
    fp32 = fx.float_outputs(model)
    sim = _calibrated(api, model, data, param_type=api.int4)
    i = _int_dtype(api)
    candidates = [((4, i), (8, i)), ((8, i), (8, i))]
    evaluate = api.CallbackFunc(lambda session, _: _top1_eval(fp32)(session))
    forward = api.CallbackFunc(lambda session, batches: [session.run(None, d) for d in batches], data)
    result = api.choose_mixed_precision(sim, candidates, evaluate, evaluate, 0.2, str(tmp / "amp"), True, forward)
    return {"type": type(result).__name__,
            "entry": None if not result else tuple(type(v).__name__ for v in result[0])}


def _closeness_eval(fp32: np.ndarray):
    """1 - relative L2 error of the probe logits (1.0 in FP32; W8A8 0.982, W4A8 0.869 on the fixture)."""
    def evaluate(session) -> float:
        out = session.run(None, fx.probe())[0]
        return float(1.0 - np.linalg.norm(out - fp32) / np.linalg.norm(fp32))
    return evaluate


AMP_DROP = 0.06
"""Between W8A8's drop (0.018) and W4A8's (0.131): aimet-onnx's search runs (no early exit)."""


@step(f"choose_mixed_precision(...) search, W4A8/W8A8 within {AMP_DROP}")
def amp_search(api, model, data, tmp):
    """The chosen configuration: the last pareto entry within the budget as (relative bit ops, score, its group's
    parameter quantizers, candidate), the 4-bit quantizers the sim is left with and its outputs. Shown, not
    compared: how many entries the list has (the points each search evaluated: aimet-onnx keeps flips that change
    nothing, a group without weights at W4A8 or a BN scale the norm rule keeps at 8 bits; quantsim skips them).
    Groups are compared by their parameter quantizers: a tied activation quantizer is named after its first tensor
    here (``bn2_out``) and after the last one in aimet-onnx (``relu2_out``)."""
    fp32 = fx.float_outputs(model)
    sim = _calibrated(api, model, data, param_type=api.int4)
    i = _int_dtype(api)
    candidates = [((8, i), (4, i)), ((8, i), (8, i))]
    evaluate = api.CallbackFunc(lambda session, _: _closeness_eval(fp32)(session))
    forward = api.CallbackFunc(lambda session, batches: [session.run(None, d) for d in batches], data)
    result = api.choose_mixed_precision(sim, candidates, evaluate, evaluate, AMP_DROP, str(tmp / "amp"), True, forward)
    entries = list(result or [])
    within = [e for e in entries if e[1] >= 1.0 - AMP_DROP]
    chosen = None
    if within:
        bops, score, group, candidate = within[-1]
        chosen = (round(float(bops), 3), round(float(score), 3), tuple(sorted(group.parameter_quantizers)),
                  tuple((int(bw), getattr(dt, "name", str(dt))) for bw, dt in candidate))
    four = sorted(n for n, q in sim.qc_quantize_op_dict.items() if q.enabled and q.bitwidth == 4)
    return {**_result(sim, step=None), "is_list": isinstance(result, list), "chosen": chosen, "four_bit": four,
            "info: entries": len(entries)}


def _int_dtype(api):
    if api.side == "aimet":
        from aimet_onnx.common.defs import QuantizationDataType
    else:
        from quantsim import QuantizationDataType
    return QuantizationDataType.int


@step("QuantAnalyzer(...).analyze(...) JSON files")
def quant_analyzer(api, model, data, tmp):
    """The JSON files and the names in each (layers, ``<op>_input_0``/``<op>_output_0`` activations, weights). The
    HTML pages are left out on purpose: aimet-onnx writes one bokeh page per plot, quantsim one page by design."""
    fp32 = fx.float_outputs(model)
    forward = api.CallbackFunc(lambda session, batches: [session.run(None, d) for d in batches], data)
    evaluate = api.CallbackFunc(lambda session, _: _top1_eval(fp32)(session))
    analyzer = api.QuantAnalyzer(model, fx.probe(), forward, evaluate)
    results = tmp / "qa"
    analyzer.analyze(quant_scheme=api.QuantScheme.post_training_tf, results_dir=str(results))
    files = {}
    for path in sorted(results.rglob("*.json")):
        content = json.loads(path.read_text())
        files[path.relative_to(results).as_posix()] = sorted(content) if isinstance(content, dict) else type(content).__name__
    return {"json": files}


# ------------------------------------------------------------------------------------------- exports, loads


for _version in ("0.6.1", "1.0.0", "2.0.0"):
    def _export(api, model, data, tmp, _v=_version):
        sim = _calibrated(api, model, data)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _export_summary(sim, tmp, _v)
    step(f"sim.export(..., encoding_version='{_version}') contents")(_export)


def _qdq_ops(qdq: onnx.ModelProto) -> dict:
    counts: dict[str, int] = {}
    for n in qdq.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def _run_qdq(qdq: onnx.ModelProto) -> np.ndarray:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(qdq.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, fx.probe())[0]


for _kwargs in ({}, {"export_int32_bias": True}, {"prequantize_constants": True},
                {"export_int32_bias": True, "prequantize_constants": True}, {"force_activation_as": "signed"}):
    def _qdq(api, model, data, tmp, _kw=_kwargs):
        sim = _calibrated(api, model, data)
        qdq = sim.to_onnx_qdq(**_kw)
        return {"out": _run_qdq(qdq), "step": _output_step(sim),
                "int_weights": sorted(i.name for i in qdq.graph.initializer if i.data_type in (2, 3, 6, 22, 21)
                                      and len(i.dims) > 1) != []}
    step(f"to_onnx_qdq({', '.join(f'{k}={v!r}' for k, v in _kwargs.items())})")(_qdq)


def _aimet_encodings(model, data, version: str, folder: Path) -> Path:
    """An encodings file written by aimet-onnx for the default sim (the file a user brings along)."""
    from benchmarks.parity.apis import aimet_api
    sim = _calibrated(aimet_api(), copy.deepcopy(model), data)
    sim.export(str(folder), "aimet", encoding_version=version)
    return folder / "aimet.encodings"


@step("load_encodings_to_sim(sim, aimet's 1.0.0 file)")
def load_encodings(api, model, data, tmp):
    path = _aimet_encodings(model, data, "1.0.0", tmp)
    sim = api.QuantizationSimModel(model)
    api.load_encodings_to_sim(sim, str(path), strict=False)
    return _result(sim)


@step("set_and_freeze_param_encodings(aimet's file) + compute_encodings")
def freeze_params(api, model, data, tmp):
    path = _aimet_encodings(model, data, "1.0.0", tmp)
    sim = api.QuantizationSimModel(model)
    sim.set_and_freeze_param_encodings(str(path))
    sim.compute_encodings(data)
    return _result(sim)


@step("encodings_to_onnx_qdq(model, aimet's 2.0.0 file)")
def enc_to_qdq(api, model, data, tmp):
    path = _aimet_encodings(model, data, "2.0.0", tmp)
    encodings = json.loads(Path(path).read_text())
    qdq = api.encodings_to_onnx_qdq(model, encodings)
    return {"out": _run_qdq(qdq), "step": None, "ops": _qdq_ops(qdq)}


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="parity_", dir=os.environ.get("TMPDIR")))
