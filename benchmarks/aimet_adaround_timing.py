"""aimet-onnx's AdaRound on `bench_adaround.LAYERS`, timed: run with a Python that has aimet-onnx installed.

    /path/to/aimet-venv/bin/python -m benchmarks.aimet_adaround_timing ITERATIONS
    /path/to/aimet-venv/bin/python -m benchmarks.aimet_adaround_timing ITERATIONS MODEL.onnx FEEDS.npz \
        [EVAL.npz OUT_DIR [adaround|seq_mse]]

Prints one ``name<TAB>seconds per 1,000 iterations<TAB>CPU seconds per 1,000 iterations`` line per layer (the
whole apply_adaround call, as for quantsim; CPU time is the fair measure on a shared machine: run both sides
with ``OMP_NUM_THREADS=1``, which torch and numpy's BLAS both follow). `bench_adaround --aimet-python PATH` runs
it and prints the ratios. With a model and its calibration feeds (``.npz`` of ``batch<i>/<input>`` arrays):
one ``model<TAB>wall seconds<TAB>CPU seconds`` line for the whole model's AdaRound (W4A8) and one
``seq_mse<TAB>...`` line for its Sequential MSE (20 candidates), each on a freshly calibrated sim. With held-out
feeds and an output folder, the sim's outputs on them after each method go to ``OUT_DIR/<method>.npz``
(``batch<i>/output<j>``) for the caller to score; a last argument runs only that method.
"""
from __future__ import annotations

import sys
import time

from benchmarks.bench_adaround import LAYERS, _layer_model


def _load_feeds(path):
    import numpy as np

    with np.load(path) as stored:
        batches: dict[str, dict] = {}
        for key in stored.files:
            batch, name = key.split("/", 1)
            batches.setdefault(batch, {})[name] = stored[key]
    return [batches[k] for k in sorted(batches, key=lambda b: int(b[5:]))]


def main(argv: list[str] | None = None) -> int:
    from aimet_onnx import apply_adaround, apply_seq_mse
    from aimet_onnx.common.defs import QuantScheme
    from aimet_onnx.quantsim import QuantizationSimModel

    args = argv or sys.argv[1:]
    iterations = int(args[0])
    held_out, out_dir, only = None, None, None
    if len(args) >= 3:
        import onnx

        feeds = _load_feeds(args[2])
        if len(args) >= 5:
            held_out, out_dir = _load_feeds(args[3]), args[4]
        only = args[5] if len(args) >= 6 else None
        model = onnx.load(args[1])
        for graph_input in model.graph.input:  # AIMET makes dummy inputs from the declared shape: fix the
            if graph_input.name in feeds[0]:  # dimensions every batch agrees on (the others get feeds[0])
                shapes = {f[graph_input.name].shape for f in feeds + (held_out or [])}
                for axis, dim in enumerate(graph_input.type.tensor_type.shape.dim):
                    sizes = {s[axis] for s in shapes}
                    if len(sizes) == 1:
                        dim.dim_value = sizes.pop()
                    else:
                        dim.dim_param = f"{graph_input.name}_{axis}"
        cases = {"model": (model, feeds)}
    else:
        cases = {name: _layer_model(*spec) for name, spec in LAYERS.items()}

    def timed(name, model, feeds, run, scale):
        sim = QuantizationSimModel(model, param_type="int4", activation_type="int8", quant_scheme=QuantScheme.min_max,
                                   providers=["CPUExecutionProvider"], dummy_input=feeds[0])
        sim.compute_encodings(feeds)
        start, cpu = time.perf_counter(), time.process_time()
        run(sim, feeds)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"{name}\t{wall * scale:.3f}\t{cpu * scale:.3f}", flush=True)
        if held_out is not None:
            import numpy as np

            outputs = [sim.session.run(None, f) for f in held_out]
            np.savez(f"{out_dir}/{'adaround' if name == 'model' else name}.npz",
                     **{f"batch{i}/output{j}": o for i, outs in enumerate(outputs) for j, o in enumerate(outs)})

    for name, (model, feeds) in cases.items():
        if only in (None, "adaround"):
            timed(name, model, feeds, lambda sim, f: apply_adaround(sim, f, num_iterations=iterations),
                  1 if name == "model" else 1000 / iterations)
    if "model" in cases and only in (None, "seq_mse"):  # min_max is post_training_tf, which Seq MSE asserts
        timed("seq_mse", *cases["model"], lambda sim, f: apply_seq_mse(sim, f, num_candidates=20), 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
