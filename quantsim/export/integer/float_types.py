"""Float16-compute models in the integer export: each tensor's float value is kept in the tensor's own type.

A model converted to float16 (onnxconverter-common's ``convert_float_to_float16``: float32 I/O, a ``Cast`` to
float16 after the input, float16 ops, blocked ops between ``Cast`` pairs) is simulated with float32
quantizers between Casts: ``Cast(float) -> QuantizeLinear -> DequantizeLinear -> Cast(float16)``
(`quantsim.sim.build`). The lowering matches that at its float boundaries:

* a float value of a float16 tensor (an island's input, an op left in float) is the float32 dequantization
  of its codes (``Cast -> Sub -> Mul``, bit-identical to DequantizeLinear) then ``Cast(float16)``: exactly
  the sim's value. (DequantizeLinear writes float16 only from a float16 scale, from opset 19: the sim's
  float32 scale rounded to float16 is another grid.)
* a float16 value is ``Cast(float)`` before its QuantizeLinear (which takes float32 below opset 19), as in
  the sim;
* a ``Cast`` between float types of a quantized tensor moves no code: its output keeps the codes and the
  grid of its input (`movement.lower_float_cast`). The sim rounds the dequantized value to float16 there:
  a relative change of at most 2^-11 of a value at most 255 steps from zero, so at most 1/8 step, which
  moves a later code only where the value lies that close to a rounding midpoint.

`as_float32` and `as_own_type` are the two Casts; the ``memo`` of the context shares each one.
"""
from __future__ import annotations

from onnx import TensorProto

__all__ = ["HALF", "is_half", "as_float32", "as_own_type", "cast_once"]

HALF = TensorProto.FLOAT16


def is_half(ctx, tensor: str) -> bool:
    """True when ``tensor`` of the source model is float16."""
    return ctx.index.elem_type.get(tensor) == HALF


def cast_once(ctx, source: str, to: int, base: str) -> str:
    """``Cast(source, to)``, one node per (source, type) in the new graph."""
    key = ("cast", source, to)
    if key not in ctx.memo:
        out = ctx.fresh(f"{base}/as_{TensorProto.DataType.Name(to).lower()}")
        ctx.emit("Cast", [source], [out], name=f"{base}/cast", to=to)
        ctx.memo[key] = out
    return ctx.memo[key]


def as_float32(ctx, source: str, tensor: str) -> str:
    """``source`` (a new-graph value of ``tensor``'s type) in float32: a Cast for a float16 tensor."""
    return cast_once(ctx, source, TensorProto.FLOAT, tensor) if is_half(ctx, tensor) else source


def as_own_type(ctx, value: str, tensor: str) -> str:
    """``value`` (float32) in ``tensor``'s own type: a Cast for a float16 tensor."""
    return cast_once(ctx, value, HALF, tensor) if is_half(ctx, tensor) else value
