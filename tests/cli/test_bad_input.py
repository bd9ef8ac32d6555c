"""Bad input through the command line, as a newcomer or a hostile user gives it.

Every case must end with exit code 1 (a user error) or 2 (bad usage: an option or a spec key
refused), in one line ``error: ...`` that says what to do, never a traceback, and must leave
nothing behind that refuses the corrected command: where a case writes under ``--out``, the
corrected command is run into the same ``--out`` and must succeed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tiny_runs import assert_user_error, cli, save_tiny_lm, write_prompts


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bad")
    out = {
        "model": save_tiny_lm(base / "model"),
        "notok": save_tiny_lm(base / "notok", tokenizer=False),
        "causal": save_tiny_lm(base / "causal", head=True),
        "prompts": write_prompts(base / "prompts.txt", ["the cat sat", "a dog ran far"]),
    }
    for name, content in {"corrupt": os.urandom(4096), "truncated": None}.items():
        folder = base / name
        shutil.copytree(out["model"], folder)
        weights = folder / "model.safetensors"
        data = content if content is not None else weights.read_bytes()[:200]
        weights.write_bytes(data)
        out[name] = folder
    (base / "latin1.txt").write_bytes("the cat\ncaf\xe9 au lait\n".encode("latin-1"))
    (base / "surrogate.jsonl").write_text('{"text": "the cat"}\n{"text": "a \\ud800 dog"}\n')
    (base / "nul.txt").write_bytes(b"the cat\n\x00\x00\x00\n")
    (base / "empty.txt").write_text("\n\n")
    (base / "bad.jsonl").write_text('{"text": "the cat"}\n{"text": \n')
    (base / "nocol.csv").write_text("question,answer\nthe cat,a dog\n")
    (base / "prompts.pdf").write_text("the cat\n")
    (base / "long.txt").write_text("the cat sat\n" + " ".join(["the cat"] * 30) + "\n")
    (base / "afile").write_text("not a folder\n")
    for name in ("latin1.txt", "surrogate.jsonl", "nul.txt", "empty.txt", "bad.jsonl",
                 "nocol.csv", "prompts.pdf", "long.txt", "afile"):
        out[name] = base / name
    return out


def measure_args(files: dict[str, Path], out: Path, *extra: str, model: str = "model",
                 prompts: str = "prompts") -> list[str]:
    m = files[model] if model in files else model
    p = files[prompts] if prompts in files else prompts
    return ["--quiet", "measure", "--model", str(m), "--prompts", str(p), "--out", str(out),
            "--k", "2", "--coupling", "depth", *extra]


def assert_corrected_command_works(files: dict[str, Path], out: Path) -> None:
    r = cli(*measure_args(files, out))
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------------------- config
@pytest.mark.parametrize(("option", "value", "expected"), [
    ("--k", "abc", "--k"),
    ("--p", "abc", "--p"),
    ("--tokens", ",", "--tokens"),
    ("--k", "4.7", "--k"),
    ("--batch-size", "abc", "--batch-size"),
    ("--k", "0", "--k must be a whole number >= 1"),
    ("--p", "3", "p = 1, 2 or inf"),
    ("--tokens", "first", "--tokens"),
    ("--batch-size", "0", "--batch-size"),
    ("--seed", str(2**64), "--seed"),
    ("--init-seed", "-1", "--init-seed"),
    ("--coupling", "diagonal", "choose from"),
    ("--variant", "nope", "choose from"),
    ("--orientation", "up", "choose from"),
    ("--method", "magic", "method"),
    ("--analysis-dtype", "float16", "float32 or float64"),
    ("--layers", "0", "numbered from 1"),
    ("--limit", "0", "limit"),
    ("--dtype", "int8", "choose one of"),
    ("--device", "tpu:7", "device"),
])
def test_bad_option_values(files: dict[str, Path], tmp_path: Path, option: str, value: str,
                           expected: str) -> None:
    out = tmp_path / "run"
    r = cli(*measure_args(files, out, option, value))
    assert_user_error(r, expected, code=2)  # refused as the options are parsed
    assert not out.exists(), "a refused command wrote its run directory"


@pytest.mark.parametrize("args", [
    ["measure", "--prompts", "x.txt", "--out", "o"],  # no --model
    ["measure", "--model", "m", "--prompts", "x.txt", "--out", "o", "--no-such-option"],
    ["no-such-command"],
    ["show"],
])
def test_bad_usage_exits_2(args: list[str]) -> None:
    r = cli(*args)
    assert_user_error(r, code=2)


@pytest.mark.parametrize(("extra", "expected"), [
    (["--k", "64"], "hidden size d=16"),
    (["--layers", "9..16"], "3 blocks"),
])
def test_config_that_does_not_fit_the_model_writes_nothing(files: dict[str, Path], tmp_path: Path,
                                                           extra: list[str], expected: str) -> None:
    out = tmp_path / "run"
    for resume in ([], ["--resume"]):
        r = cli(*measure_args(files, out, *extra, *resume))
        assert_user_error(r, expected)
        assert not out.exists()
    assert_corrected_command_works(files, out)


@pytest.mark.parametrize(("extra", "expected"), [
    (["--blocks", "no_such"], "no sub-module 'no_such'"),
    (["--blocks", "norm"], "pass the path of the list of layers"),
])
def test_blocks_that_cannot_be_found_write_nothing(files: dict[str, Path], tmp_path: Path,
                                                   extra: list[str], expected: str) -> None:
    """A model whose blocks are not where --blocks says: one line saying what to pass."""
    out = tmp_path / "run"
    r = cli(*measure_args(files, out, *extra, model="causal"))
    assert_user_error(r, expected)
    assert not out.exists()


# ---------------------------------------------------------------------------- prompts
@pytest.mark.parametrize(("prompts", "expected"), [
    ("latin1.txt", "not UTF-8"),
    ("surrogate.jsonl", "lone surrogate"),
    ("nul.txt", "NUL bytes"),
    ("empty.txt", "empty"),
    ("bad.jsonl", "not valid JSON"),
    ("nocol.csv", "--prompt-column"),
    ("prompts.pdf", ".txt"),
    ("missing.txt", "not found"),
    ("builtin:nonexistent", "known: builtin:"),
    ("long.txt", "context of 32"),
])
def test_bad_prompts_are_refused_before_anything_is_written(files: dict[str, Path], tmp_path: Path,
                                                            prompts: str, expected: str) -> None:
    out = tmp_path / "run"
    r = cli(*measure_args(files, out, prompts=prompts))
    assert_user_error(r, expected)
    assert not out.exists()


def test_a_prompt_of_only_unknown_symbols_is_not_measured_silently(files: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    p = tmp_path / "odd.txt"
    p.write_text("the cat sat\n\u2603 \u2603\n")  # tokenizes to [UNK] [UNK] only
    r = cli(*measure_args(files, tmp_path / "run", prompts=str(p)))
    assert_user_error(r, "no text token")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- models
@pytest.mark.parametrize(("model", "expected"), [
    ("notok", "no usable tokenizer"),
    ("corrupt", "could not load the weights"),
    ("truncated", "could not load the weights"),
    ("./no/such/folder", "does not exist"),
    ("afile", "config.json"),
])
def test_bad_model_folders(files: dict[str, Path], tmp_path: Path, model: str,
                           expected: str) -> None:
    out = tmp_path / "run"
    r = cli(*measure_args(files, out, model=model))
    assert_user_error(r, expected)
    assert not out.exists()


def test_unreachable_hub_fails_at_once_with_the_ways_out(files: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    r = cli(*measure_args(files, tmp_path / "run", model="nobody/no-such-model-xyz"))
    assert_user_error(r, "cannot be reached", "local model folder", "HF_HUB_OFFLINE=1")


def test_hub_id_not_in_the_cache_offline(files: dict[str, Path], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli(*measure_args(files, tmp_path / "run", model="nobody/no-such-model-xyz"))
    assert_user_error(r, "HF_HUB_OFFLINE=1")


def test_quiet_loading_shows_no_bar_and_no_load_report(files: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """-q silences transformers' weight bar; a causal LM's unused lm_head is not reported.
    (A real process: transformers writes to the file descriptors, not to click's streams.)"""

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "blockcoupling",
                          *measure_args(files, tmp_path / "run", model="causal")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    everything = res.stdout + res.stderr
    assert "Loading weights" not in everything
    assert "UNEXPECTED" not in everything and "LOAD REPORT" not in everything
    # -q: no progress and no library chatter, but the results (issue 20: never hidden)
    assert res.stderr.strip() == "", res.stderr
    assert "depth-wise coupling" in res.stdout and "wrote" in res.stdout


def test_saving_a_model_writes_no_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    """transformers' "Writing model shards" bar (carriage returns) stays out of the studies'
    logs: every checkpoint a study saves goes through loading.save_model."""
    import transformers as tf
    from transformers.utils import logging as hf_logging

    from blockcoupling.loading import save_model

    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        model.save_pretrained(tmp_path / "plain")
        assert "Writing model shards" in capsys.readouterr().err  # the bar this test keeps out
        save_model(model, tmp_path / "quiet")
        assert capsys.readouterr().err == ""
        assert hf_logging.is_progress_bar_enabled()  # restored afterwards
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()
    assert (tmp_path / "quiet" / "config.json").is_file()


def test_no_library_bars_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without -q, a log file (stderr not a terminal: what the CLI passes) gets no
    hub/transformers bars; a terminal keeps them; what the user set stays."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    from blockcoupling.verbosity import set_verbosity

    was, hub_was = hf_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled()
    try:
        for tty, preset, expected in ((False, None, "1"), (True, None, None), (False, "0", "0")):
            if preset is None:
                monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
            else:
                monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", preset)
            hf_logging.enable_progress_bar()
            set_verbosity(terminal=tty)
            assert os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == expected
            assert hf_logging.is_progress_bar_enabled() is (expected != "1")
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()
        (hub_utils.disable_progress_bars if hub_was else hub_utils.enable_progress_bars)()


# ---------------------------------------------------------------------------- --out
def test_out_under_a_file(files: dict[str, Path], tmp_path: Path) -> None:
    r = cli(*measure_args(files, files["afile"] / "run"))
    assert_user_error(r, "is a file", "another --out")
    r = cli(*measure_args(files, files["afile"]))
    assert_user_error(r, "is a file")


def test_out_is_a_folder_of_other_files(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    for resume in ([], ["--resume"]):
        r = cli(*measure_args(files, out, *resume))
        assert_user_error(r, "new", "--out")
    assert (out / "notes.txt").read_text() == "keep me"


def _read_only_dir(tmp_path: Path) -> Path | None:
    """A folder nobody may write to: a read-only tmpfs (as root), or chmod 555 otherwise."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        return ro
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                         capture_output=True)
    return ro if res.returncode == 0 else None


def test_read_only_output_parent_and_run_directory(files: dict[str, Path], tmp_path: Path) -> None:
    ro = _read_only_dir(tmp_path)
    if ro is None:
        pytest.skip("no read-only folder can be made here")
    try:
        r = cli(*measure_args(files, ro / "run"))
        assert_user_error(r, "not writable")
        r = cli("report", str(files["model"]), "--out", str(ro / "report.html"))
        assert r.exit_code == 1 and "Traceback" not in r.output
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], capture_output=True)
        else:
            ro.chmod(0o755)


# ---------------------------------------------------------------------------- runs
def test_existing_run_and_resume_with_other_settings(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert_corrected_command_works(files, out)
    r = cli(*measure_args(files, out))
    assert_user_error(r, "--resume")
    r = cli(*measure_args(files, out, "--resume", "--batch-size", "1"))
    out_text = r.output
    assert r.exit_code == 1 and "Traceback" not in out_text
    assert "batch_size: run has 8, now 1" in out_text and "--batch-size 8" in out_text
    r = cli(*measure_args(files, out, "--resume"))  # the run's own options: nothing to do
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("target", ["missing", "file", "foreign"])
def test_show_and_report_on_what_is_not_a_run(files: dict[str, Path], tmp_path: Path,
                                              target: str) -> None:
    path = {"missing": tmp_path / "nope", "file": files["afile"], "foreign": files["model"]}[target]
    assert_user_error(cli("show", str(path)), "run")
    assert_user_error(cli("report", str(path), "--out", str(tmp_path / "r.html")), "run")
    assert not (tmp_path / "r.html").exists()
