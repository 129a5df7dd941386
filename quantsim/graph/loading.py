"""Loading a user's model: a ModelProto or a path, checked, with a label that names it in errors."""
from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx.external_data_helper import load_external_data_for_model

from quantsim.errors import InvalidArgumentError, InvalidTypeError, one_line
from quantsim.graph.large_models import is_large
from quantsim.graph.mapped import MappedWeights
from quantsim.graph.source_weights import map_external
from quantsim.graph.wrapped import as_model_proto

__all__ = ["load_model", "load_model_mapped", "file_signature", "external_files"]

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QcQuantizeOp"})


def load_model(model: onnx.ModelProto | str | os.PathLike,
               signatures: dict[str, list[int] | None] | None = None) -> tuple[onnx.ModelProto, str]:
    """A checked ModelProto and a label naming it (file path or ``graph '<name>'``) for error messages.

    With ``signatures`` (a dict) and a file, the stat signature (`file_signature`) of the
    file and of each external-data file it references is recorded there, taken before its bytes are read."""
    proto, label, _ = load_model_mapped(model, signatures, None)
    return proto, label


def load_model_mapped(model: onnx.ModelProto | str | os.PathLike, signatures: dict[str, list[int] | None] | None,
                      min_bytes: int | None) -> tuple[onnx.ModelProto, str, MappedWeights | None]:
    """`load_model`, but a file's big external weights stay in their files (`source_weights.load_mapped`, when
    they total at least ``min_bytes``; never with None): the model holds references to them, read through the
    returned `MappedWeights` (None when nothing stayed mapped)."""
    weights = None
    model = as_model_proto(model)
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        try:
            proto, weights = _load_file(path, signatures, min_bytes)
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
    shapeless = [v.name for v in (*proto.graph.input, *proto.graph.output)
                 if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    if shapeless:
        proto = _with_inferred_io_shapes(proto, shapeless, label)
    try:
        if isinstance(model, (str, os.PathLike)) and not shapeless:
            onnx.checker.check_model(str(model))  # from the file: works past 2 GiB, no re-serialisation
        elif not is_large(proto):  # a >2 GiB ModelProto cannot be serialised for the checker
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        if "topologically sorted" not in str(error):  # preparation sorts the nodes, or names the cycle / input
            raise InvalidArgumentError(f"{label} fails onnx.checker: {one_line(str(error))}") from error
    return (*_checked_tail(proto, label), weights)


def _with_inferred_io_shapes(proto: onnx.ModelProto, names: list[str], label: str) -> onnx.ModelProto:
    """A copy of ``proto`` whose graph inputs / outputs ``names``, declared without a shape (onnx-graphsurgeon
    writes them so; onnxruntime runs such a model, onnx.checker refuses it), carry the shape ONNX shape
    inference gives them; `InvalidArgumentError` naming the first one it cannot give a shape."""
    hint = ("onnx.checker requires a shape on every graph input and output: declare one (dims may be symbolic, "
            "e.g. 'batch')")
    if is_large(proto):
        raise InvalidArgumentError(f"{label}: graph input/output {names[0]!r} is declared without a shape; {hint}")
    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {v.name: v.type for v in (*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info)}
    unknown = [n for n in names if n not in types or not types[n].tensor_type.HasField("shape")]
    if unknown:
        raise InvalidArgumentError(f"{label}: graph input/output {unknown[0]!r} is declared without a shape and "
                                   f"ONNX shape inference cannot give it one; {hint}")
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for info in (*copy.graph.input, *copy.graph.output):
        if info.name in names:
            info.type.CopyFrom(types[info.name])
    return copy


def file_signature(path: str | os.PathLike) -> list[int] | None:
    """Size, inode, device, mtime and ctime (ns) of ``path``; None if it cannot be stat'ed."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_size, info.st_ino, info.st_dev, info.st_mtime_ns, info.st_ctime_ns]


def external_files(model: onnx.ModelProto, folder: str | os.PathLike) -> list[Path]:
    """The external-data files that ``model`` (loaded without its external data) references, resolved
    against ``folder``, each once."""
    found: dict[str, Path] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), None)
        if location:
            found.setdefault(location, (Path(folder) / location).resolve())
    return list(found.values())


def _load_file(path: Path, signatures: dict[str, list[int] | None] | None, min_bytes: int | None
               ) -> tuple[onnx.ModelProto, MappedWeights | None]:
    """``onnx.load(path)``, noting the signatures of the files it reads first (see `load_model`); with
    ``min_bytes``, big weights stay mapped (`load_model_mapped`)."""
    if signatures is not None:
        signatures[str(path.resolve())] = file_signature(path)
    proto = onnx.load(str(path), load_external_data=False)
    files = external_files(proto, path.parent)
    if signatures is not None:
        signatures.update((str(name), file_signature(name)) for name in files)
    if not files:
        return proto, None
    if min_bytes is not None:
        return proto, map_external(proto, path.parent, min_bytes)
    load_external_data_for_model(proto, str(path.parent))
    return proto, None


def _checked_tail(proto: onnx.ModelProto, label: str) -> tuple[onnx.ModelProto, str]:
    quantized = [n.name or n.op_type for n in proto.graph.node if n.op_type in _QDQ_OPS]
    if quantized:
        raise InvalidArgumentError(
            f"{label} already contains quantization nodes ({', '.join(quantized[:3])}...): build the sim with "
            "QuantizationSimModel.from_onnx_qdq(model) instead"
        )
    return proto, label
