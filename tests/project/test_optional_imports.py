"""Optional dependencies: one form of message when a package is missing (`errors.require`),
and no hand-written copy of that rule left in the sources."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from blockcoupling.errors import BlockCouplingError, require

SRC = Path(__file__).resolve().parents[2] / "src" / "blockcoupling"


class _Special(BlockCouplingError):
    pass


def test_present_module_is_returned() -> None:
    assert require("json.decoder", what="x", install="y").__name__ == "json.decoder"


def test_missing_module_is_one_line_naming_install_and_way_out() -> None:
    with pytest.raises(_Special) as info:
        require("no_such_pkg_bc.sub", what="the frobnicator", install="'blockcoupling[x]'",
                alternative="or use --plain", error=_Special)
    assert str(info.value) == ("the frobnicator needs no_such_pkg_bc: pip install "
                               "'blockcoupling[x]' (or use --plain)")


def test_a_modules_own_missing_dependency_is_named(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bc_wrapper_mod.py").write_text("import bc_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BlockCouplingError, match=r"^the study needs bc_missing_dependency: "):
        require("bc_wrapper_mod", what="the study", install="z")
    sys.modules.pop("bc_wrapper_mod", None)


def test_package_overrides_the_import_name() -> None:
    with pytest.raises(BlockCouplingError, match=r"needs pyyaml: pip install"):
        require("no_such_yaml_bc", what="reading", package="pyyaml", install="pyyaml")


def test_no_hand_written_install_messages_remain() -> None:
    """A ``pip install`` hint raised from an ``except ImportError`` outside errors.py is a
    second copy of `require`'s rule (positive control: the pattern finds the old form)."""
    pattern = re.compile(r"except ImportError[^\n]*\n(?:[^\n]*\n){0,3}?[^\n]*raise[^\n]*"
                         r"(?:\n[^\n]*){0,2}pip install")
    old = ('    except ImportError as err:\n        raise BlockCouplingError("x needs y: '
           'pip install z") from err\n')
    assert pattern.search(old)
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if p.name != "errors.py" and pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
