"""Sphinx configuration of quantsim's documentation site (``make docs``; docs/README.md says why Sphinx).

The API pages and the command-line page are generated here, at every build, into ``docs/_generated/``
(ignored by git): one page per package listing every name of its ``__all__`` as read at build time, so a
name another change adds appears without editing any page, and the ``--help`` text of the ``quantsim``
command and of each subcommand as argparse prints it.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document this checkout's packages, not whatever is installed

project = "quantsim"
author = "quantsim contributors"
copyright = "quantsim contributors"  # noqa: A001 - Sphinx's name

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
html_theme = "furo"
html_title = "quantsim"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_copy_source = False
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
suppress_warnings = ["myst.header"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True}
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = True
add_module_names = False

# every cross-reference must resolve (the build runs with -W), except to libraries this site does not
# document: no intersphinx, since the build must work without internet
nitpicky = True
nitpick_ignore_regex = [
    # implementation classes named in public signatures or bases (mixins of the sim, records of the target and
    # BatchNorm-fold results): their fields are documented where the public function returning them is
    (r"py:class", r"quantsim\.(sim\.(model_hooks|model_exports|aimet_surface|quantizer_aimet)\..*|graph\.index\.GraphIndex"
                  r"|batch_norm_fold\.BNLayer|target\.(profile|legality)\..*)"),
    (r"py:.*", r"(onnx|onnxruntime|ort|np|numpy|numpy\.typing|npt|scipy|tqdm|concurrent|collections|typing"
               r"|typing_extensions|os|pathlib|hashlib|logging|enum|dataclasses|argparse|io|abc)(\..*)?"),
    (r"py:.*", r"(ModelProto|GraphProto|NodeProto|TensorProto|ValueInfoProto|InferenceSession|ndarray|NDArray"
               r"|DTypeLike|ArrayLike|Path|PathLike|Executor|Future|Iterable|Iterator|Callable|Mapping|Sequence"
               r"|Hashable|Generator|ContextManager|AbstractContextManager|Any|Literal|Self|TypeAlias|Enum"
               r"|IntEnum|StrEnum|Number|Protocol|_hashlib\.HASH|HASH)"),
    # a type alias of mixed_precision.amp_result (AIMET's ((act_bw, act_dtype), (param_bw, param_dtype)) pair)
    ("py:class", "AimetCandidate"),
    # Sphinx splits some nested generic attribute annotations at the comma and looks the pieces up
    ("py:class", r"dict\[str"), ("py:class", r"list\[tuple\[~re\.Pattern"),
    ("py:class", r"tuple\[float \| None"),
]

PACKAGES = {
    "quantsim": "The simulation, its quantizers and types, encodings files, exports and errors.",
    "adaround": "AdaRound, Sequential MSE and cross-layer equalization, built on quantsim's public names.",
    "mixed_precision": "Precision overrides, analysis, automatic mixed precision and auto quantization.",
}
# types that public signatures and attributes name but the packages do not export: documented on the
# package's page, below its public names, so the references resolve
SUPPORTING = {
    "quantsim": ["quantsim.sim.config.QuantFlags", "quantsim.sim.config.OpTypeRule",
                 "quantsim.sim.decisions.Decision", "quantsim.calibration.schemes.registry.CalibrationScheme",
                 "quantsim.calibration.schemes.registry.EncodingRequest"],
}
GENERATED = DOCS / "_generated"


def _kind(obj: object) -> str:
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        return "autofunction"
    return "autodata"


def _attribute_doc(package: str, name: str, obj: object) -> str:
    """The ``#:`` comment or docstring after the assignment that defined ``name`` in the package's modules."""
    from sphinx.pycode import ModuleAnalyzer

    for modname, module in list(sys.modules.items()):
        if (modname == package or modname.startswith(package + ".")) and getattr(module, name, None) is obj:
            try:
                docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
            except Exception:  # noqa: BLE001 - a module without source (never here, but not fatal)
                continue
            if ("", name) in docs:
                return "\n".join(docs[("", name)]).strip()
    return ""


def _data_entry(package: str, name: str, obj: object) -> list[str]:
    """A ``py:data`` entry: its type, its value (short reprs only) and its own doc comment, if any."""
    value = repr(obj)
    lines = [f".. py:data:: {name}", f"   :type: {type(obj).__name__}"]
    if len(value) <= 100 and "\n" not in value:
        lines.append(f"   :value: {value}")
    doc = _attribute_doc(package, name, obj)
    lines.append("")
    lines += [f"   {line}" if line else "" for line in (doc or f"An instance of ``{type(obj).__name__}``.").splitlines()]
    return lines


def _guide_examples() -> dict[str, list[tuple[str, str]]]:
    """For each word used in a guide's python blocks: the guides (path, title) that use it."""
    uses: dict[str, list[tuple[str, str]]] = {}
    for guide in sorted((DOCS / "guides").glob("*.md")):
        text = guide.read_text()
        title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), guide.stem)
        code = "\n".join(re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M))
        for word in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)):
            uses.setdefault(word, []).append((guide.stem, title))
    return uses


def _api_page(package: str, summary: str, examples: dict[str, list[tuple[str, str]]]) -> str:
    module = importlib.import_module(package)
    names = [name for name in module.__all__ if not name.startswith("__")]
    lines = [f"# `{package}`", "", summary, "", f"Every name of `{package}.__all__`, in its order.", "",
             "```{eval-rst}", f".. currentmodule:: {package}", "```", "", "| name | what it is |", "|---|---|"]
    for name in names:
        obj = getattr(module, name)
        if _kind(obj) == "autodata":
            doc = _attribute_doc(package, name, obj) or f"``{obj!r}``, a ``{type(obj).__name__}``."
        else:
            doc = inspect.getdoc(obj) or ""
        first = re.split(r"(?<=\.)\s", " ".join(doc.split("\n\n")[0].split()), maxsplit=1)[0].replace("|", "\\|")
        lines.append(f"| {{py:obj}}`{name} <{package}.{name}>` | {first} |")
    lines.append("")
    modules: dict[str, None] = {}  # the modules defining the names, in first-use order
    for name in names:
        obj = getattr(module, name)
        directive = _kind(obj)
        lines += [f"## `{name}`", "", "```{eval-rst}"]
        lines += _data_entry(package, name, obj) if directive == "autodata" else [f".. {directive}:: {package}.{name}"]
        if inspect.isclass(obj) and obj.__bases__ != (object,):
            lines.append("   :show-inheritance:")  # an error's ValueError, an enum's Enum; never "Bases: object"
        lines += ["```", ""]
        home = getattr(obj, "__module__", None) if directive != "autodata" else None
        # a module named like a public name (quantsim.prepare, the module, vs quantsim.prepare, the function)
        # would be a second object of the same name: its docstring is the function's entry already
        shadowed = isinstance(home, str) and home.rsplit(".", 1)[-1] in names and home.count(".") == 1
        if isinstance(home, str) and home.startswith(package + ".") and home in sys.modules and not shadowed:
            modules.setdefault(home, None)
            lines += [f"Defined in {{py:mod}}`{home}` (its notes are at the end of this page).", ""]
        used = examples.get(name, [])
        if used:
            links = ", ".join(f"[{title}](../guides/{stem}.md)" for stem, title in used)
            lines += [f"Examples: {links}.", ""]
    if modules:
        lines += ["## Module notes", "",
                  "The docstrings of the modules that define the names above: the rules and conventions the",
                  "entries refer to as the module docstring.", ""]
        for home in sorted(modules):
            lines += [f"### `{home}`", "", "```{eval-rst}", f".. automodule:: {home}", "   :no-members:", "```", ""]
    if SUPPORTING.get(package):
        lines += ["## Types used in signatures", "",
                  "Not exported by the package, but named by the signatures and attributes above.", ""]
        for target in SUPPORTING[package]:
            lines += [f"### `{target.rsplit('.', 1)[1]}`", "", "```{eval-rst}", f".. autoclass:: {target}", "```", ""]
    if "__version__" in module.__all__:
        lines += ["## `__version__`", "", f"The package version, `{module.__version__}`.", ""]
    return "\n".join(lines)


def _cli_page() -> str:
    from quantsim_cli.arguments import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal width: fixed, so builds are reproducible
    parser = build_parser()
    parser.prog = "quantsim"
    lines = ["# Command line", "",
             "The `quantsim` command (also `python -m quantsim`). The help texts below are captured from the",
             "argument parser when the site is built, so they are the installed program's.", ""]

    def visit(p, title: str, depth: int) -> None:
        lines.extend([f"{'#' * depth} `{title} --help`", "", "```text", p.format_help().rstrip(), "```", ""])
        for action in p._actions:  # argparse keeps subcommands in a private action type
            choices = getattr(action, "choices", None)
            if action.__class__.__name__ == "_SubParsersAction" and isinstance(choices, dict):
                for name, sub in choices.items():
                    visit(sub, f"{title} {name}", min(depth + 1, 4))

    visit(parser, "quantsim", 2)
    return "\n".join(lines)


def _schemas_page() -> str:
    lines = ["# JSON Schemas", "",
             "The schemas of quantsim's file formats, as shipped in `docs/schemas/`; "
             "`tests/test_docs_schemas.py` validates the files quantsim writes against them.", ""]
    for schema in sorted((DOCS / "schemas").glob("*.json")):
        lines += [f"## `{schema.name}`", "", f"```{{literalinclude}} ../schemas/{schema.name}",
                  ":language: json", "```", ""]
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    """Write only when the text changed, so Sphinx rebuilds only what changed."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate() -> None:
    GENERATED.mkdir(exist_ok=True)
    examples = _guide_examples()
    for package, summary in PACKAGES.items():
        _write(GENERATED / f"api_{package}.md", _api_page(package, summary, examples))
    _write(GENERATED / "cli.md", _cli_page())
    _write(GENERATED / "schemas.md", _schemas_page())


generate()


def _copy_schemas(app, exception) -> None:  # noqa: ANN001 - Sphinx's callback signature
    """Pages link to ``schemas/*.json``: ship them beside the pages so the links work in the built site."""
    if exception is None and app.builder.format == "html":
        import shutil

        shutil.copytree(DOCS / "schemas", Path(app.outdir) / "schemas", dirs_exist_ok=True)


def _soft_object_role():
    """The default role of docstrings (`name`): a link to the documented object it names, else plain code."""
    from sphinx import addnodes
    from sphinx.domains.python import PyXRefRole

    class SoftObjectRole(PyXRefRole):
        def run(self):
            self.name = "py:obj"
            made, messages = super().run()
            for node in made:
                if isinstance(node, addnodes.pending_xref):
                    node["quantsim_soft"] = True
            return made, messages

    return SoftObjectRole()


default_role = "quantsim-obj"


def setup(app) -> dict[str, bool]:  # noqa: ANN001
    app.add_role("quantsim-obj", _soft_object_role())
    app.connect("build-finished", _copy_schemas)
    app.connect("missing-reference", _resolve_by_suffix)
    return {"parallel_read_safe": True}


def _resolve_by_suffix(app, env, node, contnode):  # noqa: ANN001 - Sphinx's callback signature
    """Docstrings name things as their own module sees them (`auto_quantize` inside mixed_precision.auto_quant,
    `replace_weight` inside QuantizationSimModel): resolve such a reference to the one documented object whose
    full name ends with it. Several candidates, or none, stay unresolved (and fail the nitpicky build)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.").removesuffix("()")
    domain = env.get_domain("py")
    found = [name for name in domain.objects if name == target or name.endswith("." + target)]
    public = [name for name in found if name in {f"{package}.{target}" for package in PACKAGES}]
    found = public or found  # `compute_encodings`: the public function rather than the method
    if len(found) != 1:
        # a docstring's `name` (the default role) that names no documented object stays plain code: parameter
        # names, internal modules; explicit roles (:class:`X`) and signatures must resolve
        return contnode if node.get("quantsim_soft") else None
    from sphinx.util.nodes import make_refnode

    entry = domain.objects[found[0]]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, found[0])
