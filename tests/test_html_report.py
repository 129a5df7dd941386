"""The HTML reports: one well-formed, self-contained page; worst tensors first; names escaped; a chart per
section; the Pareto page's chosen point highlighted; atomic writes."""
import json
import os
import re
import stat
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixed_precision.html_page as html_page
from mixed_precision import group_sensitivity, report_dict, tensor_health, write_analysis_html, write_pareto_html
from quantsim import InvalidArgumentError, QuantizationSimModel

NASTY = "scores<b>&\"'"  # a tensor name that breaks unescaped HTML
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source", "track", "embed"}
SVG_LEAVES = {"rect", "line", "circle", "path", "polyline"}


class _Checker(HTMLParser):
    """Checks nesting (every non-void element closed in order) and collects attributes, text and sections."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.text: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _check_page(text: str) -> _Checker:
    assert text.startswith("<!DOCTYPE html>")
    checker = _Checker()
    checker.feed(text)
    checker.close()
    assert checker.stack == [], f"unclosed elements {checker.stack}"
    assert not {"script", "link", "img", "iframe", "object"} & set(checker.tags)
    for tag, key, value in checker.attrs:
        assert not (key in ("src", "href", "xlink:href") or key.startswith("on")), (tag, key, value)
    assert "url(" not in text and "@import" not in text
    assert not re.search(r"(src|href)\s*=", text)
    for svg in re.findall(r"<svg.*?</svg>", text, re.S):
        ET.fromstring(svg)  # each chart is well-formed XML too
    return checker


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"<h2>(.*?)</h2>", text)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.fixture(scope="module")
def analysed():
    """x -> Add(mask) -> NASTY -> Sigmoid -> MatMul(W) -> y: the mask collapses NASTY's 8-bit grid (a
    Sigmoid, not a Softmax, and range health off: the sim's own rules would otherwise fix the grid)."""
    mask = np.zeros((1, 8), np.float32)
    mask[0, :2] = -1e4
    w = np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Add", ["x", "mask"], [NASTY], name="add"),
                               helper.make_node("Sigmoid", [NASTY], ["p"], name="sigmoid"),
                               helper.make_node("MatMul", ["p", "W"], ["y"], name="mm<&>")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                              [numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sim = QuantizationSimModel(model, progress=False, range_health=False)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((16, 8)).astype(np.float32)} for _ in range(2)]
    sim.compute_encodings(feeds)
    reference = QuantizationSimModel(model, progress=False)
    for q in reference.quantizers:
        q.enabled = False
    expected = [reference.session.run(None, f)[0] for f in feeds]

    def score(session) -> float:
        got = [session.run(None, f)[0] for f in feeds]
        noise = sum(float(np.sum((e - g) ** 2)) for e, g in zip(expected, got))
        return -noise  # finite for the float sim too

    float_score, quantized, groups = group_sensitivity(sim, score)
    report = report_dict(float_score, quantized, groups, tensor_health(sim, feeds))
    return {**report, "title": "analysis <of> a & b", "score": "minus the squared error"}


def test_report_dict_carries_ranges_and_histograms(analysed):
    rows = {t["tensor"]: t for t in analysed["tensors"]}
    nasty = rows[NASTY]
    assert nasty["float_min"] < -9000 and nasty["grid_min"] <= nasty["float_min"]
    # a step of 1e4 / 255: the grid's top rounds to 0 and every positive value is clipped
    rng = np.random.default_rng(0)  # the fixture's feeds again
    positive = sum(int(np.count_nonzero(rng.standard_normal((16, 8)).astype(np.float32)[:, 2:] > 0)) for _ in range(2))
    assert nasty["grid_max"] == 0.0 < nasty["float_max"] and tuple(nasty["clipped"]) == (0, positive)
    # every value on the code it rounds to: the -1e4 entries on the lowest, the rest (all within half a step of
    # zero, the positive ones clipped) on the highest
    assert len(nasty["histogram"]) == 32 and sum(nasty["histogram"]) == 2 * 16 * 8
    assert nasty["histogram"][0] == 2 * 16 * 2 and nasty["histogram"][-1] == 2 * 16 * 6
    # the grid costs NASTY next to nothing against its energy (the -1e4 entries dominate), yet it collapsed;
    # the softmax after it inherits the damage but its own grid is fine: not flagged
    assert nasty["grid_sqnr_db"] > 40 and "collapsed" in nasty["verdict"]
    assert analysed["tensors"][0]["tensor"] == NASTY and rows["p"]["verdict"] == "ok"
    assert rows["p"]["grid_sqnr_db"] - rows["p"]["sqnr_db"] > 20
    assert rows["mask"]["verdict"] == "ok"  # two distinct values on two codes: nothing merged
    json.dumps(analysed)


def test_analysis_page_is_self_contained_worst_first_and_escaped(analysed, tmp_path):
    path = write_analysis_html(analysed, tmp_path / "analysis.html")
    text = path.read_text(encoding="utf-8")
    checker = _check_page(text)
    assert NASTY not in text and "mm<&>" not in text
    assert "scores&lt;b&gt;&amp;&quot;&#x27;" in text
    assert "analysis &lt;of&gt; a &amp; b" in text
    assert any(NASTY in t for t in checker.text)  # parsed back to the real name
    worst = re.findall(r'<div class="worst[^"]*"><div><code>(.*?)</code>', text)
    assert worst[0] == html_page.escape(analysed["tensors"][0]["tensor"]) == html_page.escape(NASTY)
    first_block = text[text.index('<div class="worst'):]
    assert "collapsed onto" in first_block[:first_block.index("</div></div>")]  # with its fix beside it
    sections = _sections(text)
    for name in ("Worst tensors first", "Sensitivity per quantizer group", "SQNR per tensor", "Ranges"):
        assert "<svg" in sections[name], name
    assert text.count("<details>") >= 3 and "<table>" in sections["Every number"]
    # the page summarises before any table: both scores in the first screen
    head = text[:text.index("<h2>")]
    assert html_page.format_number(analysed["quantized_score"]) in head


def test_analysis_page_renders_the_json_form_and_older_reports(analysed, tmp_path):
    document = json.loads(json.dumps(analysed))
    document["float_score"] = None  # an exact float model: infinite SQNR written as null
    for row in document["tensors"]:
        for key in ("grid_sqnr_db", "float_min", "float_max", "grid_min", "grid_max", "histogram", "clipped"):
            row.pop(key)
    text = write_analysis_html(document, tmp_path / "old.html").read_text()
    _check_page(text)
    assert "\u221e" in text and "no histogram" in text
    empty = write_analysis_html({"float_score": 1.0, "quantized_score": 0.5, "groups": [], "tensors": []},
                                tmp_path / "empty.html").read_text()
    _check_page(empty)


POINTS = [{"bitops_ratio": 1.0, "score": 30.0, "label": "all W8A16"},
          {"bitops_ratio": 0.3, "score": 12.0, "label": "all <W8A8>",
           "precisions": {"conv": "W8A8", "fc": "W8A8"}},
          {"bitops_ratio": 0.45, "score": 27.5, "label": "fc & co W8A16",
           "precisions": {"conv": "W8A8", "fc": "W8A16", "head": "W8A8"}}]


def test_pareto_page_highlights_the_chosen_point(tmp_path):
    text = write_pareto_html(tmp_path / "pareto.html", POINTS, 2, "Pareto <front>").read_text()
    _check_page(text)
    svg = ET.fromstring(re.findall(r"<svg.*?</svg>", text, re.S)[0])
    marks = [e for e in svg.iter() if "point" in (e.get("class") or "").split()]
    highlighted = [e for e in marks if "highlight" in e.get("class")]
    assert len(marks) == 3 and len(highlighted) == 1
    assert "fc & co W8A16" in "".join(highlighted[0].itertext())
    line = next(e for e in svg.iter() if e.tag.endswith("polyline"))
    xs = [float(p.split(",")[0]) for p in line.get("points").split()]
    assert xs == sorted(xs)  # the front is drawn in bit-operations order
    chosen_rows = re.findall(r'<tr class="chosen">(.*?)</tr>', text)
    assert len(chosen_rows) == 1 and "fc &amp; co W8A16" in chosen_rows[0] and "W8A8 \u00d72" in chosen_rows[0]
    assert "all &lt;W8A8&gt;" in text and "Pareto &lt;front&gt;" in text
    unchosen = write_pareto_html(tmp_path / "none.html", POINTS, None, "t").read_text()
    assert 'class="point highlight"' not in unchosen and '<tr class="chosen">' not in unchosen


def test_pareto_page_rejects_bad_points(tmp_path):
    with pytest.raises(InvalidArgumentError, match="point 1 has no 'score'"):
        write_pareto_html(tmp_path / "p.html", [POINTS[0], {"bitops_ratio": 0.5, "label": "x"}], 0, "t")
    with pytest.raises(InvalidArgumentError, match="chosen point 3"):
        write_pareto_html(tmp_path / "p.html", POINTS, 3, "t")
    assert not (tmp_path / "p.html").exists()


def test_writes_are_atomic(analysed, tmp_path, monkeypatch):
    path = tmp_path / "analysis.html"
    path.write_text("previous page")
    broken = {**analysed, "tensors": [{"sqnr_db": 1.0}]}  # a row without its name: rendering fails
    with pytest.raises(KeyError):
        write_analysis_html(broken, path)
    assert path.read_text() == "previous page" and sorted(os.listdir(tmp_path)) == ["analysis.html"]

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(html_page.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_analysis_html(analysed, path)
    with pytest.raises(OSError, match="No space"):
        write_pareto_html(tmp_path / "pareto.html", POINTS, 0, "t")
    assert path.read_text() == "previous page" and sorted(os.listdir(tmp_path)) == ["analysis.html"]
    monkeypatch.undo()
    write_analysis_html(analysed, path)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # an ordinary file, not a private temp file
    assert path.read_text().startswith("<!DOCTYPE html>")
