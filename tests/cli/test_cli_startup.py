"""The command line starts fast (no torch at ``--help``), the package exports resolve lazily,
and boolean options take the --x/--no-x form."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import blockcoupling
from blockcoupling.cli import app

HEAVY = ("torch", "pandas", "numpy", "matplotlib", "transformers", "ray", "rich")

_PROBE = """
import json, runpy, sys
sys.argv = ["blockcoupling", *sys.argv[1:]]
try:
    runpy.run_module("blockcoupling", run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["show", "--help"]])
def test_help_imports_no_heavy_library(argv: list[str]) -> None:
    """``blockcoupling --help`` (and a command's help) must not import torch & co: they are
    what made it take ~4 s. (``measure --help`` builds its options from MeasureConfig, which
    imports torch: only that command pays for it.)"""
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          check=True)
    loaded = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert "Usage" in proc.stdout
    assert not loaded & set(HEAVY), f"--help imported {sorted(loaded & set(HEAVY))}"


def test_every_export_resolves() -> None:
    for name in blockcoupling.__all__:
        assert getattr(blockcoupling, name) is not None, name
    assert set(blockcoupling.__all__) <= set(dir(blockcoupling))
    with pytest.raises(AttributeError, match="no attribute"):
        blockcoupling.not_a_name  # noqa: B018


def test_boolean_flags_have_a_negative_form_and_help() -> None:
    out = CliRunner().invoke(app, ["measure", "--help"], terminal_width=200).output
    for flag in ("--final-norm", "--influence", "--resume", "--trust-remote-code",
                 "--remove-norm-directions"):
        assert f"{flag} / --no-{flag[2:]}" in out, flag
    assert "<bool>" not in out
    trust = out.split("--trust-remote-code / --no-trust-remote-code", 1)[1].split("\n  --", 1)[0]
    assert "trust" in trust.lower() and len(trust.split()) > 3  # the option has help text


def test_measure_config_options_are_parsed_and_reach_the_command() -> None:
    """The lazily added MeasureConfig options parse like the others (a bad value: exit 2 with
    the parser's message in one line, as the options are parsed: before any model is
    loaded)."""
    res = CliRunner().invoke(app, ["measure", "--model", "m", "--prompts", "p", "--out", "o",
                                   "--k", "ten", "--remove-norm-directions"])
    assert res.exit_code == 2 and res.output.startswith("error: --k='ten'"), res.output
    assert len(res.output.strip().splitlines()) == 1


def test_final_norm_true_is_a_usage_error_that_names_the_flag_form() -> None:
    """``--final-norm true`` is not a value: click rejects the extra argument (exit 2)."""
    res = CliRunner().invoke(app, ["measure", "--model", "m", "--prompts", "p", "--out", "o",
                                   "--final-norm", "true"])
    assert res.exit_code == 2
