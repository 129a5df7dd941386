"""State shared by the integer lowering rules: which 8-bit codes or float value stands for each tensor.

Every float tensor ``t`` of the prepared model has a *sim value*: its float value after its quantizer
(if enabled). The lowering keeps, per ``t``, the new-graph tensor that carries it:

* ``ints[t] = QTensor(name, grid)``: uint8 codes with ``sim value == (codes - zero_point) * scale``
  (float32, as DequantizeLinear); ``grid`` is an 8-bit per-tensor grid (`Grid`);
* ``floats[t] = name``: a float tensor equal to the sim value.

Conversions are exact: DequantizeLinear of codes is the sim value, and QuantizeLinear of a float sim value
that lies on an 8-bit grid (its quantizer is enabled) gives the codes back. A signed int8 grid (zero point
``z`` in [-128, 127]) is the same grid as uint8 with zero point ``z + 128``, so every 8-bit grid that fills
its container is carried as uint8 (onnxruntime's CPU kernels want uint8 activations). Narrower grids
(2..7 bits, strict symmetric) ride in the same uint8 container with the same scale and zero point (shifted
by 128 when signed) and a code range ``[low, high]`` inside [0, 255]: every op writing such a grid clamps
its codes to that range (`epilogue`, ``int_input``), which is exactly the sim's saturation. 16-bit grids
and float16 are not `Grid`s: tensors on them stay float. Float values keep their type (`float_types`).

A rule that cannot lower a node raises `Unsupported(reason)`; the driver rolls the context back to its
`snapshot` and runs the node in float instead.

Big constants of the new graph (weight codes, a constant's codes, a float constant copied for a float op) are
built as `DeferredArray`s: shape and type known, values computed by a function. With ``deferred`` (a
`quantsim.graph.deferred.DeferredWeights`) the context keeps those of at least
``DEFERRED_MIN_BYTES`` as placeholders, computed only when the model is written or materialized, one at a
time (`add_initializer`); smaller ones, and all without ``deferred``, are computed at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.core.numerics import Encoding, dequantize, fake_quantize, fp16_round_trip, quantize
from quantsim.export.integer.code_graphs import CodeGraphs
from quantsim.export.integer.float_types import as_float32, as_own_type
from quantsim.graph.deferred import DeferredArray, DeferredWeights
from quantsim.graph.index import GraphIndex

__all__ = ["Grid", "QTensor", "Unsupported", "LoweringContext", "MS_DOMAIN", "exact_grid"]

MS_DOMAIN = "com.microsoft"


class Unsupported(Exception):
    """A rule cannot lower this node to integer kernels (the message says why)."""


@dataclass(frozen=True)
class Grid:
    """A per-tensor uint8 grid: ``value = (code - zero_point) * scale`` with codes in ``[low, high]``
    (``[0, 255]`` for a full 8-bit grid, narrower for 2..7-bit and strict symmetric grids)."""

    scale: float  # a float32 value
    zero_point: int
    low: int = 0
    high: int = 255

    @classmethod
    def from_encoding(cls, enc: Encoding) -> Grid | None:
        """The uint8 grid of a per-tensor integer encoding of at most 8 bits, else None."""
        if enc is None or not enc.is_per_tensor or enc.bits > 8 or enc.block_size is not None:
            return None
        shift = 128 if enc.signed else 0
        return cls(float(np.float32(enc.scale)), int(enc.zero_point) + shift, enc.qmin + shift, enc.qmax + shift)

    @property
    def full(self) -> bool:
        """True when the grid fills the uint8 container (no clamp needed after a saturating kernel)."""
        return self.low <= 0 and self.high >= 255

    @property
    def negated(self) -> Grid:
        """The grid of the codes ``255 - q``: ``(s, 255 - z)``, codes ``[255 - high, 255 - low]``; exact, since
        ``s((255 - q) - (255 - z)) = -s(q - z)``."""
        return Grid(self.scale, 255 - self.zero_point, 255 - self.high, 255 - self.low)

    @property
    def encoding(self) -> Encoding:
        return Encoding(np.asarray(self.scale, np.float64), np.asarray(self.zero_point, np.int64), 8, False,
                        self.low, self.high)

    def quantize(self, x) -> np.ndarray:
        """Codes (int64) of float values, as QuantizeLinear (ties to even, saturating)."""
        return quantize(np.asarray(x, dtype=np.float32), self.encoding)

    def dequantize(self, codes) -> np.ndarray:
        return dequantize(np.asarray(codes), self.encoding)

    @property
    def min(self) -> float:
        return float(np.float32(self.scale) * np.float32(self.low - self.zero_point))

    @property
    def max(self) -> float:
        return float(np.float32(self.scale) * np.float32(self.high - self.zero_point))

    def on_grid(self, value: float) -> bool:
        """True when ``value`` is exactly a grid point or lies outside the grid's range."""
        value = float(np.float32(value))
        if value <= self.min or value >= self.max:
            return True
        return float(self.dequantize(self.quantize(value))) == value

    def holds(self, value: float) -> bool:
        """True when ``value`` is exactly one of the grid's values (unlike `on_grid`, nothing outside its range:
        what an unquantized tensor holds must be the codes' value itself, not its saturation)."""
        value = float(np.float32(value))
        return self.min <= value <= self.max and float(self.dequantize(self.quantize(value))) == value


def exact_grid(values: np.ndarray) -> Grid | None:
    """The coarsest power-of-two uint8 grid on which every float value of an unquantized constant is a code
    (a detector's anchor centres ``k + 0.5`` on step 0.5, its strides 8 / 16 / 32 on step 8), so an integer
    kernel reading it computes what the sim computes with the float constant; None when no such grid spans
    the values (range, including zero, over 255 steps; values that are not dyadic)."""
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating) or array.size == 0 or not np.all(np.isfinite(array)):
        return None
    v = array.astype(np.float64).reshape(-1)
    nonzero = v[v != 0]
    if nonzero.size == 0:
        return Grid(1.0, 0)
    mantissa, exponent = np.frexp(nonzero)  # v = m 2^e, |m| in [0.5, 1) = odd 2^(e - 53 + zeros)
    odd = np.abs(np.rint(np.ldexp(mantissa, 53)).astype(np.int64))
    zeros = np.log2((odd & -odd).astype(np.float64)).astype(np.int64)  # trailing zero bits of each
    shift = int(np.min(exponent - 53 + zeros))
    if not -126 <= shift <= 127:  # a float32 scale
        return None
    scale = float(np.ldexp(1.0, shift))
    low, high = min(0.0, float(v.min())) / scale, max(0.0, float(v.max())) / scale
    if high - low > 255:
        return None
    return Grid(scale, int(-low))


@dataclass(frozen=True)
class QTensor:
    """uint8 codes ``name`` in the new graph on ``grid``."""

    name: str
    grid: Grid


class LoweringContext:
    """Builder of the integer graph over ``sim.model`` (see the module docstring)."""

    def __init__(self, sim, index: GraphIndex, opset: int, deferred: DeferredWeights | None = None,
                 code_graphs: CodeGraphs | None = None, exact_grids: dict[str, Grid | None] | None = None):
        self.sim = sim
        self.code_graphs = CodeGraphs() if code_graphs is None else code_graphs  # 256-code evaluations
        # `exact_grid` of unquantized constants by name (shareable between contexts over the same sim and graph)
        self.exact_grids: dict[str, Grid | None] = {} if exact_grids is None else exact_grids
        self.index = index
        self.opset = opset
        self.deferred = deferred
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.ints: dict[str, QTensor] = {}
        self.floats: dict[str, str] = {}
        self.absorbed: set[str] = set()
        self.requant: dict[str, dict] = {}
        self.islands: list[tuple[str, str, str]] = []  # (node, op type, why) lowered to one float op
        self.domains: set[str] = set()
        self.memo: dict[tuple, str] = {}  # shared scalars and casts: key -> tensor name
        self._copied: set[str] = set()
        self._node_names: set[str] = set()
        self._sim_biases: dict[str, np.ndarray] | None = None  # `sim_constant`, computed on first use
        self.exact = True  # elementwise functions only as exact kernel chains or tables (`piecewise`); False: accept TOLERANCE

    def snapshot(self) -> tuple:
        return (len(self.nodes), len(self.initializers), dict(self.ints), dict(self.floats), set(self.absorbed),
                dict(self.requant), set(self.domains), dict(self.memo), set(self._copied), set(self._node_names))

    def restore(self, state: tuple) -> None:
        n_nodes, n_inits, ints, floats, absorbed, requant, domains, cache, copied, names = state
        del self.nodes[n_nodes:]
        del self.initializers[n_inits:]
        self.ints, self.floats, self.absorbed, self.requant = ints, floats, absorbed, requant
        self.domains, self.memo, self._copied, self._node_names = domains, cache, copied, names

    # quantizers of the sim ------------------------------------------------------------------------
    def quantizer(self, tensor: str):
        """The enabled quantizer of ``tensor`` (float16 ones included) with an encoding, else None (float value)."""
        q = self.sim.qc_quantize_op_dict.get(tensor)
        return q if q is not None and q.enabled and q.is_initialized() else None

    def grid_of(self, tensor: str) -> Grid | None:
        """The uint8 grid of ``tensor``'s enabled activation quantizer (None: none, or not 8-bit)."""
        q = self.quantizer(tensor)
        if q is None or q.spec.is_float:
            return None
        return Grid.from_encoding(q.encoding)

    def constant_grid(self, name: str) -> Grid:
        """The grid of constant ``name``: its quantizer's, or for a float constant the sim leaves unquantized
        (shape arithmetic folded into constants: anchors, strides) the `exact_grid` of its values; else
        Unsupported."""
        if self.quantizer(name) is not None:
            grid = self.grid_of(name)
            if grid is None:
                raise Unsupported(self.why_not_8bit(name))
            return grid
        if name not in self.exact_grids:  # kept through rollbacks and passes: a scan of a big constant's values
            self.exact_grids[name] = exact_grid(self.index.constant_value(name))
        grid = self.exact_grids[name]
        if grid is None:
            raise Unsupported(f"constant {name!r} has no quantizer and no 8-bit grid holds its values exactly")
        return grid

    def has_quantizer(self, tensor: str) -> bool:
        return self.quantizer(tensor) is not None

    def why_not_8bit(self, tensor: str) -> str:
        q = self.quantizer(tensor)
        if q is None:
            return f"{tensor!r} has no enabled quantizer (float value)"
        if q.spec.is_float:
            return f"{tensor!r} is simulated in {q.spec.dtype}"
        enc = q.encoding
        if not enc.is_per_tensor:
            return f"{tensor!r} is quantized per channel"
        return f"{tensor!r} is on a {enc.bits}-bit grid [{enc.qmin}, {enc.qmax}] (integer kernels take at most 8 bits)"

    def constant(self, name: str) -> np.ndarray:
        """The value the sim computes with for a constant: fake-quantized / fp16-rounded if quantized."""
        values = self.index.constant_value(name)
        q = self.quantizer(name)
        if q is None or not np.issubdtype(values.dtype, np.floating):
            return values
        if q.spec.is_float:
            return fp16_round_trip(values).astype(values.dtype)
        return fake_quantize(values, q.encoding).astype(values.dtype)

    def sim_constant(self, name: str) -> np.ndarray:
        """`constant`, except for a bias the sim adds on the int32 accumulator grid (``sim.int32_bias``,
        `quantsim.sim.int32_bias`): its value there, so that a float island computes what the sim does."""
        if self._sim_biases is None:
            self._sim_biases = {}
            if getattr(self.sim, "int32_bias", False):
                from quantsim.sim.int32_bias import sim_bias_values

                self._sim_biases = sim_bias_values(self.index.model.graph, list(self.sim.quantizers),
                                                   self.index.constant_value, self.index.is_constant)
        return self._sim_biases[name] if name in self._sim_biases else self.constant(name)

    def param_encoding(self, name: str) -> Encoding:
        """Encoding of a weight usable by 8-bit kernels (int grid of at most 8 bits), else Unsupported."""
        if not self.index.is_constant(name):
            raise Unsupported(f"weight {name!r} is not a constant")
        q = self.quantizer(name)
        if q is None:
            raise Unsupported(f"weight {name!r} is not quantized (float weights)")
        if q.spec.is_float:
            raise Unsupported(f"weight {name!r} is simulated in {q.spec.dtype}")
        enc = q.encoding
        if enc.bits > 8 or enc.block_size is not None:
            raise Unsupported(f"weight {name!r} is on a {enc.bits}-bit {q.spec.granularity.describe()} grid")
        return enc

    # names and constants ----------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        return self.index.fresh_name(base)

    def add_initializer(self, array: np.ndarray | DeferredArray, base: str) -> str:
        """A new initializer named after ``base`` holding ``array`` (a `DeferredArray` stays a placeholder
        where the module docstring says so); returns its name."""
        name = self.fresh(base)
        self.initializers.append(self._tensor(array, name))
        return name

    def _tensor(self, array: np.ndarray | DeferredArray, name: str) -> TensorProto:
        if isinstance(array, DeferredArray):
            elem_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            if self.deferred is not None and self.deferred.accepts(elem_type, array.shape):
                return self.deferred.add(name, elem_type, array.shape, array.array)
            array = array.array()
        return numpy_helper.from_array(np.asarray(array), name)

    def lazy_constant(self, name: str, dtype, compute) -> DeferredArray:
        """``compute()`` (values of ``dtype`` in the shape of constant ``name``) as a `DeferredArray`."""
        return DeferredArray(tuple(self.index.initializers[name].dims), np.dtype(dtype), compute)

    def scalar(self, value, dtype, base: str = "const") -> str:
        """A scalar initializer, shared between identical values."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.memo:
            self.memo[key] = self.add_initializer(array, base)
        return self.memo[key]

    def grid_inputs(self, grid: Grid, base: str) -> tuple[str, str]:
        """``(scale, zero_point)`` initializer names of a grid (float32 scalar, uint8 scalar)."""
        return (self.scalar(grid.scale, np.float32, f"{base}/scale"),
                self.scalar(grid.zero_point, np.uint8, f"zero_point/uint8/{grid.zero_point}"))

    def node_name(self, base: str) -> str:
        """A node name unused in the new graph (the original node's name when it is free)."""
        name, counter = base, 1
        while name in self._node_names:
            name, counter = f"{base}_{counter}", counter + 1
        self._node_names.add(name)
        return name

    def emit(self, op_type: str, inputs, outputs, *, name: str | None = None, domain: str = "",
             attributes_of: onnx.NodeProto | None = None, **attrs):
        """Append a node; ``attributes_of`` copies another node's attributes (then ``attrs`` on top)."""
        node = helper.make_node(op_type, list(inputs), list(outputs), name=self.node_name(name or op_type),
                                domain=domain or None)
        if attributes_of is not None:
            node.attribute.extend(a for a in attributes_of.attribute if a.name not in attrs)
        node.attribute.extend(helper.make_attribute(key, value) for key, value in sorted(attrs.items()))
        if domain:
            self.domains.add(domain)
        self.nodes.append(node)
        return node

    # tensor forms -------------------------------------------------------------------------------------
    def set_int(self, tensor: str, name: str, grid: Grid) -> QTensor:
        self.ints[tensor] = QTensor(name, grid)
        return self.ints[tensor]

    def int_input(self, tensor: str) -> QTensor:
        """uint8 codes of ``tensor`` (quantizing a float sim value or a constant exactly), else Unsupported."""
        if tensor in self.ints:
            return self.ints[tensor]
        grid = self.constant_grid(tensor) if self.index.is_constant(tensor) else self.grid_of(tensor)
        if grid is None:
            raise Unsupported(self.why_not_8bit(tensor))
        if self.index.is_constant(tensor):
            values = self.lazy_constant(tensor, np.uint8, lambda: grid.quantize(self.index.constant_value(tensor)))
            return self.set_int(tensor, self.add_initializer(values, f"{tensor}/codes"), grid)
        source = self.floats.get(tensor)
        if source is None:
            raise Unsupported(f"{tensor!r} is not available")
        source = as_float32(self, source, tensor)  # a float16 value: QuantizeLinear takes float32, as in the sim
        if not grid.full:  # saturate to the narrow grid in float: clip(x, min, max) quantizes to [low, high]
            source = self.float_clip(source, grid.min, grid.max, tensor)
        scale, zp = self.grid_inputs(grid, tensor)
        codes = self.fresh(f"{tensor}/codes")
        self.emit("QuantizeLinear", [source, scale, zp], [codes], name=f"{tensor}/quantize")
        return self.set_int(tensor, codes, grid)

    def float_clip(self, source: str, low: float, high: float, base: str) -> str:
        """``Clip(source, low, high)`` in float32 (a narrow grid's saturation ahead of its QuantizeLinear)."""
        clipped = self.fresh(f"{base}/clipped")
        self.emit("Clip", [source, self.scalar(low, np.float32, "clip/low"), self.scalar(high, np.float32, "clip/high")],
                  [clipped], name=f"{base}/clip")
        return clipped

    def arithmetic_dequantize(self, codes: str, scale: float, zero_point: int, base: str) -> str:
        """``(float(codes) - zero_point) * scale`` as Cast -> Sub -> Mul (bit-identical to DequantizeLinear).

        Float islands read their inputs this way rather than through DequantizeLinear, so onnxruntime's
        Q/DQ optimizers (which would fuse ``DQ -> Conv`` with float weights into an int8 per-tensor
        QLinearConv, or quantize a float bias) leave the island exactly as the sim computes it.
        """
        value = self.fresh(f"{base}/as_float")
        self.emit("Cast", [codes], [value], name=f"{base}/cast", to=TensorProto.FLOAT)
        if zero_point:
            centered = self.fresh(f"{base}/centered")
            self.emit("Sub", [value, self.scalar(float(zero_point), np.float32, "dequantize/zero_point")], [centered],
                      name=f"{base}/center")
            value = centered
        out = self.fresh(f"{base}/dequantized")
        self.emit("Mul", [value, self.scalar(np.float32(scale), np.float32, "dequantize/scale")], [out],
                  name=f"{base}/scale")
        return out

    def dequantize_output(self, tensor: str) -> str:
        """A DequantizeLinear of ``tensor``'s codes (for graph outputs), in the output's own type."""
        codes = self.ints[tensor]
        scale, zp = self.grid_inputs(codes.grid, tensor)
        name = self.fresh(f"{tensor}/dequantized")
        self.emit("DequantizeLinear", [codes.name, scale, zp], [name], name=f"{tensor}/dequantize")
        return as_own_type(self, name, tensor)

    def float_input(self, tensor: str) -> str:
        """A float (or non-float, unchanged) tensor of the new graph holding ``tensor``'s sim value."""
        if not tensor:
            return ""
        if tensor in self.floats:
            return self.floats[tensor]
        if tensor in self.ints:  # in the tensor's own type (`float_types`)
            codes = self.ints[tensor]
            value = self.arithmetic_dequantize(codes.name, codes.grid.scale, codes.grid.zero_point, tensor)
            self.floats[tensor] = as_own_type(self, value, tensor)
            return self.floats[tensor]
        if self.index.is_constant(tensor):
            if tensor not in self._copied:
                self._copied.add(tensor)
                stored = self.index.initializers[tensor]
                if self.deferred is not None and self.deferred.accepts(stored.data_type, tuple(stored.dims)):
                    self.initializers.append(self.deferred.add(tensor, stored.data_type, tuple(stored.dims),
                                                               lambda: self.sim_constant(tensor)))
                else:
                    self.initializers.append(numpy_helper.from_array(self.sim_constant(tensor), tensor))
            return tensor
        if not self.index.is_float(tensor):
            return tensor  # shape / index arithmetic keeps its name
        raise Unsupported(f"{tensor!r} is not available")

    def any_input(self, tensor: str) -> str:
        """Codes if available, else the float value (for ops that only read shapes)."""
        return self.ints[tensor].name if tensor in self.ints else self.float_input(tensor)

    # output side ------------------------------------------------------------------------------------
    def output_grid(self, tensor: str, inherited: Grid | None = None) -> Grid:
        """The grid an integer op must write ``tensor`` on: its quantizer's, or ``inherited`` when it has none."""
        grid = self.grid_of(tensor)
        if grid is not None:
            return grid
        if self.has_quantizer(tensor) or inherited is None:
            raise Unsupported(self.why_not_8bit(tensor))
        return inherited

    def record(self, node: onnx.NodeProto, entry: dict) -> None:
        self.requant[node.name] = entry
