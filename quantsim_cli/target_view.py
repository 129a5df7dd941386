"""``quantsim inspect --target NAME_OR_FILE``: what would run where on a target, a row per node.

For a float model the rows come from the sim the other options build (`quantsim.sim.target_rules`); for a QDQ
export (a ``.onnx`` file with QuantizeLinear/DequantizeLinear, alone or in an export folder) from its Q/DQ
nodes (`quantsim.export.legality`). Each node runs on an ``integer`` kernel, in ``float16``/``float8``, in
``float`` (between DequantizeLinear and QuantizeLinear, where the target allows it), as ``shape`` arithmetic,
or is ``illegal`` with the rule it breaks.
"""
from __future__ import annotations

from typing import Any

import onnx

from quantsim import legality_report
from quantsim_cli.report import text_table

__all__ = ["target_rows", "sim_target_report", "qdq_target_report", "print_target_report"]


def target_rows(report: Any) -> list[dict[str, str]]:
    """One row per node verdict (node, op type, runs, detail), then one per graph I/O finding."""
    rows = [{"node": v.node, "op_type": v.op_type, "runs": v.runs if not v.rule else f"illegal ({v.rule})",
             "detail": v.detail} for v in report.verdicts]
    named = {v.node for v in report.verdicts}
    rows += [{"node": f.node, "op_type": f.op_type, "runs": f"illegal ({f.rule})", "detail": f.message}
             for f in report.errors if f.node not in named]
    return rows


def sim_target_report(sim: Any, target: str) -> Any:
    return legality_report(sim, target)


def qdq_target_report(model: onnx.ModelProto, target: str) -> Any:
    return legality_report(model, target)


def print_target_report(report: Any, label: str) -> None:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(report.counts().items()))
    print(f"{label} on target {report.target.name}: {counts}; {len(report.errors)} illegal, "
          f"{len(report.warnings)} warning(s)")
    print(text_table(("node", "op type", "runs", "detail"), [tuple(r.values()) for r in target_rows(report)],
                     width=200))
    for finding in report.findings:
        print(f"  {finding.severity}: {finding}")
