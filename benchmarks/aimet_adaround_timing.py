"""aimet-onnx's AdaRound on `bench_adaround.LAYERS`, timed: run with a Python that has aimet-onnx installed.

    /path/to/aimet-venv/bin/python -m benchmarks.aimet_adaround_timing ITERATIONS
    /path/to/aimet-venv/bin/python -m benchmarks.aimet_adaround_timing ITERATIONS MODEL.onnx FEEDS.npz

Prints one ``name<TAB>seconds per 1,000 iterations<TAB>CPU seconds per 1,000 iterations`` line per layer (the
whole apply_adaround call, as for quantsim; CPU time is the fair measure on a shared machine: run both sides
with ``OMP_NUM_THREADS=1``, which torch and numpy's BLAS both follow). `bench_adaround --aimet-python PATH` runs
it and prints the ratios. With a model and its calibration feeds (``.npz`` of ``batch<i>/<input>`` arrays):
one ``model<TAB>wall seconds<TAB>CPU seconds`` line for the whole model's AdaRound (W4A8) and one
``seq_mse<TAB>...`` line for its Sequential MSE (20 candidates), each on a freshly calibrated sim.
"""
from __future__ import annotations

import sys
import time

from benchmarks.bench_adaround import LAYERS, _layer_model


def main(argv: list[str] | None = None) -> int:
    from aimet_onnx import apply_adaround, apply_seq_mse
    from aimet_onnx.common.defs import QuantScheme
    from aimet_onnx.quantsim import QuantizationSimModel

    args = argv or sys.argv[1:]
    iterations = int(args[0])
    if len(args) == 3:
        import numpy as np
        import onnx

        with np.load(args[2]) as stored:
            batches: dict[str, dict[str, np.ndarray]] = {}
            for key in stored.files:
                batch, name = key.split("/", 1)
                batches.setdefault(batch, {})[name] = stored[key]
        feeds = [batches[k] for k in sorted(batches, key=lambda b: int(b[5:]))]
        model = onnx.load(args[1])
        for graph_input in model.graph.input:  # AIMET makes dummy inputs from the declared shape: fix it
            if graph_input.name in feeds[0]:
                for dim, size in zip(graph_input.type.tensor_type.shape.dim, feeds[0][graph_input.name].shape):
                    dim.dim_value = size
        cases = {"model": (model, feeds)}
    else:
        cases = {name: _layer_model(*spec) for name, spec in LAYERS.items()}
    def timed(name, model, feeds, run, scale):
        sim = QuantizationSimModel(model, param_type="int4", activation_type="int8", quant_scheme=QuantScheme.min_max,
                                   providers=["CPUExecutionProvider"])
        sim.compute_encodings(feeds)
        start, cpu = time.perf_counter(), time.process_time()
        run(sim, feeds)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"{name}\t{wall * scale:.3f}\t{cpu * scale:.3f}", flush=True)

    for name, (model, feeds) in cases.items():
        timed(name, model, feeds, lambda sim, f: apply_adaround(sim, f, num_iterations=iterations),
              1 if name == "model" else 1000 / iterations)
    if "model" in cases:  # quant_scheme min_max is post_training_tf, the scheme AIMET's Sequential MSE asserts
        timed("seq_mse", *cases["model"], lambda sim, f: apply_seq_mse(sim, f, num_candidates=20), 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
