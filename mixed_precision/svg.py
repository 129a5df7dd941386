"""Inline SVG charts for the HTML reports: pure functions from numbers to an ``<svg>`` string.

No plotting dependency, no script, no external resource: each chart is one self-contained ``<svg>`` element
(valid XML, so it also opens as a ``.svg`` file) that a browser draws inline in an HTML page. Every piece of
text (tensor names can hold ``<``, ``&`` and quotes) goes through `escape`. Each data mark carries a class
(``bar``, ``point``, ``bin``) and a ``<title>`` child with its exact value, shown as a tooltip.

Geometry: a value ``v`` on an axis whose ticks run from ``t0`` to ``t1`` sits at
``start + (v - t0) / (t1 - t0) * length``; bars grow from zero (or from the axis start when zero is outside).
Ticks are "nice" numbers (steps of 1, 2, 2.5 or 5 times a power of ten) that enclose the data.
"""
from __future__ import annotations

import html
import math
from collections.abc import Collection, Sequence

__all__ = ["escape", "format_number", "nice_ticks", "bar_chart", "line_chart", "histogram", "PALETTE", "HIGHLIGHT"]

PALETTE = ("#4477aa", "#ee8833", "#228833", "#aa3377", "#66ccee")
HIGHLIGHT = "#cc3311"
_FONT = 'font-family="sans-serif" font-size="11"'
_CHAR_WIDTH = 6.2  # average width of an 11px sans-serif character, for laying out labels


def escape(text: object) -> str:
    """``text`` safe inside SVG/HTML text and double- or single-quoted attributes."""
    return html.escape(str(text), quote=True)


def format_number(value: float | None) -> str:
    """Four significant digits; ``-`` for None or NaN, ``inf``/``-inf`` for infinities."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` evenly spaced round numbers, the first ``<= lo`` and the last ``>= hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"ticks need a finite range, got [{lo}, {hi}]")
    lo, hi = min(lo, hi), max(lo, hi)
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * magnitude >= raw * (1 - 1e-9))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    digits = max(0, -math.floor(math.log10(step)) + 2)
    return [round(k * step, digits) + 0.0 for k in range(first, last + 1)]


def _scale(value: float, domain: tuple[float, float], start: float, length: float) -> float:
    return start + (value - domain[0]) / (domain[1] - domain[0]) * length


def _n(value: float) -> str:
    """A coordinate, to a hundredth of a pixel."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _svg(width: float, height: float, title: str, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{_n(width)}" height="{_n(height)}" '
            f'viewBox="0 0 {_n(width)} {_n(height)}" role="img" aria-label="{escape(title)}" {_FONT}>'
            f"<title>{escape(title)}</title>" + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}"{extra}>{escape(text)}</text>'


def _shorten(label: str, chars: int) -> str:
    return label if len(label) <= chars else "\u2026" + label[-(chars - 1):]


def bar_chart(labels: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], *, title: str,
              unit: str = "", markers: Sequence[tuple[str, float]] = (), highlight: Collection[int] = (),
              missing: str = "n/a", width: float = 760, bar_height: float = 12, label_width: float | None = None) -> str:
    """Horizontal bars, one row per label and one bar per series in each row (a legend when several).

    ``series`` is ``[(name, values)]`` with one value per label; a None or non-finite value draws no bar and
    writes ``missing`` (e.g. ``"exact"`` for an infinite SQNR). ``markers`` are labelled vertical lines
    (e.g. the float model's score); rows whose index is in ``highlight`` get a red label.
    """
    for name, values in series:
        if len(values) != len(labels):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(labels)} labels")
    finite = [float(v) for v in [*(v for _, values in series for v in values), *(v for _, v in markers)]
              if v is not None and math.isfinite(v)]
    ticks = nice_ticks(min([0.0, *finite]), max([0.0, *finite]) if finite else 1.0)
    domain = (ticks[0], ticks[-1])
    longest = max((len(s) for s in labels), default=0)
    left = label_width if label_width is not None else min(280.0, 12 + _CHAR_WIDTH * longest)
    chars = max(4, int((left - 12) / _CHAR_WIDTH))
    right, top = 64.0, 24.0 + (16.0 if len(series) > 1 else 0.0)
    plot = width - left - right
    row = bar_height * len(series) + 6
    height = top + row * len(labels) + 30 + 12 * len(markers)
    zero = _scale(min(max(0.0, domain[0]), domain[1]), domain, left, plot)
    body = [_text(4, 14, title, extra=' font-weight="bold"')]
    if len(series) > 1:
        x = left
        for i, (name, _) in enumerate(series):
            body.append(f'<rect x="{_n(x)}" y="22" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
            body.append(_text(x + 14, 31, name))
            x += 30 + _CHAR_WIDTH * len(name)
    bottom = top + row * len(labels)
    for t in ticks:
        x = _scale(t, domain, left, plot)
        body.append(f'<line x1="{_n(x)}" y1="{_n(top)}" x2="{_n(x)}" y2="{_n(bottom)}" stroke="#ddd"/>')
        body.append(_text(x, bottom + 14, format_number(t) + unit, "middle"))
    for i, label in enumerate(labels):
        y = top + i * row + 3
        colour = f' fill="{HIGHLIGHT}"' if i in highlight else ""
        body.append(f'<text x="{_n(left - 6)}" y="{_n(y + row / 2)}" text-anchor="end"{colour}>'
                    f"<title>{escape(label)}</title>{escape(_shorten(label, chars))}</text>")
        for k, (name, values) in enumerate(series):
            value, by = values[i], y + k * bar_height
            if not _finite(value):
                body.append(_text(zero + 4, by + bar_height - 2, missing, extra=' fill="#666"'))
                continue
            assert value is not None
            end = _scale(value, domain, left, plot)
            x0, x1 = min(zero, end), max(zero, end)
            tip = f"{label} \u2014 {name}: {format_number(value)}{unit}"
            body.append(f'<rect class="bar" x="{_n(x0)}" y="{_n(by)}" width="{_n(x1 - x0)}" '
                        f'height="{_n(bar_height - 1)}" fill="{PALETTE[k % len(PALETTE)]}">'
                        f"<title>{escape(tip)}</title></rect>")
            body.append(_text(x1 + 3, by + bar_height - 2, format_number(value) + unit, extra=' fill="#333"'))
    body.append(f'<line x1="{_n(zero)}" y1="{_n(top)}" x2="{_n(zero)}" y2="{_n(bottom)}" stroke="#888"/>')
    for m, (name, value) in enumerate(markers):
        if _finite(value):
            x = _scale(value, domain, left, plot)
            body.append(f'<line class="marker" x1="{_n(x)}" y1="{_n(top - 4)}" x2="{_n(x)}" y2="{_n(bottom)}" '
                        f'stroke="{HIGHLIGHT}" stroke-dasharray="4 3"><title>{escape(name)}</title></line>')
            body.append(_text(x, bottom + 28 + 12 * m, name, "middle", f' fill="{HIGHLIGHT}"'))
    return _svg(width, height, title, body)


def line_chart(points: Sequence[tuple[float, float]], *, title: str, x_label: str, y_label: str,
               point_labels: Sequence[str] | None = None, highlight: int | None = None, connect: bool = True,
               width: float = 760, height: float = 380) -> str:
    """Points on x/y axes with ticks, joined in the given order when ``connect``; the point at index
    ``highlight`` is drawn larger, in red, with its label. Points with a non-finite coordinate are left out."""
    shown = [i for i, (x, y) in enumerate(points) if _finite(x) and _finite(y)]
    xs, ys = [points[i][0] for i in shown] or [0.0], [points[i][1] for i in shown] or [0.0]
    xticks, yticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    xdom, ydom = (xticks[0], xticks[-1]), (yticks[0], yticks[-1])
    left, right, top, bottom = 64.0, 24.0, 28.0, 48.0
    plot_w, plot_h = width - left - right, height - top - bottom

    def at(x: float, y: float) -> tuple[float, float]:
        return _scale(x, xdom, left, plot_w), top + plot_h - (_scale(y, ydom, 0.0, plot_h))

    body = [_text(4, 16, title, extra=' font-weight="bold"')]
    base = top + plot_h
    for t in xticks:
        x = _scale(t, xdom, left, plot_w)
        body.append(f'<line x1="{_n(x)}" y1="{_n(top)}" x2="{_n(x)}" y2="{_n(base)}" stroke="#eee"/>')
        body.append(_text(x, base + 14, format_number(t), "middle"))
    for t in yticks:
        y = at(xdom[0], t)[1]
        body.append(f'<line x1="{_n(left)}" y1="{_n(y)}" x2="{_n(left + plot_w)}" y2="{_n(y)}" stroke="#eee"/>')
        body.append(_text(left - 4, y + 4, format_number(t), "end"))
    body.append(f'<path d="M{_n(left)} {_n(top)}V{_n(base)}H{_n(left + plot_w)}" fill="none" stroke="#555"/>')
    body.append(_text(left + plot_w / 2, height - 8, x_label, "middle"))
    body.append(f'<text x="14" y="{_n(top + plot_h / 2)}" text-anchor="middle" '
                f'transform="rotate(-90 14 {_n(top + plot_h / 2)})">{escape(y_label)}</text>')
    coords = {i: at(*points[i]) for i in shown}
    if connect and len(shown) > 1:
        path = " ".join(f"{_n(x)},{_n(y)}" for x, y in (coords[i] for i in shown))
        body.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE[0]}" stroke-width="1.5"/>')

    def label(i: int) -> str:
        return point_labels[i] if point_labels is not None else f"point {i}"

    def tip(i: int) -> str:
        return escape(f"{label(i)}: {x_label} {format_number(points[i][0])}, {y_label} {format_number(points[i][1])}")

    for i in shown:
        if i != highlight:
            x, y = coords[i]
            body.append(f'<circle class="point" cx="{_n(x)}" cy="{_n(y)}" r="3.5" fill="{PALETTE[0]}">'
                        f"<title>{tip(i)}</title></circle>")
    if highlight is not None and highlight in coords:
        x, y = coords[highlight]
        body.append(f'<circle class="point highlight" cx="{_n(x)}" cy="{_n(y)}" r="7" fill="none" '
                    f'stroke="{HIGHLIGHT}" stroke-width="2.5"><title>{tip(highlight)}</title></circle>')
        body.append(f'<circle cx="{_n(x)}" cy="{_n(y)}" r="3.5" fill="{HIGHLIGHT}"/>')
        anchor = "end" if x > left + plot_w * 0.7 else "start"
        body.append(_text(x + (-10 if anchor == "end" else 10), y - 10, label(highlight), anchor,
                          f' fill="{HIGHLIGHT}" font-weight="bold"'))
    return _svg(width, height, title, body)


def histogram(counts: Sequence[int], edges: Sequence[float], *, title: str, x_label: str = "",
              below: int = 0, above: int = 0, log_counts: bool = False, width: float = 360, height: float = 150) -> str:
    """Vertical bins (``len(edges) == len(counts) + 1``); ``below``/``above`` count values outside the edges
    (written at the ends, e.g. values clipped by a grid). ``log_counts`` scales bar heights by log(1 + count)."""
    if len(edges) != len(counts) + 1:
        raise ValueError(f"a histogram needs len(counts) + 1 edges, got {len(edges)} edges for {len(counts)} counts")
    left, right, top, bottom = 34.0, 34.0, 22.0, 30.0
    plot_w, plot_h = width - left - right, height - top - bottom
    lo, hi = float(edges[0]), float(edges[-1])
    domain = (lo, hi) if hi > lo else (lo - 1.0, lo + 1.0)

    def tall(count: float) -> float:
        return math.log1p(count) if log_counts else float(count)

    peak = max((tall(c) for c in counts), default=0.0) or 1.0
    base = top + plot_h
    body = [_text(4, 14, title, extra=' font-weight="bold"')]
    for i, count in enumerate(counts):
        x0, x1 = _scale(edges[i], domain, left, plot_w), _scale(edges[i + 1], domain, left, plot_w)
        h = tall(count) / peak * plot_h
        tip = f"[{format_number(edges[i])}, {format_number(edges[i + 1])}): {count}"
        body.append(f'<rect class="bin" x="{_n(x0)}" y="{_n(base - h)}" width="{_n(max(x1 - x0 - 0.5, 0.5))}" '
                    f'height="{_n(h)}" fill="{PALETTE[0]}"><title>{escape(tip)}</title></rect>')
    body.append(f'<line x1="{_n(left)}" y1="{_n(base)}" x2="{_n(left + plot_w)}" y2="{_n(base)}" stroke="#555"/>')
    ticks = [t for t in nice_ticks(*domain, count=4) if domain[0] <= t <= domain[1]]
    for t in ticks:
        x = _scale(t, domain, left, plot_w)
        body.append(f'<line x1="{_n(x)}" y1="{_n(base)}" x2="{_n(x)}" y2="{_n(base + 3)}" stroke="#555"/>')
        body.append(_text(x, base + 13, format_number(t), "middle"))
    if below:
        body.append(_text(left - 2, base - 2, f"\u2190{below}", "end", f' fill="{HIGHLIGHT}"'))
    if above:
        body.append(_text(left + plot_w + 2, base - 2, f"{above}\u2192", "start", f' fill="{HIGHLIGHT}"'))
    if x_label:
        body.append(_text(left + plot_w / 2, height - 4, x_label, "middle", ' fill="#555"'))
    return _svg(width, height, title, body)
