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
    """A tiny GPT-2 folder, two prompts and a finished run of it (`measure`, in-process;
    its bases and Jacobians stored, for ``cross``)."""
    root = tmp_path_factory.mktemp("conventions")
    save_tiny_lm(root / "lm")
    write_prompts(root / "prompts.txt", ["the cat sat on the mat", "a dog ran far"])
    r = cli("-q", "measure", "-m", str(root / "lm"), "--prompts", str(root / "prompts.txt"),
            "--out", str(root / "run"), "--k", "2", "--batch-size", "1", "--save-bases",
            "--save-jacobians")
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
    r = cli("sweep", str(spec), "--out", str(tiny / "s"), "--dry-run", "--num-cpus", "1")
    assert r.exit_code == 0, r.output
    assert "--num-cpus is deprecated; use --cluster-cpus" in r.output
    r = cli("sweep", str(spec), "--out", str(tiny / "s"), "--executor", "local", "--json",
            "--num-cpus", "1")  # a Ray cluster's size: nothing to --executor local
    assert r.exit_code == 2 and r.output.startswith("error: --num-cpus applies with --executor "
                                                    "ray only"), r.output
    r = cli("sweep", str(spec), "--out", str(tiny / "s"), "--executor", "local", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])  # after the progress lines (stderr)
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
    assert r.exit_code == 2
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


# ---------------------------------------------------------------- every option, checked as parsed
#: what each command needs to reach its options; nothing named here is read: every option
#: is checked as it is parsed, before the command's body runs
_NEEDS: dict[str, list[str]] = {
    "correlate": ["RUN", "--scores", "paper"], "chance-floor": ["--scores", "paper"],
    "cross": ["RUN", "RUN2"], "difficulty": ["RUN"], "show": ["RUN"], "models": [],
    "perturb": ["--model", "M", "--prompts", "p.txt", "--out", "OUT"],
    "measure": ["--model", "M", "--prompts", "p.txt", "--out", "OUT"],
    "report": ["RUN", "--out", "OUT/r.html"], "demo": ["--out", "OUT"],
    "sweep": ["spec.yaml", "--out", "OUT"], "sweep-status": ["OUT"],
    "vit-train": ["--out", "OUT"], "vit-grid": ["--out", "OUT"],
    "vit-figures": ["OUT", "--out", "OUT/f"], "study lm-family": ["--out", "OUT"],
    "study generalization": ["--out", "OUT"], "study intervention": ["--out", "OUT"],
    "collection upgrade": ["OUT"],
}
#: options that take any text (a name, a path, an address): nothing to refuse as they are
#: parsed; what they name is checked when it is read, in one line (tests/cli/test_bad_input.py)
_FREE_TEXT = {"--model", "--prompts", "--out", "--json-out", "--scores", "--labels",
              "--prompt-column", "--split", "--revision", "--blocks", "--offload-folder",
              "--cache-dir", "--address", "--spec", "--runs", "--ratings", "--model-a",
              "--data-dir"}


@pytest.fixture(scope="module")
def parse() -> object:
    """The CLI run in this process, its click commands built once."""
    from tests.helpers.tiny_runs import cli_parser

    return cli_parser()


#: a value each option that requires another accepts alone
_ACCEPTED = {"--max-memory": "cpu=1GiB", "--offload-folder": "offload"}


def _rule_of(param: object) -> object:
    """The `validate.Rule` an option is checked by as it is parsed (None: none)."""
    callback = getattr(param, "callback", None)
    callback = getattr(callback, "__wrapped__", callback)
    resolve = getattr(callback, "resolve", None)
    return resolve() if resolve is not None else None


def _bad_values(rule: object) -> list[str]:
    """Values ``rule`` refuses: one of the wrong type, and each bound crossed."""
    from blockcoupling import validate

    out = ["not-a-value"]
    if rule is None:
        return out
    fn, bounds = rule  # type: ignore[misc]
    if fn in (validate.whole, validate.number):
        out += ["nan"] + (["1.5"] if fn is validate.whole else [])
        for key, step in (("minimum", -1), ("maximum", 1), ("above", 0), ("below", 0)):
            if bounds.get(key) is not None:
                out.append(f"{bounds[key] + step:g}" if fn is validate.number
                           else str(bounds[key] + step))
    if fn is validate.device_name:
        out += ["hip", "xla", "tpu:7"]
    return out


def _value_options(cmd: object, name: str) -> list[object]:
    return [p for p in cmd.get_params(click.Context(cmd, info_name=name))  # type: ignore[attr-defined]
            if _is_option(p) and not getattr(p, "is_flag", False) and p.opts[0] != "--help"]


def test_every_command_is_enumerated() -> None:
    assert {name for name, cmd in _commands() if not hasattr(cmd, "list_commands")} == \
        set(_NEEDS)


@pytest.mark.parametrize("command", sorted(_NEEDS))
def test_every_option_refuses_bad_values_as_it_is_parsed(
        command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parse: object) -> None:
    """Every option of every command (sub-commands too) that takes a value: a value of the
    wrong type and each bound of its declared rule crossed are refused in one line naming
    the option, exit 2, as the options are parsed: nothing is loaded, nothing is written.
    An option that takes a value is either checked by a rule (its record field's, or the
    `validate.Rule` its command declares) or listed as free text."""
    monkeypatch.chdir(tmp_path)
    cmd = dict(_commands())[command]
    unchecked = []
    for param in _value_options(cmd, command):
        flag = param.opts[0]  # type: ignore[attr-defined]
        rule = _rule_of(param)
        from blockcoupling import validate

        if flag in _FREE_TEXT or (rule is not None and rule[0] is validate.text):  # type: ignore[index]
            continue
        if rule is None:
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if annotation in (int, float, int | None, float | None):
                unchecked.append(flag)  # a number without a declared range
        for bad in _bad_values(rule):
            r = parse(*command.split(), *_NEEDS[command], flag, bad)  # type: ignore[operator]
            lines = r.output.strip().splitlines()  # type: ignore[attr-defined]
            where = f"{command} {flag} {bad}: {r.output!r}"  # type: ignore[attr-defined]
            assert r.exit_code == 2, where  # type: ignore[attr-defined]
            assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], where
            assert list(tmp_path.iterdir()) == [], f"{where} wrote {list(tmp_path.iterdir())}"
    assert unchecked == [], f"{command}: numbers without a declared rule: {unchecked}"


def test_every_rule_between_options_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parse: object) -> None:
    """The rules between options, declared once: a field's ``requires`` (``--init-seed``
    needs ``--init random``), a command's ``exclusive`` options (``--spec`` or ``--quick``)
    and its ``requires`` (``--address`` needs ``--executor ray``): breaking one is one line
    naming both, exit 2, nothing written; never a silent drop."""
    from blockcoupling import validate
    from blockcoupling.fields import GIVEN

    monkeypatch.chdir(tmp_path)

    def value(param: object) -> list[str]:
        """The option given with a value it accepts alone (its default, else 3)."""
        flag = param.opts[0]  # type: ignore[attr-defined]
        default = getattr(param, "default", None)
        return [flag] if getattr(param, "is_flag", False) else \
            [flag, "3" if default is None else str(default)]

    seen = []
    for name, cmd in _commands():
        params = {p.name: p for p in cmd.get_params(click.Context(cmd, info_name=name))}
        for p in params.values():
            requires = getattr(getattr(p.callback, "__wrapped__", p.callback), "requires", None)
            if requires:
                flag, other = p.opts[0], "--" + requires[0].replace("_", "-")
                alone = [flag, _ACCEPTED.get(flag, "3")]
                r = parse(*name.split(), *_NEEDS[name], *alone)  # type: ignore[operator]
                need = other if requires[1] is GIVEN else f"{other} {requires[1]}"
                assert r.exit_code == 2 and r.output.startswith(
                    f"error: {flag} applies with {need} only"), (name, flag, r.output)
                seen.append((name, flag))
        for a, others in getattr(cmd, "exclusive", {}).items():
            for b in others:
                group = [p for k, p in params.items() if k.startswith(f"{b}__")
                         and (_rule_of(p) or (None,))[0] is validate.whole]  # takes 3
                pb = params.get(b) or group[0]
                r = parse(*name.split(), *_NEEDS[name], *value(params[a]),  # type: ignore[operator]
                          *value(pb))
                lines = r.output.strip().splitlines()
                assert r.exit_code == 2 and len(lines) == 1, (name, a, b, r.output)
                assert params[a].opts[0] in lines[0] and pb.opts[0] in lines[0], lines
                seen.append((name, f"{a} x {b}"))
        for a, (other, wanted) in getattr(cmd, "requires", {}).items():
            choices = _rule_of(params[other])[1]["choices"]  # type: ignore[index]
            another = next(c for c in choices if c != wanted)
            r = parse(*name.split(), *_NEEDS[name], *value(params[a]),  # type: ignore[operator]
                      params[other].opts[0], another)
            lines = r.output.strip().splitlines()
            flag = params[a].opts[0]
            assert r.exit_code == 2 and len(lines) == 1, (name, a, r.output)
            assert lines[0].startswith(f"error: {flag} applies with {params[other].opts[0]} "
                                       f"{wanted} only"), lines
            seen.append((name, f"{a} needs {other}"))
        assert list(tmp_path.iterdir()) == [], name
    for expected in [("measure", "--init-seed"), ("perturb", "--init-seed"),
                     ("sweep", "address needs executor"), ("vit-train", "dry_run x estimate"),
                     ("study generalization", "address needs executor"),
                     ("measure", "--max-memory"), ("measure", "--offload-folder"),
                     ("study generalization", "spec x quick"), ("study lm-family", "runs x quick"),
                     ("study intervention", "address needs executor"),
                     ("study intervention", "spec x quick"),
                     ("vit-grid", "spec x config")]:
        assert expected in seen, (expected, seen)


# ---------------------------------------------------------------- one JSON dialect
def _strict(text: str) -> object:
    """JSON as every reader parses it: ``NaN``/``Infinity`` refused, and no missing value
    written as a string (``"nan"``: cross --json wrote them so)."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON output")

    doc = json.loads(text, parse_constant=refuse)
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
        assert node not in ("nan", "NaN", "inf", "-inf"), "a missing value written as a string"
    return doc


@pytest.mark.slow  # about 30 s: a sweep, a perturbation, a correlation, a rated run
def test_every_command_that_writes_json_writes_one_dialect(tiny: Path, tmp_path: Path) -> None:
    """Every command with ``--json`` (printed) or ``--json-out`` (a file): strict JSON, a
    missing value null, and a ``--json-out`` into folders that do not exist yet made as
    every other output is (it failed naming a temporary file)."""
    pytest.importorskip("statsmodels", reason="correlate needs blockcoupling[study]")
    from tests.helpers.synthetic_runs import write_synthetic_run
    from tests.helpers.tiny_runs import e2h_arc_rows

    runs = [write_synthetic_run(tmp_path / f"r{i}", 0.2 + 0.1 * i, label=f"m{i}",
                                model=f"org/m{i}", seed=i) for i in range(5)]
    scores = tmp_path / "scores.csv"
    scores.write_text("model,score\n" + "".join(f"m{i},{20 + 9 * i}\n" for i in range(5)))
    rows = e2h_arc_rows(tmp_path / "e2h.jsonl")
    rated = tmp_path / "rated"
    assert cli("-q", "measure", "-m", str(tiny / "lm"), "--prompts", f"hf:e2h-arc@{rows}",
               "--limit", "6", "--k", "2", "--out", str(rated)).exit_code == 0
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"models": [{"label": "lm", "model": str(tiny / "lm")}],
                                    "prompts": [str(tiny / "prompts.txt")],
                                    "measure": {"k": [2], "coupling": ["depth"]}}))
    measure = ["-m", str(tiny / "lm"), "--prompts", str(tiny / "prompts.txt"), "--k", "2"]
    run, lm = str(tiny / "run"), str(tiny / "lm")
    commands: dict[str, list[list[str]]] = {
        "correlate": [[*map(str, runs), "--scores", str(scores), "--n-boot", "0"]],
        "chance-floor": [["--scores", "paper"]],
        "cross": [[run, run]],
        "perturb": [["-m", lm, "--prompts", str(tiny / "prompts.txt"), "--levels", "0.1",
                     "--draws", "2", "--out", str(tmp_path / "perturb")]],
        "difficulty": [[str(rated), "--ratings", f"hf:e2h-arc@{rows}", "--n-boot", "0"]],
        "measure": [[*measure, "--out", str(tmp_path / "m"), "--dry-run"]],  # a run: as show
        "show": [[run]], "models": [[]],
        "sweep": [[str(spec), "--out", str(tmp_path / "s"), "--executor", "local"]],
        "sweep-status": [[str(tmp_path / "s")]],
        "collection upgrade": [[str(tmp_path / "s")]],
        "vit-train": [["--out", str(tmp_path / "v"), "--dry-run"]],
        "vit-grid": [["--out", str(tmp_path / "g"), "--drop-path", "0", "--weight-decay",
                      "0.1", "--dry-run"]],
        "study lm-family": [["--out", str(tmp_path / "l"), "--quick", "--dry-run"]],
        "study generalization": [["--out", str(tmp_path / "e"), "--quick", "--dry-run"]],
        "study intervention": [["--out", str(tmp_path / "i"), "--quick", "--dry-run"]],
    }
    writing = {name for name, cmd in _commands() for p in cmd.get_params(
        click.Context(cmd, info_name=name)) if _is_option(p) and p.opts[0] in ("--json",
                                                                                "--json-out")}
    assert writing == set(commands)  # every command that writes JSON is tried
    for name, cmd in _commands():
        if name not in commands:
            continue
        flags = {p.opts[0] for p in cmd.get_params(click.Context(cmd, info_name=name))
                 if _is_option(p)}
        for args in commands[name]:
            r = cli("-q", *name.split(), *args, "--json")  # stdout and stderr: no progress
            assert r.exit_code == 0, (name, r.output)
            _strict(r.output[r.output.index("{") if name == "sweep" else 0:])
        if "--json-out" in flags:
            out = tmp_path / "new" / name / "x.json"
            r = cli("-q", *name.split(), *commands[name][0], "--json-out", str(out))
            assert r.exit_code == 0 and f"wrote {out}" in r.output, (name, r.output)
            _strict(out.read_text())
