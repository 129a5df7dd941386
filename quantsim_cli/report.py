"""Rendering: plain-text and Markdown tables, and the ``report.md`` that ``quantsim quantize`` writes.

The subcommands gather data (`QuantizeResult`); this module only formats it.
"""
from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantsim_cli.metrics import AgreementAccumulator, Timings, format_db

__all__ = ["text_table", "markdown_table", "QuantizeResult", "stayed_float", "write_quantize_report", "percent",
           "json_ready"]


def percent(value: float | None) -> str:
    """``99.2%`` or ``-``."""
    return "-" if value is None else f"{100 * value:.1f}%"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ", width: int = 60) -> str:
    """Columns padded to their widest cell (cells cut at ``width``), for the terminal."""
    table = [[str(c) for c in header]] + [[str(c)[:width] for c in row] for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def json_ready(value: Any) -> Any:
    """Infinite or NaN floats become None (JSON has no infinity), recursively."""
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


@dataclass
class QuantizeResult:
    """Everything ``quantize`` measured and did, for the summary and the report."""

    model: str
    settings: list[tuple[str, str]]
    data: str
    batches: int
    quantizers: int
    enabled: int
    agreement: AgreementAccumulator | None = None
    health: list[Any] = field(default_factory=list)
    layer_reports: list[tuple[str, Any]] = field(default_factory=list)  # (step, adaround.LayerReport)
    overrides: list[tuple[str, str, str]] = field(default_factory=list)
    float_rows: list[tuple[str, str, str]] = field(default_factory=list)  # (what, kind, why)
    integer_report: list[Any] = field(default_factory=list)
    analysis_page: Path | None = None  # analysis.html, when the analysis ran
    files: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)  # an earlier run's artefacts this run removed
    search_section: str | None = None  # Markdown of the accuracy-budget search (--max-drop), when it ran
    timings: Timings = field(default_factory=Timings)


_ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Gelu"}


def _disabled_reason(sim: Any, q: Any) -> str:
    """Why the config leaves a quantizer off, read from the prepared graph (placement keeps no reasons)."""
    tensor = q.tensors[0]
    graph = sim.model.graph
    readers = [n for n in graph.node if tensor in n.input]
    writer = next((n for n in graph.node if tensor in n.output), None)
    if q.role == "param":
        biased = [n for n in readers if len(n.input) > 2 and n.input[2] == tensor]
        if any(n.op_type in ("Conv", "ConvTranspose", "Gemm") for n in biased):
            return "bias: the config does not simulate biases (the integer export makes them int32)"
        if biased:
            return f"bias of {biased[0].op_type}: the config does not simulate biases"
        return "parameter: the config's params rules leave it unquantized"
    if len(readers) == 1 and readers[0].op_type in _ACTIVATIONS:
        return f"quantized after the {readers[0].op_type} that follows it (supergroup)"
    if writer is not None:
        return f"output of {writer.op_type}: the config leaves it unquantized (it keeps its input's grid)"
    return "the config leaves it unquantized"


def stayed_float(sim: Any) -> list[tuple[str, str, str]]:
    """``(tensor or node, kind, why)`` for what the sim does not quantize with an integer grid: preparation's and
    placement's float tensors, disabled quantizers and FP16 quantizers."""
    rows = [(what, "left in float", why) for what, why in sim.left_in_float]
    for q in sim.quantizers:
        names = ", ".join(q.tensors)
        if not q.enabled:
            rows.append((names, f"{q.role}, disabled", _disabled_reason(sim, q)))
        elif q.spec.is_float:
            rows.append((names, f"{q.role}, {q.spec.describe()}", "float precision requested (type or override)"))
    return rows


def _health_rows(health: list[Any]) -> list[tuple]:
    return [(h.tensor, format_db(h.sqnr_db), f"{h.codes_used}/{h.codes_available}" if h.codes_used else "-", h.verdict)
            for h in health]


def _layer_rows(reports: list[tuple[str, Any]]) -> list[tuple]:
    def loss(value: float | None) -> str:
        return "-" if value is None else f"{value:.4g}"
    return [(step, r.node, r.op_type, r.status + (f" ({r.reason})" if r.reason else ""), loss(r.loss_before),
             loss(r.loss_after), f"{r.seconds:.2f}") for step, r in reports]


def write_quantize_report(path: Path, result: QuantizeResult) -> Path:
    """Write ``report.md``: settings, output agreement, per-layer SQNR, weight optimisation, precision overrides,
    what stayed float and why, files and timings."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"# quantsim report: {Path(result.model).name}", "",
             f"{now}. {result.quantizers} quantizers ({result.enabled} enabled), calibrated on {result.batches} "
             f"batch(es) from {result.data}.", "", "## Settings", "",
             markdown_table(("option", "value"), result.settings), ""]
    if result.search_section:
        parts += [result.search_section, ""]
    if result.agreement is not None:
        parts += ["## Outputs against the float model", "",
                  "On the analysis batches (the first `--analysis-batches` of the data).", "",
                  markdown_table(("output", "SQNR", "max abs error", "max abs float", "top-1 agreement"),
                                 [(o.name, format_db(o.sqnr_db), f"{o.max_abs_error:.4g}", f"{o.max_abs_reference:.4g}",
                                   percent(o.top1_agreement)) for o in result.agreement.rows()]), ""]
    if result.health:
        parts += ["## Per-layer SQNR (quantized activations, worst first)", "",
                  "Each tensor's value in the sim against the float model, and the grid codes its values use; "
                  "collapsed grids come first with the usual fix."
                  + (f" Charts, ranges and histograms: [{result.analysis_page.name}]({result.analysis_page.name})."
                     if result.analysis_page is not None else ""), "",
                  markdown_table(("tensor", "SQNR", "codes used", "verdict"), _health_rows(result.health)), ""]
    if result.layer_reports:
        parts += ["## Weight optimisation", "",
                  markdown_table(("step", "node", "op", "status", "loss before", "loss after", "seconds"),
                                 _layer_rows(result.layer_reports)), ""]
    if result.overrides:
        parts += ["## Precision overrides", "",
                  markdown_table(("node", "preset", "rule"), result.overrides), ""]
    parts += ["## What stayed float, and why", ""]
    parts += [markdown_table(("tensor / node", "kind", "why"), result.float_rows) if result.float_rows
              else "Every tensor the config asks to quantize is quantized.", ""]
    if result.integer_report:
        parts += ["Integer export: nodes left in float", "",
                  markdown_table(("node", "op type", "why"), [tuple(e) for e in result.integer_report]), ""]
    parts += ["## Files", "", "Written by this run (and `report.md`):", ""] + [f"- `{f.name}`" for f in result.files] + [""]
    if result.removed:
        parts += ["Removed (left in this folder by an earlier run with the same prefix): "
                  + ", ".join(f"`{f.name}`" for f in result.removed) + ".", ""]
    parts += ["## Timings", "", markdown_table(("step", "seconds"),
                                                [(s, f"{t:.2f}") for s, t in result.timings.steps]
                                                + [("total", f"{result.timings.total:.2f}")]), ""]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
