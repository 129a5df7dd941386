"""Run every parity step on aimet-onnx and on quantsim and print the table (step, aimet, quantsim, agree?).

quantsim runs each step twice: with its defaults, and with the three constructor switches that give aimet-onnx's
placement (`benchmarks.parity.apis.AIMET_SWITCHES`; each default announces itself with an
AimetDifferenceWarning naming its switch). A difference that holds with the switches is a real one.

Outputs agree when the largest difference of the probe logits is at most one step of aimet's output grid, or
half of aimet's own largest error against FP32, whichever is larger (AdaRound and CLE, whose optimisation is
not bit-reproducible across implementations, are held to aimet's error instead of a step). Every other read-
out (encodings names, bitwidths, dtypes, return types, file lists) must be equal, except those a step marks
``info: `` (shown when they differ, not compared).
"""
from __future__ import annotations

import argparse
import copy
import logging
import shutil
import sys
import time
import traceback
import warnings

import numpy as np

from benchmarks.parity import fixtures as fx
from benchmarks.parity.apis import aimet_api, quantsim_api
from benchmarks.parity.steps import STEPS, scratch

LOOSE = ("adaround", "seq_mse", "equalize", "choose_mixed")
INFO = "info: "
"""Read-outs whose key starts with this are shown when they differ but do not decide agreement."""


def run_side(api, name: str) -> tuple[dict | None, str, list[str]]:
    """One step on one side: (read-outs or None, error text, warnings raised)."""
    model, data, tmp = fx.build_model(), fx.calibration(), scratch()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = STEPS[name](api, model, data, tmp)
        said = sorted({str(w.message).splitlines()[0][:120] for w in caught
                       if not issubclass(w.category, DeprecationWarning) and "quantsim" in (w.filename + str(w.category))})
        return result, "", said
    except Exception as exc:  # noqa: BLE001 - every failure is a row of the table
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        logging.getLogger(__name__).debug("%s on %s: %s", name, api.side, traceback.format_exc())
        return None, f"{type(exc).__name__}: {text}"[:140], []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compare(name: str, a: dict, q: dict, fp32: np.ndarray) -> tuple[bool, str]:
    """Whether quantsim's read-outs agree with aimet's, and the one-line figure that says why."""
    notes, ok = [], True
    if "out" in a and "out" in q:
        diff = float(np.max(np.abs(np.asarray(q["out"], np.float64) - a["out"])))
        err = float(np.max(np.abs(a["out"] - fp32)))
        loose = any(k in name for k in LOOSE)
        tol = 1.0 * err if loose else max(a.get("step") or 0.0, 0.5 * err)
        ok = diff <= tol + 1e-7
        notes.append(f"max diff {diff:.3g} (aimet err {err:.3g}, tol {tol:.3g})")
    for key in sorted(set(a) | set(q)):
        if key in ("out", "step"):
            continue
        if key.startswith(INFO):
            if a.get(key) != q.get(key):
                notes.append(f"{key[len(INFO):]} (not compared): aimet {short(a.get(key))} vs {short(q.get(key))}")
            continue
        if a.get(key) != q.get(key):
            ok = False
            notes.extend(differences(key, a.get(key), q.get(key)))
    return ok, "; ".join(notes)


def differences(key: str, a, q) -> list[str]:
    """One note per differing entry when both read-outs are dicts (an entry one side lacks reads ``only aimet`` /
    ``only quantsim``), else one note for the whole value."""
    if not (isinstance(a, dict) and isinstance(q, dict)):
        return [f"{key}: aimet {short(a)} vs {short(q)}"]
    notes = []
    for sub in sorted(set(a) | set(q), key=str):
        if sub not in q:
            notes.append(f"{key}[{sub!r}]: only aimet ({short(a[sub])})")
        elif sub not in a:
            notes.append(f"{key}[{sub!r}]: only quantsim ({short(q[sub])})")
        elif a[sub] != q[sub]:
            diff = ""
            if isinstance(a[sub], list) and isinstance(q[sub], list):
                diff = f" (only aimet {sorted(set(map(str, a[sub])) - set(map(str, q[sub])))}, only quantsim " \
                       f"{sorted(set(map(str, q[sub])) - set(map(str, a[sub])))})"
            notes.append(f"{key}[{sub!r}]: aimet {short(a[sub])} vs {short(q[sub])}{diff}")
    return notes


def short(value) -> str:
    text = repr(value)
    return text if len(text) < 160 else text[:157] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="substrings of step names to run")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.ERROR)
    if not args.verbose:
        logging.disable(logging.WARNING)  # aimet-onnx logs every step at INFO/WARNING on its own handlers
    fp32 = fx.float_outputs(fx.build_model())
    rows = ["| step | aimet-onnx 2.42 | quantsim (defaults): agree? | quantsim with AIMET's switches: agree? |",
            "|---|---|---|---|"]
    agreed = switched = 0
    names = [n for n in STEPS if not args.only or any(s in n for s in args.only)]
    for name in names:
        t0 = time.perf_counter()
        a, a_err, _ = run_side(aimet_api(), name)
        cells = []
        for api in (quantsim_api(), quantsim_api(aimet_switches=True)):
            q, q_err, q_warn = run_side(api, name)
            if a is None or q is None:
                ok, note = False, (q_err if q is None else "")
            else:
                ok, note = compare(name, a, copy.deepcopy(q), fp32)
            kinds = sorted({w.split(":")[0] for w in q_warn})
            warned = f" (warned: {'; '.join(kinds)[:120]})" if q_warn and not ok else ""
            cells.append((ok, ("yes" if ok else "**no**") + (f": {note}" if note else "") + warned))
        agreed += cells[0][0]
        switched += cells[1][0]
        aimet_cell = "ran" if a is not None else a_err
        rows.append(f"| `{name}` | {aimet_cell} | {cells[0][1]} | {cells[1][1]} |")
        print(f"[{time.perf_counter() - t0:5.1f}s] {name}: {'agree' if cells[0][0] else 'DIFFER'} / "
              f"{'agree' if cells[1][0] else 'DIFFER'} with switches", file=sys.stderr, flush=True)
    rows.append(f"\n{agreed} of {len(names)} steps agree with quantsim's defaults; {switched} of {len(names)} with "
                "AIMET's switches (fold_batchnorm=False, range_health=False, depthwise_supergroups=False, int32_bias=False).")
    table = "\n".join(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
