"""One error root: every public error is a QuantsimError and keeps its built-in base."""
import ast
from pathlib import Path

import numpy as np
import pytest

import quantsim
from quantsim import errors

ROOT = Path(__file__).resolve().parents[1] / "quantsim"


@pytest.mark.parametrize("name", [n for n in errors.__all__ if n.endswith("Error")])
def test_every_public_error_is_a_quantsim_error_with_a_builtin_base(name):
    cls = getattr(errors, name)
    assert issubclass(cls, quantsim.QuantsimError)
    # KeyError: an unknown quantizer name in sim.qc_quantize_op_dict raised KeyError before it had its own class
    assert issubclass(cls, (ValueError, TypeError, RuntimeError, KeyError)) or cls is errors.QuantsimError
    assert getattr(quantsim, name) is cls


def test_warnings_share_a_root():
    assert issubclass(quantsim.PrepareWarning, quantsim.QuantsimWarning)
    assert issubclass(quantsim.QuantsimWarning, UserWarning)


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_raises_only_its_own_errors(path):
    """``raise ValueError(...)`` and friends would escape ``except QuantsimError``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
            assert node.exc.func.id not in ("ValueError", "TypeError", "RuntimeError", "KeyError", "Exception"), (
                f"{path.name}:{node.lineno} raises a bare {node.exc.func.id}")


def test_a_real_bad_call_raises_a_quantsim_error():
    from tiny_cnn import new_sim

    sim = new_sim()
    with pytest.raises(quantsim.QuantsimError):
        sim.compute_encodings([{"input": np.full((1, 3, 8, 8), np.nan, np.float32)}])
    with pytest.raises(ValueError):
        sim.qc_quantize_op_dict[next(iter(sim.qc_quantize_op_dict))].set_bitwidth(1)
