"""A float16 image model through the integer export: what stays float, agreement with the sim, latency.

    python -m benchmarks.bench_fp16_integer --model PATH [--calibration 4] [--evaluation 2] [--repeats 3]
        [--float32-twin]

For float16-compute models as onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)``
writes them (float32 I/O, Casts, float16 ops, blocked ops between Cast pairs) with one static
``[1, 3, H, W]`` image input, e.g. IS-Net background removal (``medium.onnx`` of the npm package
``@imgly/background-removal-data``; not fetched here, pass its path). Inputs are the cached photos
(`benchmarks.suite.scenes`), resized to ``H x W`` and normalised as that package does, ``(rgb - 128) / 256``.

The sim (defaults, ``weight_codes="auto"``) is calibrated on ``--calibration`` photo views; the integer
export's report (ops left in float, by op type and reason) and its op counts are printed; on
``--evaluation`` other views the first two outputs are compared with the sim in steps of the grid of the
quantized tensor they are cast from (fraction of elements at >= 1 and > 1 step, max) and with the float
model (mean absolute difference; IoU of the masks at 0.5). Then the float model, the sim's QDQ export and
the integer model run one thread each, interleaved, best of ``--repeats`` by wall and by CPU time.
``--float32-twin`` runs everything on the same model converted back to float32 (float16 constants to
float32, float Casts to Identity): the control that separates the float16 handling from the integer
kernels' own rounding.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

import quantsim
from benchmarks.common import interleaved_best
from benchmarks.suite.scenes import load_photos, photo_views, resize

IMAGES = Path.home() / ".cache" / "quantsim" / "models" / "images"


def float32_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` computing in float32: float16 initializers and Constant values converted, float Casts -> Identity."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    for tensor in twin.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT16:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))
    for node in twin.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float32), attr.t.name))
        if node.op_type == "Cast" and node.attribute[0].i in (TensorProto.FLOAT16, TensorProto.FLOAT):
            node.op_type = "Identity"
            del node.attribute[:]
    del twin.graph.value_info[:]
    return twin


def _feeds(model: onnx.ModelProto, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    info = model.graph.input[0]
    height, width = (d.dim_value for d in info.type.tensor_type.shape.dim[2:])
    views = photo_views(load_photos(IMAGES), count, seed=seed)
    return [{info.name: ((resize(v, width, height).astype(np.float32) - 128.0) / 256.0).transpose(2, 0, 1)[None].copy()}
            for v in views]


def _quantized_source(sim, name: str) -> str | None:
    """The tensor whose quantizer decides graph output ``name`` (through Casts and Identities)."""
    producers = {o: n for n in sim.model.graph.node for o in n.output}
    while True:
        q = sim.qc_quantize_op_dict.get(name)
        if q is not None and q.enabled and q.encoding is not None:
            return name
        node = producers.get(name)
        if node is None or node.op_type not in ("Cast", "Identity"):
            return None
        name = node.input[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--calibration", type=int, default=4)
    parser.add_argument("--evaluation", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--float32-twin", action="store_true")
    args = parser.parse_args()
    model = onnx.load(str(args.model))
    if args.float32_twin:
        model = float32_twin(model)
    calibration, evaluation = _feeds(model, args.calibration, 1), _feeds(model, args.evaluation, 7)
    started, cpu = time.perf_counter(), time.process_time()
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(calibration)
    print(f"sim + calibration: {time.perf_counter() - started:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")
    started = time.perf_counter()
    exported = sim.export_integer(weight_codes="auto")
    print(f"export_integer: {time.perf_counter() - started:.1f} s; decisions: {list(sim.decisions)}")
    print("integer model ops:", dict(Counter(n.op_type for n in exported.model.graph.node)))
    print("left in float:", dict(Counter((e.op_type, e.reason) for e in exported.report)))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {"float": model, "qdq": sim.to_onnx_qdq(weight_codes="auto"), "integer": exported.model}
    runs = {k: ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
            for k, m in sessions.items()}
    names = [o.name for o in runs["integer"].get_outputs()][:2]
    for index, feed in enumerate(evaluation):
        got, want, ref = (runs["integer"].run(names, feed), sim.session.run(names, feed), runs["float"].run(names, feed))
        for name, a, b, r in zip(names, got, want, ref):
            source = _quantized_source(sim, name)
            scale = float(sim.qc_quantize_op_dict[source].encoding.scale) if source else 1.0
            steps = np.round(np.abs(a.astype(np.float64) - b) / scale)
            iou = np.mean((a > 0.5) & (r > 0.5)) / max(float(np.mean((a > 0.5) | (r > 0.5))), 1e-9)
            print(f"view {index} {name}: vs sim >= 1 step {np.mean(steps >= 1):.2%}, > 1 step {np.mean(steps > 1):.2%}, "
                  f"max {steps.max():.0f}; |integer - float| mean {np.abs(a - r).mean():.4f} "
                  f"(sim {np.abs(b - r).mean():.4f}); mask IoU vs float {iou:.4f}")
    feed = evaluation[0]
    for label, clock in (("wall", time.perf_counter), ("CPU", time.process_time)):
        best = interleaved_best({k: (lambda s=s: s.run(None, feed)) for k, s in runs.items()}, repeats=args.repeats,
                                clock=clock)
        print(f"latency ({label}, 1 thread, best of {args.repeats}):",
              ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in best.items()))


if __name__ == "__main__":
    main()
