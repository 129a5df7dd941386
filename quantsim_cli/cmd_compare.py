"""``quantsim compare FLOAT_MODEL QUANTIZED_MODEL --data PATH``: output agreement and latency of two ONNX models.

Both run on stock onnxruntime (CPU) over the same data, which is checked against the float model's inputs.
Outputs are paired by name (by position when the quantized model renamed them). Per output: SQNR against the
float model, max absolute error, and top-1 agreement for ``[N, classes]`` outputs. Latency: the median of
``--runs`` timed runs of the first batch per model, after one warm-up run.
"""
from __future__ import annotations

import argparse
import json
import logging

import onnxruntime as ort

from quantsim import InvalidArgumentError
from quantsim_cli.data import model_inputs, open_data
from quantsim_cli.metrics import AgreementAccumulator, format_db, median_latency_ms
from quantsim_cli.report import json_ready, percent, text_table

__all__ = ["run_compare", "open_session"]

_log = logging.getLogger(__name__)


def open_session(path: str, option: str, providers: list[str] | None = None) -> ort.InferenceSession:
    """An onnxruntime session of ``path`` on ``providers`` (default CPU); a model onnxruntime refuses is an
    error naming the file."""
    try:
        return ort.InferenceSession(path, providers=providers or ["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own exception types
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InvalidArgumentError(f"{option} {path}: onnxruntime cannot load it ({first})") from None


def _output_pairs(reference: ort.InferenceSession, test: ort.InferenceSession, test_path: str) -> dict[str, str]:
    ref_names = [o.name for o in reference.get_outputs()]
    test_names = [o.name for o in test.get_outputs()]
    if set(ref_names) <= set(test_names):
        return {name: name for name in ref_names}
    if len(ref_names) == len(test_names):
        _log.info("%s renames the outputs; pairing them by position", test_path)
        return dict(zip(ref_names, test_names))
    raise InvalidArgumentError(f"{test_path}: outputs {test_names} do not match the float model's {ref_names}")


def run_compare(args: argparse.Namespace) -> int:
    """The ``compare`` subcommand; returns the exit code."""
    inputs = model_inputs(args.float_model)
    quantized_inputs = {spec.name for spec in model_inputs(args.quantized_model)}
    missing = [spec.name for spec in inputs if spec.name not in quantized_inputs]
    if missing:
        raise InvalidArgumentError(f"{args.quantized_model}: has no input {missing[0]!r} (it has "
                                   f"{', '.join(sorted(quantized_inputs))})")
    data = open_data(args.data, inputs, args.batch_size, args.max_batches)
    reference = open_session(args.float_model, "FLOAT_MODEL", args.providers)
    test = open_session(args.quantized_model, "QUANTIZED_MODEL", args.providers)
    pairs = _output_pairs(reference, test, args.quantized_model)
    agreement = AgreementAccumulator()
    first = None
    batches = 0
    for feed in data:
        first = first or feed
        batches += 1
        ref = dict(zip([o.name for o in reference.get_outputs()], reference.run(None, feed)))
        got = dict(zip([o.name for o in test.get_outputs()], test.run(None, feed)))
        agreement.add(ref, {name: got[pairs[name]] for name in ref})
    assert first is not None  # CalibrationData raises when there are no batches
    latency = {"float_ms": median_latency_ms(lambda: reference.run(None, first), args.runs),
               "quantized_ms": median_latency_ms(lambda: test.run(None, first), args.runs)}
    if args.quiet:
        return 0
    if args.json:
        print(json.dumps(json_ready({"batches": batches, "outputs": [o.as_dict() for o in agreement.rows()],
                                     "latency": latency})))
        return 0
    print(f"compared {args.quantized_model} with {args.float_model} on {batches} batch(es) from {data.description}")
    print(text_table(("output", "SQNR", "max abs error", "max abs float", "top-1 agreement"),
                     [(o.name, format_db(o.sqnr_db), f"{o.max_abs_error:.4g}", f"{o.max_abs_reference:.4g}",
                       percent(o.top1_agreement)) for o in agreement.rows()]))
    ratio = latency["quantized_ms"] / latency["float_ms"] if latency["float_ms"] > 0 else float("nan")
    print(f"  latency (first batch, median of {args.runs}): float {latency['float_ms']:.2f} ms, "
          f"quantized {latency['quantized_ms']:.2f} ms ({ratio:.2f}x)")
    return 0
