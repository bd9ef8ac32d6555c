"""docs/paper.md, the paper figure by figure: every command of the page parses as the CLI
takes it, every variable has a tiny value, the sweep specs it names are valid, every figure the
page shows is one the script collects; and (slow) every command of the page runs on tiny and
shipped models (docs/tutorials/paper_figures.py, the script the docs build runs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from blockcoupling.cli import app
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "paper.md"


P = load_script(ROOT / "docs" / "tutorials" / "paper_figures.py")


def _usage_errors() -> tuple[type[Exception], ...]:
    """click's usage error, and typer's own copy of it (typer may vendor click)."""
    import click

    out: list[type[Exception]] = [click.UsageError]
    try:
        from typer._click.exceptions import UsageError
    except ImportError:
        return tuple(out)
    return (*out, UsageError)


USAGE = _usage_errors()


def test_every_command_parses_with_the_papers_values(tmp_path: Path) -> None:
    """Each command, with the paper's values, is a valid invocation (options and arguments as
    the CLI declares them): click parses it without running it."""
    group = typer.main.get_command(app)
    commands = P.page_commands()
    assert len(commands) >= 25
    values = P.paper_values()
    assert values["LLM"] == "meta-llama/Meta-Llama-3-8B" and values["NORMDIRS"] == ""
    for command in commands:
        args = P.expand(command, values, tmp_path)
        ctx = group.make_context("blockcoupling", [*args], resilient_parsing=True)
        sub = group.get_command(ctx, args[0])
        assert sub is not None, command
        try:
            sub.make_context(args[0], args[1:])
        except USAGE as err:  # an option the command does not have
            pytest.fail(f"{command}: {err}")


def test_the_parser_catches_a_wrong_option(tmp_path: Path) -> None:
    group = typer.main.get_command(app)
    args = P.expand("blockcoupling measure --model $LLM --nope 1", {"LLM": "x"}, tmp_path)
    sub = group.get_command(group.make_context("blockcoupling", args, resilient_parsing=True),
                            args[0])
    with pytest.raises(USAGE):
        sub.make_context(args[0], args[1:])


def test_every_variable_has_a_tiny_value_and_expands() -> None:
    values = P.paper_values()
    assert set(values) == set(P.TINY_KEYS)
    used = set(re.findall(r"\$(\w+)", " ".join(P.page_commands())))
    assert used <= set(values) and used == set(values)  # no variable set but unused
    assert P.expand("blockcoupling x $NORMDIRS --k $K_GPT2,$KS", values, ROOT)[1:] == \
        ["--k", "77,10,30,50"]  # an empty variable disappears, as in a shell


def test_the_specs_the_page_names_are_valid() -> None:
    from blockcoupling.studies.sweep.spec import load_spec

    values = P.paper_values()
    for key in ("PYTHIA", "MODELS", "MODELS_RANDOM"):
        spec = load_spec(ROOT / values[key])
        assert spec.models
    assert len(load_spec(ROOT / values["MODELS"]).models) == 42  # every row of Table 1
    assert {m.init for m in load_spec(ROOT / values["MODELS_RANDOM"]).models} == {"random"}


def test_every_shown_figure_is_collected_and_every_table_and_figure_has_a_row() -> None:
    text = PAGE.read_text(encoding="utf-8")
    shown = set(re.findall(r"generated/paper_figures/([\w.]+\.png)", text))
    assert shown == set(P.FIGURES) | set(P.FILES)
    for label in ("Fig. 1a", "Fig. 1b", "Fig. 2", "Fig. 3", "Fig. 4", "Fig. 8", "Fig. 9",
                  "Fig. 10", "Fig. 11", "Fig. 12", "Fig. 16", "Fig. 17", "Fig. 23", "Fig. 24",
                  "Fig. 25", "Fig. 34", "Fig. 37", "Table 1", "Table 2", "Table 3", "Table 4",
                  "alignment_vary_k", "correlation_hyperparams", "coupling_fixedin",
                  "coupling_fixedout", "lss-all", "expo-all", "pca", "svalues_trained"):
        assert label in text, label


@pytest.mark.slow
def test_every_command_of_the_page_runs_on_tiny_models(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert P.main(out, tmp_path / "scratch") == 0
    for name in [*P.FIGURES, *P.FILES]:
        assert (out / name).stat().st_size > 5_000, name
    table = (out / "commands.md").read_text()
    assert table.count("| 0 |") == len(P.page_commands())
