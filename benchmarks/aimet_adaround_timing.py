"""aimet-onnx's AdaRound on `bench_adaround.LAYERS`, timed: run with a Python that has aimet-onnx installed.

    /path/to/aimet-venv/bin/python -m benchmarks.aimet_adaround_timing ITERATIONS

Prints one ``name<TAB>seconds per 1,000 iterations<TAB>CPU seconds per 1,000 iterations`` line per layer (the
whole apply_adaround call, as for quantsim; CPU time is the fair measure on a shared machine: run both sides
with ``OMP_NUM_THREADS=1``, which torch and numpy's BLAS both follow). `bench_adaround --aimet-python PATH` runs
it and prints the ratios.
"""
from __future__ import annotations

import sys
import time

from benchmarks.bench_adaround import LAYERS, _layer_model


def main(argv: list[str] | None = None) -> int:
    from aimet_onnx import apply_adaround
    from aimet_onnx.common.defs import QuantScheme
    from aimet_onnx.quantsim import QuantizationSimModel

    iterations = int((argv or sys.argv[1:])[0])
    for name, spec in LAYERS.items():
        model, feeds = _layer_model(*spec)
        sim = QuantizationSimModel(model, param_type="int4", activation_type="int8", quant_scheme=QuantScheme.min_max,
                                   providers=["CPUExecutionProvider"])
        sim.compute_encodings(feeds)
        start, cpu = time.perf_counter(), time.process_time()
        apply_adaround(sim, feeds, num_iterations=iterations)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"{name}\t{wall * 1000 / iterations:.3f}\t{cpu * 1000 / iterations:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
