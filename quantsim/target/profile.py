"""Target profiles: what the hardware (or runtime) that will run an export can execute.

A `TargetProfile` is data (a JSON file, schema ``docs/schemas/target.schema.json``, documented in
``docs/target-profiles.md``): which quantized types the target's Q/DQ can carry for activations and
parameters, which (activation, parameter) kernels each op type has, whether an op without a matching kernel
may run in float between DequantizeLinear and QuantizeLinear (``float_fallback``), whether graph inputs
and outputs must be quantized, whether grids must be symmetric, which weight granularities it takes, and
the accumulator width. Profiles ship in ``quantsim/target/profiles`` (`SHIPPED_TARGETS`); `load_target`
reads one by name, a profile file, or an AIMET quantsim-config whose ``supported_kernels`` make a partial
target (`from_quantsim_config`).

Kernel tables are keyed by op type, by a named op group (``"@weighted"``, ``"@integer_export"``, ...;
`quantsim.target.groups`, which reads the library's own op tables) or by ``"*"`` (any op). An op type's
kernels are those of its exact entry, else of the first group in the file that contains it, else ``"*"``.
A kernel is AIMET's ``{"activation": {"bitwidth", "dtype"}, "param": {...}}``; without ``param`` it takes
any parameter (or none). With ``narrow_grids_in_wider_kernels`` an n-bit integer grid runs on a kernel of
its native container's width (codes of a 4-bit grid are 8-bit codes, of a 12-bit grid 16-bit codes).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from quantsim.core.dtypes import float8e4m3fn, float16, float32, qtype
from quantsim.errors import TargetError

__all__ = ["Kernel", "TargetProfile", "load_target", "from_quantsim_config", "SHIPPED_TARGETS", "PROFILE_DIR",
           "TARGET_FORMAT", "GRANULARITIES"]

TARGET_FORMAT = "quantsim.target/1"
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
GRANULARITIES = ("per_tensor", "per_channel", "per_block")
SHIPPED_TARGETS = tuple(sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
"""Names `load_target` accepts without a path (the files in `PROFILE_DIR`)."""

_KEYS = {"$schema", "format", "name", "description", "float_fallback", "quantized_inputs", "quantized_outputs",
         "accumulator_bits", "activation_types", "param_types", "symmetric_activations", "symmetric_weights",
         "weight_granularities", "narrow_grids_in_wider_kernels", "kernels"}
_REQUIRED = {"format", "name", "float_fallback", "activation_types", "param_types", "kernels"}


@dataclass(frozen=True)
class Kernel:
    """One kernel form: its activation type and its parameter type (None: any parameter, or none)."""

    activation: qtype
    param: qtype | None = None

    def describe(self) -> str:
        return f"A {self.activation}" + (f" / W {self.param}" if self.param is not None else "")


def _same_family(grid: qtype, kernel: qtype, widen: bool) -> bool:
    if grid == kernel:
        return True
    # a narrow grid rides in its native container (2..8 bits in 8-bit codes, 9..16 in 16-bit), never wider
    return widen and grid.kind == "int" and kernel.kind == "int" and max(grid.storage_bits(), 8) == kernel.bits


@dataclass(frozen=True)
class TargetProfile:
    """What a target runs (module docstring). Build one with `load_target`; read it with `allows`,
    `has_kernel`, `kernels_for`, `activation_type_allowed` and `param_type_allowed`."""

    name: str
    description: str
    float_fallback: bool
    quantized_inputs: bool
    quantized_outputs: bool
    accumulator_bits: int
    activation_types: tuple[qtype, ...]
    param_types: tuple[qtype, ...]
    symmetric_activations: bool
    symmetric_weights: bool
    weight_granularities: frozenset[str]
    narrow_grids_in_wider_kernels: bool
    kernels: Mapping[str, tuple[Kernel, ...]] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""
    partial: bool = False

    def __str__(self) -> str:
        return self.name

    def __reduce__(self):
        """Pickling (sims with a target are pickled and deep-copied): the read-only kernel table travels as a dict."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["kernels"] = dict(self.kernels)
        return _rebuild_profile, (state,)

    # types ---------------------------------------------------------------------------------------
    def _type_in(self, dtype: qtype, types: tuple[qtype, ...]) -> bool:
        if dtype == float32:
            return self.float_fallback or float32 in types
        return any(_same_family(dtype, t, self.narrow_grids_in_wider_kernels) for t in types)

    def activation_type_allowed(self, dtype: qtype | str) -> bool:
        """Whether the target carries activations of ``dtype`` (float32: whether ops may stay in float)."""
        return self._type_in(qtype.as_qtype(dtype), self.activation_types)

    def param_type_allowed(self, dtype: qtype | str) -> bool:
        """Whether the target takes parameters (weights) of ``dtype``."""
        return self._type_in(qtype.as_qtype(dtype), self.param_types)

    # kernels -------------------------------------------------------------------------------------
    def kernels_for(self, op_type: str) -> tuple[Kernel, ...]:
        """The kernel forms of ``op_type``: its own entry, else the first group containing it, else ``"*"``."""
        from quantsim.target.groups import group_members

        if op_type in self.kernels:
            return self.kernels[op_type]
        for key, kernels in self.kernels.items():
            if key.startswith("@") and op_type in group_members(key):
                return kernels
        return self.kernels.get("*", ())

    def has_kernel(self, op_type: str, param_type: qtype | str | None, activation_type: qtype | str) -> bool:
        """Whether ``op_type`` has a kernel (integer, float16, ...) for these types on the target: no float
        fallback counted. ``param_type`` None for an op without parameters."""
        act = qtype.as_qtype(activation_type)
        param = None if param_type is None else qtype.as_qtype(param_type)
        widen = self.narrow_grids_in_wider_kernels
        for kernel in self.kernels_for(op_type):
            if not _same_family(act, kernel.activation, widen):
                continue
            if param is None or kernel.param is None or _same_family(param, kernel.param, widen):
                return True
        return False

    def allows(self, op_type: str, param_type: qtype | str | None, activation_type: qtype | str) -> bool:
        """Whether an ``op_type`` node whose inputs are ``activation_type`` (and weights ``param_type``; None
        for none, float32 for unquantized) is legal on the target: a kernel takes it, or the target carries
        both types and may run the op in float between DequantizeLinear and QuantizeLinear. This is the
        question AMP asks of each candidate per layer."""
        act = qtype.as_qtype(activation_type)
        param = None if param_type is None else qtype.as_qtype(param_type)
        if not self.activation_type_allowed(act) or (param is not None and not self.param_type_allowed(param)):
            return False
        return self.has_kernel(op_type, param, act) or self.float_fallback

    def granularity_allowed(self, granularity: str) -> bool:
        return granularity in self.weight_granularities

    def to_dict(self) -> dict[str, Any]:
        """The profile as the JSON document `load_target` reads."""
        def side(t: qtype) -> dict:
            return {"bitwidth": t.bits, "dtype": "float" if t.is_float else "int"}

        return {"format": TARGET_FORMAT, "name": self.name, "description": self.description,
                "float_fallback": self.float_fallback, "quantized_inputs": self.quantized_inputs,
                "quantized_outputs": self.quantized_outputs, "accumulator_bits": self.accumulator_bits,
                "activation_types": [repr(t) for t in self.activation_types],
                "param_types": [repr(t) for t in self.param_types],
                "symmetric_activations": self.symmetric_activations, "symmetric_weights": self.symmetric_weights,
                "weight_granularities": sorted(self.weight_granularities),
                "narrow_grids_in_wider_kernels": self.narrow_grids_in_wider_kernels,
                "kernels": {k: [{"activation": side(x.activation), **({"param": side(x.param)} if x.param else {})}
                                for x in v] for k, v in self.kernels.items()}}


def _rebuild_profile(state: dict) -> TargetProfile:
    return TargetProfile(**{**state, "kernels": MappingProxyType(state["kernels"])})


# parsing -------------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, problem: str) -> TargetError:
        return TargetError(f"target {self.source}: {path}: {problem}")

    def flag(self, doc: Mapping, key: str, default: bool) -> bool:
        value = doc.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def type_name(self, value: Any, path: str) -> qtype:
        if not isinstance(value, str):
            raise self.fail(path, f"expected a type name such as 'int8', got {value!r}")
        if value.startswith("int") and value[3:].isdigit():
            bits = int(value[3:])
            if not 2 <= bits <= 16:
                raise self.fail(path, f"integer types have 2..16 bits, got {value!r}")
            return qtype.int(bits)
        try:
            return qtype.from_string(value)
        except Exception:  # noqa: BLE001 - re-raised with the JSON path
            raise self.fail(path, f"unknown type {value!r} (int2..int16, float16, float32, float8e4m3fn, "
                                  "float8e5m2)") from None

    def types(self, doc: Mapping, key: str) -> tuple[qtype, ...]:
        value = doc.get(key)
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"expected a non-empty list of type names, got {value!r}")
        return tuple(self.type_name(v, f"{key}[{i}]") for i, v in enumerate(value))

    def side(self, value: Any, path: str) -> qtype:
        if not isinstance(value, Mapping) or set(value) != {"bitwidth", "dtype"}:
            raise self.fail(path, f"expected {{'bitwidth': n, 'dtype': 'int' | 'float'}}, got {value!r}")
        bits, dtype = value["bitwidth"], value["dtype"]
        if isinstance(bits, bool) or not isinstance(bits, int):
            raise self.fail(f"{path}.bitwidth", f"expected an integer, got {bits!r}")
        if dtype == "int":
            if not 2 <= bits <= 16:
                raise self.fail(f"{path}.bitwidth", f"integer kernels have 2..16 bits, got {bits}")
            return qtype.int(bits)
        if dtype == "float":
            floats = {8: float8e4m3fn, 16: float16, 32: float32}
            if bits not in floats:
                raise self.fail(f"{path}.bitwidth", f"float kernels have 8, 16 or 32 bits, got {bits}")
            return floats[bits]
        raise self.fail(f"{path}.dtype", f"expected 'int' or 'float', got {dtype!r}")

    def kernel_list(self, value: Any, path: str) -> tuple[Kernel, ...]:
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list of kernels, got {value!r}")
        out = []
        for i, item in enumerate(value):
            where = f"{path}[{i}]"
            if not isinstance(item, Mapping) or "activation" not in item or set(item) - {"activation", "param"}:
                raise self.fail(where, f"expected {{'activation': ..., 'param': ...}} (param optional), got {item!r}")
            param = self.side(item["param"], f"{where}.param") if "param" in item else None
            out.append(Kernel(self.side(item["activation"], f"{where}.activation"), param))
        return tuple(out)

    def kernels(self, value: Any) -> Mapping[str, tuple[Kernel, ...]]:
        from quantsim.target.groups import GROUPS

        if not isinstance(value, Mapping):
            raise self.fail("kernels", f"expected an object keyed by op type, '@group' or '*', got {value!r}")
        out = {}
        for key, kernels in value.items():
            if key.startswith("@") and key not in GROUPS:
                raise self.fail(f"kernels.{key}", f"unknown op group; known groups: {', '.join(sorted(GROUPS))}")
            out[key] = self.kernel_list(kernels, f"kernels.{key}")
        return MappingProxyType(out)

    def profile(self, doc: Any) -> TargetProfile:
        if not isinstance(doc, Mapping):
            raise self.fail("<top>", "expected a JSON object")
        unknown = sorted(set(doc) - _KEYS)
        if unknown:
            raise self.fail(unknown[0], f"unknown key; expected {', '.join(sorted(_KEYS - {'$schema'}))}")
        missing = sorted(_REQUIRED - set(doc))
        if missing:
            raise self.fail(missing[0], "required key missing")
        if doc["format"] != TARGET_FORMAT:
            raise self.fail("format", f"expected {TARGET_FORMAT!r}, got {doc['format']!r}")
        if not isinstance(doc["name"], str) or not doc["name"]:
            raise self.fail("name", "expected a non-empty string")
        bits = doc.get("accumulator_bits", 32)
        if isinstance(bits, bool) or not isinstance(bits, int) or not 16 <= bits <= 64:
            raise self.fail("accumulator_bits", f"expected an integer in 16..64, got {bits!r}")
        granularities = doc.get("weight_granularities", list(GRANULARITIES))
        if not isinstance(granularities, list) or not set(granularities) <= set(GRANULARITIES) or not granularities:
            raise self.fail("weight_granularities", f"expected a non-empty list of {GRANULARITIES}, got {granularities!r}")
        return TargetProfile(
            name=doc["name"], description=str(doc.get("description", "")),
            float_fallback=self.flag(doc, "float_fallback", False),
            quantized_inputs=self.flag(doc, "quantized_inputs", False),
            quantized_outputs=self.flag(doc, "quantized_outputs", False), accumulator_bits=bits,
            activation_types=self.types(doc, "activation_types"), param_types=self.types(doc, "param_types"),
            symmetric_activations=self.flag(doc, "symmetric_activations", False),
            symmetric_weights=self.flag(doc, "symmetric_weights", False),
            weight_granularities=frozenset(granularities),
            narrow_grids_in_wider_kernels=self.flag(doc, "narrow_grids_in_wider_kernels", False),
            kernels=self.kernels(doc["kernels"]), source=self.source)


def _read_json(path: Path, label: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise TargetError(f"target {label}: cannot read {path} ({error.strerror or error})") from None
    except ValueError as error:
        raise TargetError(f"target {label}: {path} is not valid JSON ({error})") from None


def from_quantsim_config(config, source: str = "<config>") -> TargetProfile:
    """A partial target from an AIMET quantsim-config's ``supported_kernels`` (``defaults`` for every op,
    ``op_type.<Op>`` for that op): the types any kernel names are the types the target carries; what a
    config cannot say is taken strictly (no float fallback, grids of any symmetry and granularity, I/O
    not required quantized, 32-bit accumulators). ``config`` is a `QuantsimConfig` or what `load_config` takes."""
    from quantsim.errors import ConfigError
    from quantsim.sim.config import QuantsimConfig, load_config

    if not isinstance(config, QuantsimConfig):
        try:
            config = load_config(config)
        except ConfigError as error:
            raise TargetError(f"target {source}: not a target profile and not a usable quantsim config ({error})") from None
    reader = _Reader(source)
    kernels: dict[str, tuple[Kernel, ...]] = {}
    if config.supported_kernels:
        kernels["*"] = reader.kernel_list([dict(k) for k in config.supported_kernels], "defaults.supported_kernels")
    for op_type, rule in config.op_types.items():
        if rule.supported_kernels:
            kernels[op_type] = reader.kernel_list([dict(k) for k in rule.supported_kernels],
                                                  f"op_type.{op_type}.supported_kernels")
    if not kernels:
        raise TargetError(f"target {source}: the quantsim config has no supported_kernels, so it says nothing about "
                          "a target; pass a target profile (quantsim.target.SHIPPED_TARGETS) instead")
    every = [k for ks in kernels.values() for k in ks]
    activations = tuple(dict.fromkeys(k.activation for k in every))
    params = tuple(dict.fromkeys(k.param for k in every if k.param is not None)) or activations
    return TargetProfile(
        name=Path(source).stem if source.endswith(".json") else source,
        description=f"partial target from the supported_kernels of quantsim config {config.source}",
        float_fallback=False, quantized_inputs=False, quantized_outputs=False, accumulator_bits=32,
        activation_types=activations, param_types=params, symmetric_activations=False, symmetric_weights=False,
        weight_granularities=frozenset(GRANULARITIES), narrow_grids_in_wider_kernels=False,
        kernels=MappingProxyType(kernels), source=source, partial=True)


def load_target(target: TargetProfile | str | os.PathLike | Mapping) -> TargetProfile:
    """A `TargetProfile` from a shipped name (`SHIPPED_TARGETS`: ``"onnxruntime-cpu"``, ``"generic-npu"``,
    ``"gpu-qdq"``), a profile JSON file, a decoded profile mapping, or an AIMET quantsim-config file (or
    mapping) with ``supported_kernels`` (a partial target, `from_quantsim_config`). Raises `TargetError`
    naming the file and JSON path of anything it cannot use."""
    if isinstance(target, TargetProfile):
        return target
    if isinstance(target, Mapping):
        if "defaults" in target and "format" not in target:
            return from_quantsim_config(target, "<mapping>")
        return _Reader("<mapping>").profile(target)
    if not isinstance(target, (str, os.PathLike)):
        raise TargetError(f"target must be a TargetProfile, a shipped name, a file path or a mapping, got "
                          f"{type(target).__name__}")
    name = os.fspath(target)
    name = os.fsdecode(name) if isinstance(name, bytes) else name
    if isinstance(target, str) and name in SHIPPED_TARGETS:
        path = PROFILE_DIR / f"{name}.json"
        return _Reader(name).profile(_read_json(path, name))
    path = Path(name)
    if not path.exists():
        raise TargetError(f"target {name!r}: neither a shipped target ({', '.join(SHIPPED_TARGETS)}) nor an existing file")
    doc = _read_json(path, name)
    if isinstance(doc, Mapping) and "defaults" in doc and "format" not in doc:
        return from_quantsim_config(str(path), name)
    return _Reader(name).profile(doc)
