"""One loop for the model-export scripts (`torch_export`, `keras_export`, ...), which run outside quantsim's
environment, and one call of torch's two exporters."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path


def export_each(jobs: Iterable[tuple[str, Callable[[], Path]]]) -> None:
    """Run each ``(label, export)``, printing the file written and its seconds, or why it was not written: a
    model an exporter refuses or cannot convert is reported, not fatal."""
    for label, export in jobs:
        start = time.perf_counter()
        try:
            print(f"{export().name}: {time.perf_counter() - start:.1f} s", flush=True)
        except Exception as error:  # noqa: BLE001 - any exporter failure is the model's, reported
            print(f"{label}: not exported: {type(error).__name__}: {str(error)[:200]}", flush=True)


def torch_onnx_export(model, args: tuple, target: Path, exporter: str, input_names: list[str],
                      output_names: list[str], dynamic_axes: dict | None = None) -> Path:
    """``model(*args)`` written to ``target`` by torch's TorchScript exporter (``exporter="ts"``, opset 17) or
    its dynamo exporter (``"dynamo"``, opset 18, weights inside the file), under ``torch.no_grad()``."""
    import torch

    with torch.no_grad():
        if exporter == "ts":
            torch.onnx.export(model, args, str(target), opset_version=17, dynamo=False, input_names=input_names,
                              output_names=output_names, dynamic_axes=dynamic_axes)
        else:
            torch.onnx.export(model, args, str(target), opset_version=18, dynamo=True, external_data=False,
                              input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes)
    return target


def torch_exports_main(argv: list[str] | None, description: str, default_out: Path, names: list[str],
                       export: Callable[[str, str, Path], Path]) -> int:
    """The command line of a script writing models through torch's two exporters: ``--out``, ``--exporter``
    (ts, dynamo), ``--models`` (of ``names``); ``export(name, exporter, out)`` writes one file."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=str(default_out))
    parser.add_argument("--exporter", nargs="+", choices=("ts", "dynamo"), default=["ts", "dynamo"])
    parser.add_argument("--models", nargs="+", choices=names, default=names)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    export_each((f"{name} ({exporter})", lambda name=name, exporter=exporter: export(name, exporter, out))
                for exporter in args.exporter for name in args.models)
    return 0
