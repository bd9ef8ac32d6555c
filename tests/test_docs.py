"""The documentation site: every public name has a docstring, the generated reference pages
cover the code, and the site builds with ``mkdocs build --strict`` after running the tutorials.

The docstring check reads the docstrings the way the API reference renders them (griffe, the
loader of mkdocstrings), so a dataclass's generated signature or an inherited class docstring
does not count as documentation.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import blockcoupling as bc

ROOT = Path(__file__).resolve().parent.parent


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
def test_site_builds_strictly_and_shows_the_tutorials(tmp_path: Path) -> None:
    """The whole site from a copy of the checkout: the hook runs the three tutorials (they
    write their figures and tables), then ``mkdocs build --strict`` (warnings are errors)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    pytest.importorskip("material", reason="the docs extra is not installed")
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("mkdocs.yml", "README.md", "BENCHMARKS.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs",
                    ignore=shutil.ignore_patterns("generated", "__pycache__"))
    shutil.copytree(ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "src").symlink_to(ROOT / "src")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", BLOCKCOUPLING_DOCS_FRESH="1",
               HF_HUB_OFFLINE="1", MPLBACKEND="Agg",
               BLOCKCOUPLING_CACHE=str(tmp_path / "cache"))
    env.pop("BLOCKCOUPLING_DOCS_TUTORIALS", None)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(tmp_path / "site")], cwd=root, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-6000:]
    site = tmp_path / "site"
    for figure in ("above_chance/above_chance.png", "emergence/emergence.png",
                   "width_floor/width_floor.png", "width_floor/floor_curve.png"):
        assert (site / "tutorials" / "generated" / figure).stat().st_size > 10_000, figure
    page = (site / "tutorials" / "above-chance" / "index.html").read_text()
    assert "coupling_vs_null" in page and "z = mean / se" in page  # the table was included
    assert "blockcoupling measure" in (site / "reference" / "cli" / "index.html").read_text()
    assert "measure_to_dir" in (site / "reference" / "api" / "index.html").read_text()
