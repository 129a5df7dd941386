"""Loading a user's model: a ModelProto or a path, checked, with a label that names it in errors."""
from __future__ import annotations

import os
from pathlib import Path

import onnx

from quantsim.errors import InvalidArgumentError, InvalidTypeError
from quantsim.graph.large_models import is_large

__all__ = ["load_model"]

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QcQuantizeOp"})


def load_model(model: onnx.ModelProto | str | os.PathLike) -> tuple[onnx.ModelProto, str]:
    """A checked ModelProto and a label naming it (file path or ``graph '<name>'``) for error messages."""
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        try:
            proto = onnx.load(str(path))
        except Exception as error:  # noqa: BLE001 - any decoding failure means "not an ONNX file"
            raise InvalidArgumentError(f"{path} is not a readable ONNX model: {error}") from error
        label = str(path)
    elif isinstance(model, onnx.ModelProto):
        proto, label = model, f"graph {model.graph.name or '<unnamed>'!r}"
    else:
        raise InvalidTypeError(f"model must be an onnx.ModelProto or a path, got {type(model).__name__}")
    if not proto.graph.node:
        raise InvalidArgumentError(f"{label} has no nodes (is it an ONNX model?)")
    untyped = [o.name for o in (*proto.graph.input, *proto.graph.output) if o.type.WhichOneof("value") is None
               and o.name not in {t.name for t in proto.graph.initializer}]
    if untyped:
        raise InvalidArgumentError(f"{label}: graph input/output {untyped[0]!r} has no type (ONNX requires an element "
                                   "type on every graph input and output)")
    try:
        if isinstance(model, (str, os.PathLike)):
            onnx.checker.check_model(str(model))  # from the file: works past 2 GiB, no re-serialisation
        elif not is_large(proto):  # a >2 GiB ModelProto cannot be serialised for the checker
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        if "topologically sorted" in str(error):
            return _checked_tail(proto, label)  # preparation sorts the nodes, or names the cycle / missing input
        raise InvalidArgumentError(f"{label} fails onnx.checker: {_one_line(str(error))}") from error
    return _checked_tail(proto, label)


def _checked_tail(proto: onnx.ModelProto, label: str) -> tuple[onnx.ModelProto, str]:
    quantized = [n.name or n.op_type for n in proto.graph.node if n.op_type in _QDQ_OPS]
    if quantized:
        raise InvalidArgumentError(
            f"{label} already contains quantization nodes ({', '.join(quantized[:3])}...): build the sim with "
            "QuantizationSimModel.from_onnx_qdq(model) instead"
        )
    return proto, label


def _one_line(message: str) -> str:
    """The checker's message on one line, with the node it names (its first line often stops before it),
    without the trailing ``==> Context`` dump of the whole node."""
    message = message.split("==> Context:")[0]
    return " ".join(part.strip() for part in message.splitlines() if part.strip())
