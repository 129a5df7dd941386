"""The analysis and Pareto reports as single self-contained HTML pages (inline CSS and SVG, no script, nothing
fetched from elsewhere), written atomically.

`write_analysis_html` renders `mixed_precision.report_dict`'s output (or its JSON, where infinite SQNRs are
None) so it reads top-down without scrolling through numbers: the summary (float against quantized score),
the worst tensors first with their suggested fix and a histogram of their values over their grid, per-group
sensitivity and per-tensor SQNR charts, how much of each grid the values use, then every number in collapsed
tables. `write_pareto_html` draws automatic mixed precision's Pareto front (relative bit-operations against
score) with the chosen point highlighted, and its table.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mixed_precision.files import write_text_atomic
from mixed_precision.svg import bar_chart, escape, format_number, histogram, line_chart
from quantsim import InvalidArgumentError

__all__ = ["write_analysis_html", "write_pareto_html", "render_analysis_html", "render_pareto_html",
           "render_layer_sensitivity_html", "write_layer_sensitivity_html",
           "WORST_SHOWN", "CHART_ROWS", "INHERITED_MARGIN_DB", "page", "table", "card", "number"]

WORST_SHOWN = 8  # tensors listed first, each with its fix and histogram
CHART_ROWS = 40  # rows per bar chart; every row is in the collapsed tables
#: a tensor whose end-to-end SQNR is this much below its own grid's inherits its error from earlier quantizers
INHERITED_MARGIN_DB = 10.0

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1120px;padding:0 16px;
color:#222;line-height:1.4}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.2em;margin-top:32px;border-bottom:1px solid #ddd}
.muted{color:#666}.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:140px}
.card b{display:block;font-size:1.4em}.bad{color:#cc3311}.good{color:#228833}
.worst{display:grid;grid-template-columns:minmax(0,1fr) 360px;gap:8px 16px;border:1px solid #eee;
border-left:4px solid #cc3311;padding:8px 12px;margin:8px 0}.worst.ok{border-left-color:#bbb}
.worst code{word-break:break-all;font-weight:bold}
table{border-collapse:collapse;font-size:.9em;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.flag td:first-child,tr.chosen td{font-weight:bold}tr.chosen{background:#fde8e4}
details{margin:8px 0}summary{cursor:pointer;font-weight:bold}svg.chart{max-width:100%;height:auto}
"""


# ---- shared page pieces ------------------------------------------------------------------------------------
def _page(title: str, body: Sequence[str]) -> str:
    """A complete HTML document titled ``title`` with the reports' inline CSS around the ``body`` pieces."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], classes: Sequence[str] | None = None,
           numeric: Sequence[int] = ()) -> str:
    """An HTML table (cells escaped); ``classes`` per row, columns in ``numeric`` right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    lines = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="num">{escape(c)}</td>' if k in numeric else f"<td>{escape(c)}</td>"
                        for k, c in enumerate(row))
        lines.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def _card(label: str, value: str, cls: str = "") -> str:
    """A summary card: a muted label over a large value (``cls``: "bad" / "good" colours it)."""
    return f'<div class="card"><span class="muted">{escape(label)}</span><b class="{cls}">{escape(value)}</b></div>'


def _num(value: float | None, unit: str = "") -> str:
    """A score or SQNR: None (JSON's infinity) and inf read as exact."""
    if value is None or (isinstance(value, float) and math.isinf(value) and value > 0):
        return "\u221e"
    return format_number(value) + unit


# ---- the analysis page ---------------------------------------------------------------------------------------
def _group_label(group: Mapping[str, Any]) -> str:
    nodes = list(group.get("nodes") or ())
    return ", ".join(nodes) if nodes else "(" + ", ".join(group.get("quantizers") or ()) + ")"


def _fix(row: Mapping[str, Any]) -> str:
    """The suggested fix: the verdict when flagged, else whether the error is the tensor's own."""
    verdict = row.get("verdict", "ok")
    if verdict != "ok":
        return str(verdict)
    sqnr, own = row.get("sqnr_db"), row.get("grid_sqnr_db")
    if sqnr is not None and own is not None and own - sqnr > INHERITED_MARGIN_DB:
        return (f"its own grid keeps {own:.1f} dB: the loss comes from earlier quantizers (see the group "
                "sensitivity below), not from this range")
    return "no range problem: nothing to change here"


def _codes(row: Mapping[str, Any]) -> str:
    return f"{row['codes_used']} of {row['codes_available']}" if row.get("codes_used") else "-"


def _range(lo: float | None, hi: float | None) -> str:
    return "-" if lo is None or hi is None else f"[{format_number(lo)}, {format_number(hi)}]"


def _histogram_svg(row: Mapping[str, Any]) -> str:
    counts, lo, hi = list(row.get("histogram") or ()), row.get("grid_min"), row.get("grid_max")
    if not counts or lo is None or hi is None:
        return '<p class="muted">no histogram (no per-tensor grid)</p>'
    edges = [lo + (hi - lo) * i / len(counts) for i in range(len(counts) + 1)]
    below, above = (list(row.get("clipped") or (0, 0)) + [0, 0])[:2]
    return histogram(counts, edges, title="values on the grid's codes (height: log count)", log_counts=True,
                     below=below, above=above, x_label="values outside the grid: counted at its ends" if below or above else "")


def _worst_section(tensors: Sequence[Mapping[str, Any]]) -> list[str]:
    flagged = sum(row.get("verdict", "ok") != "ok" for row in tensors)
    out = ["<h2>Worst tensors first</h2>",
           f'<p class="muted">{flagged} of {len(tensors)} quantized activations flagged; the {min(WORST_SHOWN, len(tensors))} '
           "worst (flagged, then by SQNR against the float model) with the suggested fix.</p>"]
    for row in tensors[:WORST_SHOWN]:
        ok = row.get("verdict", "ok") == "ok"
        facts = (f"SQNR {_num(row.get('sqnr_db'), ' dB')} against float, own grid alone "
                 f"{_num(row.get('grid_sqnr_db'), ' dB')}; codes used {_codes(row)}; float range "
                 f"{_range(row.get('float_min'), row.get('float_max'))}, grid {_range(row.get('grid_min'), row.get('grid_max'))}")
        out.append(f'<div class="worst{" ok" if ok else ""}"><div><code>{escape(row["tensor"])}</code>'
                   f'<p class="muted">{escape(facts)}</p><p class="{"" if ok else "bad"}">{escape(_fix(row))}</p></div>'
                   f"<div>{_histogram_svg(row)}</div></div>")
    if not tensors:
        out.append("<p>No calibrated activation quantizers were analysed.</p>")
    return out


def _groups_section(report: Mapping[str, Any], score: str) -> list[str]:
    groups = list(report.get("groups") or ())
    out = ["<h2>Sensitivity per quantizer group</h2>",
           f'<p class="muted">{escape(score)} with only this group quantized (low: the group costs accuracy) and with '
           "only this group left float (high: keeping it float recovers accuracy); the most sensitive first.</p>"]
    if not groups:
        return out + ["<p>No quantizer groups were scored.</p>"]
    shown = groups[:CHART_ROWS]
    markers = [(f"float {_num(report.get('float_score'))}", report.get("float_score")),
               (f"quantized {_num(report.get('quantized_score'))}", report.get("quantized_score"))]
    out.append(bar_chart([_group_label(g) for g in shown],
                         [("only this group quantized", [g.get("alone") for g in shown]),
                          ("only this group float", [g.get("without") for g in shown])],
                         title=f"quantizer groups ({len(shown)} of {len(groups)})", missing="\u221e",
                         markers=[(n, v) for n, v in markers if v is not None]))
    return out


def _sqnr_section(tensors: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["<h2>SQNR per tensor</h2>",
           '<p class="muted">Each quantized activation against the float model (end to end: it carries the error of '
           "every earlier quantizer) and its own grid alone on its float values; red labels are flagged.</p>"]
    if not tensors:
        return out + ["<p>No tensors.</p>"]
    shown = tensors[:CHART_ROWS]
    out.append(bar_chart([str(t["tensor"]) for t in shown],
                         [("end to end", [t.get("sqnr_db") for t in shown]),
                          ("own grid alone", [t.get("grid_sqnr_db") for t in shown])],
                         title=f"SQNR, dB, worst first ({len(shown)} of {len(tensors)})", missing="\u221e",
                         highlight={i for i, t in enumerate(shown) if t.get("verdict", "ok") != "ok"}))
    return out


def _ranges_section(tensors: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["<h2>Ranges</h2>",
           '<p class="muted">Share of each grid\'s codes the values really use (a few per cent: the range is stretched by '
           "outliers or by values of very different sizes sharing one grid), fewest first; the calibrated ranges are "
           "in the table below.</p>"]
    used = sorted((t for t in tensors if t.get("codes_used") and t.get("codes_available")),
                  key=lambda t: t["codes_used"] / t["codes_available"])
    if used:
        shown = used[:CHART_ROWS]
        out.append(bar_chart([str(t["tensor"]) for t in shown],
                             [("codes used", [100.0 * t["codes_used"] / t["codes_available"] for t in shown])],
                             title=f"grid codes used, % ({len(shown)} of {len(used)})", unit="%",
                             highlight={i for i, t in enumerate(shown) if t.get("verdict", "ok") != "ok"}))
    else:
        out.append("<p>No per-tensor grids to count codes on.</p>")
    rows = [(t["tensor"], _range(t.get("float_min"), t.get("float_max")), _range(t.get("grid_min"), t.get("grid_max")),
             *(list(t.get("clipped") or (0, 0)) + [0, 0])[:2]) for t in tensors]
    out.append("<details><summary>Calibrated ranges of every tensor</summary>"
               + _table(("tensor", "float range", "grid range", "clipped below", "clipped above"), rows, numeric=(3, 4))
               + "</details>")
    return out


def _details_section(groups: Sequence[Mapping[str, Any]], tensors: Sequence[Mapping[str, Any]]) -> list[str]:
    group_rows = [(_group_label(g), len(g.get("quantizers") or ()), _num(g.get("alone")), _num(g.get("without")))
                  for g in groups]
    tensor_rows = [(t["tensor"], _num(t.get("sqnr_db"), " dB"), _num(t.get("grid_sqnr_db"), " dB"), _codes(t),
                    t.get("verdict", "ok")) for t in tensors]
    return ["<h2>Every number</h2>",
            f"<details><summary>All {len(groups)} quantizer groups</summary>"
            + _table(("nodes", "quantizers", "only it quantized", "only it float"), group_rows, numeric=(1, 2, 3))
            + "</details>",
            f"<details><summary>All {len(tensors)} tensors</summary>"
            + _table(("tensor", "SQNR", "own grid SQNR", "codes used", "verdict"), tensor_rows,
                     [("flag" if t.get("verdict", "ok") != "ok" else "") for t in tensors], numeric=(1, 2))
            + "</details>"]


def render_analysis_html(report: Mapping[str, Any], *, title: str | None = None) -> str:
    """The analysis page's HTML text (see `write_analysis_html`)."""
    title = title or str(report.get("title") or "quantsim analysis")
    score = str(report.get("score") or "score")
    groups, tensors = list(report.get("groups") or ()), list(report.get("tensors") or ())
    float_score, quantized = report.get("float_score"), report.get("quantized_score")
    cards = [_card("float model", _num(float_score)), _card("quantized model", _num(quantized))]
    if float_score is not None and quantized is not None:
        change = quantized - float_score
        cards.append(_card("change", f"{change:+.4g}", "bad" if change < 0 else "good"))
    flagged = sum(t.get("verdict", "ok") != "ok" for t in tensors)
    cards += [_card("quantizer groups", str(len(groups))),
              _card("tensors flagged", f"{flagged} of {len(tensors)}", "bad" if flagged else "good")]
    body = [f"<h1>{escape(title)}</h1>", f'<p class="muted">Score: {escape(score)}; higher is better.</p>',
            '<div class="cards">' + "".join(cards) + "</div>"]
    if groups:
        worst = groups[0]
        best = max(groups, key=lambda g: _sort_key(g.get("without")))
        body.append(f"<p>Most sensitive group: <code>{escape(_group_label(worst))}</code> ({_num(worst.get('alone'))} "
                    f"with only it quantized). Keeping <code>{escape(_group_label(best))}</code> float recovers the "
                    f"most ({_num(best.get('without'))}).</p>")
    body += _worst_section(tensors) + _groups_section(report, score) + _sqnr_section(tensors)
    body += _ranges_section(tensors) + _details_section(groups, tensors)
    return _page(title, body)


def _sort_key(value: float | None) -> float:
    return math.inf if value is None else float(value)


def write_analysis_html(report: Mapping[str, Any], path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Write the analysis page for ``report`` (`report_dict` output, or its JSON form) to ``path`` atomically.

    Optional keys ``title`` and ``score`` (what the score measures) label the page; tensor rows without the
    range and histogram fields (older reports) render without them.
    """
    return write_text_atomic(path, render_analysis_html(report, title=title))


# ---- the Pareto page -----------------------------------------------------------------------------------------
def _checked_points(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    for i, point in enumerate(points):
        for key in ("bitops_ratio", "score", "label"):
            if key not in point:
                raise InvalidArgumentError(f"Pareto point {i} has no {key!r} (keys: {sorted(point)})")
    return list(points)


def _precision_summary(precisions: Mapping[str, Any] | None) -> str:
    if not precisions:
        return "-"
    counts = Counter(str(p) for p in precisions.values())
    return ", ".join(f"{name} \u00d7{n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def render_pareto_html(points: Sequence[Mapping[str, Any]], chosen: int | None, title: str) -> str:
    """The Pareto page's HTML text (see `write_pareto_html`)."""
    points = _checked_points(points)
    if chosen is not None and not 0 <= chosen < len(points):
        raise InvalidArgumentError(f"chosen point {chosen} is not one of the {len(points)} Pareto points")
    order = sorted(range(len(points)), key=lambda i: float(points[i]["bitops_ratio"]))
    body = [f"<h1>{escape(title)}</h1>"]
    if chosen is not None:
        c = points[chosen]
        body.append('<div class="cards">' + _card("chosen", str(c["label"]))
                    + _card("relative bit-operations", format_number(float(c["bitops_ratio"])))
                    + _card("score", _num(c["score"])) + _card("points", str(len(points))) + "</div>")
    else:
        body.append(f"<p>{len(points)} points; none chosen.</p>")
    body.append("<h2>Pareto front</h2>")
    body.append(line_chart([(float(points[i]["bitops_ratio"]), _float(points[i]["score"])) for i in order],
                           title="score against relative bit-operations", x_label="relative bit-operations",
                           y_label="score", point_labels=[str(points[i]["label"]) for i in order],
                           highlight=order.index(chosen) if chosen is not None else None))
    rows = [("\u2605" if i == chosen else "", points[i]["label"], format_number(float(points[i]["bitops_ratio"])),
             _num(points[i]["score"]), _precision_summary(points[i].get("precisions"))) for i in order]
    body.append("<h2>Points</h2>" + _table(("", "label", "relative bit-operations", "score", "precisions"), rows,
                                           ["chosen" if i == chosen else "" for i in order], numeric=(2, 3)))
    if chosen is not None and points[chosen].get("precisions"):
        mapping = points[chosen]["precisions"]
        body.append(f"<details><summary>Precision of every group at the chosen point ({len(mapping)})</summary>"
                    + _table(("group", "precision"), [(g, p) for g, p in mapping.items()]) + "</details>")
    return _page(title, body)


def _float(value: Any) -> float:
    return math.inf if value is None else float(value)


def write_pareto_html(path: str | os.PathLike, points: Sequence[Mapping[str, Any]], chosen: int | None,
                      title: str) -> Path:
    """Write the Pareto page to ``path`` atomically: score against relative bit-operations for each point
    (mappings with ``bitops_ratio``, ``score``, ``label`` and optionally ``precisions``, group -> precision
    name), joined in bit-operations order, the point at index ``chosen`` highlighted, and the points' table."""
    return write_text_atomic(path, render_pareto_html(points, chosen, title))


# ---- the per-layer sensitivity page --------------------------------------------------------------------------
def render_layer_sensitivity_html(scores: Mapping[str, float], title: str) -> str:
    """A page of per-node scores (`analyze_per_layer_sensitivity`): the lowest (most sensitive) first, as a bar
    chart of the first `CHART_ROWS` and a table of all."""
    order = sorted(scores, key=lambda name: _sort_key(scores[name]))
    shown = order[:CHART_ROWS]
    body = [f"<h1>{escape(title)}</h1>",
            f"<p class=\"muted\">{len(scores)} nodes, each scored with only its own quantizers enabled; the lowest "
            "score is the most sensitive node.</p>",
            bar_chart(shown, [("score", [scores[name] for name in shown])], title="score, lowest first"),
            _table(["node", "score"], [(name, _num(scores[name])) for name in order], numeric=(1,))]
    return _page(title, body)


def write_layer_sensitivity_html(scores: Mapping[str, float], path: str | os.PathLike, *,
                                 title: str = "Per-layer sensitivity (quantizers enabled)") -> Path:
    """Write `render_layer_sensitivity_html`'s page to ``path`` atomically."""
    return write_text_atomic(path, render_layer_sensitivity_html(scores, title))


#: the page pieces other report pages (`mixed_precision.quant_analyzer_page`) are built from
page, table, card, number = _page, _table, _card, _num
