"""Whole-model AdaRound and Sequential MSE: quantsim against aimet-onnx 2.42, time and quality, interleaved.

``bench_adaround --speed-only --whole-model KEYS [--rounds N] [--aimet-python PATH]`` calls :func:`run`. Each
round runs, for every model and method (W4A8 AdaRound with the given iterations, Sequential MSE with 20
candidates): quantsim on a freshly calibrated sim, then (with ``aimet_python``) aimet-onnx on the same model file,
calibration feeds and iterations in a subprocess (``benchmarks.aimet_adaround_timing``). Both sides report the
call's process CPU seconds and wall seconds; quality is the output SQNR (dB, all outputs against FP32 on the
suite's held-out feeds) and the suite's task metric, and each quantsim run prints a fingerprint of every
initializer of its sim graph (rounded weights, scales, zero points, int32 biases) so two versions of the code
can be checked bit for bit on real models. The load average (``os.getloadavg``) is printed before each run.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

METHODS = ("adaround", "seq_mse")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    """One timed call: who, CPU and wall seconds, output SQNR, task metric, load average before it."""

    side: str
    cpu: float
    wall: float
    sqnr: float
    metric: float
    load: float
    fingerprint: str = ""


@dataclass
class Cell:
    runs: list[Run] = field(default_factory=list)

    def span(self, attr: str, fmt: str = "{:.1f}") -> str:
        values = [getattr(r, attr) for r in self.runs]
        lo, hi = min(values), max(values)
        return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def output_sqnr(reference: list[list[np.ndarray]], outputs: list[list[np.ndarray]]) -> float:
    """SQNR in dB of every floating-point output of every held-out feed, pooled, against FP32."""
    pairs = [(np.asarray(r, np.float64).ravel(), np.asarray(o, np.float64).ravel())
             for rs, os_ in zip(reference, outputs) for r, o in zip(rs, os_) if np.asarray(r).dtype.kind == "f"]
    ref = np.concatenate([r for r, _ in pairs])
    out = np.concatenate([o for _, o in pairs])
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - out) ** 2), 1e-30)))


def fingerprint(sim) -> str:
    """SHA-256 of every initializer of the sim graph (name, dtype, shape, bytes), in name order."""
    digest = hashlib.sha256()
    for init in sorted(sim.sim_model().graph.initializer, key=lambda t: t.name):
        array = numpy_helper.to_array(init)
        digest.update(f"{init.name}|{array.dtype}|{array.shape}|".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def _save_feeds(path: Path, feeds) -> None:
    np.savez(path, **{f"batch{i}/{k}": v for i, feed in enumerate(feeds) for k, v in feed.items()})


def _ours(case, method: str, iterations: int, reference) -> Run:
    import quantsim
    from adaround import apply_adaround, apply_seq_mse

    load = os.getloadavg()[0]
    sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), param_type="int4", progress=False)
    sim.compute_encodings(case.calib)
    time.sleep(0.1)  # let the calibration session's spinning workers stop
    start, cpu = time.perf_counter(), time.process_time()
    if method == "adaround":
        apply_adaround(sim, case.calib, num_iterations=iterations)
    else:
        apply_seq_mse(sim, case.calib)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    outputs = [sim.session.run(None, f) for f in case.eval]
    return Run("quantsim", cpu, wall, output_sqnr(reference, outputs),
               case.score(reference, outputs)[case.primary], load, fingerprint(sim))


def _aimet(case, method: str, iterations: int, reference, python: str, timeout: float) -> Run | str:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        calib, held_out = Path(tmp) / "calib.npz", Path(tmp) / "eval.npz"
        _save_feeds(calib, case.calib)
        _save_feeds(held_out, case.eval)
        try:
            done = subprocess.run([python, "-m", "benchmarks.aimet_adaround_timing", str(iterations),
                                   str(case.model_path), str(calib), str(held_out), tmp, method], cwd=ROOT,
                                  capture_output=True, text=True, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"not finished in {timeout:.0f} s"
        lines = [line.split("\t") for line in done.stdout.splitlines() if line.count("\t") == 2]
        if done.returncode or not lines or not (Path(tmp) / f"{method}.npz").exists():
            return f"failed: {done.stderr.strip().splitlines()[-1:]}"
        with np.load(Path(tmp) / f"{method}.npz") as stored:
            outputs = [[stored[f"batch{i}/output{j}"] for j in range(len(reference[i]))] for i in range(len(reference))]
    _, wall, cpu = lines[-1]
    return Run("aimet-onnx", float(cpu), float(wall), output_sqnr(reference, outputs),
               case.score(reference, outputs)[case.primary], load)


def run(keys: list[str], cases: dict, iterations: int, rounds: int, aimet_python: str | None,
        aimet_timeout: float = 900.0) -> list[str]:
    """Interleaved rounds over ``keys`` (``cases[key]`` is a suite ``Case``); returns the markdown table."""
    cells: dict[tuple[str, str, str], Cell] = {}
    failures: dict[tuple[str, str], str] = {}
    references = {}
    for key in keys:
        session = ort.InferenceSession(str(cases[key].model_path), providers=["CPUExecutionProvider"])
        references[key] = [session.run(None, f) for f in cases[key].eval]
    for round_ in range(rounds):
        for key in keys:
            case = cases[key]
            for method in METHODS:
                sides: list[Run | str] = [_ours(case, method, iterations, references[key])]
                if aimet_python and (key, method) not in failures:
                    sides.append(_aimet(case, method, iterations, references[key], aimet_python, aimet_timeout))
                for result in sides:
                    if isinstance(result, str):
                        failures[(key, method)] = result
                        print(f"[adaround] round {round_ + 1} {case.name} {method} aimet-onnx: {result}",
                              file=sys.stderr)
                        continue
                    cells.setdefault((key, method, result.side), Cell()).runs.append(result)
                    print(f"[adaround] round {round_ + 1} {case.name} {method} {result.side}: CPU {result.cpu:.2f} s, "
                          f"wall {result.wall:.2f} s, SQNR {result.sqnr:.2f} dB, {case.primary} {result.metric:.4f}, "
                          f"load {result.load:.1f} {result.fingerprint}", file=sys.stderr, flush=True)
    lines = ["| whole model | quantsim CPU s | quantsim wall s | aimet-onnx CPU s | aimet-onnx wall s | aimet / quantsim "
             "(CPU) | SQNR dB quantsim / aimet | task metric quantsim / aimet | load |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for key in keys:
        case = cases[key]
        for method in METHODS:
            ours = cells.get((key, method, "quantsim"), Cell())
            theirs = cells.get((key, method, "aimet-onnx"))
            label = f"AdaRound {iterations} it" if method == "adaround" else "Sequential MSE"
            loads = Cell(ours.runs + (theirs.runs if theirs else []))
            if theirs is None:
                note = failures.get((key, method), "not run")
                lines.append(f"| {case.name}, {label} | {ours.span('cpu', '{:.2f}')} | {ours.span('wall')} | {note} | | "
                             f"| {ours.span('sqnr')} / | {ours.span('metric', '{:.3f}')} / | {loads.span('load')} |")
                continue
            ratios = [t.cpu / o.cpu for o, t in zip(ours.runs, theirs.runs)]
            lines.append(f"| {case.name}, {label} | {ours.span('cpu', '{:.2f}')} | {ours.span('wall')} "
                         f"| {theirs.span('cpu')} | {theirs.span('wall')} | {min(ratios):.1f}-{max(ratios):.1f}x "
                         f"| {ours.span('sqnr')} / {theirs.span('sqnr')} "
                         f"| {ours.span('metric', '{:.3f}')} / {theirs.span('metric', '{:.3f}')} | {loads.span('load')} |")
    return lines
