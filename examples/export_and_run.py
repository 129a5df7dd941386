"""Deployable models: the QDQ model and the fully integer model, run in plain onnxruntime.

    .venv/bin/python examples/export_and_run.py                        # PP-OCR's text-direction classifier
    .venv/bin/python examples/export_and_run.py --model m.onnx --data calib.npz

After W8A8 calibration it writes
* ``model_qdq.onnx``: QuantizeLinear/DequantizeLinear pairs that onnxruntime (any provider) fuses into
  integer kernels where it can;
* ``model_int8.onnx`` + ``model_int8.requant.json``: the fully integer model (QLinearConv, QGemm, ...)
  with its fixed-point requantization table; ``integer.report`` lists every op that stayed float and why;
then runs both next to FP32 and the sim, printing their agreement with FP32, their largest difference
from the sim in output quantization steps, and their latency. A minute on 2 cores.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from quantsim import QuantizationSimModel  # noqa: E402


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _latency(session: ort.InferenceSession, feeds: list[dict], repeats: int = 3) -> float:
    """Best of ``repeats`` seconds to run every feed."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for feed in feeds:
            session.run(None, feed)
        best = min(best, time.perf_counter() - start)
    return best


def _output_step(sim: QuantizationSimModel, output: str) -> float | None:
    """The quantization step of the sim's first output, or None when that output is not quantized."""
    quantizer = sim.get_qc_quantize_op().get(output)
    if quantizer is None or not quantizer.enabled or quantizer.encoding is None:
        return None
    return float(np.max(quantizer.encoding.scale))


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], out_dir: Path, *,
        progress: bool = True) -> dict[str, dict[str, float]]:
    """Export the QDQ and integer models of a W8A8 sim into ``out_dir`` and compare them (see above)."""
    reference = float_outputs(model, evaluation)
    sim = QuantizationSimModel(model, progress=progress)
    sim.compute_encodings(calibration)
    onnx.save(sim.to_onnx_qdq(), str(out_dir / "model_qdq.onnx"))
    integer = sim.export_integer()
    integer.save(out_dir / "model_int8")
    if integer.report:
        print(f"ops left float in the integer model:\n{integer.report}")
    simulated = [sim.session.run(None, feed) for feed in evaluation]
    step = _output_step(sim, model.graph.output[0].name)
    sessions = {"FP32": ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
                "sim": sim.session, "QDQ": _session(out_dir / "model_qdq.onnx"),
                "integer": _session(out_dir / "model_int8.onnx")}
    results = {}
    for name, session in sessions.items():
        outputs = [session.run(None, feed) for feed in evaluation]
        results[name] = output_agreement(reference, outputs)
        if name != "FP32":
            largest = max(float(np.max(np.abs(o[0] - s[0]))) for o, s in zip(outputs, simulated))
            results[name]["steps from sim" if step else "max |difference| from sim"] = largest / (step or 1.0)
        results[name]["ms per batch"] = 1000 * _latency(session, evaluation) / len(evaluation)
        print(f"{name:8s} " + ", ".join(f"{k} {v:.3f}" for k, v in results[name].items()))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv)
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="quantsim-export-"))
    run(model, calibration, evaluation, out_dir)
    print(f"models in {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
