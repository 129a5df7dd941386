"""Elementwise functions of one 8-bit tensor on onnxruntime's fast integer kernels, checked code by code.

A function ``y = f(x)`` of one uint8 tensor sees only 256 input codes, so its exact result is a table
(`lut.lut_table`). onnxruntime runs a table lookup (``Cast`` + ``Gather``) about ten times slower than
its QLinear kernels, so the piecewise-linear functions get kernel chains instead:

* HardSwish ``x * clip(a x + b, 0, 1)`` (also HardSigmoid-times-input, as preparation spells it below
  opset 14): the gate ``clip(x + b/a, 0, 1/a)`` is one ``QLinearAdd`` onto the grid ``(1 / (255 a), 0)``,
  whose uint8 saturation *is* the clip (or onto a finer grid ending at ``x``'s largest value when that
  is below ``1/a - b/a``); then ``QLinearMul(x, gate)`` writes the output grid;
* HardSigmoid ``clip(a x + b, 0, 1)``: ``QLinearAdd(x, b/a)`` onto ``(s_y / a, z_y)``, then the code clamp
  of ``[q(0), q(1)]``;
* ``x + c``, ``x - c``, ``x * c``, ``x / c`` with a one-element constant: ``QLinearAdd`` / ``QLinearMul``
  with ``c`` as a one-code constant; PRelu with one slope: ``QLinearLeakyRelu``;
* a move to another grid (`regrid`, identity ``f``): ``QLinearAdd(x, 0)``, else single-input
  ``QLinearConcat`` (onnxruntime's own 256-entry requantization table).

Each candidate is run by onnxruntime (default optimizations, as a deployed model) on all 256 codes and
compared with the exact table; of the candidates that pass, the one with the fewest differing codes is
used, and a function without a passing candidate keeps the table. Tables themselves are a
``GatherElements`` on the flattened codes (about 4x faster than ``Gather`` in onnxruntime 1.3x; exact).
By default (``export_integer(exact=True)``, ``ctx.exact``) a candidate passes only when it equals the
table on every code, so the integer model computes what the sim computes: data movement and scalar
arithmetic usually pass; HardSwish's gate is rounded to 8 bits (an error of up to ``|x| / (510 s_y)``
output steps, 1-3% of its outputs one step off), so HardSwish keeps its table, at about 2.8x the chain's
kernel time (1.08-1.32x end to end on MobileNetV3-style models, about the fused QDQ session's speed).
``exact=False`` accepts HardSwish and HardSigmoid within one output step (``TOLERANCE``); those one-step
errors grow through the layers that follow (PicoDet's detection F1 0.625 instead of the sim's 0.722, PP-OCR's
classifiers 1.8-1.9 dB away from the sim; benchmarks/README.md "Sim vs deployed models").
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.export.integer.context import MS_DOMAIN, Grid, LoweringContext, QTensor
from quantsim.graph.index import node_attributes

__all__ = ["fast_form", "TOLERANCE", "apply_table"]

#: largest |candidate - table| (output steps) accepted per function
TOLERANCE = {"HardSwish": 1, "HardSigmoid": 1}


class _Emitter:
    """Emits a candidate chain either into the lowering context or into a 256-code probe graph."""

    def __init__(self, ctx: LoweringContext, base: str, probe: bool):
        self.ctx, self.base, self.probe = ctx, base, probe
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, value, dtype) -> str:
        if not self.probe:
            return self.ctx.scalar(value, dtype, f"{self.base}/const")
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def grid(self, scale: float, zero_point: int) -> list[str]:
        return [self.const(np.float32(scale), np.float32), self.const(zero_point, np.uint8)]

    def node(self, op: str, inputs: list[str], domain: str = MS_DOMAIN, **attrs) -> str:
        if not self.probe:
            out = self.ctx.fresh(f"{self.base}/{op}")
            self.ctx.emit(op, inputs, [out], name=f"{self.base}/{op}", domain=domain, **attrs)
            return out
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], domain=domain or None, **attrs))
        return out


Chain = Callable[[_Emitter, str], str]  # (emitter, input codes name) -> output codes name


def _constant_codes(value: float) -> tuple[int, float, int]:
    """``(code, scale, zero_point)`` of a uint8 grid holding ``value`` exactly at one code."""
    if value == 0:
        return 0, 1.0, 0
    return (255, abs(value) / 255, 0) if value > 0 else (0, abs(value) / 255, 255)


def _add_chain(x: Grid, c: float, out_scale: float, out_zp: int) -> Chain:
    code, scale, zp = _constant_codes(c)

    def chain(em: _Emitter, codes: str) -> str:
        return em.node("QLinearAdd", [codes, *em.grid(x.scale, x.zero_point), em.const(code, np.uint8),
                                      *em.grid(scale, zp), *em.grid(out_scale, out_zp)])
    return chain


def _mul_chain(x: Grid, c: float, y: Grid) -> Chain:
    code, scale, zp = _constant_codes(c)

    def chain(em: _Emitter, codes: str) -> str:
        return em.node("QLinearMul", [codes, *em.grid(x.scale, x.zero_point), em.const(code, np.uint8),
                                      *em.grid(scale, zp), *em.grid(y.scale, y.zero_point)])
    return chain


def _hard_sigmoid_chain(x: Grid, y: Grid, alpha: float, beta: float) -> Chain:
    affine = _add_chain(x, beta / alpha, y.scale / alpha, y.zero_point)
    low, high = int(y.quantize(0.0)), int(y.quantize(1.0))

    def chain(em: _Emitter, codes: str) -> str:
        return em.node("Clip", [affine(em, codes), em.const(low, np.uint8), em.const(high, np.uint8)], domain="")
    return chain


def _hard_swish_chain(x: Grid, y: Grid, alpha: float, beta: float, top: float) -> Chain:
    """``x * alpha * u`` with the gate ``u = clip(x + beta/alpha, 0, top)`` on the grid ``(top / 255, 0)``:
    ``top = 1/alpha`` clips like HardSigmoid; a smaller ``top`` that ``x`` never exceeds is finer."""
    gate = _add_chain(x, beta / alpha, top / 255.0, 0)

    def chain(em: _Emitter, codes: str) -> str:
        g = gate(em, codes)
        return em.node("QLinearMul", [codes, *em.grid(x.scale, x.zero_point), g, *em.grid(alpha * top / 255.0, 0),
                                      *em.grid(y.scale, y.zero_point)])
    return chain


def _leaky_relu_chain(x: Grid, y: Grid, alpha: float) -> Chain:
    def chain(em: _Emitter, codes: str) -> str:
        return em.node("QLinearLeakyRelu", [codes, *em.grid(x.scale, x.zero_point), *em.grid(y.scale, y.zero_point)],
                       alpha=float(alpha))
    return chain


def _concat_chain(x: Grid, y: Grid) -> Chain:
    def chain(em: _Emitter, codes: str) -> str:
        return em.node("QLinearConcat", [*em.grid(y.scale, y.zero_point), codes, *em.grid(x.scale, x.zero_point)],
                       axis=0)
    return chain


def _scalar(ctx: LoweringContext, node: onnx.NodeProto, data_slot: int) -> float | None:
    other = node.input[1 - data_slot]
    value = np.asarray(ctx.constant(other), np.float64).reshape(-1)
    return float(value[0]) if value.size == 1 and np.isfinite(value[0]) else None


def _candidates(ctx: LoweringContext, function: onnx.NodeProto | None, data_slot: int, x: Grid,
                y: Grid) -> list[Chain]:
    """Kernel chains that may compute ``function`` (None: identity) from ``x`` onto ``y``."""
    if function is None:
        return [_add_chain(x, 0.0, y.scale, y.zero_point), _concat_chain(x, y)]
    op, attrs = function.op_type, node_attributes(function)
    if op == "HardSwish":
        alpha, beta = 1.0 / 6.0, 0.5
        tops = [1.0 / alpha, min(1.0 / alpha, x.max + beta / alpha)]  # the gate's full range, or the reachable one
        return [_hard_swish_chain(x, y, alpha, beta, top) for top in dict.fromkeys(tops) if top > 0]
    if op == "HardSigmoid":
        alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
        return [_hard_sigmoid_chain(x, y, alpha, beta)] if alpha > 0 and ctx.opset >= 12 else []
    if op in ("Add", "Sub", "Mul", "Div", "PRelu") and len(function.input) == 2:
        c = _scalar(ctx, function, data_slot)
        if c is None or (op in ("Sub", "Div") and data_slot != 0) or (op == "PRelu" and data_slot != 0):
            return []
        if op == "Add":
            return [_add_chain(x, c, y.scale, y.zero_point)]
        if op == "Sub":
            return [_add_chain(x, -c, y.scale, y.zero_point)]
        if op == "Mul":
            return [_mul_chain(x, c, y)]
        if op == "Div":
            return [_mul_chain(x, 1.0 / c, y)] if c != 0 else []
        return [_leaky_relu_chain(x, y, c)]
    return []


def _probe(ctx: LoweringContext, chains: list[Chain]) -> list[np.ndarray | None]:
    """Each candidate's output codes for the 256 input codes, as onnxruntime computes them (None: it fails).
    All candidates form one graph, run with the export's other probes (`code_graphs`); only when that graph
    fails is each tried alone."""
    em = _Emitter(ctx, "probe", probe=True)
    outs = [chain(em, "x") for chain in chains]
    graph = helper.make_graph(em.nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.UINT8, [256])],
                              [helper.make_tensor_value_info(out, TensorProto.UINT8, [256]) for out in outs],
                              em.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ctx.opset),
                                                    helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = ctx.index.model.ir_version
    try:
        codes = ctx.code_graphs.evaluate(model, fuse_qdq=True)  # batched with the export's other probes
    except Exception:  # noqa: BLE001 - a kernel onnxruntime lacks here: that candidate's table stays
        return [_probe(ctx, [chain])[0] for chain in chains] if len(chains) > 1 else [None]
    return [np.asarray(c, np.int64) for c in codes]


def fast_form(ctx: LoweringContext, x: QTensor, y: Grid, function: onnx.NodeProto | None, data_slot: int,
              table: np.ndarray, low: int, high: int, base: str) -> str | None:
    """Codes of ``function`` (None: identity) on ``y`` from integer kernels matching ``table`` (already
    clamped to ``[low, high]``) within `TOLERANCE`, emitted into ``ctx``; None when no candidate does."""
    tolerance = TOLERANCE.get(function.op_type, 0) if function is not None and not ctx.exact else 0
    exact = np.asarray(table, np.int64)
    best, fewest = None, 257
    chains = _candidates(ctx, function, data_slot, x.grid, y)
    for chain, got in zip(chains, _probe(ctx, chains) if chains else []):
        if got is None:
            continue
        error = np.abs(np.clip(got, low, high) - exact)
        if error.max() <= tolerance and int(np.count_nonzero(error)) < fewest:
            best, fewest = chain, int(np.count_nonzero(error))
    return None if best is None else best(_Emitter(ctx, base, probe=False), x.name)


def apply_table(ctx: LoweringContext, x: QTensor, table: np.ndarray, base: str) -> str:
    """``table[codes]``: ``GatherElements`` over the flattened int32 codes, reshaped back."""
    index_key, shape_key = ("flat int32 index", x.name), ("shape", x.name)
    if index_key not in ctx.memo:
        flat = ctx.fresh(f"{base}/flat")
        ctx.emit("Reshape", [x.name, ctx.scalar(np.asarray([-1], np.int64), np.int64, "shape/flat")], [flat],
                 name=f"{base}/flatten")
        ctx.memo[index_key] = ctx.fresh(f"{base}/index")
        ctx.emit("Cast", [flat], [ctx.memo[index_key]], name=f"{base}/cast", to=TensorProto.INT32)
        ctx.memo[shape_key] = ctx.fresh(f"{base}/shape")
        ctx.emit("Shape", [x.name], [ctx.memo[shape_key]], name=f"{base}/shape")
    index, shape = ctx.memo[index_key], ctx.memo[shape_key]
    looked_up = ctx.fresh(f"{base}/looked_up")
    ctx.emit("GatherElements", [ctx.add_initializer(table.astype(np.uint8), f"{base}/table"), index], [looked_up],
             name=f"{base}/lut", axis=0)
    out = ctx.fresh(f"{base}/codes")
    ctx.emit("Reshape", [looked_up, shape], [out], name=f"{base}/unflatten")
    return out
