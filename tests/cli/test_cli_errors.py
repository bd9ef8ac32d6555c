"""The CLI's error handling lives once, in cli/app.py (user_errors, guarded): no command
catches BlockCouplingError or OSError by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import typer

from blockcoupling.cli.app import STATE, guarded, user_errors
from blockcoupling.errors import BlockCouplingError

CLI = Path(__file__).resolve().parents[2] / "src" / "blockcoupling" / "cli"


def test_user_errors_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert not STATE["verbose"]
    with pytest.raises(typer.Exit) as stop, user_errors("cannot read the runs"):
        raise PermissionError(13, "Permission denied", "/runs/a")
    assert stop.value.exit_code == 1
    assert capsys.readouterr().err.strip() == (
        "error: cannot read the runs: /runs/a: Permission denied; check the path and try again")
    with pytest.raises(typer.Exit), user_errors():
        raise BlockCouplingError("say what to do")
    assert capsys.readouterr().err.strip() == "error: say what to do"


def test_guarded_says_what_is_saved_on_ctrl_c(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as stop, guarded(saved="units are saved in X"):
        raise KeyboardInterrupt
    assert stop.value.exit_code == 130
    assert "interrupted: units are saved in X; run the same command again" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(p.name for p in CLI.glob("*.py")
                                        if p.name not in ("app.py", "__init__.py")))
def test_no_command_catches_user_errors_by_hand(path: str) -> None:
    """A handler that reports an error to the user (fail, os_error, typer.Exit) is the shared
    guard's job; handlers that only decide something (e.g. "not a ViT folder") are fine."""
    tree = ast.parse((CLI / path).read_text(encoding="utf-8"))
    reporting = {"fail", "_fail", "os_error", "_os_error", "Exit"}

    def names(node: ast.AST) -> set[str]:
        return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
                if isinstance(n, ast.Name | ast.Attribute)}

    by_hand = [f"line {h.lineno}" for h in ast.walk(tree)
               if isinstance(h, ast.ExceptHandler) and names(ast.Module(h.body, [])) & reporting]
    assert by_hand == [], f"cli/{path} reports errors by hand ({by_hand}): use user_errors"
