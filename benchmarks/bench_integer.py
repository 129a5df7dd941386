"""Integer export benchmark: onnxruntime latency of FP32, our QDQ and integer models, and ORT's quantizer.

    python -m benchmarks.bench_integer [--size 224] [--repeats 30] [--threads 0] [--models cls rec ...]
        [--weight-codes int8|uint8|both]

Three conv nets built here with seeded He-initialised weights (BN already folded into the convs), and
the suite's real PP-OCR cls / rec / det models and nudenet's YOLOv8n detector (`benchmarks.suite`, QUICK calibration split, one
evaluation item as the timed input):

* ``resnet_style``: 7x7/2 stem + Relu, 3x3/2 MaxPool, four stages of one basic block (3x3 Conv+Relu,
  3x3 Conv, 1x1/2 projection when the shape changes, Add+Relu), GlobalAveragePool, Flatten, Gemm(1000);
* ``mobilenet_style``: 3x3/2 stem + Relu6 (Clip 0-6), MobileNetV2-like inverted residuals (1x1 expand +
  Relu6, 3x3 depthwise + Relu6, 1x1 linear project, residual Add), 1x1 Conv + Relu6, GAP, Flatten, Gemm;
* ``pplcnet_style``: PP-LCNet-like depthwise-separable stack with 28 HardSwish and two SE blocks
  (HardSigmoid gates).

One process, one run: the same N(0,1) calibration batches calibrate the sim (min-max, uint8 asymmetric
activations, int8 symmetric per-channel weights) and ``onnxruntime.quantization.quantize_static``
(MinMax, per_channel=True, QUInt8 activations / QInt8 weights, QOperator and QDQ formats). Each model
then runs in a default ``onnxruntime.InferenceSession`` (ORT_ENABLE_ALL; ``--threads`` sets
intra_op_num_threads, default 1 for stable numbers on a shared machine; 0 = onnxruntime's default) on a
1x3xSxS input; latency is the best (and median) of ``--repeats`` runs, the variants interleaved
round-robin so they share the machine's background load.
Columns: latency, FP32 / variant ratio, the largest deviation from the exact sim in output steps (our
exports) and the relative error of the first output vs FP32; the integer row notes the nodes left in
float, the lookup tables, and its speed relative to the QOperator model (> 1: faster). Suite models also get
their case's primary score vs FP32 on the QUICK evaluation split (quality column); a model whose dynamic
export leaves shape arithmetic float (nudenet's anchors) is exported with ``input_shapes`` = the timed
input's shape (noted in the row). ``--weight-codes uint8`` stores our exports' 8-bit weight codes as uint8
(``weight_codes="uint8"``) and gives ``quantize_static`` ``weight_type=QUInt8``: exact on x86 CPUs without VNNI,
where the default int8 x uint8 kernels saturate; ``both`` runs the two side by side. The Markdown
table is printed and written to benchmarks/results/integer.md (integer_uint8.md, integer_both.md).
"""
from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from benchmarks.common import cpu_session, ort_quantize_static

RESULTS = Path(__file__).resolve().parent / "results"
# report entries that move or reshape data or compute shapes (not arithmetic on activations)
_MOVEMENT = frozenset({"Reshape", "Concat", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Split", "Slice", "Gather",
                       "Shape", "Cast", "ConstantOfShape", "Range", "Flatten", "Identity", "graph input",
                       "graph output"})


class _Net:
    """A tiny graph builder: seeded He-initialised convs with bias, names numbered in order."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, value, prefix: str = "c") -> str:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs, **attrs) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x, cin, cout, k, stride=1, group=1):
        fan_in = cin // group * k * k
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (0.05 * self.rng.standard_normal(cout)).astype(np.float32)
        return self.op("Conv", [x, self.const(w, "w"), self.const(b, "b")], kernel_shape=[k, k],
                       strides=[stride, stride], pads=[k // 2] * 4, group=group)

    def relu6(self, x):
        return self.op("Clip", [x, self.const(np.float32(0.0), "lo"), self.const(np.float32(6.0), "hi")])

    def head(self, x, channels, classes=1000):
        flat = self.op("Flatten", [self.op("GlobalAveragePool", [x])], axis=1)
        w = (self.rng.standard_normal((classes, channels)) / np.sqrt(channels)).astype(np.float32)
        return self.op("Gemm", [flat, self.const(w, "w"), self.const(np.zeros(classes, np.float32), "b")], transB=1)

    def model(self, name: str, size: int, out: str, classes: int = 1000) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   ["N", 3, size, size])],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", classes])],
                                  self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench_integer")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def resnet_style(size: int) -> onnx.ModelProto:
    n = _Net(0)
    x = n.op("Relu", [n.conv("x", 3, 32, 7, 2)])
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 32
    for stage, cout in enumerate([32, 64, 128, 256]):
        s = 1 if stage == 0 else 2
        y = n.conv(n.op("Relu", [n.conv(x, c, cout, 3, s)]), cout, cout, 3)
        shortcut = x if (s == 1 and c == cout) else n.conv(x, c, cout, 1, s)
        x, c = n.op("Relu", [n.op("Add", [y, shortcut])]), cout
    return n.model("resnet_style", size, n.head(x, c))


def mobilenet_style(size: int) -> onnx.ModelProto:
    n = _Net(1)
    x, c = n.relu6(n.conv("x", 3, 32, 3, 2)), 32
    for cout, s, expand in [(16, 1, 1), (24, 2, 6), (24, 1, 6), (32, 2, 6), (32, 1, 6), (64, 2, 6), (64, 1, 6),
                            (96, 1, 6), (160, 2, 6), (160, 1, 6), (320, 1, 6)]:
        hidden = c * expand
        y = x if expand == 1 else n.relu6(n.conv(x, c, hidden, 1))
        y = n.conv(n.relu6(n.conv(y, hidden, hidden, 3, s, group=hidden)), hidden, cout, 1)
        x, c = (n.op("Add", [x, y]) if s == 1 and c == cout else y), cout
    x = n.relu6(n.conv(x, c, 640, 1))
    return n.model("mobilenet_style", size, n.head(x, 640))


def pplcnet_style(size: int) -> onnx.ModelProto:
    """PP-LCNet x0.5-like: HardSwish after the stem, every depthwise and pointwise conv and the last 1x1
    conv (28 HardSwish ops), squeeze-excitation (GAP, Conv, Relu, Conv, HardSigmoid, Mul) in the last two
    blocks."""
    n = _Net(2)

    def hswish(x):
        return n.op("HardSwish", [x])

    x, c = hswish(n.conv("x", 3, 8, 3, 2)), 8
    for k, cout, s, se in [(3, 16, 1, False), (3, 32, 2, False), (3, 32, 1, False), (3, 64, 2, False),
                           (3, 64, 1, False), (3, 128, 2, False)] + [(5, 128, 1, False)] * 5 + \
                          [(5, 256, 2, True), (5, 256, 1, True)]:
        x = hswish(n.conv(x, c, c, k, s, group=c))
        if se:
            g = n.op("GlobalAveragePool", [x])
            g = n.op("HardSigmoid", [n.conv(n.op("Relu", [n.conv(g, c, c // 4, 1)]), c // 4, c, 1)], alpha=0.2, beta=0.5)
            x = n.op("Mul", [x, g])
        x, c = hswish(n.conv(x, c, cout, 1)), cout
    x = hswish(n.conv(n.op("GlobalAveragePool", [x]), c, 640, 1))
    return n.model("pplcnet_style", size, n.head(x, 640))


def _interleaved_times(fns: dict, repeats: int, warmup: int = 3) -> dict[str, np.ndarray]:
    """Wall times (s) of each function, run round-robin ``repeats`` times after ``warmup`` rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return {k: np.asarray(v) for k, v in times.items()}


def _suite_model(name: str):
    """(model, calibration feeds, two test feeds, case) of a suite model (benchmarks.suite, QUICK sizes): PP-OCR
    cls / rec / det, nudenet's YOLOv8n detector, the PicoDet layout detector, the PP-LCNet orientation
    classifier or ddddocr's CRNN."""
    from benchmarks.suite.cases import QUICK, cls_case, det_case, rec_case
    from benchmarks.suite.fetch import cache_dir
    from benchmarks.suite.wide_cases import BUILDERS

    if name in BUILDERS:
        folder, build = BUILDERS[name]
        case = build(cache_dir() / "models" / folder, QUICK)
    else:
        case = {"cls": cls_case, "det": det_case, "rec": rec_case}[name](cache_dir() / "models" / "ppocr", QUICK)
    return onnx.load(case.model_path), case.calib, [{k: v[:1] for k, v in f.items()} for f in case.eval[:2]], case


def _quality(case, sessions: dict) -> dict[str, str]:
    """The suite's primary score (vs FP32, on the case's evaluation feeds) of each session but FP32."""
    if case is None:
        return {}
    outputs = {k: [s.run(None, feed) for feed in case.eval] for k, s in sessions.items()}
    return {k: f"{case.primary} {case.score(outputs['FP32'], outs)[case.primary]:.3f}"
            for k, outs in outputs.items() if k != "FP32"}


def bench_model(name: str, model: onnx.ModelProto, repeats: int, threads: int, calibration: list[dict],
                tests: list[dict], case=None, codes: tuple[str, ...] = ("int8",)) -> list[dict]:
    from onnxruntime.quantization import QuantFormat

    import quantsim
    from quantsim.export.integer.export import export_integer

    t0 = time.perf_counter()
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(calibration)
    exported = export_integer(sim)
    fixed = ""
    if any("input_shapes" in e.reason and e.op_type not in _MOVEMENT for e in exported.report):  # float arithmetic
        exported = export_integer(sim, input_shapes={k: list(v.shape) for k, v in tests[0].items()})
        fixed = f"input_shapes {'x'.join(str(d) for v in tests[0].values() for d in v.shape)}; "
    prepare_s = time.perf_counter() - t0
    variants: dict[str, onnx.ModelProto] = {"FP32": model}
    integer_rows: dict[str, str] = {}  # integer variant -> its QOperator counterpart (same weight code type)
    for code in codes:
        tag = "" if codes == ("int8",) else f", {code} weights"
        integer = exported.model if code == "int8" else export_integer(
            sim, weight_codes=code, input_shapes={k: list(v.shape) for k, v in tests[0].items()} if fixed else None).model
        variants[f"quantsim QDQ (to_onnx_qdq{tag})"] = sim.to_onnx_qdq(weight_codes=code)
        variants[f"quantsim integer (export_integer{tag})"] = integer
        ort_tag = "" if codes == ("int8",) else f", {'QUInt8' if code == 'uint8' else 'QInt8'} weights"
        variants[f"ORT quantize_static QOperator{ort_tag}"] = ort_quantize_static(model, calibration, QuantFormat.QOperator,
                                                                              code)
        variants[f"ORT quantize_static QDQ{ort_tag}"] = ort_quantize_static(model, calibration, QuantFormat.QDQ, code)
        integer_rows[f"quantsim integer (export_integer{tag})"] = f"ORT quantize_static QOperator{ort_tag}"
    sessions = {k: cpu_session(m, threads=threads) for k, m in variants.items()}
    feed = tests[0]
    times = _interleaved_times({k: (lambda s=s: s.run(None, feed)) for k, s in sessions.items()}, repeats)
    best = {k: float(v.min()) for k, v in times.items()}
    q = sim.qc_quantize_op_dict.get(model.graph.output[0].name)
    scale = float(q.encoding.scale) if q is not None and q.enabled and q.encoding is not None else float("nan")
    sim_out = np.concatenate([sim.session.run(None, t)[0].reshape(-1) for t in tests])
    fp32 = np.concatenate([sessions["FP32"].run(None, t)[0].reshape(-1) for t in tests])
    rows = []
    for key, session in sessions.items():
        out = np.concatenate([session.run(None, t)[0].reshape(-1) for t in tests])
        ours = key.startswith("quantsim")
        rows.append({
            "model": name, "variant": key, "ms": best[key] * 1e3, "ratio": best["FP32"] / best[key],
            "median_ms": float(np.median(times[key])) * 1e3,
            "steps": _deviation(np.abs(out - sim_out).max(), scale) if ours else "",
            "rel_err": float(np.abs(out - fp32).max() / np.abs(fp32).max()),
            "nodes": len(variants[key].graph.node),
        })
    quality = _quality(case, sessions)
    for row in rows:
        row["quality"] = quality.get(row["variant"], "")
    constants = {t.name for t in exported.model.graph.initializer}  # lookup tables: Gather from a constant
    tables = sum(n.op_type in ("Gather", "GatherElements") and n.input[0] in constants for n in exported.model.graph.node)
    compute = Counter(e.op_type for e in exported.report if e.op_type not in _MOVEMENT)
    for row in rows:
        if row["variant"] in integer_rows:
            row["note"] = (f"{fixed}{len(exported.report)} float nodes ({sum(compute.values())} compute: "
                           f"{' '.join(f'{op} {n}' for op, n in sorted(compute.items())) or 'none'}), {tables} tables; "
                           f"vs QOperator {best[integer_rows[row['variant']]] / best[row['variant']]:.2f}x; "
                           f"sim+export {prepare_s:.1f} s")
    return rows


def _deviation(largest: float, scale: float) -> str:
    """Largest |export - sim| in output steps, or absolute when the output has no quantizer (a float Concat)."""
    return f"{largest / scale:.0f}" if np.isfinite(scale) else f"{largest:.3g} (float output)"


def render(rows: list[dict], args) -> str:
    lines = [
        "# Integer export latency (onnxruntime CPU)", "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, onnxruntime {ort.__version__}, onnx {onnx.__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, intra_op threads "
        f"{args.threads or 'default'}; input 1x3x{args.size}x{args.size}; best of {args.repeats} interleaved runs; "
        f"weight codes {args.weight_codes}.",
        "", "| model | variant | nodes | best ms | median ms | FP32 / variant (best) | max \\|Δ\\| vs sim (out steps) | "
        "max \\|Δ\\| / max\\|FP32\\| | quality vs FP32 | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['variant']} | {r['nodes']} | {r['ms']:.2f} | {r['median_ms']:.2f} | "
                     f"{r['ratio']:.2f}x | "
                     f"{r['steps']} | {r['rel_err']:.4f} | {r.get('quality', '')} | {r.get('note', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads (0: onnxruntime default)")
    parser.add_argument("--models", nargs="+", default=["resnet_style", "mobilenet_style", "pplcnet_style", "cls",
                                                         "rec", "det", "nudenet"],
                        help="built nets and/or real suite models (PP-OCR cls, rec, det; nudenet's YOLOv8n; layout "
                             "(PicoDet), orientation (PP-LCNet), ddddocr; fetched by benchmarks.suite.fetch)")
    parser.add_argument("--weight-codes", choices=("int8", "uint8", "both"), default="int8",
                        help="8-bit weight code type of our QDQ / integer exports (weight_codes=...) and of "
                             "quantize_static's models (uint8: weight_type=QUInt8); both: the two side by side. "
                             "uint8 runs exactly on x86 CPUs without VNNI, where int8 x uint8 kernels saturate")
    args = parser.parse_args(argv)
    codes = ("int8", "uint8") if args.weight_codes == "both" else (args.weight_codes,)
    logging.getLogger().setLevel(logging.ERROR)
    ort.set_default_logger_severity(3)
    rows = []
    rng = np.random.default_rng(7)
    size = args.size
    calibration = [{"x": rng.standard_normal((2, 3, size, size)).astype(np.float32)} for _ in range(4)]
    tests = [{"x": rng.standard_normal((1, 3, size, size)).astype(np.float32)} for _ in range(4)]
    built = {"resnet_style": resnet_style, "mobilenet_style": mobilenet_style, "pplcnet_style": pplcnet_style}
    for name in args.models:
        if name in built:
            rows += bench_model(name, built[name](size), args.repeats, args.threads, calibration, tests, codes=codes)
        else:
            model, real_calibration, real_tests, case = _suite_model(name)
            label = f"ppocr {name}" if name in ("cls", "rec", "det") else name
            rows += bench_model(label, model, args.repeats, args.threads, real_calibration, real_tests, case, codes=codes)
    table = render(rows, args)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.weight_codes == "int8" else f"_{args.weight_codes}"
    (RESULTS / f"integer{suffix}.md").write_text(table)


if __name__ == "__main__":
    main()
