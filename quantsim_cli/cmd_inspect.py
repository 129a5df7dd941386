"""``quantsim inspect MODEL_OR_DIR``: the quantizers a sim would place, or what an export contains.

For a float ONNX model: every quantizer of a (not calibrated) sim built with the given options, by prepared
tensor name, with its role, type, granularity and where the tensor came from (a tensor of the original
model, or one preparation created: the node that produces or reads it), then what stays float and why.
For an export folder or file (``.encodings``, ``.onnx``, ``.requant.json``): what each file holds.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from quantsim import InvalidArgumentError
from quantsim_cli.data import model_inputs
from quantsim_cli.report import text_table
from quantsim_cli.simbuild import sim_from_args
from quantsim_cli.target_view import print_target_report, qdq_target_report, sim_target_report, target_rows

__all__ = ["run_inspect", "quantizer_rows", "describe_export_file"]

_QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
_EXPORT_SUFFIXES = (".encodings", ".onnx", ".json")


_WEIGHTED = {"Conv": {1: "weight", 2: "bias"}, "ConvTranspose": {1: "weight", 2: "bias"}, "Gemm": {1: "weight", 2: "bias"},
             "MatMul": {1: "weight"}}


class _Origins:
    """Where each prepared tensor came from: the original model's producers and the nodes preparation folded."""

    def __init__(self, original: onnx.ModelProto, prepared: onnx.ModelProto):
        self.names = {i.name for i in original.graph.input} | {i.name for i in original.graph.initializer}
        self.names |= {t for n in original.graph.node for t in (*n.input, *n.output)}
        self.was_made_by = {t: n for n in original.graph.node for t in n.output}
        self.made_by = {t: n for n in prepared.graph.node for t in n.output}
        self.read_by: dict[str, onnx.NodeProto] = {}
        for node in prepared.graph.node:
            for tensor in node.input:
                self.read_by.setdefault(tensor, node)
        kept = {n.name for n in prepared.graph.node}
        self.original_nodes = {n.name: n for n in original.graph.node}
        self.removed = [n for n in original.graph.node if n.name not in kept]

    def _folded_into(self, node: onnx.NodeProto) -> str:
        before = self.original_nodes.get(node.name)
        outputs = set(before.output) if before is not None else set()
        folded = [n for n in self.removed if outputs & set(n.input)]
        return f" ({', '.join(f'{n.name} ({n.op_type})' for n in folded)} folded in)" if folded else ""

    def describe(self, tensor: str, role: str) -> str:
        """``original, weight of conv (Conv)``, ``made by preparation, bias of conv (Conv) (bn folded in)``, ..."""
        known = tensor in self.names
        if role == "param":
            node = self.read_by.get(tensor)
            if node is None:
                return ("original" if known else "made by preparation") + ", constant"
            slot = _WEIGHTED.get(node.op_type, {}).get(list(node.input).index(tensor), "constant input")
            where = f"{slot} of {node.name} ({node.op_type})"
            return f"{'original' if known else 'made by preparation'}, {where}{self._folded_into(node)}"
        now, before = self.made_by.get(tensor), self.was_made_by.get(tensor)
        if now is None:
            return "original, model input" if known else "model input"
        if not known:
            return f"made by preparation, output of {now.name} ({now.op_type})"
        if before is not None and before.name != now.name:
            return f"original, was the output of {before.name} ({before.op_type}), now of {now.name} ({now.op_type})"
        return f"original, output of {now.name} ({now.op_type})"


def quantizer_rows(sim: Any, original: onnx.ModelProto) -> list[dict[str, str]]:
    """One row per quantized tensor of ``sim``: tensor, role, spec, enabled, tied quantizer, origin."""
    origins = _Origins(original, sim.model.model)
    rows = []
    for q in sim.quantizers:
        for tensor in q.tensors:
            rows.append({"tensor": tensor, "role": q.role, "spec": q.spec.describe(),
                         "enabled": "yes" if q.enabled else "no", "tied_to": "" if tensor == q.name else q.name,
                         "origin": origins.describe(tensor, q.role)})
    return rows


def _inspect_model(args: argparse.Namespace, path: Path) -> int:
    model_inputs(path)  # a clear error for a missing or unreadable file
    original = onnx.load(str(path), load_external_data=False)
    if any(n.op_type in _QDQ_OPS for n in original.graph.node):
        return _inspect_export(args, [path])
    sim = sim_from_args(args, str(path))
    rows = quantizer_rows(sim, original)
    floats = [{"tensor": what, "why": why} for what, why in sim.left_in_float]
    target = sim_target_report(sim, args.target_profile) if getattr(args, "target_profile", None) else None
    if args.quiet:
        return 0
    if args.json:
        extra = {} if target is None else {"target": target.target.name, "nodes": target_rows(target)}
        print(json.dumps({"model": str(path), "quantizers": rows, "left_in_float": floats, **extra}, indent=1))
        return 0
    enabled = sum(q.enabled for q in sim.quantizers)
    print(f"{path}: {len(sim.quantizers)} quantizers ({enabled} enabled) for {len(rows)} tensors; "
          f"param {args.param_type}, activation {args.activation_type}")
    print(text_table(("tensor", "role", "spec", "enabled", "tied to", "origin"),
                     [tuple(r.values()) for r in rows], width=200))
    if floats:
        print("left in float:")
        for row in floats:
            print(f"  {row['tensor']}: {row['why']}")
    if target is not None:
        print_target_report(target, str(path))
    return 0


def _encoding_entries(doc: dict) -> list[tuple[str, str, str]]:
    """``(section, tensor, type)`` of every entry of a 0.6.1 / 1.0.0 / 2.0.0 encodings document."""
    entries = []
    for section in ("param_encodings", "activation_encodings", "encodings"):
        value = doc.get(section)
        items = value.items() if isinstance(value, dict) else ((e.get("name", "?"), e) for e in value or [])
        for name, entry in items:
            first = entry[0] if isinstance(entry, list) and entry else entry
            if not isinstance(first, dict):
                continue
            bits = first.get("bw", first.get("bitwidth"))
            kind = str(first.get("dtype", "int")).lower()
            label = first.get("output_dtype") or (f"{kind}{bits}" if bits is not None else kind)
            entries.append((section.replace("_encodings", ""), str(name), str(label)))
    return entries


def describe_export_file(path: Path) -> dict[str, Any]:
    """What one export file holds (encodings entries, ONNX op counts, requantization table size)."""
    if path.suffix == ".onnx":
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as error:  # noqa: BLE001 - any decoding failure means "not an ONNX file"
            raise InvalidArgumentError(f"{path}: not a readable ONNX model ({type(error).__name__})") from None
        ops = Counter(n.op_type for n in model.graph.node)
        integer = sum(c for op, c in ops.items() if op.startswith(("QLinear", "QGemm", "ConvInteger", "MatMulInteger")))
        kind = "integer" if integer else "QDQ" if ops.keys() & _QDQ_OPS else "float"
        return {"file": path.name, "kind": f"{kind} ONNX model", "nodes": len(model.graph.node),
                "ops": dict(ops.most_common(8))}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InvalidArgumentError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f"{path}: expected a JSON object")
    if "requant" in doc and "format" in doc:
        return {"file": path.name, "kind": f"requantization table ({doc.get('format')})",
                "entries": len(doc.get("requant") or {}), "left_in_float": [list(r) for r in doc.get("report") or []]}
    entries = _encoding_entries(doc)
    if not entries and "version" not in doc:
        raise InvalidArgumentError(f"{path}: neither an encodings file nor a requantization table")
    counts = Counter(f"{section} {label}" for section, _, label in entries)
    return {"file": path.name, "kind": f"encodings {doc.get('version', '?')}", "entries": len(entries),
            "types": dict(sorted(counts.items()))}


def _inspect_export(args: argparse.Namespace, files: list[Path]) -> int:
    described = [describe_export_file(f) for f in files]
    if getattr(args, "target_profile", None):
        for item, path in zip(described, files):
            if item.get("kind") == "QDQ ONNX model":
                report = qdq_target_report(onnx.load(str(path)), args.target_profile)
                item.update(target=report.target.name, target_nodes=target_rows(report))
                if not args.quiet and not args.json:
                    print_target_report(report, path.name)
    if args.quiet:
        return 0
    if args.json:
        print(json.dumps(described, indent=1))
        return 0
    for item in described:
        details = ", ".join(f"{k} {v}" for k, v in item.items() if k not in ("file", "kind", "target_nodes"))
        print(f"{item['file']}: {item['kind']}; {details}")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    """The ``inspect`` subcommand; returns the exit code."""
    target = Path(args.target)
    if target.is_dir():
        files = sorted(p for p in target.iterdir() if p.is_file() and p.name.endswith(_EXPORT_SUFFIXES))
        if not files:
            raise InvalidArgumentError(f"{target}: no .encodings, .onnx or .json files to inspect")
        return _inspect_export(args, files)
    if not target.exists():
        raise InvalidArgumentError(f"{target}: no such file or folder")
    if target.suffix == ".onnx":
        return _inspect_model(args, target)
    if not target.name.endswith(_EXPORT_SUFFIXES):
        raise InvalidArgumentError(f"{target}: expected an ONNX model, an export folder or an .encodings / .json file")
    return _inspect_export(args, [target])
