"""The argument parser: every subcommand, option and value check of the ``quantsim`` command line.

Option values are checked here (argparse ``type=`` and ``choices=``), so a bad value is a usage error (exit
code 2) with a message naming the option; files and data are checked when they are read (exit code 1).
"""
from __future__ import annotations

import argparse

import onnxruntime as ort

import quantsim

__all__ = ["build_parser", "ARTEFACTS", "TYPES", "SCHEMES", "ENCODING_VERSIONS", "positive_int", "non_negative_int",
           "artefact_list", "provider_list"]

#: what ``quantize --write`` can produce
ARTEFACTS = ("encodings", "float", "qdq", "integer")
WEIGHT_CODES = ("int8", "uint8", "auto")  # QuantizationSimModel.to_onnx_qdq(weight_codes=...)
TYPES = ("int4", "int8", "int16", "float16")
SCHEMES = ("min_max", "tf", "tf_enhanced", "percentile")
ENCODING_VERSIONS = ("0.6.1", "1.0.0", "2.0.0")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _percentile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 100], got {text!r}") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 100], got {text!r}")
    return value


def _duration(text: str) -> float:
    from quantsim.prepare import parse_duration

    try:
        return parse_duration(text)
    except quantsim.QuantsimError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _size(text: str) -> str:
    from quantsim.prepare import parse_size

    try:
        parse_size(text, "--max-size")
    except quantsim.QuantsimError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def candidate_list(text: str) -> list[str]:
    """argparse type: comma-separated precision presets (W4A8, W8A8, W8A16, W16A16, FP16)."""
    items = [item.strip().upper() for item in text.split(",") if item.strip()]
    known = ("W4A8", "W8A8", "W8A16", "W16A16", "FP16")
    unknown = [item for item in items if item not in known]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(known)}, got {text!r}")
    return items


def artefact_list(text: str) -> list[str]:
    """argparse type: a comma-separated subset of `ARTEFACTS` (``all`` for every one)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if items == ["all"]:
        return list(ARTEFACTS)
    unknown = [item for item in items if item not in ARTEFACTS]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"unknown artefact(s) {unknown or [text]}; choose from {', '.join(ARTEFACTS)} "
                                         "or 'all'")
    return list(dict.fromkeys(items))


def provider_list(text: str) -> list[str]:
    """argparse type: comma-separated onnxruntime execution providers, each available in this installation
    (``CUDAExecutionProvider`` needs the onnxruntime-gpu package)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    available = ort.get_available_providers()
    missing = [item for item in items if item not in available]
    if missing or not items:
        raise argparse.ArgumentTypeError(f"execution provider(s) {missing or [text]} not available in this "
                                         f"onnxruntime; available: {', '.join(available)}")
    return list(dict.fromkeys(items))


#: the ``--providers`` option of the commands that run models
PROVIDERS_OPTION: dict = {
    "type": provider_list, "default": None, "metavar": "LIST",
    "help": "comma-separated onnxruntime execution providers, in order of preference (default "
            "CPUExecutionProvider), e.g. CUDAExecutionProvider,CPUExecutionProvider"}


def _add_global(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The logging options; a subcommand's copy has no defaults, so it never undoes ``quantsim -q COMMAND``."""
    def default(value):
        return argparse.SUPPRESS if suppress else value

    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", default=default(False),
                      help="print errors only (no summary, warnings or progress bars)")
    loud.add_argument("-v", "--verbose", action="count", default=default(0),
                      help="more log output (-v: steps, -vv: debug details)")
    parser.add_argument("--debug", action="store_true", default=default(False),
                        help="show the full traceback of an error")


def _add_data(parser: argparse.ArgumentParser, required: bool = True) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--data", required=required, metavar="PATH",
                       help="a folder of .npy/.npz files (one batch each), one .npz with one array per model input "
                            "(or one .npy; split into batches), or module:function returning an iterable of feed dicts")
    group.add_argument("--batch-size", type=positive_int, metavar="N",
                       help="rows per batch (default: each file of a folder as it is, 16 for a single .npz/.npy; "
                            "the model's batch size when it is fixed)")
    group.add_argument("--max-batches", type=positive_int, metavar="N", help="use at most N batches")


def _add_sim(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("quantization")
    group.add_argument("--param-type", choices=TYPES, default="int8", help="weight type (default int8)")
    group.add_argument("--activation-type", choices=TYPES, default="int8", help="activation type (default int8)")
    group.add_argument("--quant-scheme", choices=SCHEMES, default="min_max",
                       help="activation calibration scheme (default min_max)")
    group.add_argument("--percentile", type=_percentile, default=100.0, metavar="P",
                       help="percentile for --quant-scheme percentile (default 100)")
    granularity = group.add_mutually_exclusive_group()
    granularity.add_argument("--config", metavar="FILE",
                             help="AIMET quantsim-config JSON file (or 'default', 'per_channel', 'per_tensor')")
    granularity.add_argument("--per-channel", dest="granularity", action="store_const", const="per_channel",
                             help="per-channel weights (the default config)")
    granularity.add_argument("--per-tensor", dest="granularity", action="store_const", const="per_tensor",
                             help="per-tensor weights")
    group.add_argument("--keep-batchnorm", action="store_true",
                       help="do not fold BatchNormalization (to give it its own precision in --overrides)")
    group.add_argument("--overrides", metavar="JSON",
                       help="precision-override file (mixed_precision format: default / op_type / regex / node)")
    group.add_argument("--providers", **PROVIDERS_OPTION)


def build_parser() -> argparse.ArgumentParser:
    """The ``quantsim`` parser with its subcommands (``args.command`` names the one chosen)."""
    common = argparse.ArgumentParser(add_help=False)
    _add_global(common, suppress=True)
    parser = argparse.ArgumentParser(
        prog="quantsim",
        description="Quantize ONNX models on stock onnxruntime (AIMET-compatible simulation and exports).",
        epilog="Exit codes: 0 ok, 1 error (bad file, data or model), 2 usage (bad command line).")
    _add_global(parser, suppress=False)
    parser.add_argument("--version", action="version", version=f"quantsim {quantsim.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    quantize = commands.add_parser("quantize", parents=[common], help="calibrate a model and write its artefacts",
                                   description="Calibrate MODEL on --data, optionally improve it (Sequential MSE, "
                                               "AdaRound, precision overrides), write the artefacts and report.md.")
    quantize.add_argument("model", metavar="MODEL", help="float ONNX model file")
    quantize.add_argument("--out", required=True, metavar="DIR",
                          help="output folder (created if missing). An earlier run's artefacts with the same prefix "
                               "(and its analysis.html) are removed before this run writes, so the folder holds only "
                               "this run's files; report.md lists them and what was removed")
    _add_data(quantize)
    _add_sim(quantize)
    improve = quantize.add_argument_group("improvements (adaround package)")
    improve.add_argument("--seq-mse", type=non_negative_int, default=0, metavar="CANDIDATES",
                         help="Sequential MSE weight ranges with this many candidates per channel (0: off; 20 is "
                              "AIMET's default)")
    improve.add_argument("--adaround", type=non_negative_int, default=0, metavar="ITERATIONS",
                         help="AdaRound with this many iterations per layer (0: off; AIMET recommends 10000)")
    budget = quantize.add_argument_group(
        "accuracy budget (mixed_precision.auto_quantize: the cheapest configuration within --max-drop)")
    budget.add_argument("--max-drop", type=non_negative_float, metavar="DROP",
                        help="search for the cheapest configuration whose --eval score is at most DROP below the "
                             "float model's (defaults, calibration schemes, CLE, Sequential MSE + AdaRound, per-layer "
                             "mixes); replaces --param-type/--activation-type/--quant-scheme/--overrides")
    budget.add_argument("--eval", metavar="module:function",
                        help="with --max-drop: function(session) -> float, higher is better, scoring an onnxruntime "
                             "session on your evaluation data (module:function or path/to/file.py:function)")
    budget.add_argument("--candidates", type=candidate_list, metavar="LIST",
                        help="with --max-drop: precisions to choose from (default W4A8,W8A8,W8A16,W16A16,FP16)")
    budget.add_argument("--time-budget", type=non_negative_float, metavar="SECONDS",
                        help="with --max-drop: stop the search once this is spent (between steps, and inside the "
                             "mixed-precision search before its next evaluation)")
    budget.add_argument("--phase1", choices=("proxy", "callback"),
                        help="with --max-drop: what ranks the layers in the mixed-precision search's phase 1: the "
                             "output SQNR against the float model on the first calibration batch (proxy, default) or "
                             "the --eval function (callback: one full evaluation per layer group and precision)")
    budget.add_argument("--score-on", choices=("export", "sim", "both"),
                        help="with --max-drop: score each configuration on its QDQ export in onnxruntime's integer "
                             "kernels (export, default: what deploys), on the sim's session (sim), or on the lower of "
                             "the two (both: a choice that holds in the fused and the exact integer kernels)")
    budget.add_argument("--resume", action="store_true",
                        help="with --max-drop: reuse the scores an interrupted search left in --out")
    output = quantize.add_argument_group("output")
    output.add_argument("--write", type=artefact_list, default=["encodings", "float"], metavar="LIST",
                        help=f"comma-separated artefacts: {', '.join(ARTEFACTS)} or all (default encodings,float; "
                             "the float model is written with its encodings file)")
    output.add_argument("--prefix", metavar="NAME", help="file name prefix (default: the model file's stem)")
    output.add_argument("--weight-codes", choices=WEIGHT_CODES, default="int8",
                        help="storage type of the 8-bit weight codes in the qdq and integer models (default int8; "
                             "uint8: the same values, exact on onnxruntime's kernels on x86 CPUs without VNNI; "
                             "auto: uint8 where this machine needs it). The encodings file is unaffected")
    output.add_argument("--encoding-version", choices=ENCODING_VERSIONS, default="1.0.0",
                        help="AIMET encodings format (default 1.0.0)")
    output.add_argument("--analysis-batches", type=non_negative_int, default=4, metavar="N",
                        help="batches for the report's per-layer SQNR (default 4; 0 skips it)")

    inspect = commands.add_parser("inspect", parents=[common], help="list a model's quantizers or an export's contents",
                                  description="For an ONNX model: the quantizers a default sim places, with the "
                                              "prepared tensor names and where they came from. For an export folder "
                                              "or file: what it contains.")
    inspect.add_argument("target", metavar="MODEL_OR_DIR", help="float ONNX model, export folder or export file")
    _add_sim(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.add_argument("--target", dest="target_profile", metavar="NAME_OR_FILE",
                         help="also show where each node would run on this target (onnxruntime-cpu, generic-npu, "
                              "gpu-qdq, a target profile or an AIMET config with supported_kernels): integer kernel, "
                              "float16, float, or illegal with the rule")

    compare = commands.add_parser("compare", parents=[common], help="output agreement and latency of two models",
                                  description="Run FLOAT_MODEL and QUANTIZED_MODEL (QDQ or integer export) on --data: "
                                              "per-output SQNR, max error, top-1 agreement, onnxruntime latency.")
    compare.add_argument("float_model", metavar="FLOAT_MODEL")
    compare.add_argument("quantized_model", metavar="QUANTIZED_MODEL")
    _add_data(compare)
    compare.add_argument("--providers", **PROVIDERS_OPTION)
    compare.add_argument("--runs", type=positive_int, default=10, metavar="N",
                         help="timed runs of the first batch per model (default 10)")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")

    analyze = commands.add_parser("analyze", parents=[common], help="per-layer sensitivity and range health",
                                  description="Calibrate MODEL on --data and report each quantizer group's "
                                              "sensitivity (output SQNR quantized alone / left float) and each "
                                              "activation's SQNR and codes used.")
    analyze.add_argument("model", metavar="MODEL")
    _add_data(analyze)
    _add_sim(analyze)
    analyze.add_argument("--analysis-batches", type=positive_int, default=4, metavar="N",
                         help="batches to score on (default 4; calibration uses all)")
    analyze.add_argument("--out", metavar="DIR", help="also write analysis.md, analysis.json and analysis.html here")
    analyze.add_argument("--top", type=positive_int, default=10, metavar="N", help="rows to print per table")

    cache = commands.add_parser("cache", parents=[common], help="the preparation cache",
                                description="List, clear or trim the on-disk cache of prepared models "
                                            "($QUANTSIM_CACHE_DIR, default ~/.cache/quantsim). Each new entry trims "
                                            "it to its size limit ($QUANTSIM_CACHE_MAX_SIZE, default 5G) by removing "
                                            "the least recently used entries; entries a process is reading are "
                                            "never removed.")
    cache.add_argument("action", choices=("list", "clear", "trim"),
                       help="list: entries with size, last use and whether in use; clear: remove entries (all, or "
                            "with --older-than those unused for that long); trim: evict least recently used entries "
                            "down to --max-size")
    cache.add_argument("--cache-dir", metavar="DIR", help="cache folder (default: $QUANTSIM_CACHE_DIR or ~/.cache/quantsim)")
    cache.add_argument("--older-than", type=_duration, metavar="DURATION",
                       help="clear: only entries last used longer ago than this (e.g. 30d, 12h, 90m, 45s)")
    cache.add_argument("--max-size", type=_size, metavar="SIZE",
                       help="trim: the size to trim to (e.g. 2G, 500M; default $QUANTSIM_CACHE_MAX_SIZE or 5G)")
    return parser
