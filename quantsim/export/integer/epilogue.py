"""Output side of an integer op: the grid it writes, and the bias Add / Relu / Clip it absorbs.

In the sim a supergroup such as Conv -> Relu has no quantizer on the Conv output: the float result goes
through the Relu and only then is quantized. The integer op therefore writes its codes directly on the
grid of the last tensor of the chain, and the activations become a clamp on codes, which is exact because
quantization ``q`` is monotone (non-decreasing):

    q(max(x, 0)) = max(q(x), q(0)),      q(clip(x, a, b)) = clip(q(x), q(a), q(b)).

A chain of clamps composes into one clamp ``clip(c, L, H)`` with ``L = f(0)``, ``H = f(255)`` (``f`` the
chain applied to codes), intersected with the output grid's own code range (``[0, 255]``, narrower for
sub-8-bit grids). When ``L == 0`` and ``H == 255`` the grid already implies the clamp (e.g. a Relu
output grid with zero point 0, a Relu6 grid whose max is <= 6) and nothing is emitted; otherwise one
uint8 ``Clip`` follows the op. A ``Min``/``Max`` with a constant bound is a clamp too: a scalar bound joins the
``Clip``; a per-channel one (a ReLU6 whose bounds cross-layer equalization rescaled, ``adaround.equalize_model``)
becomes one uint8 ``Min``/``Max`` with the bound's codes, after it. ``Add(MatMul(x, W), b)`` (the MatmulAdd
pattern, the MatMul output has no quantizer) is absorbed as the bias of the integer MatMul.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from quantsim.export.integer.context import Grid, LoweringContext, QTensor, Unsupported
from quantsim.graph.index import node_attributes

__all__ = ["Epilogue", "epilogue", "finish", "clip_bounds", "clamp_codes", "code_clamp"]

ACTIVATIONS = frozenset({"Relu", "Clip"})


@dataclass(frozen=True)
class Epilogue:
    """Where an op's codes go: ``tensor`` on ``grid``, clamped to ``[low, high]``; ``nodes`` absorbed."""

    tensor: str
    grid: Grid
    low: int
    high: int
    nodes: tuple
    bias: np.ndarray | None = None
    #: per-element (per-channel) clamps after ``[low, high]``: ``("Min" | "Max", bound's float values)``
    bounds: tuple = ()


def clip_bounds(ctx: LoweringContext, node: onnx.NodeProto) -> tuple[float, float]:
    """``(min, max)`` of a Relu or Clip node (``-inf``/``inf`` when absent); Unsupported if not constant."""
    if node.op_type == "Relu":
        return 0.0, float("inf")
    attrs = node_attributes(node)
    low, high = float(attrs.get("min", -np.inf)), float(attrs.get("max", np.inf))
    for slot in (1, 2):
        if len(node.input) > slot and node.input[slot]:
            name = node.input[slot]
            if not ctx.index.is_constant(name):
                raise Unsupported(f"Clip bound {name!r} is not a constant")
            value = float(np.asarray(ctx.constant(name)).reshape(-1)[0])
            low, high = (value, high) if slot == 1 else (low, value)
    return low, high


def code_clamp(grid: Grid, low: float, high: float) -> tuple[int, int]:
    """The uint8 codes a clamp of real values to ``[low, high]`` becomes on ``grid`` (infinite: 0 / 255)."""
    lo = 0 if not np.isfinite(low) else int(grid.quantize(low))
    hi = 255 if not np.isfinite(high) else int(grid.quantize(high))
    return lo, hi


def epilogue(ctx: LoweringContext, node: onnx.NodeProto, *, allow_bias: bool = False) -> Epilogue:
    """Follow ``node.output[0]`` through an optional bias Add and Relu/Clip ops to a quantized tensor."""
    tensor = node.output[0]
    absorbed: list[onnx.NodeProto] = []
    activations: list[tuple[float, float]] = []
    per_element: list[tuple[str, np.ndarray]] = []
    bias = None
    index = ctx.index
    while not ctx.has_quantizer(tensor):
        consumer = index.single_consumer(tensor)
        if consumer is None:
            raise Unsupported(f"output {tensor!r} has no quantizer and is not followed by a quantized op")
        if allow_bias and bias is None and not activations and consumer.op_type == "Add":
            pair = index.bias_add(tensor)
            if pair is None:
                raise Unsupported(f"output {tensor!r} feeds an Add that is not a constant bias")
            bias = np.asarray(ctx.constant(pair[1]), dtype=np.float32).reshape(-1)  # per column (`bias_add`)
        elif consumer.op_type in ACTIVATIONS and consumer.input[0] == tensor:
            activations.append(clip_bounds(ctx, consumer))
        elif (bound := _constant_bound(ctx, consumer, tensor)) is not None:
            if np.size(bound) == 1:
                value = float(np.asarray(bound).reshape(-1)[0])
                activations.append((-np.inf, value) if consumer.op_type == "Min" else (value, np.inf))
            else:
                per_element.append((consumer.op_type, np.asarray(bound, dtype=np.float32)))
        else:
            raise Unsupported(f"output {tensor!r} has no quantizer (it feeds {consumer.op_type} {consumer.name!r})")
        absorbed.append(consumer)
        tensor = consumer.output[0]
    grid = ctx.output_grid(tensor)
    low, high = grid.low, grid.high  # a narrow (sub-8-bit) grid is itself a clamp of the kernel's uint8 codes
    for bounds in activations:
        lo, hi = code_clamp(grid, *bounds)
        low, high = int(np.clip(low, lo, hi)), int(np.clip(high, lo, hi))
    return Epilogue(tensor, grid, low, high, tuple(absorbed), bias, tuple(per_element))


def _constant_bound(ctx: LoweringContext, node: onnx.NodeProto, tensor: str) -> np.ndarray | None:
    """The constant operand of ``Min(tensor, c)`` / ``Max(tensor, c)`` (either order), else None."""
    if node.op_type not in ("Min", "Max") or len(node.input) != 2 or tensor not in node.input:
        return None
    other = node.input[1] if node.input[0] == tensor else node.input[0]
    if other == tensor or not ctx.index.is_constant(other):
        return None
    return np.asarray(ctx.constant(other))


def clamp_codes(ctx: LoweringContext, codes: str, low: int, high: int, base: str) -> str:
    """``codes`` clamped to ``[low, high]`` by one uint8 Clip (nothing when the clamp is the full range)."""
    if low <= 0 and high >= 255:
        return codes
    if ctx.opset < 12:
        raise Unsupported("a uint8 Clip needs opset >= 12")
    out = ctx.fresh(f"{base}/clamped")
    ctx.emit("Clip", [codes, ctx.scalar(low, np.uint8, "clamp/low"), ctx.scalar(high, np.uint8, "clamp/high")],
             [out], name=f"{base}/clamp")
    return out


def finish(ctx: LoweringContext, ep: Epilogue, codes: str) -> QTensor:
    """Apply the epilogue's clamp to ``codes`` and register them as ``ep.tensor``; mark absorbed nodes."""
    codes = clamp_codes(ctx, codes, ep.low, ep.high, ep.tensor)
    for k, (op, bound) in enumerate(ep.bounds):
        bound_codes = np.clip(ep.grid.quantize(bound), 0, 255).astype(np.uint8)
        out = ctx.fresh(f"{ep.tensor}/bound{k}")
        ctx.emit(op, [codes, ctx.add_initializer(bound_codes, f"{ep.tensor}/bound{k}/codes")], [out],
                 name=f"{ep.tensor}/bound{k}")
        codes = out
    ctx.absorbed.update(n.name for n in ep.nodes)
    return ctx.set_int(ep.tensor, codes, ep.grid)
