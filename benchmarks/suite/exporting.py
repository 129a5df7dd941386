"""One loop for the model-export scripts (`torch_export`, `keras_export`), which run outside quantsim's environment."""
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
