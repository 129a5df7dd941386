"""AdaRound / Sequential MSE quality and speed on the suite's real models, side by side in one run.

    python -m benchmarks.bench_adaround [--models cls,rec] [--iterations 1000] [--quick]

For each model: W8A8 and W4A8 with nearest rounding, W4A8 + AdaRound, W4A8 + Sequential MSE + AdaRound
(weights per channel, activations min-max, the suite's calibration and held-out data and metric).
Then seconds per 1,000 AdaRound iterations for typical layer shapes; when ``aimet_onnx`` is importable
(it is not a dependency) the same layers go through its AdaRound for the ratio.
"""
from __future__ import annotations

import argparse
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


def _quality_rows(key: str, model_dirs, size, iterations: int) -> list[tuple[str, str, str, float]]:
    import quantsim
    from adaround import apply_adaround, apply_seq_mse

    src, build = C.BUILDERS[key]
    case = build(model_dirs[src], size)
    reference = _outputs(ort.InferenceSession(str(case.model_path), providers=PROVIDERS), case.eval)
    rows = []

    def sim_of(param_type):
        sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), param_type=param_type, progress=False)
        sim.compute_encodings(case.calib)
        return sim

    def score(sim, label, seconds):
        metrics = case.score(reference, _outputs(sim.session, case.eval))
        rows.append((case.name, label, f"{metrics[case.primary]:.4f}", seconds))
        print(f"[adaround] {case.name} {label}: {case.primary} {metrics[case.primary]:.4f} ({seconds:.1f} s)",
              file=sys.stderr)

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


def speed_rows(iterations: int) -> list[tuple[str, float, str]]:
    import quantsim
    from adaround import apply_adaround

    rows = []
    for name, spec in LAYERS.items():
        model, feeds = _layer_model(*spec)
        sim = quantsim.QuantizationSimModel(model, param_type="int4", progress=False)
        sim.compute_encodings(feeds)
        start = time.perf_counter()
        (report,) = apply_adaround(sim, feeds, num_iterations=iterations)
        ours = (time.perf_counter() - start) * 1000 / iterations
        aimet = _aimet_seconds(model, feeds, iterations)
        rows.append((name, ours, "n/a (aimet-onnx not installed)" if aimet is None else f"{aimet:.2f} ({aimet / ours:.1f}x)"))
        print(f"[adaround] {name}: {ours:.2f} s / 1000 it ({report.mode})", file=sys.stderr)
    return rows


def _aimet_seconds(model, feeds, iterations):
    try:
        from aimet_onnx import apply_adaround as aimet_apply_adaround
        from aimet_onnx.adaround.adaround_weight import Adaround as AimetAdaround  # noqa: F401
        from aimet_onnx.quantsim import QuantizationSimModel as AimetSim
    except Exception:  # noqa: BLE001 - optional comparison
        return None
    sim = AimetSim(model, param_type="int4")
    sim.compute_encodings(feeds)
    start = time.perf_counter()
    aimet_apply_adaround(sim, feeds, num_iterations=iterations)
    return (time.perf_counter() - start) * 1000 / iterations


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cls,rec")
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--speed-iterations", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="the suite's small data split")
    args = ap.parse_args(argv)
    size = C.QUICK if args.quick else C.FULL
    model_dirs = fetch_all()
    lines = ["| model | variant | metric | value | seconds |", "|---|---|---|---|--:|"]
    for key in args.models.split(","):
        rows, case = _quality_rows(key, model_dirs, size, args.iterations)
        lines += [f"| {m} | {v} | {case.primary} | {val} | {s:.1f} |" for m, v, val, s in rows]
    lines += ["", "| layer | quantsim s / 1000 it | aimet-onnx s / 1000 it (ratio) |", "|---|--:|--:|"]
    lines += [f"| {n} | {s:.2f} | {a} |" for n, s, a in speed_rows(args.speed_iterations)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
