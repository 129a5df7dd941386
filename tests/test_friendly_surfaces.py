"""Friendlier surfaces: unknown quantizer names list the closest ones; reports print as tables."""
import pytest
from tiny_cnn import calibrated_sim, new_sim

from quantsim import QuantsimError, UnknownQuantizerError
from quantsim.export.integer.export import IntegerReport, ReportEntry


def test_unknown_quantizer_name_lists_the_closest_names():
    sim = new_sim()
    with pytest.raises(UnknownQuantizerError, match=r"no quantizer for tensor 'W3'; closest: 'W', 'W2'") as caught:
        sim.qc_quantize_op_dict["W3"]
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, QuantsimError)
    assert not str(caught.value).startswith("'")  # a sentence, not KeyError's quoted repr
    with pytest.raises(KeyError, match="quantsim inspect"):
        sim.qc_quantize_op_dict["completely_unrelated_name"]


def test_quantizer_dict_still_behaves_as_a_dict():
    sim = new_sim()
    table = sim.qc_quantize_op_dict
    assert isinstance(table, dict) and table.get("nope") is None and "nope" not in table
    assert table["W"] is table.get("W") and set(table) >= {"W", "x", "y"}
    assert dict(table) == {k: table[k] for k in table}


def test_integer_report_prints_as_a_table():
    exported = calibrated_sim().export_integer()
    assert exported.report == [] and "nothing left in float" in str(exported.report)
    report = IntegerReport([ReportEntry("ln", "LayerNormalization", "no integer lowering"),
                            ReportEntry("x", "graph input", "kept float: 16-bit grid")])
    lines = str(report).splitlines()
    assert lines[0] == "integer export: 2 node(s) left in float"
    assert lines[1].split() == ["node", "op", "type", "why", "it", "stayed", "float"]
    assert lines[2].startswith("  ln    LayerNormalization  no integer lowering")
    assert report[0].node == "ln" and list(report[1]) == ["x", "graph input", "kept float: 16-bit grid"]
