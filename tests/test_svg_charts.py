"""The inline SVG charts: well-formed XML, escaped text, and marks where hand-worked geometry puts them."""
import xml.etree.ElementTree as ET

import pytest

from mixed_precision.svg import bar_chart, escape, format_number, histogram, line_chart, nice_ticks

NS = {"svg": "http://www.w3.org/2000/svg"}
NASTY = "a<b>&\"c'd"


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def _marks(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def _f(e: ET.Element, attr: str) -> float:
    return float(e.get(attr))


def test_nice_ticks_enclose_the_data_in_round_steps():
    assert nice_ticks(0, 1) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(3, 97) == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    assert nice_ticks(-5, 15) == [-5.0, 0.0, 5.0, 10.0, 15.0]
    assert nice_ticks(0, 25) == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    assert nice_ticks(0.001, 0.0037) == [0.001, 0.002, 0.003, 0.004]
    ticks = nice_ticks(7, 7)  # one value: padded around it
    assert ticks[0] < 7 < ticks[-1]
    with pytest.raises(ValueError):
        nice_ticks(0, float("inf"))


def test_escape_and_number_formats():
    assert escape(NASTY) == "a&lt;b&gt;&amp;&quot;c&#x27;d"
    assert [format_number(v) for v in (None, float("nan"), float("inf"), -float("inf"), 1234.5678, 0.5)] == [
        "-", "-", "inf", "-inf", "1235", "0.5"]


def test_bar_lengths_follow_the_values_and_names_are_escaped():
    # label column 100 px, right margin 64: 236 px of plot for ticks 0..25
    svg = bar_chart(["first", NASTY], [("score", [10.0, 25.0])], title=f"t {NASTY}", width=400, label_width=100)
    assert NASTY not in svg and escape(NASTY) in svg
    root = _parse(svg)
    bars = _marks(root, "bar")
    assert [round(_f(b, "x"), 2) for b in bars] == [100.0, 100.0]
    assert [round(_f(b, "width"), 2) for b in bars] == [round(10 / 25 * 236, 2), 236.0]
    assert _f(bars[0], "y") < _f(bars[1], "y")  # rows in the given order, top down
    texts = ["".join(e.itertext()) for e in root.iter(f"{{{NS['svg']}}}text")]
    assert any(NASTY in t for t in texts)  # the parser gives the original name back
    assert root.find("svg:title", NS).text == f"t {NASTY}"


def test_negative_values_grow_left_from_zero_and_missing_values_draw_no_bar():
    svg = bar_chart(["a", "b", "c"], [("s", [-5.0, 15.0, None])], title="t", width=400, label_width=100,
                    missing="exact", markers=[("float", 10.0)])
    root = _parse(svg)
    bars = _marks(root, "bar")
    assert len(bars) == 2  # ticks -5..15 over 236 px: zero at 100 + 5/20 * 236 = 159
    assert (round(_f(bars[0], "x"), 2), round(_f(bars[0], "width"), 2)) == (100.0, 59.0)
    assert (round(_f(bars[1], "x"), 2), round(_f(bars[1], "width"), 2)) == (159.0, 177.0)
    assert "exact" in svg
    marker = _marks(root, "marker")[0]
    assert round(_f(marker, "x1"), 2) == 100 + 15 / 20 * 236


def test_grouped_bars_have_one_bar_per_series_and_a_legend():
    svg = bar_chart(["a", "b"], [("alone", [1.0, 2.0]), ("without", [3.0, 4.0])], title="t")
    root = _parse(svg)
    assert len(_marks(root, "bar")) == 4
    assert "alone" in svg and "without" in svg
    with pytest.raises(ValueError, match="without"):
        bar_chart(["a", "b"], [("without", [1.0])], title="t")


def test_line_chart_coordinates_and_highlighted_point():
    # left 64, right 24, top 28, bottom 48: plot 312 x 224; x ticks 0..2, y ticks 0..10
    svg = line_chart([(0.0, 0.0), (1.0, 10.0), (2.0, 5.0), (3.0, float("nan"))], title="p", x_label="bit-ops",
                     y_label="score", point_labels=["low", "top", NASTY, "broken"], highlight=2, width=400, height=300)
    root = _parse(svg)
    points = _marks(root, "point")
    assert len(points) == 3  # the NaN point is left out
    plain = [(_f(p, "cx"), _f(p, "cy")) for p in points if "highlight" not in p.get("class")]
    assert plain == [(64.0, 252.0), (220.0, 28.0)]
    (chosen,) = _marks(root, "highlight")
    assert (_f(chosen, "cx"), _f(chosen, "cy")) == (376.0, 140.0)
    assert NASTY in chosen.find("svg:title", NS).text
    assert NASTY not in svg


def test_histogram_bins():
    # left/right 34: 292 px for edges 0..3; top 22, bottom 30: 98 px for the tallest bin
    root = _parse(histogram([1, 4, 2], [0.0, 1.0, 2.0, 3.0], title=NASTY, below=3))
    bins = _marks(root, "bin")
    assert [round(_f(b, "height"), 2) for b in bins] == [24.5, 98.0, 49.0]
    assert [round(_f(b, "x"), 2) for b in bins] == [34.0, round(34 + 292 / 3, 2), round(34 + 2 * 292 / 3, 2)]
    assert all(round(_f(b, "y") + _f(b, "height"), 2) == 120.0 for b in bins)  # standing on the axis
    assert any("3" in "".join(t.itertext()) for t in root.iter(f"{{{NS['svg']}}}text"))
    with pytest.raises(ValueError, match="edges"):
        histogram([1, 2], [0.0, 1.0], title="t")
