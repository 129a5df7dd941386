"""Wall and process CPU time of a step, logged at DEBUG: how a slow calibration or session creation is broken
down without a profiler (``quantsim.sim.calibrate``, ``quantsim.graph.session``)."""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["timed"]


@contextmanager
def timed(log: logging.Logger, step: str) -> Iterator[None]:
    """Log ``"<step> <wall> s (CPU <cpu> s)"`` on ``log`` at DEBUG once the block ends (CPU: the process's,
    all threads); measures nothing where DEBUG is off."""
    if not log.isEnabledFor(logging.DEBUG):
        yield
        return
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        log.debug("%s %.3f s (CPU %.3f s)", step, time.perf_counter() - wall, time.process_time() - cpu)
