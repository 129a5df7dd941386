"""The documentation site (issue 32): every public name of the three packages has an entry in the built API
reference, and the command-line page holds each subcommand's help.

Checks ``docs/_build/html`` as ``make docs`` left it (``make test`` builds it first); without a build it builds
the site into a temporary folder, and skips only when Sphinx (the ``docs`` extra) is not installed."""
from __future__ import annotations

import html
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "docs" / "_build" / "html"
PACKAGES = ("quantsim", "adaround", "mixed_precision")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if (BUILT / "index.html").exists():
        return BUILT
    pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("myst_parser")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
                           str(ROOT / "docs"), str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, f"the docs build failed:\n{done.stdout}\n{done.stderr}"
    return out


def documented_ids(page: Path) -> set[str]:
    """The ids of the API entries (``<dt ... id="quantsim.QuantizationSimModel">``) of a built page."""
    return {html.unescape(m) for m in re.findall(r'<dt class="sig[^"]*" id="([^"]+)"', page.read_text())}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_has_an_entry_in_the_api_reference(site, package):
    module = importlib.import_module(package)
    page = site / "_generated" / f"api_{package}.html"
    assert page.exists(), f"{page} was not built"
    ids = documented_ids(page)
    text = page.read_text()
    missing = [name for name in module.__all__
               if f"{package}.{name}" not in ids and not (name == "__version__" and "__version__" in text)]
    assert not missing, (f"{package}.__all__ names without an entry in {page.relative_to(site)}: {missing} "
                         "(rebuild with `make docs`; a stale build lacks names added since)")


def test_api_entries_carry_signatures_and_docstrings(site):
    page = (site / "_generated" / "api_quantsim.html").read_text()
    entry = page.split('id="quantsim.QuantizationSimModel"', 1)[1][:60000]  # the class entry: methods included
    assert "param_type" in entry and "compute_encodings" in entry
    assert "Quantization simulation of an ONNX model" in entry


def test_command_line_page_holds_every_subcommands_help(site):
    from quantsim_cli.arguments import build_parser

    page = html.unescape((site / "_generated" / "cli.html").read_text())
    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    missing = [name for name in commands if f"usage: quantsim {name}" not in page]
    assert not missing, f"subcommands without their --help on the CLI page: {missing}"


def test_guides_and_format_pages_are_in_the_site(site):
    pages = [p.stem for p in (ROOT / "docs" / "guides").glob("*.md")]
    assert len(pages) >= 6
    missing = [p for p in pages if not (site / "guides" / f"{p}.html").exists()]
    missing += [p.stem for p in (ROOT / "docs").glob("*.md") if not (site / f"{p.stem}.html").exists()]
    assert not missing, f"pages not built: {missing}"
    schemas = (site / "_generated" / "schemas.html").read_text()
    assert all(s.name in schemas for s in (ROOT / "docs" / "schemas").glob("*.json"))
