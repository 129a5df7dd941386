"""``quantsim quantize MODEL --data PATH --out DIR``: calibrate, improve, export, report.

Steps, each timed: read the data's first batch (bad data fails before the slow steps), prepare the sim,
apply precision overrides, calibrate, Sequential MSE and/or AdaRound (then calibrate the activations again
against the new weights), write the artefacts, measure the outputs and per-layer SQNR on the first
``--analysis-batches`` batches (with ``analysis.html``, the per-tensor charts of
`mixed_precision.write_analysis_html`), write ``report.md`` and print a short summary.

Re-running into the same ``--out`` with the same prefix replaces the earlier run: once calibration has
succeeded, every artefact an earlier run may have written under the prefix (``<prefix>.encodings``,
``.onnx``, ``.qdq.onnx``, ``.integer.onnx``, ``.integer.requant.json`` and their ``.data`` files), its
``analysis.html`` and ``report.md`` are removed before this run writes its own, so the folder never mixes,
say, an int8 QDQ model from one run with 4-bit encodings from another; each removal is logged and listed in
the new ``report.md``, whose file list is read back from the folder (the files of this run that are there).
The input model and its external data are never removed.
"""
from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import onnx

from quantsim import InvalidArgumentError
from quantsim_cli.cmd_auto import SEARCH_FILES, check_budget_options, run_search, search_settings
from quantsim_cli.data import model_inputs, open_data
from quantsim_cli.metrics import AgreementAccumulator, format_db
from quantsim_cli.report import QuantizeResult, json_ready, percent, stayed_float, write_quantize_report
from quantsim_cli.simbuild import apply_overrides, config_from_args, load_overrides_from_args, sim_from_args

__all__ = ["run_quantize", "artefact_paths", "remove_earlier_run", "files_of_this_run"]

_log = logging.getLogger(__name__)


def artefact_paths(out: Path, prefix: str, write: list[str]) -> list[Path]:
    """The files ``--write`` may produce in ``out`` (a model over 2 GB also has its ``<model>.data``)."""
    paths = []
    if "encodings" in write or "float" in write:
        paths.append(out / f"{prefix}.encodings")
    if "float" in write:
        paths += _model_files(out / f"{prefix}.onnx")
    if "qdq" in write:
        paths += _model_files(out / f"{prefix}.qdq.onnx")
    if "integer" in write:
        paths += [*_model_files(out / f"{prefix}.integer.onnx"), out / f"{prefix}.integer.requant.json"]
    return paths


def _model_files(path: Path) -> list[Path]:
    return [path, path.with_name(path.name + ".data")]


def _input_files(model_path: str) -> set[Path]:
    """The input model file and the external-data files it names (resolved): never removed as stale."""
    model = Path(model_path).resolve()
    files = {model, model.with_name(model.name + ".data")}
    try:
        skeleton = onnx.load(str(model), load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable model fails later with its own error
        return files
    for tensor in skeleton.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                files.add((model.parent / entry.value).resolve())
    return files


def remove_earlier_run(out: Path, prefix: str, model_path: str) -> list[Path]:
    """Remove what an earlier ``quantize`` may have left in ``out`` under ``prefix`` (every artefact of
    `artefact_paths` for all of ``--write``, ``analysis.html`` and ``report.md``), except the input model's own
    files; returns the artefacts removed (logged; the old report is not counted)."""
    keep = _input_files(model_path)
    removed = []
    for path in [*artefact_paths(out, prefix, ["encodings", "float", "qdq", "integer"]), out / "analysis.html",
                 out / "report.md"]:  # the earlier run's report: a failed export must not leave it describing the folder
        if path.is_file() and path.resolve() not in keep:
            path.unlink()
            removed.append(path)
    stale = [p for p in removed if p.name != "report.md"]
    if stale:
        _log.warning("removed %s of an earlier run in %s (this run writes its own artefacts)",
                     ", ".join(p.name for p in stale), out)
    return stale


def files_of_this_run(out: Path, prefix: str, write: list[str], since: float) -> list[Path]:
    """The artefacts of ``write`` that are in ``out`` now and were written at or after ``since`` (read from the
    folder, not from what the export meant to write)."""
    found = []
    for path in artefact_paths(out, prefix, write):
        try:
            if path.stat().st_mtime >= since:
                found.append(path)
        except FileNotFoundError:
            continue
    return found


def _check_output(args: argparse.Namespace) -> tuple[Path, str]:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(f"--out {out}: exists and is not a folder")
    prefix = args.prefix or Path(args.model).stem
    if not prefix or any(c in prefix for c in "/\\") or prefix in (".", ".."):
        raise InvalidArgumentError(f"--prefix {prefix!r}: must be a plain file name")
    model = Path(args.model).resolve()
    if any(p.resolve() == model for p in artefact_paths(out, prefix, args.write)):
        raise InvalidArgumentError(f"--out {out}: writing {prefix}.onnx there would overwrite the input model; "
                                   "choose another --out or --prefix")
    return out, prefix


def _settings(args: argparse.Namespace) -> list[tuple[str, str]]:
    return [("parameter type", args.param_type), ("activation type", args.activation_type),
            ("quant scheme", args.quant_scheme + (f" (percentile {args.percentile:g})"
                                                   if args.quant_scheme == "percentile" else "")),
            ("config", config_from_args(args) or "default (per-channel weights)"),
            ("BatchNormalization", "kept" if args.keep_batchnorm else "folded"),
            ("precision overrides", args.overrides or "none"),
            ("Sequential MSE", f"{args.seq_mse} candidates" if args.seq_mse else "off"),
            ("AdaRound", f"{args.adaround} iterations per layer" if args.adaround else "off"),
            ("encodings version", args.encoding_version), ("artefacts", ", ".join(args.write)),
            ("weight codes", args.weight_codes)]


def _improve(args: argparse.Namespace, sim, data, result: QuantizeResult) -> None:
    if not (args.seq_mse or args.adaround):
        return
    from adaround import apply_adaround, apply_seq_mse

    if args.seq_mse:
        with result.timings("Sequential MSE"):
            result.layer_reports += [("Sequential MSE", r) for r in apply_seq_mse(sim, data, num_candidates=args.seq_mse)]
    if args.adaround:
        with result.timings("AdaRound"):
            result.layer_reports += [("AdaRound", r) for r in apply_adaround(sim, data, num_iterations=args.adaround)]
    with result.timings("calibration with the new weights"):
        sim.compute_encodings(data)  # weight encodings are frozen; activations follow the new weights


def _export(args: argparse.Namespace, sim, out: Path, prefix: str, result: QuantizeResult) -> None:
    out.mkdir(parents=True, exist_ok=True)
    since = time.time() - 2  # coarse file-system clocks
    with result.timings("export"):
        result.removed = remove_earlier_run(out, prefix, args.model)
        if "encodings" in args.write or "float" in args.write:
            sim.export(out, prefix, export_model="float" in args.write, encoding_version=args.encoding_version,
                       qdq="qdq" in args.write, weight_codes=args.weight_codes)
        elif "qdq" in args.write:
            # streamed weight by weight, staged, any size
            sim.to_onnx_qdq(path=out / f"{prefix}.qdq.onnx", weight_codes=args.weight_codes)
        if "integer" in args.write:
            integer = sim.export_integer(weight_codes=args.weight_codes)
            integer.save(out / f"{prefix}.integer")
            result.integer_report = list(integer.report)
    result.files += files_of_this_run(out, prefix, args.write, since)


def _analyse(args: argparse.Namespace, sim, data, out: Path, result: QuantizeResult) -> None:
    if not args.analysis_batches:
        return
    from mixed_precision import report_dict, tensor_health, write_analysis_html

    with result.timings("analysis"):
        batches = data.first(args.analysis_batches)
        outputs = [o.name for o in sim.model.graph.output]
        agreement = AgreementAccumulator()
        for ref, got in zip(sim.capture(outputs, batches, quantized=False), sim.capture(outputs, batches)):
            agreement.add(ref, got)
        result.agreement = agreement
        result.health = tensor_health(sim, batches)
        page = json_ready(report_dict(math.inf, agreement.overall_sqnr_db(), [], result.health))
        page["title"] = f"quantsim quantize: {Path(args.model).name}"
        page["score"] = "output SQNR against the float model, dB (per-group sensitivity: quantsim analyze)"
        result.analysis_page = write_analysis_html(page, out / "analysis.html")
        result.files.append(result.analysis_page)


def _summary(result: QuantizeResult, report: Path) -> str:
    lines = [f"quantized {result.model}: {result.enabled} of {result.quantizers} quantizers enabled, "
             f"{result.batches} calibration batch(es) from {result.data}"]
    if result.agreement is not None:
        for o in result.agreement.rows():
            top1 = f", top-1 agreement {percent(o.top1_agreement)}" if o.top1_agreement is not None else ""
            lines.append(f"  output {o.name}: SQNR {format_db(o.sqnr_db)}, max abs error {o.max_abs_error:.4g}{top1}")
    if result.health:
        worst = result.health[0]
        lines.append(f"  worst activation: {worst.tensor} {format_db(worst.sqnr_db)}"
                     + ("" if worst.verdict == "ok" else f" ({worst.verdict})"))
    if result.float_rows:
        lines.append(f"  {len(result.float_rows)} tensor(s) stay float (see the report)")
    lines.append("  wrote " + ", ".join(str(f) for f in result.files + [report]))
    steps = ", ".join(f"{step} {seconds:.1f}" for step, seconds in result.timings.steps)
    lines.append(f"  time {result.timings.total:.1f} s ({steps})")
    return "\n".join(lines)


def run_quantize(args: argparse.Namespace) -> int:
    """The ``quantize`` subcommand; returns the exit code."""
    out, prefix = _check_output(args)
    check_budget_options(args)
    inputs = model_inputs(args.model)
    data = open_data(args.data, inputs, args.batch_size, args.max_batches)
    overrides = load_overrides_from_args(args)
    searching = args.max_drop is not None
    result = QuantizeResult(model=args.model, settings=search_settings(args) if searching else _settings(args),
                            data=data.description, batches=0, quantizers=0, enabled=0)
    with result.timings("read first batch"):
        data.first(1)  # the data's errors before the slow steps
    if searching:
        with result.timings("accuracy budget search"):
            counted = _Counted(data)
            search, result.search_section = run_search(args, counted, out)
            sim, result.batches = search.sim, counted.count
    else:
        with result.timings("prepare"):
            sim = sim_from_args(args, args.model)
        if overrides is not None:
            with result.timings("precision overrides"):
                result.overrides = apply_overrides(sim, overrides, args.overrides)
        with result.timings("calibration"):
            counted = _Counted(data)
            sim.compute_encodings(counted)
            result.batches = counted.count
        _improve(args, sim, data, result)
    _export(args, sim, out, prefix, result)
    if searching:
        result.files += [out / name for name in SEARCH_FILES if (out / name).is_file()]
    _analyse(args, sim, data, out, result)
    result.quantizers = len(sim.quantizers)
    result.enabled = sum(q.enabled for q in sim.quantizers)
    result.float_rows = stayed_float(sim)
    report = write_quantize_report(out / "report.md", result)
    if not args.quiet:
        print(_summary(result, report))
    return 0


class _Counted:
    """Iterates the data once, counting the batches."""

    def __init__(self, data) -> None:
        self.data, self.count = data, 0

    def __iter__(self):
        self.count = 0
        for feed in self.data:
            self.count += 1
            yield feed
