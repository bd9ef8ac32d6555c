"""The command line as a user runs it: measure, show, models, report, resume, exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import blockcoupling as bc
from blockcoupling.cli import app
from tests.helpers.tiny_runs import save_tiny_lm

runner = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("model") / "tiny-gpt2")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    p.write_text("the cat sat on the mat\nwhat is the capital of france\na dog ran far\n"
                 "the dog sat\nthe cat ran on the mat\n")
    return p


def run(*args: str) -> object:
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_measure_show_report(model_dir: Path, prompts_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run("--quiet", "measure", "--model", str(model_dir), "--prompts", str(prompts_file),
            "--out", str(out), "--k", "2,4", "--coupling", "depth,self", "--tokens", "all",
            "--influence")
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["k"] == [2, 4]
    df = pd.read_parquet(out / "coupling.parquet")
    assert set(df["kind"]) == {"depth", "self"} and df["prompt_id"].nunique() == 5
    m = bc.open_run(out)
    assert len(m.coupling) == len(df) and set(m.influence["metric"]) >= {"frobenius"}
    # the stored numbers are the API's numbers
    net = bc.measure  # same model, same prompts, same options
    from blockcoupling.loading import load_model

    model, tok = load_model(str(model_dir))
    api = net(model, tok, bc.load_prompts(str(prompts_file)), k=(2, 4), coupling=("depth", "self"),
              tokens="all", influence=True, progress=False)
    pd.testing.assert_series_equal(api.coupling["value"], m.coupling["value"], check_names=False)

    r = run("show", str(out))
    assert r.exit_code == 0 and "depth-wise coupling, K=2, 5 prompts: above chance" in r.output
    # the decode-step fast path, per layer: recorded in meta and stated
    assert manifest["meta"]["fast_path"] == {"1": True, "2": True, "3": True}
    assert "fast path: taken at every measured layer (1-3)" in r.output
    html = tmp_path / "report.html"
    r = run("--quiet", "report", str(out), "--out", str(html))
    assert r.exit_code == 0, r.output
    assert html.exists() and html.stat().st_size > 10_000


def test_models_lists_architectures() -> None:
    r = run("models")
    assert r.exit_code == 0
    for arch in ("gpt2", "llama", "bert", "vit"):
        assert arch in r.output


@pytest.mark.parametrize(
    "args, message, code",
    [
        (["--model", "./no/such/model"], "does not exist", 1),
        (["--k", "500"], "larger than the model's hidden size", 1),
        (["--coupling", "diagonal"], "--coupling 'diagonal': choose from depth", 2),
        (["--tokens", "99"], "out of range", 1),
    ],
)
def test_user_errors_exit_1_with_message(model_dir: Path, prompts_file: Path, tmp_path: Path,
                                         args: list[str], message: str, code: int) -> None:
    """A user error is exit 1, an option refused as it is parsed (bad usage) exit 2; both
    one line."""
    base = {"--model": str(model_dir), "--prompts": str(prompts_file),
            "--out": str(tmp_path / "r"), "--k": "2"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv]
    r = runner.invoke(app, ["--quiet", "measure", *flat])
    assert r.exit_code == code, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1


def test_bad_usage_exits_2() -> None:
    r = runner.invoke(app, ["measure", "--no-such-flag"])
    assert r.exit_code == 2


def test_corrupt_run_dir(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    r = runner.invoke(app, ["show", str(tmp_path)])
    assert r.exit_code == 1 and "Traceback" not in r.output


@pytest.mark.slow  # the default suite has this in test_faults (SIGKILL at seeded points of six
# kinds, resumed bit-identically through the CLI) and test_bad_input (no --resume: refused)
def test_kill_and_resume_gives_the_same_numbers(model_dir: Path, prompts_file: Path,
                                                tmp_path: Path) -> None:
    """SIGKILL mid-run, then --resume: no duplicates, same numbers as one uninterrupted run."""
    words = "the a cat dog sat on mat ran far".split()
    many = tmp_path / "many.txt"
    many.write_text("\n".join(" ".join(words[(i + j) % 9] for j in range(3 + i % 5))
                              for i in range(40)))
    common = ["--model", str(model_dir), "--prompts", str(many), "--k", "2",
              "--coupling", "depth", "--tokens", "all", "--batch-size", "1"]
    full = tmp_path / "full"
    assert run("--quiet", "measure", *common, "--out", str(full)).exit_code == 0

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "blockcoupling", "--quiet", "measure", *common,
                             "--out", str(killed)])
    deadline = time.time() + 120
    parts = killed / "parts"
    while time.time() < deadline:
        if parts.exists() and len(list(parts.glob("*"))) >= 3:
            break
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = bc.open_run(killed).prompts["prompt_id"].nunique() if (killed / "manifest.json").exists() else 0
    assert done_before < 40, "the run finished before it could be killed"
    r = run("--quiet", "measure", *common, "--out", str(killed), "--resume")
    assert r.exit_code == 0, r.output
    a, b = bc.open_run(full), bc.open_run(killed)
    for name in ("coupling", "trajectory", "token_metrics", "spectra"):
        ta = a.table(name).sort_values(list(a.table(name).columns[:8])).reset_index(drop=True)
        tb = b.table(name).sort_values(list(b.table(name).columns[:8])).reset_index(drop=True)
        assert len(ta) == len(tb)
        pd.testing.assert_frame_equal(ta, tb)
    # without --resume an existing run is refused
    r = runner.invoke(app, ["--quiet", "measure", *common, "--out", str(killed)])
    assert r.exit_code == 1 and "--resume" in r.output


def test_python_dash_m_entry_point() -> None:
    r = subprocess.run([sys.executable, "-m", "blockcoupling", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "measure" in r.stdout

