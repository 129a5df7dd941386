"""AIMET quantsim-config JSON -> typed, frozen quantization rules.

AIMET describes where quantizers go with a JSON file whose booleans are the *strings* ``"True"`` and
``"False"``.  This module is the only place that knows about that: `load_config` validates a file (or an
alias, or an already-decoded mapping) against AIMET's schema and returns a `QuantsimConfig` made of plain
Python booleans, tuples and read-only mappings.  Nothing here touches a model; `placement` applies the
rules in AIMET's order (defaults -> params -> op_type -> supergroups -> model_input -> model_output ->
per-channel -> supergroup passes).

Validation is strict: unknown keys at any level, wrong types, values AIMET refuses at load time
(``defaults.ops.is_input_quantized``, ``defaults.ops.is_output_quantized: "False"``, a ``"False"`` in the
``is_input_quantized`` / ``is_output_quantized`` slots that only accept ``"True"``) and duplicate JSON keys
all raise `ConfigError`, whose message names the source and the JSON path of the offending key.  The one
leniency: real JSON ``true``/``false`` are accepted wherever a string boolean is.

Settings that are absent resolve to ``False`` (AIMET starts with every quantizer disabled and only
enables what the config asks for), except ``None`` fields of `QuantFlags`/`OpTypeRule`, which mean "not
specified at this level" and fall through to the next level.
"""
from __future__ import annotations

import copyreg
import difflib
import functools
import io
import json
import math
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import onnx

from quantsim.errors import ConfigError, warn_at_caller
from quantsim.graph.op_facts import OP_FACTS

__all__ = [
    "warn_unapplied_config",
    "QuantFlags",
    "OpTypeRule",
    "QuantsimConfig",
    "load_config",
    "CONFIG_ALIASES",
    "CONFIG_DIR",
    "KNOWN_SUPERGROUP_PASSES",
]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"

#: Shipped configs by alias.  ``None`` and ``"default"`` mean the per-channel file, as in AIMET.
CONFIG_ALIASES: dict[str, str] = {
    "default": "default_config_per_channel.json",
    "per_channel": "default_config_per_channel.json",
    "per_tensor": "default_config.json",
}

#: Graph passes AIMET registers for ``supergroup_pass_list``.
KNOWN_SUPERGROUP_PASSES = frozenset({"MatmulAdd", "LayerNormalization", "RMSNormalization", "MaskedSoftmax"})

_BITWIDTHS = (4, 8, 16, 32)
_DTYPES = ("int", "float")
_EMPTY: Mapping[str, Any] = MappingProxyType({})



@dataclass(frozen=True)
class QuantFlags:
    """Quantize/symmetric switches for a param type (or an op's output); ``None`` = not set at this level."""

    is_quantized: bool | None = None
    is_symmetric: bool | None = None


@dataclass(frozen=True)
class OpTypeRule:
    """Everything ``op_type.<OpType>`` may say; ``None`` fields defer to the defaults.

    ``supported_kernels`` is validated and kept for completeness (AIMET only enforces it behind a module
    flag that is off by default).
    """

    is_input_quantized: bool | None = None
    is_output_quantized: bool | None = None
    is_symmetric: bool | None = None
    params: Mapping[str, QuantFlags] = field(default_factory=lambda: _EMPTY)
    per_channel_quantization: bool | None = None
    encoding_constraints: tuple[float, float | None] | None = None
    supported_kernels: tuple[Mapping[str, Any], ...] = ()


_EMPTY_RULE = OpTypeRule()


@dataclass(frozen=True)
class QuantsimConfig:
    """A validated quantsim config.  Mappings are read-only; booleans are real booleans."""

    output_quantized: bool
    activation_symmetric: bool
    param_quantized: bool
    param_symmetric: bool
    strict_symmetric: bool
    unsigned_symmetric: bool
    per_channel_quantization: bool
    hw_version: str | None
    supported_kernels: tuple[Mapping[str, Any], ...]
    params: Mapping[str, QuantFlags]
    op_types: Mapping[str, OpTypeRule]
    supergroups: tuple[tuple[str, ...], ...]
    supergroup_pass_list: tuple[str, ...]
    model_input_quantized: bool
    model_output_quantized: bool
    source: str

    def __reduce__(self):
        """Pickle support: the read-only mappings travel as dicts and come back read-only."""
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: _reduce_read_only}
        pickler.dump({f.name: getattr(self, f.name) for f in fields(self)})
        return _config_from_pickle, (buffer.getvalue(),)

    def op_rule(self, op_type: str) -> OpTypeRule:
        """The ``op_type`` entry for `op_type`, or an all-``None`` rule when the config does not list it."""
        return self.op_types.get(op_type, _EMPTY_RULE)

    def per_channel_for(self, op_type: str) -> bool:
        """Per-channel flag for the params of `op_type`: the op-type value, else the default."""
        value = self.op_rule(op_type).per_channel_quantization
        return self.per_channel_quantization if value is None else value

    def param_flags(self, op_type: str, param_type: str) -> QuantFlags:
        """Fully resolved flags for one param: ``op_type`` params > top-level ``params`` > ``defaults.params``."""
        levels = (
            self.op_rule(op_type).params.get(param_type, QuantFlags()),
            self.params.get(param_type, QuantFlags()),
            QuantFlags(self.param_quantized, self.param_symmetric),
        )
        quantized = next(lv.is_quantized for lv in levels if lv.is_quantized is not None)
        symmetric = next(lv.is_symmetric for lv in levels if lv.is_symmetric is not None)
        return QuantFlags(is_quantized=quantized, is_symmetric=symmetric)

    def to_quantizer_args_flags(self) -> dict:
        """The config-derived part of AIMET's legacy ``quant_args`` block."""
        per_channel = self.per_channel_quantization or any(
            rule.per_channel_quantization for rule in self.op_types.values()
        )
        return {"is_symmetric": self.param_symmetric, "per_channel_quantization": bool(per_channel)}


# ----------------------------------------------------------------------------------------------- parsing
def _read_only(values: dict) -> Mapping[str, Any]:
    return MappingProxyType(values)


def _reduce_read_only(mapping: Mapping[str, Any]) -> tuple:
    return _read_only, (dict(mapping),)


def _config_from_pickle(data: bytes) -> QuantsimConfig:
    return QuantsimConfig(**pickle.loads(data))  # noqa: S301 - our own bytes, from QuantsimConfig.__reduce__


class _Parser:
    """Validates one decoded config; every error carries ``source`` and the JSON path."""

    def __init__(self, source: str, label: str | None = None):
        self.source = source
        self.label = label or source

    def fail(self, path: str, message: str) -> ConfigError:
        where = f"{path}: " if path else ""
        return ConfigError(f"{self.label}: {where}{message}")

    @staticmethod
    def join(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def obj(self, value: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> Mapping:
        """Check `value` is a JSON object with only `allowed` keys and all `required` ones."""
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected an object, got {type(value).__name__}")
        for key in value:
            if key not in allowed:
                raise self.fail(self.join(path, str(key)), f"unknown key (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                raise self.fail(self.join(path, key), "required key is missing")
        return value

    def array(self, value: Any, path: str) -> list:
        if not isinstance(value, (list, tuple)):
            raise self.fail(path, f"expected an array, got {type(value).__name__}")
        return list(value)

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"expected a non-empty string, got {value!r}")
        return value

    def boolean(self, value: Any, path: str, only_true: bool = False) -> bool:
        """``"True"``/``"False"`` (or JSON true/false) -> bool; `only_true` rejects False like AIMET does."""
        if isinstance(value, bool):
            result = value
        elif value == "True" or value == "False":
            result = value == "True"
        else:
            raise self.fail(path, f"expected 'True' or 'False', got {value!r}")
        if only_true and not result:
            raise self.fail(path, "only 'True' is supported here (AIMET raises NotImplementedError)")
        return result

    def opt_bool(self, obj: Mapping, key: str, path: str, only_true: bool = False) -> bool | None:
        return self.boolean(obj[key], self.join(path, key), only_true) if key in obj else None

    def number(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(path, f"expected a finite number, got {value!r}")
        return float(value)

    # -------------------------------------------------------------------------------- sections
    def flags(self, value: Any, path: str) -> QuantFlags:
        obj = self.obj(value, path, ("is_quantized", "is_symmetric"))
        return QuantFlags(self.opt_bool(obj, "is_quantized", path), self.opt_bool(obj, "is_symmetric", path))

    def flags_map(self, value: Any, path: str) -> Mapping[str, QuantFlags]:
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected an object, got {type(value).__name__}")
        return MappingProxyType({self.string(k, self.join(path, str(k))): self.flags(v, self.join(path, k))
                                 for k, v in value.items()})

    def kernel_side(self, value: Any, path: str) -> Mapping[str, Any]:
        obj = self.obj(value, path, ("bitwidth", "dtype"), required=("bitwidth", "dtype"))
        bitwidth, dtype = obj["bitwidth"], obj["dtype"]
        if isinstance(bitwidth, bool) or bitwidth not in _BITWIDTHS:
            raise self.fail(self.join(path, "bitwidth"), f"expected one of {_BITWIDTHS}, got {bitwidth!r}")
        if dtype not in _DTYPES:
            raise self.fail(self.join(path, "dtype"), f"expected 'int' or 'float', got {dtype!r}")
        return MappingProxyType({"bitwidth": int(bitwidth), "dtype": dtype})

    def kernels(self, value: Any, path: str, param_required: bool) -> tuple[Mapping[str, Any], ...]:
        out = []
        required = ("activation", "param") if param_required else ("activation",)
        for i, item in enumerate(self.array(value, path)):
            item_path = f"{path}[{i}]"
            obj = self.obj(item, item_path, ("activation", "param"), required)
            out.append(MappingProxyType({k: self.kernel_side(obj[k], self.join(item_path, k)) for k in obj}))
        return tuple(out)

    def constraints(self, value: Any, path: str) -> tuple[float, float | None]:
        obj = self.obj(value, path, ("min", "max"), required=("min",))
        lo = self.number(obj["min"], self.join(path, "min"))
        hi = self.number(obj["max"], self.join(path, "max")) if "max" in obj else None
        if hi is not None and hi < lo:
            raise self.fail(path, f"min ({lo}) is greater than max ({hi})")
        return lo, hi

    def defaults(self, value: Any, path: str = "defaults") -> dict:
        allowed = ("ops", "params", "strict_symmetric", "unsigned_symmetric", "per_channel_quantization",
                   "supported_kernels", "hw_version")
        obj = self.obj(value, path, allowed, required=("ops", "params"))
        ops_path = self.join(path, "ops")
        ops = self.obj(obj["ops"], ops_path, ("is_input_quantized", "is_output_quantized", "is_symmetric"))
        if "is_input_quantized" in ops:
            raise self.fail(self.join(ops_path, "is_input_quantized"),
                            "not supported in defaults (AIMET raises NotImplementedError)")
        params = self.flags(obj["params"], self.join(path, "params"))
        hw_version = obj.get("hw_version")
        if hw_version is not None and not isinstance(hw_version, str):
            raise self.fail(self.join(path, "hw_version"), f"expected a string, got {hw_version!r}")
        kernels = (self.kernels(obj["supported_kernels"], self.join(path, "supported_kernels"), True)
                   if "supported_kernels" in obj else ())
        return {
            "output_quantized": bool(self.opt_bool(ops, "is_output_quantized", ops_path, only_true=True)),
            "activation_symmetric": bool(self.opt_bool(ops, "is_symmetric", ops_path)),
            "param_quantized": bool(params.is_quantized),
            "param_symmetric": bool(params.is_symmetric),
            "strict_symmetric": bool(self.opt_bool(obj, "strict_symmetric", path)),
            "unsigned_symmetric": bool(self.opt_bool(obj, "unsigned_symmetric", path)),
            "per_channel_quantization": bool(self.opt_bool(obj, "per_channel_quantization", path)),
            "hw_version": hw_version,
            "supported_kernels": kernels,
        }

    def op_rule(self, value: Any, path: str) -> OpTypeRule:
        allowed = ("is_input_quantized", "is_output_quantized", "is_symmetric", "params", "supported_kernels",
                   "per_channel_quantization", "encoding_constraints")
        obj = self.obj(value, path, allowed)
        return OpTypeRule(
            is_input_quantized=self.opt_bool(obj, "is_input_quantized", path, only_true=True),
            is_output_quantized=self.opt_bool(obj, "is_output_quantized", path),
            is_symmetric=self.opt_bool(obj, "is_symmetric", path),
            params=self.flags_map(obj["params"], self.join(path, "params")) if "params" in obj else _EMPTY,
            per_channel_quantization=self.opt_bool(obj, "per_channel_quantization", path),
            encoding_constraints=(self.constraints(obj["encoding_constraints"],
                                                   self.join(path, "encoding_constraints"))
                                  if "encoding_constraints" in obj else None),
            supported_kernels=(self.kernels(obj["supported_kernels"], self.join(path, "supported_kernels"),
                                            False) if "supported_kernels" in obj else ()),
        )

    def supergroups(self, value: Any, path: str = "supergroups") -> tuple[tuple[str, ...], ...]:
        groups = []
        for i, item in enumerate(self.array(value, path)):
            item_path = f"{path}[{i}]"
            obj = self.obj(item, item_path, ("op_list",), required=("op_list",))
            list_path = self.join(item_path, "op_list")
            ops = self.array(obj["op_list"], list_path)
            if len(ops) < 2:
                raise self.fail(list_path, f"a supergroup needs at least 2 op types, got {len(ops)}")
            groups.append(tuple(self.op_type(op, f"{list_path}[{j}]") for j, op in enumerate(ops)))
        return tuple(groups)

    def op_type(self, value: Any, path: str) -> str:
        """An ONNX op type (any domain onnx defines, or one the op-facts table knows): a typo such as
        ``"Convv"`` would otherwise match no node and change nothing."""
        name = self.string(value, path)
        known = known_op_types()
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise self.fail(path, f"unknown op type {name!r} (not an ONNX op type){hint}")
        return name

    def pass_list(self, value: Any, path: str = "supergroup_pass_list") -> tuple[str, ...]:
        names = tuple(self.string(v, f"{path}[{i}]") for i, v in enumerate(self.array(value, path)))
        for i, name in enumerate(names):
            if name not in KNOWN_SUPERGROUP_PASSES:
                raise self.fail(f"{path}[{i}]", f"unknown supergroup pass {name!r} "
                                                f"(known: {', '.join(sorted(KNOWN_SUPERGROUP_PASSES))})")
        return names

    def config(self, value: Any) -> QuantsimConfig:
        required = ("defaults", "params", "op_type", "supergroups", "model_input", "model_output")
        top = self.obj(value, "", required + ("supergroup_pass_list",), required=required)
        if not isinstance(top["op_type"], Mapping):
            raise self.fail("op_type", f"expected an object, got {type(top['op_type']).__name__}")
        op_types = {self.op_type(k, f"op_type.{k}"): self.op_rule(v, f"op_type.{k}")
                    for k, v in top["op_type"].items()}
        model_input = self.obj(top["model_input"], "model_input", ("is_input_quantized",))
        model_output = self.obj(top["model_output"], "model_output", ("is_output_quantized",))
        return QuantsimConfig(
            **self.defaults(top["defaults"]),
            params=self.flags_map(top["params"], "params"),
            op_types=MappingProxyType(op_types),
            supergroups=self.supergroups(top["supergroups"]),
            supergroup_pass_list=self.pass_list(top.get("supergroup_pass_list", [])),
            model_input_quantized=bool(self.opt_bool(model_input, "is_input_quantized", "model_input", True)),
            model_output_quantized=bool(self.opt_bool(model_output, "is_output_quantized", "model_output",
                                                      True)),
            source=self.source,
        )


@functools.lru_cache(maxsize=1)
def known_op_types() -> frozenset[str]:
    """Op types a config may name: every schema onnx defines (all domains and versions) plus the op-facts
    table's (e.g. onnxruntime's com.microsoft ops)."""
    names = {schema.name for schema in onnx.defs.get_all_schemas_with_history()}
    return frozenset(names | set(OP_FACTS))


# ----------------------------------------------------------------------------------------------- loading
def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(Exception):
    pass


def _read_json(path: Path, source: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read config file {path}: {exc}") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise ConfigError(f"{source}: duplicate key {exc.args[0]!r} in {path}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON ({path}): {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: JSON nested too deeply to be a quantsim config ({path})") from None


def load_config(config_file: str | os.PathLike | Mapping | None = None) -> QuantsimConfig:
    """Load and validate a quantsim config.

    `config_file` is ``None`` (the per-channel default, like AIMET's ``config_file=None``), an alias from
    `CONFIG_ALIASES`, a path to a JSON file, or an already-decoded mapping.  Raises `ConfigError`.
    """
    if config_file is None:
        config_file = "default"
    if isinstance(config_file, Mapping):
        return _Parser("<mapping>").config(config_file)
    if not isinstance(config_file, (str, os.PathLike)):
        raise ConfigError(f"config_file must be a path, an alias or a mapping, got {type(config_file).__name__}")
    name = os.fspath(config_file)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if isinstance(config_file, str) and name in CONFIG_ALIASES:
        path = CONFIG_DIR / CONFIG_ALIASES[name]
        return _Parser(name, f"{name} ({path})").config(_read_json(path, name))
    path = Path(name)
    looks_like_alias = isinstance(config_file, str) and os.sep not in name and "/" not in name \
        and path.suffix == "" and not path.exists()
    if looks_like_alias:
        raise ConfigError(f"{name}: unknown config alias; shipped aliases are "
                          f"{', '.join(sorted(CONFIG_ALIASES))} (HTP/DSP configs are not shipped: pass the "
                          f"JSON file path instead)")
    return _Parser(name).config(_read_json(path, name))


_WARNED_HW_VERSIONS: set[tuple[str, str]] = set()


def warn_unapplied_config(config: QuantsimConfig) -> None:
    """Warn (once per config source and version) that ``hw_version`` has no effect. AIMET uses it only for
    exception rules of particular Hexagon versions (norm-layer parameters forced to 8 bits on V66-V69, the int8 /
    int16 pairing of dynamic MatMul inputs); quantsim has no per-version target model: norm parameters keep >= 8
    bits on every target and precisions are set with ``set_tensor_precision``. Everything else the config says
    takes effect (``supported_kernels`` is returned by ``sim.get_supported_kernels()``)."""
    if config.hw_version is None or (config.source, config.hw_version) in _WARNED_HW_VERSIONS:
        return
    _WARNED_HW_VERSIONS.add((config.source, config.hw_version))
    warn_at_caller(f"config {config.source}: hw_version {config.hw_version!r} has no effect: AIMET's per-version "
                   "exception rules (norm parameters at 8 bits on V66-V69, dynamic MatMul int8/int16 pairing) are not "
                   "applied; set precisions with sim.set_tensor_precision", UserWarning)
