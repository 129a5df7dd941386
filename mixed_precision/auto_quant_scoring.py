"""How `auto_quantize` scores a configuration besides the sim's own session: AMP's phase-2 callback on the QDQ
export (`OnExport`), and the final check of the chosen configuration both ways (`check_final`): its QDQ export
in onnxruntime's fused kernels and the sim itself, which the unfused export and `export_integer`'s exact
arithmetic compute up to near-tie rounding flips."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from quantsim import QuantizationSimModel

__all__ = ["OnExport", "check_final"]


class OnExport:
    """AMP's phase-2 callback with ``score_on="export"`` or ``"both"``: the user's callback on the QDQ export
    of ``sim`` (the sim AMP changes) in onnxruntime's fused kernels, whatever session AMP hands it (the sim's),
    and with ``"both"`` the lower of that and the sim's own score. Named ``<mode>:<callback>`` for AMP's score
    cache, so caches of different modes never mix."""

    def __init__(self, evaluate: Callable, sim: QuantizationSimModel, mode: str = "export"):
        self.evaluate, self.sim, self.mode = evaluate, sim, mode
        inner = getattr(evaluate, "func", evaluate)
        self.__module__ = getattr(inner, "__module__", "")
        self.__qualname__ = f"{mode}:" + getattr(inner, "__qualname__", type(inner).__name__)

    def __call__(self, session: Any) -> Any:
        exported = self.evaluate(self.sim.fused_session())
        if self.mode != "both":
            return exported
        own = self.evaluate(self.sim.session)
        return exported if own != own else min(exported, own)  # NaN from the sim: AMP's own check reports it


def _final_score(search: Any, session: Callable[[], Any], what: str) -> float | str:
    """The callback's score of the chosen configuration's ``session()`` (its QDQ export in onnxruntime's fused
    kernels, or the sim's own), or a note saying why it could not be scored."""
    try:
        return search.call(session(), f"the chosen configuration's {what}")
    except Exception as error:  # noqa: BLE001 - reported in the result, the search's answer stands
        return f"its {what} could not be scored ({type(error).__name__}: {str(error).splitlines()[0][:200]})"


def check_final(search: Any, sim: QuantizationSimModel, met: bool) -> tuple[float | None, float | None]:
    """Score the chosen configuration both ways (QDQ export in fused kernels; the sim, which the unfused
    export and the integer export's exact arithmetic compute up to near-tie flips) and note, with a warning,
    each that misses a met target."""
    found: list[float | None] = []
    for session, what in ((sim.fused_session, "QDQ export"), (lambda: sim.session, "sim")):
        scored = _final_score(search, session, what)
        if isinstance(scored, str):
            search.notes.append(scored)
        elif met and scored < search.target:
            where = ("its QDQ export in onnxruntime's integer kernels" if what == "QDQ export" else
                     "the sim itself (what export_integer's exact arithmetic computes)")
            search.notes.append(f"{where} scores {scored:.6g}, below the target: the two round near ties "
                                "differently (print(result.sim) names the differences; score_on='both' chooses "
                                "on the lower of the two)")
            warnings.warn(f"auto_quantize: {search.notes[-1]}", RuntimeWarning, stacklevel=4)
        found.append(None if isinstance(scored, str) else scored)
    return found[0], found[1]
