"""`QuantAnalyzer`'s results as one self-contained HTML page (inline CSS and SVG, no script), written atomically:
where AIMET writes one bokeh page per chart, this page holds them all, each chart followed by its numbers in a
collapsed table. It renders the dict `QuantAnalyzer.analyze` returns (the same data as its JSON files).
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mixed_precision.files import write_text_atomic
from mixed_precision.html_page import CHART_ROWS, WORST_SHOWN, card, number, page, table
from mixed_precision.svg import bar_chart, escape, format_number, histogram

__all__ = ["QUANT_ANALYZER_PAGE", "render_quant_analyzer_html", "write_quant_analyzer_html", "DISPLAY_BINS"]

QUANT_ANALYZER_PAGE = "quant_analyzer.html"
DISPLAY_BINS = 64  # bins drawn per histogram (the JSON files keep every bin)


def _details(summary: str, header: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[int]) -> str:
    return f"<details><summary>{escape(summary)}</summary>{table(header, rows, numeric=numeric)}</details>"


def _sensitivity(report: Mapping[str, Any]) -> list[str]:
    enabled, disabled = report.get("per_layer_quant_enabled") or {}, report.get("per_layer_quant_disabled") or {}
    out = ["<h2>Per-layer sensitivity</h2>",
           '<p class="muted">Score with only this layer\'s quantizers enabled (low: the layer costs accuracy) and with '
           "only them disabled (high: keeping it float recovers accuracy); the most sensitive first.</p>"]
    names = sorted(enabled, key=lambda n: _key(enabled[n])) or sorted(disabled, key=lambda n: -_key(disabled[n]))
    if not names:
        return out + ["<p>No layers were scored.</p>"]
    shown = names[:CHART_ROWS]
    markers = [(f"{label} {number(report[key])}", float(report[key])) for label, key in
               (("float", "float_score"), ("quantized", "quantized_score")) if report.get(key) is not None]
    out.append(bar_chart(shown, [("only this layer quantized", [enabled.get(n) for n in shown]),
                                 ("only this layer float", [disabled.get(n) for n in shown])],
                         title=f"layers ({len(shown)} of {len(names)})", markers=markers))
    out.append(_details(f"All {len(names)} layers", ("layer", "only it quantized", "only it float"),
                        [(n, number(enabled.get(n)), number(disabled.get(n))) for n in names], (1, 2)))
    return out


def _key(value: Any) -> float:
    return math.inf if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _ranges(title: str, ranges: Mapping[str, Any]) -> list[str]:
    rows = []  # (name, min, max, channels)
    for name, value in ranges.items():
        if isinstance(value, Mapping):
            lows, highs = [v[0] for v in value.values()], [v[1] for v in value.values()]
            rows.append((name, min(lows), max(highs), len(value)))
        else:
            rows.append((name, value[0], value[1], 1))
    out = [f"<h2>Encoding ranges: {escape(title)}</h2>"]
    if not rows:
        return out + ["<p>None.</p>"]
    rows.sort(key=lambda r: r[1] - r[2])  # widest first
    shown = rows[:CHART_ROWS]
    out.append('<p class="muted">Each quantizer\'s encoding [min, max] (per-channel parameters: the widest over '
               "their channels), widest first.</p>")
    out.append(bar_chart([r[0] for r in shown], [("min", [r[1] for r in shown]), ("max", [r[2] for r in shown])],
                         title=f"{title} ({len(shown)} of {len(rows)})"))
    out.append(_details(f"All {len(rows)} {title}", ("name", "min", "max", "channels"),
                        [(r[0], format_number(r[1]), format_number(r[2]), r[3]) for r in rows], (1, 2, 3)))
    return out


def _histograms(histograms: Mapping[str, Any] | None) -> list[str]:
    if not histograms:
        return []
    out = ["<h2>Activation histograms</h2>",
           f'<p class="muted">Share of each activation\'s float values per bin over their range on the calibration data '
           f"(the widest {min(WORST_SHOWN, len(histograms))} of {len(histograms)}; every bin of every tensor is in "
           "activations_pdf/), with the encoding's range.</p>"]

    def width(item):
        buckets = item[1]["histogram"]
        return -(buckets[-1][0] - buckets[0][0]) if len(buckets) > 1 else 0.0

    for name, data in sorted(histograms.items(), key=width)[:WORST_SHOWN]:
        buckets = data["histogram"]
        if len(buckets) < 2:
            continue
        step = max(1, len(buckets) // DISPLAY_BINS)
        lefts = [b[0] for b in buckets]
        bin_width = lefts[1] - lefts[0]
        shares = [100.0 * sum(b[1] for b in buckets[i:i + step]) for i in range(0, len(buckets), step)]
        edges = [lefts[i] for i in range(0, len(buckets), step)] + [lefts[-1] + bin_width]
        enc = data.get("encoding") or {}
        out.append(f"<div><code>{escape(name)}</code> <span class=\"muted\">encoding [{format_number(enc.get('min'))}, "
                   f"{format_number(enc.get('max'))}]</span>"
                   + histogram(shares, edges, title="% of values per bin (height: log)", log_counts=True) + "</div>")
    return out


def _mse(mse: Mapping[str, float] | None) -> list[str]:
    if mse is None:
        return []
    out = ["<h2>Per-layer MSE</h2>",
           '<p class="muted">Mean squared difference between the float model\'s layer output and the sim\'s (AIMET\'s '
           "figure: summed over batches, divided by the number of samples), largest first.</p>"]
    names = sorted(mse, key=lambda n: -mse[n])
    if not names:
        return out + ["<p>No layer outputs have quantizers.</p>"]
    shown = names[:CHART_ROWS]
    out.append(bar_chart(shown, [("MSE", [mse[n] for n in shown])], title=f"layers ({len(shown)} of {len(names)})"))
    out.append(_details(f"All {len(names)} layers", ("layer", "MSE"), [(n, format_number(mse[n])) for n in names],
                        (1,)))
    return out


def render_quant_analyzer_html(report: Mapping[str, Any], *, title: str = "Quantization analysis") -> str:
    """The page's HTML text for `QuantAnalyzer.analyze`'s result."""
    cards = [card(label, number(report.get(key))) for label, key in
             (("float", "float_score"), ("weights quantized", "weight_quantized_score"),
              ("activations quantized", "activation_quantized_score"), ("all quantized", "quantized_score"))
             if key in report]
    body = [f"<h1>{escape(title)}</h1>", '<p class="muted">Scores from the evaluation callback; higher is better.</p>',
            '<div class="cards">' + "".join(cards) + "</div>"]
    body += _sensitivity(report)
    body += _ranges("activations", report.get("activations_min_max") or {})
    body += _ranges("weights", report.get("weights_min_max") or {})
    body += _histograms(report.get("activation_histograms"))
    body += _mse(report.get("per_layer_mse_loss"))
    return page(title, body)


def write_quant_analyzer_html(report: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write the page for ``report`` to ``path`` atomically."""
    return write_text_atomic(path, render_quant_analyzer_html(report))
