"""AdaRound / Sequential MSE quality and speed on the suite's real models, side by side in one run.

    python -m benchmarks.bench_adaround [--models cls,rec] [--iterations 1000] [--quick]

For each model: W8A8 and W4A8 with nearest rounding, W4A8 + AdaRound, W4A8 + Sequential MSE (+ AdaRound),
W8A8 + CLE (+ AdaRound) (weights per channel, activations min-max, the suite's calibration and held-out
data and metric, plus the SQNR of the first output against FP32).
Then seconds per 1,000 AdaRound iterations for typical layer shapes; when ``aimet_onnx`` is importable
(it is not a dependency) the same layers go through its AdaRound for the ratio. ``--whole-model KEYS``
times whole-model AdaRound and Sequential MSE against aimet-onnx in interleaved rounds, with output SQNR and
the task metric on the held-out feeds (`benchmarks.adaround_whole_model`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from benchmarks.suite import cases as C
from benchmarks.suite.fetch import fetch_all

PROVIDERS = ["CPUExecutionProvider"]


def _outputs(session, feeds):
    return [session.run(None, f) for f in feeds]


def _sqnr(reference, outputs) -> float:
    ref = np.concatenate([r[0].reshape(-1) for r in reference]).astype(np.float64)
    out = np.concatenate([o[0].reshape(-1) for o in outputs]).astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - out) ** 2), 1e-30)))


def _quality_rows(key: str, model_dirs, size, iterations: int):
    import quantsim
    from adaround import apply_adaround, apply_seq_mse, equalize_model

    src, build = C.BUILDERS[key]
    case = build(model_dirs[src], size)
    reference = _outputs(ort.InferenceSession(str(case.model_path), providers=PROVIDERS), case.eval)
    rows = []

    def sim_of(param_type, model=None):
        model = onnx.load(str(case.model_path)) if model is None else model
        sim = quantsim.QuantizationSimModel(model, param_type=param_type, progress=False)
        sim.compute_encodings(case.calib)
        return sim

    def score(sim, label, seconds):
        outputs = _outputs(sim.session, case.eval)
        metrics = case.score(reference, outputs)
        sqnr = _sqnr(reference, outputs)
        rows.append((case.name, label, f"{metrics[case.primary]:.4f}", f"{sqnr:.1f}", seconds))
        print(f"[adaround] {case.name} {label}: {case.primary} {metrics[case.primary]:.4f}, SQNR {sqnr:.1f} dB "
              f"({seconds:.1f} s)", file=sys.stderr)

    for param_type in ("int8", "int4"):
        start = time.perf_counter()
        score(sim_of(param_type), f"W{param_type[3:]}A8 nearest", time.perf_counter() - start)
    start = time.perf_counter()
    sim = sim_of("int4")
    apply_adaround(sim, case.calib, num_iterations=iterations)
    score(sim, f"W4A8 + AdaRound ({iterations} it)", time.perf_counter() - start)
    start = time.perf_counter()
    sim = sim_of("int4")
    apply_seq_mse(sim, case.calib)
    score(sim, "W4A8 + Seq MSE", time.perf_counter() - start)
    apply_adaround(sim, case.calib, num_iterations=iterations)
    score(sim, f"W4A8 + Seq MSE + AdaRound ({iterations} it)", time.perf_counter() - start)
    start = time.perf_counter()
    equalized = equalize_model(onnx.load(str(case.model_path)))
    sim = sim_of("int8", equalized)
    score(sim, "W8A8 + CLE", time.perf_counter() - start)
    apply_adaround(sim, case.calib, num_iterations=iterations)
    score(sim, f"W8A8 + CLE + AdaRound ({iterations} it)", time.perf_counter() - start)
    return rows, case


# speed -----------------------------------------------------------------------------------------------
LAYERS = {  # name: (op, input shape, weight shape, attributes, activation)
    "Conv 3x3 64->64 + Relu, 28x28": ("Conv", (8, 64, 28, 28), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "Relu"),
    "depthwise 3x3 128, 28x28 + Relu": ("Conv", (8, 128, 28, 28), (128, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 128},
                                        "Relu"),
    "pointwise 128->128, 28x28 (no act.)": ("Conv", (8, 128, 28, 28), (128, 128, 1, 1), {}, None),
    "Gemm 768->768 (no act.)": ("Gemm", (256, 768), (768, 768), {"transB": 1}, None),
}


def _layer_model(op, x_shape, w_shape, attrs, activation):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    nodes = [helper.make_node(op, ["x", "w"], ["z"], name="layer", **attrs)]
    if activation:
        nodes.append(helper.make_node(activation, ["z"], ["y"], name="act"))
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y" if activation else "z", TensorProto.FLOAT,
                                                             [None] * len(x_shape))],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = [{"x": rng.standard_normal(x_shape).astype(np.float32)} for _ in range(4)]
    return model, feeds


def speed_rows(iterations: int, aimet_python: str | None = None) -> list[tuple[str, float, float, str]]:
    """``(layer, wall s, CPU s, aimet-onnx cell)`` per 1,000 iterations; ratios are of CPU time (the machine
    may be shared: run with ``OMP_NUM_THREADS=1`` for one thread on both sides)."""
    import quantsim
    from adaround import apply_adaround

    aimet = _aimet_seconds(aimet_python, iterations) if aimet_python else {}
    rows = []
    for name, spec in LAYERS.items():
        model, feeds = _layer_model(*spec)
        sim = quantsim.QuantizationSimModel(model, param_type="int4", progress=False)
        sim.compute_encodings(feeds)
        start, cpu = time.perf_counter(), time.process_time()
        (report,) = apply_adaround(sim, feeds, num_iterations=iterations)
        wall, cpu = (time.perf_counter() - start) * 1000 / iterations, (time.process_time() - cpu) * 1000 / iterations
        theirs = aimet.get(name)
        cell = "n/a (aimet-onnx not run)" if theirs is None else f"{theirs[0]:.2f} / {theirs[1]:.2f} ({theirs[1] / cpu:.1f}x)"
        rows.append((name, wall, cpu, cell))
        print(f"[adaround] {name}: {wall:.2f} s wall, {cpu:.2f} s CPU / 1000 it ({report.mode}); aimet-onnx {cell}",
              file=sys.stderr)
    return rows


def _aimet_seconds(python: str, iterations: int) -> dict[str, tuple[float, float]]:
    """aimet-onnx's (wall, CPU) seconds per 1,000 iterations per layer, from a Python that has it (a
    subprocess: its torch and onnxruntime versions never meet this environment's)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([python, "-m", "benchmarks.aimet_adaround_timing", str(iterations)], cwd=root,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        print(f"[adaround] aimet-onnx timing failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    rows = (line.split("\t") for line in done.stdout.splitlines() if line.count("\t") == 2)
    return {name: (float(wall), float(cpu)) for name, wall, cpu in rows}


def _builder(key: str):
    from benchmarks.suite import wide_cases as W

    if key in C.BUILDERS:
        return C.BUILDERS[key]
    if key in W.BUILDERS:
        return W.BUILDERS[key]
    raise SystemExit(f"unknown model {key!r}: one of {sorted(C.BUILDERS) + sorted(W.BUILDERS)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cls,rec")
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--speed-iterations", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="the suite's small data split")
    ap.add_argument("--aimet-python", default=None, help="a Python with aimet-onnx installed, for the speed ratio")
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--whole-model", default=None,
                    help="also time AdaRound and Sequential MSE on these whole models (comma list, e.g. cls,orientation)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the whole-model runs")
    ap.add_argument("--skip-layers", action="store_true", help="leave out the per-layer speed table")
    ap.add_argument("--aimet-timeout", type=float, default=900.0, help="seconds before an aimet-onnx run is given up")
    args = ap.parse_args(argv)
    size = C.QUICK if args.quick else C.FULL
    model_dirs = fetch_all()
    lines = ["| model | variant | metric | value | SQNR dB (1st output) | seconds |", "|---|---|---|--:|--:|--:|"]
    for key in [] if args.speed_only else args.models.split(","):
        rows, case = _quality_rows(key, model_dirs, size, args.iterations)
        lines += [f"| {m} | {v} | {case.primary} | {val} | {q} | {s:.1f} |" for m, v, val, q, s in rows]
    if not args.skip_layers:
        lines += ["", "| layer | quantsim s / 1000 it, wall / CPU | aimet-onnx wall / CPU (CPU ratio) |", "|---|--:|--:|"]
        lines += [f"| {n} | {w:.2f} / {c:.2f} | {a} |"
                  for n, w, c, a in speed_rows(args.speed_iterations, args.aimet_python)]
    if args.whole_model:
        from benchmarks import adaround_whole_model

        keys = args.whole_model.split(",")
        cases = {key: _builder(key)[1](model_dirs[_builder(key)[0]], size) for key in keys}
        lines += [""] + adaround_whole_model.run(keys, cases, args.speed_iterations, args.rounds, args.aimet_python,
                                                 args.aimet_timeout)
    lines.append(f"(load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
