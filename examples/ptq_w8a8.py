"""W8A8 post-training quantization of your own model: calibrate, check the accuracy, export.

    .venv/bin/python examples/ptq_w8a8.py                              # PP-OCR's text-direction classifier
    .venv/bin/python examples/ptq_w8a8.py --model m.onnx --data calib.npz [--scheme tf_enhanced]

``--data`` is an ``.npz`` with one array per model input (first axis split into batches: two thirds
calibrate, one third scores). Prints what the sim decided (``sim.summary()``), the agreement with FP32,
and writes the AIMET-style ``.encodings`` + ``.onnx`` and a standard QDQ model. A minute on 2 cores.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from quantsim import QuantizationSimModel  # noqa: E402


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], out_dir: Path, *,
        scheme: str = "min_max", progress: bool = True) -> dict[str, float]:
    """Quantize ``model`` W8A8 with ``scheme``, score it on ``evaluation``, export into ``out_dir``."""
    reference = float_outputs(model, evaluation)
    start = time.perf_counter()
    sim = QuantizationSimModel(model, param_type="int8", activation_type="int8", quant_scheme=scheme,
                               progress=progress)
    sim.compute_encodings(calibration)
    result = output_agreement(reference, [sim.session.run(None, feed) for feed in evaluation])
    result["seconds"] = time.perf_counter() - start
    print(sim.summary())
    print(f"W8A8 {scheme}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()))
    sim.export(out_dir, "w8a8")  # w8a8.onnx + w8a8.encodings, as aimet-onnx writes them
    onnx.save(sim.to_onnx_qdq(), str(out_dir / "w8a8_qdq.onnx"))  # runs on any onnxruntime provider
    print(f"wrote {out_dir / 'w8a8.encodings'}, {out_dir / 'w8a8.onnx'} and {out_dir / 'w8a8_qdq.onnx'}")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv, extra=[
        ("--scheme", {"default": "min_max", "help": "calibration scheme: min_max, tf_enhanced, percentile..."})])
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="quantsim-ptq-"))
    run(model, calibration, evaluation, out_dir, scheme=args.scheme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
