"""CNNs from other exporters: the real architectures that ship inside the ``onnx`` wheel, end to end.

    python -m benchmarks.bench_light [--models resnet50 densenet121 ...] [--weight-codes int8|uint8]
        [--threads 1] [--repeats 10] [--torch [DIR]]

``--torch`` takes the models instead from the ``*.onnx`` files that `benchmarks.suite.torch_export` wrote
(torchvision and timm architectures through torch's TorchScript and dynamo exporters, random weights with
measured BatchNorm statistics; default folder ``~/.cache/quantsim/models/torch``; ``--models`` then filters by
file-name prefix).

The ``light_*.onnx`` models of ``onnx/backend/test/data/light`` (Caffe2 and early PyTorch exports at opset 9,
IR 3: variadic ``Sum`` residuals, standalone BatchNorms, LRN, Dropout, old-style Reshape) with deterministic
random weights (`benchmarks.suite.light_models.randomized`): nothing is downloaded, and none of them is in the
benchmark suite the defaults were tuned on. Per model, in one process: the W8A8 sim (min-max, the default
per-channel config) calibrated on seeded N(0, 1) images, its QDQ export and ``export_integer``, and
``onnxruntime.quantization.quantize_static`` (MinMax, per-channel, QUInt8 activations, QInt8 or QUInt8
weights as ``--weight-codes``; QDQ and QOperator) on the same images. Columns: float compute ops left in the
integer export (with the ops), each model's relative error of the output probabilities against FP32 and
top-1 agreement over the evaluation images, and latency ratios from interleaved runs (`interleaved_best`) in
sessions with ``--threads`` intra-op threads: our QDQ / quantize_static's QDQ, our integer model /
quantize_static's QOperator, FP32 / our integer model. ``--weight-codes uint8`` on x86 CPUs without VNNI,
where int8 x uint8 kernels saturate (`quantsim.graph.int8_kernels`); quantize_static's QOperator model still
holds int8 per-channel Conv weights then (last column): on such a CPU it runs the fast, saturating kernels.
The Markdown table is printed and written to ``benchmarks/results/light.md``.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.common import cpu_session, interleaved_best, ort_quantize_static, print_and_save
from benchmarks.suite.light_models import light_model, randomized

RESULTS = Path(__file__).resolve().parent / "results"
TORCH_EXPORTS = Path.home() / ".cache" / "quantsim" / "models" / "torch"
MODELS = ("resnet50", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet", "bvlc_alexnet")
SIZE = 224


def _images(rng: np.random.Generator, name: str, count: int, shape=(1, 3, SIZE, SIZE)) -> list[dict[str, np.ndarray]]:
    return [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def _quality(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    """Mean relative error (max |difference| over max |FP32|) and top-1 agreement with FP32."""
    rel = [float(np.abs(g - r).max() / max(float(np.abs(r).max()), 1e-12)) for r, g in zip(ref, got)]
    top1 = [int(np.argmax(g)) == int(np.argmax(r)) for r, g in zip(ref, got)]
    return float(np.mean(rel)), float(np.mean(top1))


def _light(name: str, workdir: Path) -> tuple[onnx.ModelProto, str] | None:
    """The onnx wheel's light model ``name`` with random weights, saved in ``workdir``; None if not there."""
    base = light_model(name)
    if base is None:
        return None
    model = randomized(base)
    path = str(workdir / f"{name}.onnx")
    onnx.save(model, path)
    return model, path


def bench_model(name: str, workdir: Path, weight_codes: str, threads: int, repeats: int,
                source: Path | None = None) -> dict:
    """One model end to end: the light model ``name``, or the ONNX file ``source``."""
    from onnxruntime.quantization import QuantFormat

    import quantsim

    if source is None:
        found = _light(name, workdir)
        if found is None:
            return {"name": name, "error": "not in this onnx wheel"}
        model, path = found
    else:
        model, path = onnx.load(str(source)), str(source)
    inits = {t.name for t in model.graph.initializer}
    data_input = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value or 1 for d in data_input.type.tensor_type.shape.dim)
    rng = np.random.default_rng(0)
    calib, evaluation = _images(rng, data_input.name, 8, shape), _images(rng, data_input.name, 4, shape)
    sim = quantsim.QuantizationSimModel(path, param_type="int8", activation_type="int8", quant_scheme="min_max",
                                        progress=False)
    sim.compute_encodings(calib)
    integer = sim.export_integer(weight_codes=weight_codes)
    floats = collections.Counter(entry.op_type for entry in integer.report)
    models = {
        "fp32": path,
        "qdq": sim.to_onnx_qdq(weight_codes=weight_codes),
        "integer": integer.model,
        "qs_qdq": ort_quantize_static(model, calib, QuantFormat.QDQ, weight_codes),
        "qs_qop": ort_quantize_static(model, calib, QuantFormat.QOperator, weight_codes),
    }
    sessions = {key: cpu_session(value, threads=threads) for key, value in models.items()}

    def run(session: ort.InferenceSession) -> list[np.ndarray]:
        return [session.run(None, feed)[0] for feed in evaluation]

    ref = run(sessions["fp32"])
    quality = {key: _quality(ref, run(s)) for key, s in sessions.items() if key != "fp32"}
    quality["sim"] = _quality(ref, [sim.session.run(None, feed)[0] for feed in evaluation])
    best = interleaved_best({key: (lambda s=s: run(s)) for key, s in sessions.items()}, repeats=repeats)
    return {"name": name, "floats": floats, "quality": quality, "best": best,
            "qs_weights": _weight_types(models["qs_qop"])}


def _weight_types(model: onnx.ModelProto) -> str:
    """The element types of a QOperator model's QLinearConv / QLinearMatMul weights (``quantize_static`` writes
    per-channel Conv weights as int8 even when asked for QUInt8)."""
    inits = {t.name: t.data_type for t in model.graph.initializer}
    slots = {"QLinearConv": 3, "QLinearMatMul": 3}
    types = {inits[n.input[slots[n.op_type]]] for n in model.graph.node
             if n.op_type in slots and n.input[slots[n.op_type]] in inits}
    return "/".join(sorted(onnx.TensorProto.DataType.Name(t).lower() for t in types)) or "-"


def render(rows: list[dict], weight_codes: str, threads: int, repeats: int) -> str:
    lines = [
        "# CNNs from other exporters (random weights: onnx wheel's light models, torchvision/timm via torch's exporters)", "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime "
        f"{ort.__version__}; {threads} intra-op thread(s), best of {repeats} interleaved passes over 4 images; "
        f"8-bit weight codes {weight_codes}.", "",
        "| model | float ops in integer export | output rel. error vs FP32: sim / our QDQ / our integer / qs QDQ / "
        "qs QOperator | top-1 = FP32: sim / integer / qs QOperator | our QDQ / qs QDQ | our integer / qs QOperator "
        "| FP32 / our integer | qs QOperator weights |",
        "|---|---|---|---|--:|--:|--:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} | | | | | | |")
            continue
        q, b = r["quality"], r["best"]
        floats = ", ".join(f"{op} {n}" for op, n in sorted(r["floats"].items())) or "0"
        errors = " / ".join(f"{q[k][0]:.3f}" for k in ("sim", "qdq", "integer", "qs_qdq", "qs_qop"))
        top1 = " / ".join(f"{q[k][1]:.2f}" for k in ("sim", "integer", "qs_qop"))
        lines.append(f"| {r['name']} | {floats} | {errors} | {top1} | {b['qdq'] / b['qs_qdq']:.2f}x "
                     f"| {b['integer'] / b['qs_qop']:.2f}x | {b['fp32'] / b['integer']:.2f}x | {r['qs_weights']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--weight-codes", choices=("int8", "uint8"), default="int8")
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads (0: onnxruntime default)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--output", default=None, help="Markdown path ('' to skip writing; default "
                        "results/light.md, results/torch.md with --torch)")
    parser.add_argument("--torch", nargs="?", const=str(TORCH_EXPORTS), default=None,
                        help="folder of benchmarks.suite.torch_export's files instead of the light models")
    args = parser.parse_args(argv)
    if args.output is None:
        args.output = str(RESULTS / ("torch.md" if args.torch else "light.md"))
    jobs: list[tuple[str, Path | None]] = [(name, None) for name in args.models]
    if args.torch:
        files = sorted(Path(args.torch).glob("*.onnx"))
        chosen = [] if args.models == list(MODELS) else args.models
        jobs = [(f.stem, f) for f in files if not chosen or any(f.stem.startswith(c) for c in chosen)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="quantsim-light-") as folder:
        for name, source in jobs:
            rows.append(bench_model(name, Path(folder), args.weight_codes, args.threads, args.repeats, source))
            print(render(rows[-1:], args.weight_codes, args.threads, args.repeats).splitlines()[-1], flush=True)
    table = render(rows, args.weight_codes, args.threads, args.repeats)
    print_and_save(table, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
