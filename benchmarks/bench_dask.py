"""AdaRound and AMP on a Dask ``LocalCluster`` of worker processes against the single-process run.

    python -m benchmarks.bench_dask [--workers 2] [--adaround cls,minilm] [--iterations 200] [--amp cls]

Each run is done twice, interleaved: in this process alone (``executor=None``) and with
``executor=client.get_executor()`` on a cluster of ``--workers`` processes, one thread each (started before the
timer: its start-up is printed apart). The results must be equal (asserted: every rounded weight and report
of `apply_adaround` bit for bit, `choose_mixed_precision`'s phase-1 scores and chosen configuration), and the
wall-clock speed-up is printed with the CPU seconds of this process and of the workers (each worker reports its
own process CPU time before and after). AdaRound gains only where layers are independent (`adaround.levels`:
a chain such as cls has one layer per level, MiniLM's query, key and value projections share one); AMP's phase
1 is one independent evaluation per quantizer group and candidate. Needs ``distributed`` (not a dependency).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.suite import cases as C
from benchmarks.suite.fetch import fetch_all

PROVIDERS = ["CPUExecutionProvider"]


def _worker_cpu() -> float:
    return time.process_time()


def _cluster_cpu(client) -> float:
    return sum(client.run(_worker_cpu).values()) if client is not None else 0.0


def _timed(run, client):
    """``(result, wall s, this process's CPU s, the workers' CPU s)`` of ``run()``."""
    workers = _cluster_cpu(client)
    start, cpu = time.perf_counter(), time.process_time()
    result = run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return result, wall, cpu, _cluster_cpu(client) - workers


def _case(key, dirs):
    from benchmarks.bench_adaround import _builder

    src, build = _builder(key)
    return build(dirs[src], C.QUICK)


def adaround_run(case, iterations: int, executor):
    import quantsim
    from adaround import apply_adaround

    sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), param_type="int4", progress=False)
    sim.compute_encodings(case.calib)

    def run():
        reports = apply_adaround(sim, case.calib, num_iterations=iterations, executor=executor)
        return ({layer.weight: sim.get_weight(layer.weight).copy() for layer in sim.weighted_layers()},
                [(r.node, r.status, r.mode, r.loss_before, r.loss_after, r.flipped) for r in reports])
    return run


def assert_same_adaround(local, remote) -> None:
    assert local[0].keys() == remote[0].keys()
    for name in local[0]:
        np.testing.assert_array_equal(local[0][name], remote[0][name], err_msg=name)
    assert local[1] == remote[1], "reports differ"


def amp_run(case, executor, scratch: str):
    import quantsim
    from benchmarks.bench_amp import SETUPS, phase1_score
    from mixed_precision import choose_mixed_precision

    key = "cls" if "cls" in case.name else "minilm" if "MiniLM" in case.name else "rec"
    candidates, drop = SETUPS[key]
    reference = [ort.InferenceSession(str(case.model_path), providers=PROVIDERS).run(None, f) for f in case.eval]
    probe, probe_reference = case.eval[:2], reference[:2]
    sign = 1.0 if case.higher_is_better else -1.0

    def phase1(session) -> float:  # a closure: Dask ships it with cloudpickle
        return phase1_score(probe_reference, [session.run(None, f) for f in probe])

    def phase2(session) -> float:
        return sign * case.score(reference, [session.run(None, f) for f in case.eval])[case.primary]

    sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), progress=False)

    def run():
        result = choose_mixed_precision(sim, candidates, phase1, phase2, drop, scratch, True, case.calib,
                                        executor=executor, progress=False)
        return dict(result.phase1_scores), result.chosen, result.score
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--adaround", default="cls,minilm", help="models for AdaRound (comma list; empty for none)")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--amp", default="cls", help="models for AMP (comma list; empty for none)")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    import distributed

    dirs = fetch_all()
    warnings.simplefilter("ignore")  # dask's port and deprecation warnings
    start = time.perf_counter()
    cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    client = distributed.Client(cluster)
    print(f"[dask] cluster of {args.workers} worker processes started in {time.perf_counter() - start:.1f} s; "
          f"load average {os.getloadavg()}", file=sys.stderr)
    lines = ["| run | single process wall / CPU s | Dask wall / CPU s (this process + workers) | speed-up (wall) "
             "| same result |", "|---|--:|--:|--:|---|"]
    try:
        jobs = []
        for key in filter(None, args.adaround.split(",")):
            case = _case(key, dirs)
            jobs.append((f"{case.name} AdaRound W4A8, {args.iterations} it",
                         lambda ex, case=case: adaround_run(case, args.iterations, ex), assert_same_adaround))
        for key in filter(None, args.amp.split(",")):
            case = _case(key, dirs)
            jobs.append((f"{case.name} AMP (choose_mixed_precision)",
                         lambda ex, case=case: amp_run(case, ex, tempfile.mkdtemp()), _assert_same_amp))
        for label, make, check in jobs:
            for _ in range(args.repeats):
                local, l_wall, l_cpu, _ = _timed(make(None), None)
                remote, r_wall, r_cpu, w_cpu = _timed(make(client.get_executor()), client)
                check(local, remote)
                line = (f"| {label} | {l_wall:.1f} / {l_cpu:.1f} | {r_wall:.1f} / {r_cpu:.1f} + {w_cpu:.1f} "
                        f"| {l_wall / r_wall:.2f}x | yes |")
                print(f"[dask] {line} load average {os.getloadavg()}", file=sys.stderr)
                lines.append(line)
    finally:
        client.close()
        cluster.close()
    print("\n".join(lines))
    return 0


def _assert_same_amp(local, remote) -> None:
    assert local[0] == remote[0], "phase-1 scores differ"
    assert local[1] == remote[1], "chosen configurations differ"
    assert local[2] == remote[2], "final scores differ"


if __name__ == "__main__":
    raise SystemExit(main())
