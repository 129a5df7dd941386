"""Numbers the subcommands report: output agreement between two runs of a model, latency, step timings."""
from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from mixed_precision import power_sqnr_db

__all__ = ["OutputAgreement", "AgreementAccumulator", "Timings", "median_latency_ms", "format_db"]

_log = logging.getLogger(__name__)


def format_db(value: float | None) -> str:
    """``34.2 dB``, ``inf`` or ``-``."""
    if value is None:
        return "-"
    return "inf (exact)" if math.isinf(value) and value > 0 else f"{value:.1f} dB"


@dataclass
class OutputAgreement:
    """One output's agreement between a reference and a test run, accumulated over batches."""

    name: str
    signal: float = 0.0
    noise: float = 0.0
    max_abs_error: float = 0.0
    max_abs_reference: float = 0.0
    top1_same: int = 0
    top1_rows: int = 0

    @property
    def sqnr_db(self) -> float:
        """Reference energy over error energy, in dB."""
        return power_sqnr_db(self.signal, self.noise)

    @property
    def top1_agreement(self) -> float | None:
        """Share of rows whose arg-max agrees (outputs shaped ``[N, classes]`` only), or None."""
        return self.top1_same / self.top1_rows if self.top1_rows else None

    def add(self, reference: np.ndarray, test: np.ndarray) -> None:
        """Fold in one batch of both runs' values of this output."""
        ref, got = np.asarray(reference, dtype=np.float64), np.asarray(test, dtype=np.float64)
        if ref.shape != got.shape:
            raise ValueError(f"output {self.name!r}: shapes differ ({ref.shape} vs {got.shape})")
        self.signal += float(np.sum(ref * ref))
        self.noise += float(np.sum((ref - got) ** 2))
        if ref.size:
            self.max_abs_error = max(self.max_abs_error, float(np.max(np.abs(ref - got))))
            self.max_abs_reference = max(self.max_abs_reference, float(np.max(np.abs(ref))))
        if ref.ndim == 2 and ref.shape[1] > 1:  # classifier-like: [N, classes]
            self.top1_same += int(np.sum(np.argmax(ref, axis=1) == np.argmax(got, axis=1)))
            self.top1_rows += ref.shape[0]

    def as_dict(self) -> dict:
        """JSON-ready numbers (None for infinite SQNR)."""
        sqnr = self.sqnr_db
        return {"output": self.name, "sqnr_db": None if math.isinf(sqnr) else sqnr,
                "max_abs_error": self.max_abs_error, "max_abs_reference": self.max_abs_reference,
                "top1_agreement": self.top1_agreement}


@dataclass
class AgreementAccumulator:
    """`OutputAgreement` per output name."""

    outputs: dict[str, OutputAgreement] = field(default_factory=dict)

    def add(self, reference: Mapping[str, np.ndarray], test: Mapping[str, np.ndarray]) -> None:
        """Fold in one batch of ``{output: values}`` of both runs."""
        for name, values in reference.items():
            self.outputs.setdefault(name, OutputAgreement(name)).add(values, test[name])

    def rows(self) -> list[OutputAgreement]:
        """The outputs in the order first seen."""
        return list(self.outputs.values())

    def overall_sqnr_db(self) -> float:
        """SQNR over every output together."""
        return power_sqnr_db(sum(o.signal for o in self.outputs.values()), sum(o.noise for o in self.outputs.values()))


class Timings:
    """Wall-clock seconds of named steps, in order (``with timings("calibration"): ...``)."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []

    @contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        _log.info("%s...", step)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.steps.append((step, seconds))
            _log.info("%s: %.2f s", step, seconds)

    @property
    def total(self) -> float:
        """Sum of the steps' seconds."""
        return sum(seconds for _, seconds in self.steps)


def median_latency_ms(run: Callable[[], object], runs: int, warmup: int = 1) -> float:
    """Median milliseconds of ``runs`` calls of ``run`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)

