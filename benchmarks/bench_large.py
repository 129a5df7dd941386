"""Large models: time and peak memory of the sim against plain onnxruntime, side by side.

Builds generated MLPs (MatMul + Add + Relu layers of ``width x width``, weights in ONNX external data) of
about the requested sizes, then runs each step in its own process so that peak RSS (``ru_maxrss``) is the
step's own:

* ``fp32``: an onnxruntime session of the float model and the calibration batches through it;
* ``sim``: ``QuantizationSimModel(path)`` (preparation cache cold, then warm), ``compute_encodings`` over
  the same batches, one ``sim.session`` run, and optionally ``sim.export`` (encodings + QDQ model) and
  ``sim.export_integer(weight_codes="auto").save`` (the written model then run in onnxruntime against the sim,
  differences in steps of the output grid).

Prints times and the peak-RSS ratio sim / fp32 per model. What is counted: ``fp32 create`` the float
session's creation, ``fp32 run`` the batches through it (the FP32 pass); ``calib`` all of
``compute_encodings``: the weight encodings, the calibration session (fake-quantized weights written or, in a
later process, found in the preparation cache entry's store, then onnxruntime's session creation with its
weight prepacking), the batches and the activation encodings; ``run`` the sim session's creation and its
batches. ``calib/fp32`` is wall time over the FP32 pass, ``cpu`` the same with process CPU time (all
threads; steadier on a shared machine)::

    python -m benchmarks.bench_large [--sizes 0.1 0.8] [--batches 16] [--export] [--export-integer]

``--create N`` measures creation alone, N times (median and range): the float session's, the sim's with an
empty preparation cache (cold: preparation and the cache write) and with the entry it wrote (warm), wall and
CPU time, each in a fresh process::

    python -m benchmarks.bench_large --create 3 --sizes 0.8 2.4

``--amp`` measures instead what automatic mixed precision adds on top of a sim of the model, each step's
time and peak RSS over the sim's resident size: the score cache's key (`mixed_precision.amp_cache.cache_key`),
the bit-operation costs with a sample feed (`mixed_precision.layer_costs`) and the pickled sim an executor
ships (``pickle.dumps``); a step that fails (e.g. protobuf's 2 GiB limit) prints its error::

    python -m benchmarks.bench_large --amp --sizes 0.8 2.4
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WIDTH = 4096
ROWS = 64


def build(path: Path, gigabytes: float, width: int = WIDTH) -> int:
    """Write an MLP of about ``gigabytes`` of float32 weights to ``path`` (external data); returns layers.

    Each weight is written to the data file as soon as it is drawn and the model only records where it lies,
    so building needs one layer's memory, not the model's (``onnx.save`` of an in-memory model holds the weights
    three times over: the initializer list, the graph's copy and the model's copy)."""
    import onnx
    from onnx import TensorProto, helper

    layers = max(1, round(gigabytes * 1e9 / (width * width * 4)))
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    location = path.name + ".data"

    def external(data_file, name: str, array: np.ndarray) -> TensorProto:
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape)
        offset = data_file.tell()
        data_file.write(array.tobytes())
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(array.nbytes))):
            tensor.external_data.add(key=key, value=value)
        tensor.data_location = TensorProto.EXTERNAL
        return tensor

    x = "x"
    with open(path.parent / location, "wb") as data_file:
        for i in range(layers):
            w = (rng.standard_normal((width, width), dtype=np.float32) / math.sqrt(width)).astype(np.float32)
            b = (0.01 * rng.standard_normal(width)).astype(np.float32)
            inits += [external(data_file, f"w{i}", w), external(data_file, f"b{i}", b)]
            nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                      helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
            x = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return layers


def _batches(count: int, width: int) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((ROWS, width), dtype=np.float32)} for _ in range(count)]


def _peak_gb() -> float:
    """This process's peak RSS. ``VmHWM`` from /proc (Linux): ``ru_maxrss`` would carry the parent's peak
    over a fork (the parent builds gigabytes of weights), which hid the children's own peaks."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1e6  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kilobytes on Linux


def _rss_gb() -> float:
    """This process's resident size now (``VmRSS``), 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def _amp_steps(path: str, data: list[dict]) -> dict:
    """The ``--amp`` measurements (module docstring), each step from the sim's resident size."""
    from mixed_precision import layer_costs
    from mixed_precision.amp_cache import cache_key
    from quantsim import QuantizationSimModel

    sim = QuantizationSimModel(path, progress=False)
    result: dict = {"step": "amp", "sim_rss_gb": _rss_gb()}
    steps = {"key": lambda: cache_key(sim, ["W8A8", "W8A16"], sim.quantizer_groups(), (len,)),
             "bitops": lambda: layer_costs(sim, data[0]),
             "pickle": lambda: len(pickle.dumps(sim, protocol=pickle.HIGHEST_PROTOCOL))}
    for name, run in steps.items():
        _reset_peak()
        base = _rss_gb()
        start = time.perf_counter()
        try:
            value = run()
        except Exception as error:  # noqa: BLE001 - a benchmark reports the failure and goes on
            result[f"{name}_error"] = f"{type(error).__name__}: {str(error)[:80]}"
            continue
        result[f"{name}_s"] = time.perf_counter() - start
        result[f"{name}_extra_gb"] = _peak_gb() - base
        if name == "pickle":
            result["pickle_gb"] = value / 1e9
    return result


def _reset_peak() -> None:
    """Restart this process's ``VmHWM`` at its current RSS (Linux ``clear_refs``), so a later step's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def child(step: str, path: str, batches: int, width: int, out_dir: str) -> dict:
    """One measured step, run in a fresh process (see module docstring)."""
    data = _batches(batches, width)
    result: dict = {"step": step}
    if step == "amp":
        return _amp_steps(path, data[:1])
    if step in ("fp32_create", "sim_create"):
        cpu, start = time.process_time(), time.perf_counter()
        if step == "fp32_create":
            import onnxruntime as ort

            ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        else:
            from quantsim import QuantizationSimModel

            QuantizationSimModel(path, progress=False)
        return {"step": step, "create_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
                "peak_gb": _peak_gb()}
    if step == "fp32":
        import onnxruntime as ort

        start = time.perf_counter()
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        result["create_s"] = time.perf_counter() - start
        start, cpu = time.perf_counter(), time.process_time()
        for feed in data:
            session.run(None, feed)
        result["run_s"], result["run_cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
    else:
        from quantsim import QuantizationSimModel

        start = time.perf_counter()
        sim = QuantizationSimModel(path, progress=False)
        result["create_s"] = time.perf_counter() - start
        result["after_create_gb"] = _peak_gb()
        start, cpu = time.perf_counter(), time.process_time()
        sim.compute_encodings(data)
        result["calibrate_s"], result["calibrate_cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
        result["after_calibrate_gb"] = _peak_gb()
        start = time.perf_counter()
        for feed in data:
            sim.session.run(None, feed)
        result["run_s"] = time.perf_counter() - start
        result["after_run_gb"] = _peak_gb()
        if "+qdq" in step:
            _reset_peak()
            start = time.perf_counter()
            sim.export(out_dir, "mlp", qdq=True)
            result["export_s"] = time.perf_counter() - start
            result["export_peak_gb"] = _peak_gb()
        if "+integer" in step:
            result.update(_export_integer(sim, data[0], out_dir))
    if "integer_peak_gb" in result:  # read before the check session of the written model, not the sim's own
        result["peak_gb"] = max(result["after_run_gb"], result.get("export_peak_gb", 0.0), result["integer_peak_gb"])
    else:
        result["peak_gb"] = max(_peak_gb(), result.get("after_run_gb", 0.0))
    return result


def _export_integer(sim, feed: dict, out_dir: str) -> dict:
    """``sim.export_integer(weight_codes="auto").save(...)``: time, peak RSS and the RSS it started from; then
    (after the peak is read) the written model in onnxruntime against the sim on one batch, in steps of the
    output's grid."""
    import onnxruntime as ort

    result: dict = {}
    _reset_peak()
    result["integer_start_gb"] = _rss_gb()
    start, cpu = time.perf_counter(), time.process_time()
    model_path, _ = sim.export_integer(weight_codes="auto").save(Path(out_dir) / "mlp.integer")
    result["integer_s"], result["integer_cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
    result["integer_peak_gb"] = _peak_gb()
    files = sorted(Path(out_dir).glob("mlp.integer.onnx*"))
    result["integer_files_gb"] = sum(p.stat().st_size for p in files) / 1e9
    digest = hashlib.sha256()
    for file in files:
        with open(file, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 24), b""):
                digest.update(block)
    result["integer_sha256"] = digest.hexdigest()[:16]
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    (got,) = session.run([output], feed)
    (want,) = sim.session.run([output], feed)
    steps = np.abs(got.astype(np.float64) - want) / float(sim.qc_quantize_op_dict[output].encoding.scale)
    result["integer_steps"] = {"max": float(steps.max()), "over_1": float(np.mean(steps > 1.01)),
                               "at_least_1": float(np.mean(steps > 0.99))}
    return result


def _run_child(step: str, path: Path, batches: int, width: int, cache: str, out_dir: str) -> dict:
    env = dict(os.environ, QUANTSIM_CACHE_DIR=cache)
    command = [sys.executable, "-m", "benchmarks.bench_large", "--child", step, str(path), str(batches), str(width),
               out_dir]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"step": step, "error": (done.stderr.strip().splitlines() or ["killed"])[-1],
                "returncode": done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 0.8], help="model sizes in GB")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--export", action="store_true", help="also export encodings + QDQ model")
    parser.add_argument("--export-integer", action="store_true",
                        help="also export the integer model (export_integer(...).save) and check it in onnxruntime")
    parser.add_argument("--amp", action="store_true", help="measure AMP's key, bit operations and pickled sim instead")
    parser.add_argument("--create", type=int, default=0, metavar="N", help="measure creation alone, N times")
    args = parser.parse_args()
    if args.amp:
        _main_amp(args)
        return
    if args.create:
        _main_create(args)
        return
    print(f"{'model':>10} {'layers':>6} | {'fp32 create':>11} {'fp32 run':>8} {'fp32 peak':>9} | "
          f"{'sim cold':>8} {'sim warm':>8} {'calib':>6} {'run':>6} {'peak':>7} | {'peak ratio':>10} "
          f"{'warm/fp32':>9} {'calib/fp32':>10} {'cpu':>5}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="quantsim-large-") as folder:
            path = Path(folder) / "mlp.onnx"
            layers = build(path, size, args.width)
            cache, out_dir = str(Path(folder) / "cache"), str(Path(folder) / "export")
            fp32 = _run_child("fp32", path, args.batches, args.width, cache, out_dir)
            cold = _run_child("sim", path, args.batches, args.width, cache, out_dir)
            warm_step = "sim" + ("+qdq" if args.export else "") + ("+integer" if args.export_integer else "")
            warm = _run_child(warm_step, path, args.batches, args.width, cache, out_dir)
            if "error" in cold or "error" in warm:
                print(f"{size:>8.1f}GB {layers:>6} | sim failed: {cold.get('error') or warm.get('error')}")
                continue
            ratio = warm["peak_gb"] / fp32["peak_gb"]
            print(f"{size:>8.1f}GB {layers:>6} | {fp32['create_s']:>10.2f}s {fp32['run_s']:>7.2f}s "
                  f"{fp32['peak_gb']:>8.2f}G | {cold['create_s']:>7.2f}s {warm['create_s']:>7.2f}s "
                  f"{warm['calibrate_s']:>5.2f}s {warm['run_s']:>5.2f}s {warm['peak_gb']:>6.2f}G | {ratio:>10.2f} "
                  f"{warm['create_s'] / fp32['create_s']:>9.2f} {warm['calibrate_s'] / fp32['run_s']:>10.2f} "
                  f"{warm['calibrate_cpu_s'] / fp32['run_cpu_s']:>5.2f}"
                  + (f"  export {warm['export_s']:.1f}s {warm['export_peak_gb']:.2f}G" if "export_s" in warm else "")
                  + (f"  integer {warm['integer_s']:.1f}s (cpu {warm['integer_cpu_s']:.1f}s) peak "
                     f"{warm['integer_peak_gb']:.2f}G from {warm['integer_start_gb']:.2f}G, "
                     f"max {warm['integer_steps']['max']:.0f} steps" if "integer_s" in warm else ""))
            print("   steps:", json.dumps({"fp32": fp32, "cold": cold, "warm": warm}))
            sys.stdout.flush()


def _main_create(args: argparse.Namespace) -> None:
    """The ``--create`` measurements (module docstring)."""
    print(f"{'model':>10} {'layers':>6} | creation: median wall (range) [median CPU], peak RSS; cold and warm / fp32")
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="quantsim-large-") as folder:
            path = Path(folder) / "mlp.onnx"
            layers = build(path, size, args.width)
            cache, out_dir = Path(folder) / "cache", str(Path(folder) / "export")
            runs: dict[str, list[dict]] = {"fp32": [], "cold": [], "warm": []}
            for _ in range(args.create):
                shutil.rmtree(cache, ignore_errors=True)
                for name, step in (("fp32", "fp32_create"), ("cold", "sim_create"), ("warm", "sim_create")):
                    runs[name].append(_run_child(step, path, 0, args.width, str(cache), out_dir))
            failed = [run["error"] for found in runs.values() for run in found if "error" in run]
            if failed:
                print(f"{size:>8.1f}GB {layers:>6} | failed: {failed[0]}")
                continue
            medians = {name: _median([run["create_s"] for run in found]) for name, found in runs.items()}
            parts = []
            for name, found in runs.items():
                walls = [run["create_s"] for run in found]
                parts.append(f"{name} {medians[name]:.2f}s ({min(walls):.2f}-{max(walls):.2f}) "
                             f"[{_median([run['cpu_s'] for run in found]):.2f}s] {max(r['peak_gb'] for r in found):.2f}G")
            print(f"{size:>8.1f}GB {layers:>6} | " + " | ".join(parts)
                  + f" | cold {medians['cold'] / medians['fp32']:.2f}x warm {medians['warm'] / medians['fp32']:.2f}x")
            sys.stdout.flush()


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _main_amp(args: argparse.Namespace) -> None:
    print(f"{'model':>10} {'layers':>6} {'sim RSS':>8} | step: time, peak over the sim's RSS")
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="quantsim-large-") as folder:
            path = Path(folder) / "mlp.onnx"
            layers = build(path, size, args.width)
            cache, out_dir = str(Path(folder) / "cache"), str(Path(folder) / "export")
            amp = _run_child("amp", path, 1, args.width, cache, out_dir)
            if "error" in amp:
                print(f"{size:>8.1f}GB {layers:>6} | failed: {amp['error']}")
                continue
            parts = [f"{name} " + (amp[f"{name}_error"] if f"{name}_error" in amp else
                                   f"{amp[f'{name}_s']:.2f}s +{amp[f'{name}_extra_gb']:.2f}G")
                     for name in ("key", "bitops", "pickle")]
            print(f"{size:>8.1f}GB {layers:>6} {amp['sim_rss_gb']:>7.2f}G | " + " | ".join(parts)
                  + (f" ({amp['pickle_gb']:.2f} GB pickled)" if "pickle_gb" in amp else ""))
            sys.stdout.flush()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        step, path, batches, width, out_dir = sys.argv[2:7]
        print(json.dumps(child(step, path, int(batches), int(width), out_dir)))
    else:
        main()
