"""Project rules enforced by tests: module size budget, dependency direction, public surface."""
import ast
import importlib
from pathlib import Path

import pytest

import quantsim

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = sorted((ROOT / "quantsim").rglob("*.py"))
#: the command line: the application layer above quantsim, adaround and mixed_precision
CLI_FILES = sorted((ROOT / "quantsim_cli").rglob("*.py"))
HARD_LINE_LIMIT = 600
FORBIDDEN_IMPORTS = ("torch", "adaround", "mixed_precision", "onnxruntime.quantization", "onnxruntime.capi")


@pytest.mark.parametrize("path", PACKAGE_FILES + CLI_FILES, ids=lambda p: str(p.relative_to(ROOT)))
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


# the algorithm packages build on quantsim's public surface only ------------------------------------------
ALGORITHM_PACKAGES = ("adaround", "mixed_precision")
ALGORITHM_FILES = sorted(p for pkg in ALGORITHM_PACKAGES for p in (ROOT / pkg).rglob("*.py")) if any(
    (ROOT / pkg).exists() for pkg in ALGORITHM_PACKAGES) else []
#: module paths users (and the algorithm packages) may import from: the README documents them
PUBLIC_MODULES = ("quantsim", "quantsim.prepare", "quantsim.export.reference", "quantsim.errors",
                  "quantsim.calibration.schemes")


def _public_names(module: str) -> set[str]:
    return set(importlib.import_module(module).__all__)


@pytest.mark.parametrize("path", ALGORITHM_FILES + CLI_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_algorithm_packages_use_only_public_quantsim_names(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "quantsim":
            assert node.module in PUBLIC_MODULES, f"{path.name}:{node.lineno} imports from {node.module}"
            public = _public_names(node.module)
            for alias in node.names:
                assert alias.name in public, f"{path.name}:{node.lineno}: {node.module}.{alias.name} is not public"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "quantsim":
                    assert alias.name in PUBLIC_MODULES, f"{path.name}:{node.lineno} imports {alias.name}"
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            raise AssertionError(f"{path.name}:{node.lineno} reaches for someone else's private attribute {node.attr!r}")


def test_quantsim_never_imports_the_algorithm_packages():
    for path in PACKAGE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] not in ALGORITHM_PACKAGES, f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] not in ALGORITHM_PACKAGES for a in node.names), path.name


@pytest.mark.parametrize("path", CLI_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cli_uses_the_algorithm_packages_through_their_top_level_names(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in ALGORITHM_PACKAGES:
            assert node.module in ALGORITHM_PACKAGES, f"{path.name}:{node.lineno} imports from {node.module}"
            public = _public_names(node.module)
            assert all(a.name in public for a in node.names), f"{path.name}:{node.lineno}: not public"
