"""What `auto_quantize` returns and writes: `AutoQuantStep`, `AutoQuantResult`, and the report files.

``<results_dir>/auto_quantize.json`` holds the reference score, the target, every step tried (its name,
settings, score, relative bit-operations and seconds) and the choice; ``auto_quantize.md`` the same as a
table; ``auto_quantize.html`` the Pareto chart of every scored step (`mixed_precision.write_pareto_html`).
``<results_dir>/.cache/auto_quantize_scores.json`` is the resumable score cache (`auto_quantize`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mixed_precision.files import write_text_atomic
from mixed_precision.html_page import write_pareto_html
from quantsim import QuantizationSimModel

__all__ = ["AutoQuantStep", "AutoQuantResult", "write_auto_quant_report", "REPORT_FILES"]

REPORT_FILES = ("auto_quantize.json", "auto_quantize.md", "auto_quantize.html")


@dataclass(frozen=True)
class AutoQuantStep:
    """One configuration the search scored.

    ``stage`` is the technique that made it (``defaults``, ``scheme``, ``cle``, ``seq_mse+adaround``,
    ``uniform`` (a costlier candidate everywhere), ``exhaustive``, ``amp``); ``settings`` what was set
    (precision, calibration scheme, ...); ``relative_bops`` its bit operations over the costliest candidate
    everywhere, read from the sim's quantizers after every automatic decision; ``seconds`` the wall time
    spent on it (0 when its score came from the cache); ``met`` whether it reached the target."""

    stage: str
    settings: dict[str, Any]
    score: float
    relative_bops: float
    seconds: float
    met: bool
    cached: bool = False

    @property
    def label(self) -> str:
        return f"{self.stage}: " + ", ".join(f"{k}={v}" for k, v in self.settings.items())


@dataclass
class AutoQuantResult:
    """The outcome of `auto_quantize`. ``sim`` is calibrated in the chosen configuration (ready to export);
    ``score`` and ``relative_bops`` are the chosen step's; ``steps`` lists every configuration scored, in the
    order tried; ``pareto`` the steps no other step beats on both cost and score (cheapest first);
    ``budget_met`` says whether ``score >= target``; ``counts`` what the search spent: ``callback_evaluations``
    (``eval_callback`` calls, the float model's and the deployed score's included), ``proxy_evaluations``
    (AMP phase-1 evaluations by the built-in output SQNR) and ``calibration_passes`` (passes over the
    calibration data, Sequential MSE's and AdaRound's own not counted); ``message`` says what was chosen, or what would be
    needed when the budget was not met. ``deployed_score`` is the callback's score of the chosen sim's QDQ
    export in onnxruntime's fused integer kernels (`QuantizationSimModel.fused_session`), what a deployment
    runs; ``sim_score`` the callback's score of the sim's own session (what the unfused QDQ export and
    `export_integer`'s exact arithmetic compute, up to near-tie rounding flips); each None when it could not be
    scored (the message says why). Both are evaluated again at the end as a check (one of them repeats
    ``score``), and the message warns when either misses a met target."""

    sim: QuantizationSimModel
    score: float
    relative_bops: float
    reference_score: float
    target: float
    allowed_accuracy_drop: float
    budget_met: bool
    chosen: AutoQuantStep
    steps: list[AutoQuantStep]
    message: str
    seconds: float
    promoted_share: float
    deployed_score: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    sim_score: float | None = None

    @property
    def pareto(self) -> list[AutoQuantStep]:
        def beaten(s: AutoQuantStep) -> bool:
            return any(o.relative_bops <= s.relative_bops and o.score >= s.score
                       and (o.relative_bops < s.relative_bops or o.score > s.score) for o in self.steps)
        return sorted((s for s in self.steps if not beaten(s)), key=lambda s: (s.relative_bops, -s.score))

    def to_dict(self) -> dict[str, Any]:
        """Everything but the sim, as plain JSON values."""
        return {"reference_score": self.reference_score, "allowed_accuracy_drop": self.allowed_accuracy_drop,
                "target": self.target, "budget_met": self.budget_met, "score": self.score,
                "relative_bops": self.relative_bops, "promoted_share": self.promoted_share,
                "chosen": self.steps.index(self.chosen) if self.chosen in self.steps else None,
                "deployed_score": self.deployed_score, "sim_score": self.sim_score, "message": self.message,
                "seconds": self.seconds,
                "counts": dict(self.counts),
                "steps": [asdict(s) for s in self.steps]}

    def summary(self) -> str:
        """A Markdown table of the steps and the choice."""
        lines = [f"# auto_quantize: {'budget met' if self.budget_met else 'budget NOT met'}", "",
                 f"Float model score {self.reference_score:.6g}; allowed drop {self.allowed_accuracy_drop:g}; "
                 f"target {self.target:.6g}.", "", self.message, "",
                 "| # | stage | settings | score | relative BOPs | met | seconds |", "|--:|---|---|--:|--:|---|--:|"]
        for i, s in enumerate(self.steps):
            mark = " **(chosen)**" if s is self.chosen else ""
            settings = ", ".join(f"{k}={v}" for k, v in s.settings.items())
            lines.append(f"| {i} | {s.stage}{mark} | {settings} | {s.score:.6g} | {s.relative_bops:.4f} | "
                         f"{'yes' if s.met else 'no'} | {s.seconds:.1f}{' (cached)' if s.cached else ''} |")
        deployed = "not scored" if self.deployed_score is None else f"{self.deployed_score:.6g}"
        own = "not scored" if self.sim_score is None else f"{self.sim_score:.6g}"
        spent = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.counts.items())
        lines.append(f"\nTotal {self.seconds:.1f} s{f' ({spent})' if spent else ''}; {100 * self.promoted_share:.1f}% "
                     f"of the quantizers above 8 bits; the chosen QDQ export in onnxruntime's integer kernels scores "
                     f"{deployed}, the sim itself {own}.")
        return "\n".join(lines) + "\n"


def write_auto_quant_report(result: AutoQuantResult, folder: str | Path) -> list[Path]:
    """Write `REPORT_FILES` into ``folder`` (atomically, each); returns their paths."""
    import json
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    points = [{"bitops_ratio": s.relative_bops, "score": s.score, "label": f"{i}. {s.label}"}
              for i, s in enumerate(result.steps)]
    chosen = result.steps.index(result.chosen) if result.chosen in result.steps else None
    return [write_text_atomic(folder / REPORT_FILES[0], json.dumps(result.to_dict(), indent=1) + "\n"),
            write_text_atomic(folder / REPORT_FILES[1], result.summary()),
            write_pareto_html(folder / REPORT_FILES[2], points, chosen, "auto_quantize: every step scored")]
