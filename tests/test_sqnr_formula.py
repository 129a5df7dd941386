"""One SQNR formula for the analysis page, the CLI and auto_quantize's proxy, checked on hand-worked values;
the edge cases are where the three copies it replaced disagreed (the analysis page called noise on a zero
signal ``inf``, a perfect score)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mixed_precision.auto_quant_proxy import MAX_DB, sqnr_db
from mixed_precision.sqnr import power_sqnr_db
from quantsim_cli.metrics import OutputAgreement


@pytest.mark.parametrize(("signal", "noise", "expected"), [
    (100.0, 1.0, 20.0), (1.0, 1.0, 0.0), (1.0, 10.0, -10.0), (2.0, 0.002, 30.0),
    (5.0, 0.0, math.inf), (0.0, 0.0, math.inf), (0.0, 3.0, -math.inf),
])
def test_power_sqnr_by_hand(signal, noise, expected):
    assert power_sqnr_db(signal, noise) == pytest.approx(expected)


def test_the_proxy_clips_the_same_formula():
    reference = [[np.array([3.0, 4.0])]]  # signal 25
    assert sqnr_db(reference, [[np.array([3.0, 4.5])]]) == pytest.approx(10 * math.log10(25 / 0.25))
    assert sqnr_db(reference, reference) == MAX_DB
    assert sqnr_db([[np.zeros(2)]], [[np.ones(2)]]) == -MAX_DB


def test_the_cli_agreement_uses_it():
    agreement = OutputAgreement("y")
    agreement.signal, agreement.noise = 0.0, 1.0
    assert agreement.sqnr_db == -math.inf
