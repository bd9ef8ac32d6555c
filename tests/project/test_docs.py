"""The documentation site: every public name has a docstring, the generated reference pages
cover the code, and the site builds with ``mkdocs build --strict`` after running the tutorials.

The docstring check reads the docstrings the way the API reference renders them (griffe, the
loader of mkdocstrings), so a dataclass's generated signature or an inherited class docstring
does not count as documentation.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import blockcoupling as bc

ROOT = Path(__file__).resolve().parents[2]


def _gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "tools" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _public_paths() -> dict[str, str]:
    """Public name -> the dotted path of its definition (as the API page references it)."""
    paths = {name: f"{module}.{name}" for module, names in bc._EXPORTS.items() for name in names}
    for name in bc.__all__:
        if name.endswith("Error"):
            paths[name] = f"blockcoupling.errors.{name}"
    return paths


def test_every_public_name_is_in_the_reference() -> None:
    paths = _public_paths()
    missing = sorted(set(bc.__all__) - set(paths) - {"__version__"})
    assert not missing, f"public names the API page would not list: {missing}"
    page = _gen_reference().api_markdown()
    for path in paths.values():
        assert f"::: {path}\n" in page


def test_config_records_read_as_a_users_page() -> None:
    """A config record on the API page is a table of its fields (type, default as written in
    Python, CLI flag, help), and mkdocstrings is told not to render the fields itself (their
    values would read ``_opt(default, "help", parse_fn, cli=...)``) nor the signature."""
    from blockcoupling.fields import field_docs

    page = _gen_reference().api_markdown()
    assert "| `k` | `tuple[int, ...]` | `(10, 30, 50)` | `--k` | Top-K sizes" in page
    assert "| `dtype` | `torch.dtype` | `torch.float32` | `--analysis-dtype` |" in page
    assert "| `layers` | `LayerSpec` | `None` | `--layers` |" in page
    block = page[page.index("::: blockcoupling.engine.config.MeasureConfig\n"):]
    options = block.split("\n\n", 1)[0]
    assert "show_signature: false" in options
    names = {d.name for d in field_docs(bc.MeasureConfig)}
    hidden = re.search(r'"!\^\((.*)\)\$"', options)
    assert hidden is not None and set(hidden.group(1).split("|")) == names
    assert "_opt(" not in page and "| `seed` | `int` | `0` |" in page


def test_every_public_name_has_a_docstring() -> None:
    griffe = pytest.importorskip("griffe", reason="the docs extra (mkdocstrings[python]) is not installed")
    package = griffe.load("blockcoupling", search_paths=[str(ROOT / "src")],
                          resolve_aliases=True, resolve_external=False)
    undocumented = []
    for name, path in sorted(_public_paths().items()):
        obj = package[path.removeprefix("blockcoupling.")]
        obj = obj.final_target if getattr(obj, "is_alias", False) else obj
        if obj.docstring is None or not obj.docstring.value.strip():
            undocumented.append(f"{name} ({path})")
    assert not undocumented, (
        "public names without a docstring (the API reference would render nothing; for a "
        f"constant write a string literal on the line after it): {undocumented}")


def test_the_docstring_check_can_fail(tmp_path: Path) -> None:
    griffe = pytest.importorskip("griffe", reason="the docs extra (mkdocstrings[python]) is not installed")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(
        'from dataclasses import dataclass\n\nX = 1\n"""X documented."""\nY = 2\n\n'
        '@dataclass\nclass C:\n    a: int\n\ndef f():\n    """f."""\n')
    package = griffe.load("pkg", search_paths=[str(tmp_path)])
    documented = {n: package[n].docstring is not None for n in ("X", "Y", "C", "f")}
    assert documented == {"X": True, "Y": False, "C": False, "f": True}


def test_cli_reference_lists_every_command() -> None:
    import typer.main

    from blockcoupling.cli import app

    group = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="blockcoupling")
    page = _gen_reference().cli_markdown()
    for name in group.list_commands(ctx):
        assert f"## `blockcoupling {name}`" in page
        for param in group.get_command(ctx, name).params:
            if getattr(param, "param_type_name", "") == "option" and not param.hidden:
                assert f"`{param.opts[0]}`" in page, (name, param.opts)


@pytest.mark.docs
@pytest.mark.slow  # builds the whole site with fresh tutorials (3-4 min): CI runs it
def test_site_builds_strictly_and_shows_the_tutorials(built_site: Path) -> None:
    """The whole site from a copy of the checkout (conftest.py's ``built_site``): the hook
    runs the three tutorials (they write their figures and tables), then ``mkdocs build
    --strict`` (warnings are errors); the mathematics is MathML, the API page renders
    cross-references, nothing is loaded from the network."""
    site = built_site
    for figure in ("above_chance/above_chance.png", "emergence/emergence.png",
                   "width_floor/width_floor.png", "width_floor/floor_curve.png"):
        assert (site / "tutorials" / "generated" / figure).stat().st_size > 10_000, figure
    page = (site / "tutorials" / "above-chance" / "index.html").read_text()
    assert "coupling_vs_null" in page and "z = mean / se" in page  # the table was included
    assert "blockcoupling measure" in (site / "reference" / "cli" / "index.html").read_text()
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "measure_to_dir" in api
    assert not re.search(r":(func|class|mod|meth|data|attr):`", api)  # no literal roles
    assert 'class="autorefs autorefs-internal"' in api  # cross-references are links
    assert "opt(" not in api and "<td><code>(10, 30, 50)</code></td>" in api  # a user's page
    concepts = (site / "concepts" / "index.html").read_text()
    assert concepts.count("<math") > 10 and 'class="arithmatex"' not in concepts
    assert ">coupling_vs_rotated</mtext>" in concepts and "\\_" not in concepts
    for path in site.rglob("*.html"):  # no page loads a script or stylesheet from elsewhere
        assert not re.search(r'<(script|link)[^>]+(src|href)="(https?:)?//', path.read_text()), path


def test_no_literal_roles_in_the_sources() -> None:
    """One docstring style (Markdown, mkdocs-autorefs links): no reST role in src/."""
    found = [f"{p.relative_to(ROOT)}:{i + 1}" for p in (ROOT / "src").rglob("*.py")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines())
             if re.search(r":(func|class|mod|meth|data|attr|exc|obj):`", line)]
    assert not found, f"reST roles (write [`name`][dotted.path] or `name`): {found[:10]}"


def test_math_becomes_mathml() -> None:
    pytest.importorskip("latex2mathml", reason="the docs extra: pip install -e '.[docs]'")
    hooks = importlib.util.spec_from_file_location("bc_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(hooks)
    hooks.loader.exec_module(module)
    html = ('<p>a <span class="arithmatex">\\(c_K &lt; 1\\)</span> b</p>'
            '<div class="arithmatex">\\[\\frac{a}{b}\\]</div>')
    out = module.math_to_mathml(html)
    assert "arithmatex" not in out and out.count("<math") == 2
    assert 'display="block"' in out and "<mfrac>" in out and "&#x0003C;" in out
    # an escaped underscore in a text group (Concepts' coupling\_vs\_rotated) is an underscore
    named = module.math_to_mathml('<div class="arithmatex">\\[\\texttt{coupling\\_vs\\_rotated}'
                                  ' = 1 - \\text{a\\_b}\\]</div>')
    assert ">coupling_vs_rotated</mtext>" in named and ">a_b</mtext>" in named
    assert "\\_" not in named
