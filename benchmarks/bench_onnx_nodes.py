"""Op coverage: every ONNX backend node test case through the sim and both exports.

    python -m benchmarks.bench_onnx_nodes [--match conv] [--list]

The onnx wheel generates its backend node test cases offline (`onnx.backend.test.case.node.collect_testcases`:
one model per op variant, with inputs). Each case whose inputs and outputs are all float32 and which
onnxruntime runs as a plain model goes through ``QuantizationSimModel`` (default W8A8 config), calibration on
the case's own inputs, ``sim.session``, the exact QDQ export (``int32_bias=False``, Q/DQ fusion off: it must
equal the sim) and ``export_integer`` (in onnxruntime, against the sim in steps of each quantized output's
grid). Prints the counts: skipped (not float32, or onnxruntime refuses the plain model), run, clear errors
(a `QuantsimError` naming the problem, by message) and crashes (anything else: a bug); then each case whose
exact QDQ export differs from the sim or whose integer export is more than ``--steps`` steps from it (or
disagrees on NaN). ``uint8`` weight codes: exact on every x86 CPU. A case gets ``--timeout`` seconds.
"""
from __future__ import annotations

import argparse
import collections
import re
import signal
import warnings

import numpy as np
import onnxruntime as ort

PROVIDERS = ["CPUExecutionProvider"]
_QUOTED = r"'[^']*'"  # names in an error message: grouped as one kind of error


class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout


def _feeds(case) -> dict[str, np.ndarray] | None:
    """The case's first inputs by graph input name, or None when it does not suit (not all float32, optional
    inputs left out, or onnxruntime refuses the plain model)."""
    graph = case.model.graph
    float32 = 1
    if any(v.type.tensor_type.elem_type != float32 for v in [*graph.input, *graph.output]) or not graph.input:
        return None
    values = case.data_sets[0][0]
    if len(values) != len(graph.input):
        return None
    feeds = {info.name: np.asarray(value) for info, value in zip(graph.input, values)}
    try:
        ort.InferenceSession(case.model.SerializeToString(), providers=PROVIDERS).run(None, feeds)
    except Exception:  # noqa: BLE001 - a case onnxruntime cannot run is out of scope
        return None
    return feeds


def _grid_step(sim, model, tensor: str) -> float | None:
    """The step of the per-tensor grid ``tensor`` lies on in the sim: its own quantizer's, or (an output of data
    movement whose quantizer the sim ties to its input) the nearest one up the chain of movement ops."""
    from quantsim.graph.op_facts import GRID_MOVEMENT_OPS

    producers = {out: node for node in model.graph.node for out in node.output}
    while True:
        q = sim.qc_quantize_op_dict.get(tensor)
        if q is not None and q.enabled and q.encoding is not None:
            return float(q.encoding.scale) if np.ndim(q.encoding.scale) == 0 else None
        node = producers.get(tensor)
        if node is None or node.op_type not in GRID_MOVEMENT_OPS:
            return None
        tensor = node.input[0]


def _worst_steps(sim, model, got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest |got - want| over the outputs in steps of the grid an output lies on (`_grid_step`; relative to
    the output's magnitude x 1000 for one on no per-tensor grid); inf where NaN disagrees."""
    worst = 0.0
    for info, g, w in zip(sim.session.get_outputs(), got, want):
        if (np.isnan(g) != np.isnan(w)).any():
            return float("inf")
        diff = np.nan_to_num(np.abs(g.astype(np.float64) - w), nan=0.0)
        scale = _grid_step(sim, model, info.name)
        if scale is not None:
            worst = max(worst, float(diff.max(initial=0.0)) / scale)
        else:
            worst = max(worst, 1000 * float(diff.max(initial=0.0)) / (float(np.nanmax(np.abs(w), initial=0.0)) + 1e-6))
    return worst


def run_case(case, feeds: dict[str, np.ndarray]) -> tuple[float, float]:
    """(largest |exact QDQ - sim|, integer-vs-sim steps) of one case."""
    from quantsim import QuantizationSimModel

    sim = QuantizationSimModel(case.model, progress=False)
    sim.compute_encodings([feeds])
    want = sim.session.run(None, feeds)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    exact = ort.InferenceSession(sim.to_onnx_qdq(weight_codes="uint8", int32_bias=False).SerializeToString(),
                                 options, providers=PROVIDERS).run(None, feeds)
    qdq = max(float(np.nan_to_num(np.abs(e.astype(np.float64) - w), nan=0.0).max(initial=0.0))
              for e, w in zip(exact, want))
    integer = sim.export_integer(weight_codes="uint8").model
    got = ort.InferenceSession(integer.SerializeToString(), providers=PROVIDERS).run(None, feeds)
    return qdq, _worst_steps(sim, case.model, got, want)


def main(argv: list[str] | None = None) -> int:
    from onnx.backend.test.case.node import collect_testcases

    from quantsim.errors import QuantsimError

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--match", default="", help="only cases whose name contains this")
    parser.add_argument("--steps", type=float, default=2.0, help="integer-vs-sim steps above which a case is listed")
    parser.add_argument("--timeout", type=int, default=30, help="seconds per case")
    parser.add_argument("--list", action="store_true", help="also list each clear error")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    ort.set_default_logger_severity(4)
    with np.errstate(all="ignore"):
        cases = [c for c in collect_testcases(None) if args.match in c.name]
    counts: collections.Counter = collections.Counter()
    errors: collections.Counter = collections.Counter()
    listed: list[str] = []
    signal.signal(signal.SIGALRM, _alarm)
    for case in cases:
        feeds = _feeds(case)
        if feeds is None:
            counts["skipped"] += 1
            continue
        signal.alarm(args.timeout)
        try:
            qdq, steps = run_case(case, feeds)
            counts["run"] += 1
            if qdq > 0 or steps > args.steps:
                listed.append(f"{case.name}: exact QDQ vs sim {qdq:.3g}, integer vs sim {steps:.2f} steps")
        except QuantsimError as error:
            counts["clear error"] += 1
            errors[f"{type(error).__name__}: {re.sub(_QUOTED, '<name>', str(error))[:110]}"] += 1
            if args.list:
                listed.append(f"{case.name}: {type(error).__name__}: {str(error)[:200]}")
        except _Timeout:
            counts["timeout"] += 1
            listed.append(f"{case.name}: over {args.timeout} s")
        except Exception as error:  # noqa: BLE001 - a crash is what this benchmark looks for
            counts["crash"] += 1
            listed.append(f"{case.name}: CRASH {type(error).__name__}: {str(error)[:200]}")
        finally:
            signal.alarm(0)
    print(f"{len(cases)} cases: " + ", ".join(f"{key} {value}" for key, value in sorted(counts.items())))
    for message, count in errors.most_common():
        print(f"  {count:4d} x {message}")
    for line in listed:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
