"""What every command shares: --version, shell completion, --json on the commands that print
results, -q/-v before or after the command, one value syntax per option name, complete help
without markup, and plain progress lines (no escape codes, no carriage returns) when stderr is
not a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
import yaml

import blockcoupling
from blockcoupling.cli import app
from tests.helpers.tiny_runs import cli, save_tiny_lm, write_prompts


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 folder, two prompts and a finished run of it (`measure`, in-process)."""
    root = tmp_path_factory.mktemp("conventions")
    save_tiny_lm(root / "lm")
    write_prompts(root / "prompts.txt", ["the cat sat on the mat", "a dog ran far"])
    r = cli("-q", "measure", "-m", str(root / "lm"), "--prompts", str(root / "prompts.txt"),
            "--out", str(root / "run"), "--k", "2", "--batch-size", "1")
    assert r.exit_code == 0, r.output
    return root


def test_version_and_completion() -> None:
    r = cli("--version")
    assert r.exit_code == 0 and r.output.strip() == f"blockcoupling {blockcoupling.__version__}"
    out = cli("--help").output
    assert "--install-completion" in out and "--show-completion" in out


def test_show_json_and_quiet_after_the_command(tiny: Path) -> None:
    r = cli("show", str(tiny / "run"), "--json", "-q")  # -q after the command is accepted
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["complete"] is True and doc["prompts_done"] == doc["prompts_total"] == 2
    assert doc["config"]["k"] == [2] and doc["rows"]["coupling"] > 0
    [stat] = [s for s in doc["statistic"] if s["variant"] == "coupling"]
    assert stat["k"] == 2 and -1 <= stat["mean"] <= 1 and stat["n_prompts"] == 2
    from blockcoupling.store import open_run

    assert stat["mean"] == open_run(tiny / "run").mean_depth_coupling(2)  # the one rule
    models = json.loads(cli("models", "--json").output)
    assert "gpt2" in models


def test_sweep_json_sweep_status_json_and_the_deprecated_alias(tiny: Path) -> None:
    spec = tiny / "spec.yaml"
    spec.write_text(yaml.safe_dump({"models": [{"label": "lm", "model": str(tiny / "lm")}],
                                    "prompts": [str(tiny / "prompts.txt")],
                                    "measure": {"k": [2], "coupling": ["depth"],
                                                "batch_size": 1}}))
    r = cli("sweep", str(spec), "--out", str(tiny / "s"), "--executor", "local", "--json",
            "--num-cpus", "1")
    assert r.exit_code == 0, r.output
    assert "--num-cpus is deprecated; use --cluster-cpus" in r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert doc["done"] == 1 and doc["failed"] == 0 and doc["ray_address"] is None
    r = cli("sweep-status", str(tiny / "s"), "--json")
    assert r.exit_code == 0, r.output
    st = json.loads(r.output)
    assert st["counts"] == {"done": 1}
    assert [u["status"] for u in st["units"]] == ["done"]
    # the headline statistic of each done unit, with its rule
    assert st["statistic"]["variant"] == "coupling_vs_rotated" and "se" in st["statistic"]
    assert st["statistic"]["replication"] == "prompts (within model)"
    unit = st["summary"][0]
    assert unit["coupling_vs_rotated_mean"] is not None and "coupling_se" in unit
    assert unit["coupling_vs_null_mean"] is not None
    assert "--num-cpus" not in cli("sweep", "--help").output  # hidden


def test_list_options_take_one_value_where_one_is_used(tmp_path: Path) -> None:
    r = cli("vit-train", "--out", str(tmp_path / "v"), "--k", "10,30")
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        "error: --k 10,30: this command uses one value (e.g. --k 10); lists are for measure"]
    assert not (tmp_path / "v").exists()


def _commands(group: click.Command | None = None, prefix: str = "") -> list[tuple[str, click.Command]]:
    """Every command, those of sub-groups (``study lm-family``) included."""
    group = typer.main.get_command(app) if group is None else group
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):  # type: ignore[attr-defined]
        cmd = group.get_command(ctx, name)  # type: ignore[attr-defined]
        out.append((prefix + name, cmd))
        if hasattr(cmd, "list_commands"):  # a group (typer's own click: not click.Group)
            out += _commands(cmd, f"{prefix}{name} ")
    return out


def _is_option(param: object) -> bool:
    """An option of a command (typer ships its own click: ``click.Option`` is not its base)."""
    return getattr(param, "param_type_name", None) == "option"


def test_every_option_has_help_without_markup() -> None:
    for name, cmd in _commands():
        ctx = click.Context(cmd, info_name=name)
        for param in cmd.get_params(ctx):
            if _is_option(param) and not param.hidden:
                assert (param.help or "").strip(), f"{name} {param.opts[0]} has no help"
        text = cmd.get_help(ctx)
        for markup in ("``", ":func:", ":class:", "[bold", "\b"):
            assert markup not in text, f"{name} --help shows {markup!r}"


def test_arguments_read_as_names_not_python() -> None:
    """A command's positional arguments are named in capitals in its usage line, its help
    and its missing-argument error: never typer's ``{run_dirs}`` placeholder nor a Python
    type such as ``<list[Path]>`` (and the generated CLI reference says the same)."""
    import re

    from typer.testing import CliRunner

    seen = 0
    for name, cmd in _commands():
        args = [p for p in cmd.params if getattr(p, "param_type_name", "") == "argument"]
        if not args:
            continue
        seen += 1
        out = CliRunner().invoke(app, [*name.split(), "--help"], terminal_width=200).output
        for a in args:
            label = a.name.upper() + ("..." if a.nargs != 1 else "")
            assert re.search(rf"Usage: .* {re.escape(label)}", out), (name, out[:300])
            assert "{" + a.name + "}" not in out, (name, out[:300])
        assert "<list[" not in out, (name, out)
        for a in args:  # the argument's row: its name, then its help (no Python type between)
            label = a.name.upper() + ("..." if a.nargs != 1 else "")
            assert re.search(rf"^  {re.escape(label)}  +\w", out, re.M), (name, out)
        missing = CliRunner().invoke(app, name.split())
        if missing.exit_code == 2 and "Missing argument" in missing.output:
            assert f"Missing argument '{args[0].name.upper()}'" in missing.output, missing.output
    assert seen >= 8


#: options that mean one thing in every command that has them: one help text (vit-grid's
#: and study generalization's --address had said "default: start a local one", while they
#: reach RAY_ADDRESS or a running cluster first, as sweep's said); the loading options of
#: measure and perturb are ModelSource's
SHARED_MEANING = ("--address", "--cluster-cpus", "--json", "--revision", "--dtype", "--device",
                  "--trust-remote-code", "--allow-missing-weights", "--init", "--init-seed")


def test_an_option_that_means_one_thing_has_one_help() -> None:
    helps: dict[str, dict[str, str]] = {}
    for name, cmd in _commands():
        for param in cmd.get_params(click.Context(cmd, info_name=name)):
            if _is_option(param) and param.opts[0] in SHARED_MEANING:
                helps.setdefault(param.opts[0], {})[name] = " ".join((param.help or "").split())
    assert {"sweep", "vit-grid", "study generalization"} <= set(helps["--address"])
    assert {"measure", "perturb"} <= set(helps["--init-seed"])
    for flag, by_command in helps.items():
        assert len(set(by_command.values())) == 1, (flag, by_command)


def test_measure_progress_in_a_log_file_is_plain_lines(tiny: Path, tmp_path: Path) -> None:
    """stderr redirected to a file: one line per finished prompt, no escape code, no \\r."""
    log = tmp_path / "stderr.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "blockcoupling", "measure", "-m", str(tiny / "lm"),
             "--prompts", str(tiny / "prompts.txt"), "--out", str(tmp_path / "run"),
             "--k", "2", "--batch-size", "1"],
            env=env, stdout=subprocess.PIPE, stderr=err, timeout=300)
    assert proc.returncode == 0, log.read_text()
    data = log.read_bytes()
    assert b"\x1b" not in data and b"\r" not in data, data[:500]
    lines = [ln for ln in data.decode().splitlines() if ln.startswith("prompts: ")]
    assert [ln.split(" (")[0] for ln in lines] == ["prompts: 1/2 prompt", "prompts: 2/2 prompt"]
    assert "depth-wise coupling" in proc.stdout.decode()  # results still on stdout


def test_quiet_sweep_still_reports_failed_units(tiny: Path) -> None:
    broken = save_tiny_lm(tiny / "broken")
    for f in broken.glob("*.safetensors"):
        f.unlink()
    spec = tiny / "broken.yaml"
    spec.write_text(yaml.safe_dump({"models": [{"label": "broken", "model": str(broken)}],
                                    "prompts": [str(tiny / "prompts.txt")],
                                    "measure": {"k": [2], "coupling": ["depth"]}}))
    r = cli("sweep", str(spec), "--out", str(tiny / "sb"), "--executor", "local", "-q")
    assert r.exit_code == 1
    assert "0 of 1 units done, 1 failed" in r.output  # -q hides progress, never results
    failed = [ln for ln in r.output.splitlines() if ln.startswith("  failed broken")]
    assert len(failed) == 1 and "could not load" in failed[0], r.output


def test_json_flag_and_the_older_json_file_form(tmp_path: Path) -> None:
    """--json prints on stdout; --json FILE.json (before --json was a flag) still writes FILE."""
    pytest.importorskip("statsmodels", reason="the correlation study needs blockcoupling[study]")
    r = cli("chance-floor", "--scores", "paper", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    r = cli("chance-floor", "--scores", "paper", "--json", str(tmp_path / "floor.json"))
    assert r.exit_code == 0 and f"wrote {tmp_path / 'floor.json'}" in r.output, r.output
    assert json.loads((tmp_path / "floor.json").read_text()) == doc
