"""What still separates the sim from its deployed models, and how big each difference is (for `summary`).

Read from the prepared graph and the sim's settings, without running anything but onnxruntime's one-off
integer-kernel probe (`graph.int8_kernels`). Each line names a difference between the sim (fake quantization:
float arithmetic between Q/DQ pairs) and what onnxruntime's integer kernels compute from the exports, with its
size per op; the end-to-end size on a model is measured by ``benchmarks/bench_agreement.py``. Per-op sizes
are those the project's tests and benchmarks measure (benchmarks/README.md, "Sim vs deployed models").
"""
from __future__ import annotations

from collections import Counter

__all__ = ["deployment_differences"]

_REQUANTIZED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_GATES = ("HardSwish", "HardSigmoid")
_AVERAGES = ("AveragePool", "GlobalAveragePool", "ReduceMean")


def deployment_differences(sim) -> list[str]:
    """Lines naming each remaining sim-vs-deployment difference of ``sim`` and its size."""
    from quantsim.sim.int32_bias import biased_ops, eligible_biases

    graph = sim.prepared_model.graph
    ops = Counter(node.op_type for node in graph.node)
    quantizers = list(sim.quantizers)
    lines = []
    constants = {t.name for t in graph.initializer}
    biased = list(biased_ops(graph, constants.__contains__))
    if biased:
        on_grid = len(eligible_biases(graph, quantizers, constants.__contains__)) if all(
            q.is_initialized() for q in quantizers if q.enabled) else None
        count = f"{len(biased)} (once calibrated: those with quantized input and weight)" if on_grid is None else (
            f"{on_grid} of {len(biased)}")
        if getattr(sim, "int32_bias", False):
            lines.append(f"biases: {count} on the int32 accumulator grid as the exports add them "
                         "(int32_bias=True): no difference")
        else:
            lines.append(f"biases: {count} are int32 in the exports but float here "
                         "(int32_bias=False): up to 0.5 accumulator units, one output step where a value lies "
                         "that close to a rounding midpoint")
    linear = sum(ops[op] for op in _REQUANTIZED)
    if linear:
        lines.append(f"requantization: {linear} Conv/Gemm/MatMul; the integer kernels scale the exact int32 "
                     "accumulator by a float32 multiplier s_in*s_w/s_out where the sim sums float32 products and "
                     "divides by s_out: one output step where a result lies within about 1e-6 of a rounding "
                     "midpoint (measured: 0.0001-0.002% of a layer's outputs on PP-OCR det and MiniLM)")
        lines.append("fixed-point targets (the requant table's mantissa and shift): rounding the 64-bit product "
                     "once gives onnxruntime's codes (run_integer_model(rounding='single')); gemmlowp's two "
                     "roundings (TFLite's reference kernels, the executor's default) move results within "
                     "2^-(e+1) of a midpoint by one step, e the right shift: 0.2-0.3% of MiniLM's Gemm outputs, "
                     "5.4% of a PP-OCR det layer's, up to a quarter where e = 1")
    gates = sum(ops[op] for op in _GATES)
    if gates:
        lines.append(f"HardSwish/HardSigmoid: {gates}; export_integer keeps exact tables (no difference); "
                     "export_integer(exact=False) runs them as faster kernel chains within one output step "
                     "(1-3% of outputs one step off, growing downstream)")
    if ops["Softmax"]:
        lines.append(f"Softmax: {ops['Softmax']}; QLinearSoftmax differs by one step on about 1-4% of outputs")
    averages = sum(ops[op] for op in _AVERAGES)
    if averages:
        lines.append(f"averages: {averages} AveragePool/GlobalAveragePool/ReduceMean; integer averages round the "
                     "sum once: one output step on near-ties")
    wide = [q for q in quantizers if q.enabled and q.param_type != "bias" and (q.spec.is_float or q.bitwidth > 8)]
    if wide and linear:
        lines.append(f"float kernels: {len(wide)} quantizers are 16-bit or float16, where the float arithmetic "
                     "between them decides roundings on a fine grid; onnxruntime runs that arithmetic with other "
                     "kernels in the export's fused session than in the sim's (NCHWc convolutions on other "
                     "layers, LayerNorm fused differently): one float ulp, one step on about 1e-4 of a layer's "
                     "outputs (PP-OCRv4 rec); the sim itself moves as much under other session options")
    if lines:
        lines.append("one-step differences grow through the layers after them, most through steep lookup "
                     "tables (GELU's Erf, Softmax, Sigmoid): measured end to end, PP-OCR det 212 output steps on "
                     "a few pixels, MiniLM 9, PP-OCRv4 rec's CER by up to 0.005 on 24 lines at W8A8 and its "
                     "mixes with 16-bit and float16 groups (as much as the sim's own CER moves with onnxruntime's "
                     "basic optimizations instead of all); a score within that of a budget is not a promise "
                     "about the export: score the export (auto_quantize does, score_on='export'), and measure a "
                     "model with benchmarks/bench_agreement.py")
    if linear:
        from quantsim.graph.int8_kernels import uint8_int8_kernels_saturate

        provider = sim.providers[0] if sim.providers else "CPUExecutionProvider"
        provider = provider[0] if isinstance(provider, tuple) else provider
        if uint8_int8_kernels_saturate(provider):
            lines.append("int8 weight codes: onnxruntime's uint8 x int8 kernels saturate on this CPU (AVX2 without "
                         "VNNI): many output steps; export with weight_codes='uint8' (or 'auto') to run exactly")
    return lines
