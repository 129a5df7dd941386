"""``quantsim`` entry point: parse, set up logging, run one subcommand, turn errors into one line and an exit code.

Exit codes: 0 ok, 1 error (a file, the data, the model or a step failed; the message names which), 2 usage
(argparse: unknown option, bad option value), 130 interrupted. ``--debug`` prints the traceback as well.
Warnings (quantsim's and Python's) are logged as ``quantsim: warning: ...`` lines; ``--quiet`` hides them.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence

from quantsim import QuantsimError
from quantsim_cli.arguments import build_parser

__all__ = ["main", "one_line", "LOG_NAMES"]

#: the loggers the command line shows (its own and the libraries it drives)
LOG_NAMES = ("quantsim", "quantsim_cli", "adaround", "mixed_precision")
_log = logging.getLogger("quantsim_cli")


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and record.levelno >= logging.ERROR:
            message += "\n" + self.formatException(record.exc_info)
        return f"quantsim: {record.levelname.lower()}: {message}"


@contextlib.contextmanager
def _logging(args: argparse.Namespace) -> Iterator[None]:
    """Log records of `LOG_NAMES` and warnings to stderr at the level the options ask for; undone on exit."""
    verbose = getattr(args, "verbose", 0)
    level = logging.ERROR if getattr(args, "quiet", False) else (
        logging.DEBUG if verbose >= 2 else logging.INFO if verbose == 1 else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    loggers = [logging.getLogger(name) for name in LOG_NAMES]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(level)
        lg.propagate = False

    def show(message, category, filename, lineno, file=None, line=None):
        _log.warning("%s: %s", category.__name__, one_line(message))

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        try:
            yield
        finally:
            for lg, (lvl, propagate) in zip(loggers, saved):
                lg.removeHandler(handler)
                lg.setLevel(lvl)
                lg.propagate = propagate


def one_line(error: object) -> str:
    """The first non-empty line of an error or warning message (file errors as ``path: reason``)."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    from quantsim_cli.cmd_analyze import run_analyze
    from quantsim_cli.cmd_cache import run_cache
    from quantsim_cli.cmd_compare import run_compare
    from quantsim_cli.cmd_inspect import run_inspect
    from quantsim_cli.cmd_quantize import run_quantize

    return {"quantize": run_quantize, "inspect": run_inspect, "compare": run_compare, "analyze": run_analyze,
            "cache": run_cache}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: usage error (2) or --help / --version (0)
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    debug = getattr(args, "debug", False)
    with _logging(args):
        try:
            return _commands()[args.command](args)
        except KeyboardInterrupt:
            print("quantsim: interrupted", file=sys.stderr)
            return 130
        except (QuantsimError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
            if debug:
                traceback.print_exc()
            known = isinstance(error, (QuantsimError, OSError))
            prefix = "" if known else f"{type(error).__name__}: "
            hint = "" if known or debug else " (--debug shows the traceback)"
            print(f"quantsim: error: {prefix}{one_line(error)}{hint}", file=sys.stderr)
            return 1
        except Exception as error:  # noqa: BLE001 - onnxruntime's own exception types and the like
            if debug:
                traceback.print_exc()
            print(f"quantsim: error: {type(error).__name__}: {one_line(error)}"
                  + ("" if debug else " (--debug shows the traceback)"), file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
