"""Parity harness: the same aimet-onnx 2.x research script run on aimet-onnx and on quantsim.

Run it in an environment where both import (aimet-onnx with a CPU torch, plus this project's runtime
dependencies), from the repository root::

    /path/to/aimet-venv/bin/python -m benchmarks.parity [--markdown FILE] [--only STEP ...]

Each step is written once against an ``api`` namespace (`benchmarks.parity.apis`): the aimet-onnx names on
one side, the names the README's import mapping gives on the other. A step returns what a user would look at
(probe outputs, encodings names, bitwidths, file contents); `benchmarks.parity.compare` says whether the two
agree. aimet-onnx is never a dependency of the project.
"""
