"""W4 LPBQ against W4 blockwise (and W4 per-channel) on the suite's real models, side by side.

    python -m benchmarks.bench_lpbq [--models cls,rec] [--block-size 16] [--quick] [--seq-mse]

Weights of Conv/Gemm/MatMul layers whose input channels the block size divides: 4-bit symmetric blocks of
``--block-size`` input channels, with float block scales (``set_blockwise_quantization_for_weights``) or LPBQ
scales (``set_lpbq_for_params``: 4-bit integer block scales under one float scale per channel); other weights
stay int8 per channel; activations int8 min-max. Prints the suite's metric against FP32 on the held-out data
the SQNR of the first output, the pooled SQNR of the weights that took blocks (the cost of the integer block
scales, free of activation-calibration noise), and the gap LPBQ - blockwise. With ``--seq-mse`` both also run Sequential
MSE. Models are read from the cache (``benchmarks/suite/fetch.py`` fetches them when absent).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.bench_adaround import _outputs, _sqnr  # one home for the output SQNR of the suite runs
from benchmarks.suite import cases as C
from benchmarks.suite import fetch

PROVIDERS = ["CPUExecutionProvider"]
OP_TYPES = ("Conv", "Gemm", "MatMul")


def _sim(case, config: str, block_size: int, seq_mse: bool):
    import quantsim
    from adaround import apply_seq_mse

    sim = quantsim.QuantizationSimModel(onnx.load(str(case.model_path)), param_type="int8", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # layers the block size does not divide stay int8 per channel
        if config == "blockwise":
            changed = quantsim.set_blockwise_quantization_for_weights(sim, OP_TYPES, 4, True, block_size)
        elif config == "lpbq":
            changed = quantsim.set_lpbq_for_params(sim, 4, block_size, op_types=set(OP_TYPES))
        else:
            changed = quantsim.set_param_type(sim, "int4", op_types=list(OP_TYPES), strict=False)
    sim.compute_encodings(case.calib)
    if seq_mse:
        apply_seq_mse(sim, case.calib, progress=False)
    return sim, [q.name for q in changed]


def _weight_sqnr(sim, names: list[str]) -> float:
    """SQNR (dB) of the fake-quantized weights ``names`` against their float values, pooled."""
    import quantsim

    signal = noise = 0.0
    for name in names:
        w = sim.get_weight(name).astype(np.float64)
        signal += float(np.sum(w ** 2))
        noise += float(np.sum((quantsim.fake_quantize(w, sim.qc_quantize_op_dict[name].encoding) - w) ** 2))
    return float(10 * np.log10(signal / max(noise, 1e-30))) if names else float("nan")


def run_model(key: str, block_size: int, size, seq_mse: bool) -> list[tuple]:
    source, build = C.BUILDERS[key]
    model_dir = {"ppocr": fetch.fetch_ppocr, "magika": fetch.fetch_magika, "minilm": fetch.fetch_minilm}[source]()
    case = build(model_dir, size)
    reference = _outputs(ort.InferenceSession(str(case.model_path), providers=PROVIDERS), case.eval)
    rows = []
    blocked: list[str] = []  # the weights LPBQ / blockwise take: the weight SQNR of every config is over these
    for config in ("blockwise", "lpbq", "per-channel"):
        for optimise in ((False, True) if seq_mse and config != "per-channel" else (False,)):
            start = time.perf_counter()
            sim, changed = _sim(case, config, block_size, optimise)
            if config == "blockwise":
                blocked = changed
            outputs = _outputs(sim.session, case.eval)
            metric = case.score(reference, outputs)[case.primary]
            sqnr = _sqnr(reference, outputs)
            label = f"W4 {config}" + (" + seq_mse" if optimise else "")
            weight_sqnr = _weight_sqnr(sim, blocked)
            rows.append((case.name, label, len(changed), metric, sqnr, weight_sqnr, case.primary))
            print(f"[lpbq] {case.name} {label}: {len(changed)} layers, {case.primary} {metric:.4f}, SQNR {sqnr:.2f} dB, "
                  f"weight SQNR {weight_sqnr:.2f} dB ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cls,rec")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="the suite's small data split")
    ap.add_argument("--seq-mse", action="store_true", help="also with Sequential MSE")
    args = ap.parse_args(argv)
    size = C.QUICK if args.quick else C.FULL
    rows = []
    for key in args.models.split(","):
        rows += run_model(key.strip(), args.block_size, size, args.seq_mse)
    print(f"| model | weights (A8, block {args.block_size}) | layers | metric vs FP32 | output SQNR (dB) | "
          "blocked weights' SQNR (dB) |")
    print("|---|---|---|---|---|---|")
    for name, label, layers, metric, sqnr, weight_sqnr, _ in rows:
        print(f"| {name} | {label} | {layers} | {metric:.4f} | {sqnr:.2f} | {weight_sqnr:.2f} |")
    by = {(r[0], r[1]): r for r in rows}
    for name in dict.fromkeys(r[0] for r in rows):
        for suffix in ("", " + seq_mse"):
            lpbq, block = by.get((name, "W4 lpbq" + suffix)), by.get((name, "W4 blockwise" + suffix))
            if lpbq and block:
                print(f"{name}{suffix}: LPBQ - blockwise = {lpbq[3] - block[3]:+.4f} {lpbq[6]}, "
                      f"{lpbq[4] - block[4]:+.2f} dB output SQNR, {lpbq[5] - block[5]:+.2f} dB weight SQNR")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
