"""Every error and warning quantsim raises on purpose, under one root.

Each public error keeps the built-in base it had before (``ValueError`` for bad values and files,
``TypeError`` for wrong kinds of arguments, ``RuntimeError`` for calls in the wrong state), so both
``except QuantsimError`` and ``except ValueError`` catch it. Messages name the node, tensor, file,
quantizer or option at fault.
"""
from __future__ import annotations

import sys
import warnings
from types import FrameType

__all__ = [
    "warn_at_caller",
    "warn_if_forking_pool",
    "QuantsimError",
    "QuantsimWarning",
    "AimetDifferenceWarning",
    "NotSupportedError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidStateError",
    "ConfigError",
    "PrepareError",
    "PrepareWarning",
    "EncodingFormatError",
    "EncodingMismatchError",
    "IntegerExportError",
    "CalibrationError",
    "SessionError",
    "UnknownQuantizerError",
    "TargetError",
    "ExportLegalityError",
]


def one_line(message: str) -> str:
    """Another library's error message on one line for ours: its lines joined, without the ``==> Context:``
    dump of a whole node that onnx's checker appends (its first line often stops before the node it names)."""
    message = message.split("==> Context:")[0]
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


class QuantsimError(Exception):
    """Root of every error quantsim raises on purpose."""


class QuantsimWarning(UserWarning):
    """Root of quantsim's warnings: it went on, with less than it wanted."""


class InvalidArgumentError(QuantsimError, ValueError):
    """An argument or value is out of range or inconsistent; the message says which and why."""


class InvalidTypeError(QuantsimError, TypeError):
    """An argument is of the wrong kind (e.g. a feed that is not a dict of arrays)."""


class InvalidStateError(QuantsimError, RuntimeError):
    """The call is not valid in the current state (e.g. changing a frozen quantizer)."""


class ConfigError(QuantsimError, ValueError):
    """A quantsim-config file or dict is invalid; the message names the JSON path."""


class PrepareError(QuantsimError, ValueError):
    """The model cannot be prepared; the message names the offending nodes, values or versions."""


class PrepareWarning(QuantsimWarning):
    """Preparation went on with less than it wanted (no shapes, a refused fold, a cache entry dropped)."""


class AimetDifferenceWarning(QuantsimWarning):
    """The sim does something aimet-onnx would not, by default and on purpose (`quantsim.sim.aimet_differences`);
    the message names the switch that gives AIMET's behaviour."""


class EncodingFormatError(QuantsimError, ValueError):
    """An encodings file (or dict, or record list) that cannot be read or written.

    The message always says where: ``"<source>: <entry>: <problem>"``, where ``source`` is the file path
    (or ``"<dict>"`` / a writer label) and ``entry`` names the tensor or list slot concerned.
    """

    def __init__(self, source: str, entry: str | None, problem: str):
        self.source = str(source)
        self.entry = entry
        self.problem = problem
        where = f"{self.source}: {entry}" if entry else self.source
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):
        return (type(self), (self.source, self.entry, self.problem))


class EncodingMismatchError(QuantsimError, ValueError):
    """Encodings do not fit the sim they are loaded into (``strict=True``); carries the mismatches."""


class IntegerExportError(QuantsimError, ValueError):
    """The model cannot be exported as an integer model as asked; the message names the node."""


class UnknownQuantizerError(QuantsimError, KeyError):
    """No quantizer has this tensor name; the message lists the closest names (a ``KeyError``, so AIMET-style
    ``except KeyError`` still catches it)."""

    def __str__(self) -> str:  # KeyError quotes its argument; this message is a sentence
        return str(self.args[0]) if self.args else ""


class CalibrationError(QuantsimError, ValueError):
    """Calibration could not produce encodings (e.g. no usable batch); the message says which input."""


class SessionError(QuantsimError, RuntimeError):
    """onnxruntime refused a model the sim built (e.g. the float model itself does not load there)."""


class TargetError(QuantsimError, ValueError):
    """A target profile cannot be read, or a precision change is illegal on the sim's target; the message
    names the node, the tensors and the rule."""


class ExportLegalityError(QuantsimError, ValueError):
    """An export would hand the target a precision mix it cannot run; ``findings`` lists every violation
    (node, tensors, rule, message)."""

    def __init__(self, message: str, findings: tuple = ()):
        super().__init__(message)
        self.findings = tuple(findings)

    def __reduce__(self):
        return (type(self), (str(self), self.findings))


class NotSupportedError(QuantsimError, NotImplementedError):
    """An aimet-onnx API that quantsim does not provide (it has no meaning in a plain-ONNX sim); the message
    names what to use instead."""


#: packages whose frames a warning skips, so it points at the user's own line
_LIBRARY_PACKAGES = ("quantsim", "adaround", "mixed_precision", "quantsim_cli")


def _is_library_frame(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module.split(".", 1)[0] in _LIBRARY_PACKAGES


def warn_at_caller(message: str, category: type[Warning] = QuantsimWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside quantsim's packages: the caller's line,
    however deep inside the library the warning arose."""
    frame: FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and _is_library_frame(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def warn_if_forking_pool(executor: object, where: str) -> None:
    """Warn (at the caller's line) when ``executor`` is a `concurrent.futures.ProcessPoolExecutor` that starts
    its workers by ``fork``, the default on Linux before Python 3.14: a forked copy of a process whose
    onnxruntime sessions hold worker threads can deadlock in the child (their locks are copied held), so such a
    pool can hang the call ``where`` names. Threads, spawned or forkserver processes and Dask are not warned."""
    from concurrent.futures import ProcessPoolExecutor

    if not isinstance(executor, ProcessPoolExecutor):
        return
    context = getattr(executor, "_mp_context", None)
    method = context.get_start_method() if context is not None else None
    if method == "fork":
        warn_at_caller(f"{where}: executor is a ProcessPoolExecutor that forks its workers; a fork of a process "
                       "whose onnxruntime sessions hold threads can deadlock. Pass ProcessPoolExecutor(..., "
                       "mp_context=multiprocessing.get_context('spawn')) (or 'forkserver')", RuntimeWarning)
