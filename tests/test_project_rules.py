"""Project rules enforced by tests: module size budget, dependency direction, public surface."""
import ast
import importlib
from pathlib import Path

import pytest

import quantsim

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = sorted((ROOT / "quantsim").rglob("*.py"))
HARD_LINE_LIMIT = 600
FORBIDDEN_IMPORTS = ("torch", "adaround", "mixed_precision", "onnxruntime.quantization", "onnxruntime.capi")


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_line_budget(path):
    lines = path.read_text().count("\n")
    assert lines <= HARD_LINE_LIMIT, f"{path.name} has {lines} lines (hard limit {HARD_LINE_LIMIT}): split it"


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_only_its_runtime_dependencies(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            assert not name.startswith(FORBIDDEN_IMPORTS), f"{path.name} imports {name}"


@pytest.mark.parametrize("name", quantsim.__all__)
def test_public_api_exists_and_is_documented(name):
    value = getattr(quantsim, name)
    if name.startswith("__") or isinstance(value, (str, int, float)) or type(value).__name__ == "qtype":
        return
    assert (getattr(value, "__doc__", None) or "").strip(), f"quantsim.{name} has no docstring"


def test_public_modules_declare_all():
    for path in PACKAGE_FILES:
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if path.name == "__init__.py" and path.parent.name in ("export",):
            continue
        assert hasattr(importlib.import_module(module), "__all__"), f"{module} has no __all__"
