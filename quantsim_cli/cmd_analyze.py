"""``quantsim analyze MODEL --data PATH``: which quantizers cost accuracy, and which tensors' grids are unhealthy.

Calibrates a sim with the given options on all the data, then scores on the first ``--analysis-batches``
batches with `mixed_precision.group_sensitivity` (score: SQNR of the model's outputs against the float model,
in dB, higher is better; each quantizer group quantized alone and left float alone) and
`mixed_precision.tensor_health` (each activation's SQNR and the grid codes it uses). Prints the worst rows;
``--out DIR`` also writes ``analysis.md``, ``analysis.json`` (`mixed_precision.report_dict`) and
``analysis.html`` (`mixed_precision.write_analysis_html`: one self-contained page with the charts).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from quantsim_cli.data import model_inputs, open_data
from quantsim_cli.metrics import AgreementAccumulator, Timings, format_db
from quantsim_cli.report import json_ready, markdown_table, text_table
from quantsim_cli.simbuild import apply_overrides, load_overrides_from_args, sim_from_args

__all__ = ["run_analyze", "output_sqnr_scorer"]


def output_sqnr_scorer(output_names: list[str], batches: list[dict[str, np.ndarray]], references: list[dict]):
    """``eval_fn(session) -> SQNR dB`` of all outputs together against the float ``references``."""
    def score(session) -> float:
        agreement = AgreementAccumulator()
        for feed, ref in zip(batches, references):
            agreement.add(ref, dict(zip(output_names, session.run(output_names, feed))))
        return agreement.overall_sqnr_db()
    return score


def _group_rows(groups, top: int) -> list[tuple]:
    ordered = sorted(groups, key=lambda g: g.alone)[:top]
    return [(", ".join(g.nodes) or "(" + ", ".join(g.quantizers) + ")", len(g.quantizers), format_db(g.alone),
             format_db(g.without)) for g in ordered]


def _health_rows(health, top: int) -> list[tuple]:
    return [(h.tensor, format_db(h.sqnr_db), f"{h.codes_used}/{h.codes_available}" if h.codes_used else "-", h.verdict)
            for h in health[:top]]


def run_analyze(args: argparse.Namespace) -> int:
    """The ``analyze`` subcommand; returns the exit code."""
    from mixed_precision import group_sensitivity, report_dict, tensor_health, write_analysis_html

    inputs = model_inputs(args.model)
    data = open_data(args.data, inputs, args.batch_size, args.max_batches)
    overrides = load_overrides_from_args(args)
    timings = Timings()
    with timings("read first batch"):
        data.first(1)
    with timings("prepare"):
        sim = sim_from_args(args, args.model)
    if overrides is not None:
        apply_overrides(sim, overrides, args.overrides)
    with timings("calibration"):
        sim.compute_encodings(data)
    batches = data.first(args.analysis_batches)
    outputs = [o.name for o in sim.model.graph.output]
    with timings("sensitivity"):
        references = list(sim.capture(outputs, batches, quantized=False))
        float_score, quantized_score, groups = group_sensitivity(sim, output_sqnr_scorer(outputs, batches, references))
    with timings("range health"):
        health = tensor_health(sim, batches)
    group_header = ("nodes", "quantizers", "SQNR quantized alone", "SQNR with it float")
    health_header = ("tensor", "SQNR", "codes used", "verdict")
    if not args.quiet:
        print(f"{args.model}: output SQNR of the quantized model {format_db(quantized_score)} "
              f"on {len(batches)} batch(es); {len(groups)} quantizer groups")
        print("most sensitive groups (lowest output SQNR when quantized alone):")
        print(text_table(group_header, _group_rows(groups, args.top)))
        print("activations, worst first:")
        print(text_table(health_header, _health_rows(health, args.top)))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        document = json_ready(report_dict(float_score, quantized_score, groups, health))
        document["score"] = "output SQNR against the float model, dB (None: exact)"
        document["title"] = f"quantsim analysis: {Path(args.model).name}"
        (out / "analysis.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
        write_analysis_html({**document, "score": "output SQNR against the float model, dB"}, out / "analysis.html")
        text = [f"# quantsim analysis: {Path(args.model).name}", "",
                f"Output SQNR of the quantized model: {format_db(quantized_score)} on {len(batches)} batch(es).", "",
                "## Quantizer groups, most sensitive first", "",
                markdown_table(group_header, _group_rows(groups, len(groups))), "",
                "## Activations, worst first", "", markdown_table(health_header, _health_rows(health, len(health))), "",
                "## Timings", "", markdown_table(("step", "seconds"), [(s, f"{t:.2f}") for s, t in timings.steps]), ""]
        (out / "analysis.md").write_text("\n".join(text), encoding="utf-8")
        if not args.quiet:
            print(f"wrote {out / 'analysis.md'}, {out / 'analysis.json'}, {out / 'analysis.html'}")
    return 0
