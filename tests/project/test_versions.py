"""The supported version range is stated in one place and tested at both ends.

``constraints-oldest.txt`` pins the oldest supported releases; ``make test-compat`` (run by
CI after ``make test``) runs the engine tests and the model-family matrix against them, while
``make test`` runs everything on the newest releases pip resolves. pyproject.toml's lower
bounds and the README must say the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import load_script

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    gen_reference = load_script(ROOT / "tools" / "gen_reference.py")
    return {"transformers": gen_reference.oldest_supported("transformers")}


def test_pyproject_lower_bounds_are_the_oldest_tested() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, version in _pins().items():
        spec = next(d for d in deps if re.match(rf"{name}\b", d))
        assert spec.split(",")[0] == f"{name}>={version}", spec


def test_readme_states_the_supported_range() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, version in _pins().items():
        assert f"{name} {version}" in readme


def test_make_test_compat_runs_the_conformance_matrix_and_ci_runs_it() -> None:
    make = (ROOT / "Makefile").read_text()
    assert "tests/engine/test_families.py" in make and "-c constraints-oldest.txt" in make
    assert "make test-compat" in (ROOT / ".ci" / "run").read_text()
