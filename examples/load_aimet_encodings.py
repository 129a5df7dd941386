"""Bring encodings from aimet-onnx (or any AIMET-format ``.encodings`` file) into a quantsim sim.

    .venv/bin/python examples/load_aimet_encodings.py                  # PP-OCR's text-direction classifier
    .venv/bin/python examples/load_aimet_encodings.py --model m.onnx --data calib.npz --encodings m.encodings

Two AIMET idioms, both reading 0.6.1, 1.0.0 and 2.0.0 files:
* ``load_encodings_to_sim(sim, path, strict=False)``: every encoding in the file (parameters and
  activations) onto the sim's quantizers; the differences from the sim's own configuration come back
  as a list (``strict=True`` raises instead). No calibration needed afterwards.
* ``sim.set_and_freeze_param_encodings(path)``: only the parameter encodings, frozen (e.g. AdaRound's),
  then ``compute_encodings`` for the activations.
Without ``--encodings`` a W8A8 sim exports a 1.0.0 file first to stand in for AIMET's. The outputs of
the loaded sims are compared with the exporting sim. A minute on 2 cores.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from examples_common import float_outputs, load_case, output_agreement, parse_case_arguments  # noqa: E402

from quantsim import QuantizationSimModel, load_encodings_to_sim  # noqa: E402


def run(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], out_dir: Path, *,
        encodings: Path | None = None, progress: bool = True) -> dict[str, dict[str, float]]:
    """Load ``encodings`` (or a freshly exported file) both ways; scores and differences as described above."""
    reference = float_outputs(model, evaluation)
    exporter = None
    if encodings is None:
        exporter = QuantizationSimModel(model, progress=progress)
        exporter.compute_encodings(calibration)
        exporter.export(out_dir, "aimet_like", export_model=False, encoding_version="1.0.0")
        encodings = out_dir / "aimet_like.encodings"

    loaded = QuantizationSimModel(model, progress=progress)
    mismatches = load_encodings_to_sim(loaded, encodings, strict=False)
    print(f"load_encodings_to_sim: {len(mismatches)} differences from the sim's configuration")
    for mismatch in mismatches[:10]:
        print(f"  {mismatch}")

    frozen = QuantizationSimModel(model, progress=progress)
    frozen.set_and_freeze_param_encodings(str(encodings))
    frozen.compute_encodings(calibration)

    results = {}
    for name, sim in (("exporting sim", exporter), ("all encodings loaded", loaded),
                      ("parameters frozen + calibrated", frozen)):
        if sim is None:
            continue
        outputs = [sim.session.run(None, feed) for feed in evaluation]
        results[name] = output_agreement(reference, outputs)
        if exporter is not None and sim is not exporter:
            expected = [exporter.session.run(None, feed) for feed in evaluation]
            results[name]["max |difference| from exporting sim"] = max(
                float(np.max(np.abs(o[0] - e[0]))) for o, e in zip(outputs, expected))
        print(f"{name:32s} " + ", ".join(f"{k} {v:.4g}" for k, v in results[name].items()))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_case_arguments(__doc__, argv, extra=[
        ("--encodings", {"type": Path, "help": "an AIMET .encodings file for --model"})])
    model, calibration, evaluation = load_case(args.model, args.data, args.batch_size)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="quantsim-encodings-"))
    run(model, calibration, evaluation, out_dir, encodings=args.encodings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
