"""`ModelView`: what ``sim.model`` returns, the sim's prepared float model in the shape of AIMET's ``ONNXModel``.

In aimet-onnx ``sim.model`` is an ``ONNXModel`` wrapper and ``sim.model.model`` its ModelProto; quantsim's
``sim.model`` was the ModelProto itself. The view serves both: ``sim.model.model`` is the ModelProto, and every
other attribute is the ModelProto's (``sim.model.graph.node``, ``sim.model.opset_import``,
``sim.model.SerializeToString()``), so ``onnx.save(sim.model, path)``, ``onnx.checker.check_model(sim.model)``
and quantsim's own functions (`QuantizationSimModel`, ``prepare``, `encodings_to_onnx_qdq`) take it as they
take the ModelProto. ``copy.deepcopy(sim.model)`` and pickling give a plain ModelProto. APIs that test
``isinstance(x, onnx.ModelProto)`` or copy with ``CopyFrom`` (``onnx.shape_inference.infer_shapes``,
``onnx.version_converter``) need ``sim.model.model``. Of ``ONNXModel``'s methods the view has those whose names
ModelProto's fields do not take (``nodes()``, ``initializer()``, ``input()``, ``output()``,
``get_initializer(name)``, ``save_model_to_file(path)``); ``graph``, ``opset_import`` and ``ir_version`` are the
ModelProto's fields, not ONNXModel's methods.

The ModelProto is fetched from the sim on each use (a large model's memory-mapped weights are copied in on
first use, as before), so a view stays valid when the sim's model is replaced.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from quantsim.graph.wrapped import as_model_proto

__all__ = ["ModelView", "as_model_proto"]


class ModelView:
    """The sim's prepared float ModelProto behind AIMET's ``ONNXModel`` surface (module docstring)."""

    __slots__ = ("_fetch",)

    def __init__(self, fetch: Callable[[], onnx.ModelProto]):
        object.__setattr__(self, "_fetch", fetch)

    @property
    def model(self) -> onnx.ModelProto:
        """Return the ModelProto itself, as AIMET's ``sim.model.model`` does."""
        return self._fetch()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fetch(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._fetch(), name, value)

    def __eq__(self, other: object) -> bool:
        return self._fetch() == as_model_proto(other)

    __hash__ = None  # type: ignore[assignment]  # like the ModelProto: mutable, not hashable

    def __deepcopy__(self, memo: dict) -> onnx.ModelProto:
        return copy.deepcopy(self._fetch(), memo)

    def __copy__(self) -> onnx.ModelProto:
        return copy.deepcopy(self._fetch())

    def __reduce__(self):
        return (onnx.load_model_from_string, (self._fetch().SerializeToString(),))

    def __repr__(self) -> str:
        graph = self._fetch().graph
        return f"<ModelView of graph {graph.name!r}: {len(graph.node)} nodes; .model is the ModelProto>"

    # AIMET ONNXModel methods that do not clash with ModelProto's fields -----------------------------
    def nodes(self) -> list[onnx.NodeProto]:
        """The graph's nodes (``ONNXModel.nodes()``)."""
        return list(self._fetch().graph.node)

    def initializer(self) -> list[onnx.TensorProto]:
        """The graph's initializers (``ONNXModel.initializer()``)."""
        return list(self._fetch().graph.initializer)

    def input(self) -> list[onnx.ValueInfoProto]:
        return list(self._fetch().graph.input)

    def output(self) -> list[onnx.ValueInfoProto]:
        return list(self._fetch().graph.output)

    def get_initializer(self, name: str) -> onnx.TensorProto | None:
        """The initializer called ``name``, or None (``ONNXModel.get_initializer``)."""
        return next((t for t in self._fetch().graph.initializer if t.name == name), None)

    def save_model_to_file(self, output_path: str | os.PathLike, use_external_data_format: bool = False) -> None:
        """Write the model to ``output_path``, staged and renamed into place. External data (``<name>.data``) is
        used when the model needs it (past protobuf's 2 GiB), whatever ``use_external_data_format`` says."""
        from quantsim.errors import warn_at_caller
        from quantsim.graph.file_set import FileSet

        if use_external_data_format:
            warn_at_caller("save_model_to_file(use_external_data_format=True): quantsim writes external data only "
                           "when the model needs it (past 2 GiB); a smaller one is written as one file", UserWarning)
        path = Path(output_path)
        with FileSet(path.parent, path.name) as files:
            files.add_model(self._fetch(), path.name)
            files.commit()
