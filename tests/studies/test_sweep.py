"""Sweeps on a real local Ray cluster: tiny models and checkpoints, a failing unit, identical
weights, a worker killed mid-unit, a driver killed and resumed; spec and CLI errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

import blockcoupling as bc
from blockcoupling.cli import app
from blockcoupling.studies.sweep import SpecError, expand, parse_step, sweep_status
from tests.helpers.sweeps import MEASURE, PROMPTS, TABLES, save_model


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """study.yaml beside its models: a GPT-2, a Pythia-like GPT-NeoX run with checkpoints
    0, 10, 20 (20 has the same weights as 10) and a broken checkpoint (no weights)."""
    root = tmp_path_factory.mktemp("study")
    save_model(root / "models" / "gpt2", "gpt2", 0)
    for step, seed in ((0, 1), (10, 2)):
        save_model(root / "runs" / "train" / f"checkpoint-{step}", "gpt_neox", seed)
    shutil.copytree(root / "runs/train/checkpoint-10", root / "runs/train/checkpoint-20")
    broken = save_model(root / "runs" / "broken" / "checkpoint-5", "gpt2", 3)
    for f in broken.glob("*.safetensors"):
        f.unlink()
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    spec = {"models": [{"label": "gpt2", "model": "models/gpt2"},
                       {"label": "neox", "checkpoints": "runs/train/checkpoint-*"},
                       {"label": "broken", "checkpoints": "runs/broken/checkpoint-*"}],
            "prompts": ["prompts.txt"], "measure": MEASURE}
    import yaml

    (root / "study.yaml").write_text(yaml.safe_dump(spec))
    neox = {**spec, "models": [spec["models"][1]]}
    (root / "neox.yaml").write_text(yaml.safe_dump(neox))
    return root


@pytest.fixture(scope="module")
def reference(study: Path, ray_cluster: str) -> bc.Sweep:
    """The uninterrupted sweep every fault test is compared with."""
    return bc.run_sweep(study / "study.yaml", study / "ref", progress=False)


def _tables(s: bc.Sweep, unit_ids: list[str] | None = None) -> dict[str, pd.DataFrame]:
    out = {}
    for name in TABLES:
        df = s.table(name)
        if unit_ids is not None:
            df = df[df["unit_id"].isin(unit_ids)].reset_index(drop=True)
        out[name] = df.drop(columns=["diag_seconds", "seconds"], errors="ignore")
    return out


def _assert_same(a: bc.Sweep, b: bc.Sweep, unit_ids: list[str]) -> None:
    ta, tb = _tables(a, unit_ids), _tables(b, unit_ids)
    for name in TABLES:
        assert len(ta[name]) > 0, name
        pd.testing.assert_frame_equal(ta[name], tb[name], check_exact=True, obj=name)


# ------------------------------------------------------------------------- on Ray
def test_sweep_on_ray(study: Path, reference: bc.Sweep) -> None:
    cat = reference.catalogue
    assert cat["label"].tolist() == ["gpt2", "neox", "neox", "neox", "broken"]
    assert cat["status"].tolist() == ["done"] * 4 + ["failed"]
    # the failing unit is marked with its message; the others went on
    assert "could not load the weights" in cat["message"].iloc[4]
    # checkpoints on a numeric step column
    neox = cat[cat["label"] == "neox"]
    assert neox["step"].tolist() == [0, 10, 20]
    # identical weights (checkpoint-20 is a copy of checkpoint-10) are reported ...
    dup = reference.duplicates()
    assert len(dup) == 1 and dup["unit_id"].iloc[0].startswith("neox-step20")
    assert dup["duplicate_of"].iloc[0] == neox["unit_id"].iloc[1]
    # ... and not counted twice in the summary
    summ = reference.summary()
    assert summ["unit_id"].tolist() == cat["unit_id"].iloc[:3].tolist()
    assert len(reference.summary(include_duplicates=True)) == 4
    assert summ["coupling_mean"].between(-1, 1).all() and (summ["k"] == 2).all()
    # chance level: c_null recovered from coupling and coupling_vs_null, below 1
    assert (summ["coupling_chance"] < 1).all()
    # the summary's headline is the statistic of each unit's own run, to the last digit
    stat = bc.coupling_statistic(reference).set_index(["unit_id", "variant"])
    for _, row in summ.iterrows():
        unit = reference.open_unit(row["unit_id"])
        for variant in ("coupling_vs_null", "coupling"):
            got = row[f"{variant}_mean"]
            assert got == stat.loc[(row["unit_id"], variant), "mean"]
            assert got == unit.mean_depth_coupling(variant=variant)
            assert row[f"{variant}_se"] == stat.loc[(row["unit_id"], variant), "se"]
    # the tables carry the unit columns and equal the measurement of the unit itself
    cp = reference.coupling
    assert list(cp.columns[:6]) == ["unit_id", "label", "model", "revision", "step", "prompt_set"]
    uid = neox["unit_id"].iloc[1]
    model, tok = __import__("blockcoupling.loading", fromlist=["load_model"]).load_model(
        str(study / "runs/train/checkpoint-10"))
    cfg = bc.MeasureConfig.parse(**MEASURE)
    direct = bc.measure(model, tok, bc.load_prompts(str(study / "prompts.txt")), config=cfg,
                        progress=False)
    mine = cp[cp["unit_id"] == uid].reset_index(drop=True)
    pd.testing.assert_series_equal(mine["value"], direct.coupling["value"], check_names=False)
    # filtered reads and SQL aggregates run in DuckDB
    few = reference.table("coupling", where="step = 10", columns=["unit_id", "value"])
    assert set(few["unit_id"]) == {uid} and list(few.columns) == ["unit_id", "value"]
    n = reference.sql("SELECT label, count(*) AS n FROM coupling GROUP BY label ORDER BY label")
    assert n["label"].tolist() == ["gpt2", "neox"]
    # offline mode reaches the workers
    import ray

    @ray.remote
    def worker_env() -> str | None:
        return os.environ.get("HF_HUB_OFFLINE")

    assert ray.get(worker_env.remote()) == "1"
    # the manifest records the executor, Ray's version and address; catalogue for DuckDB
    man = json.loads((study / "ref" / "sweep.json").read_text())
    sess = man["sessions"][-1]
    assert sess["executor"] == "ray" and sess["ray_version"] and sess["address"]
    import duckdb

    got = duckdb.sql(f"SELECT count(*) FROM '{study / 'ref' / 'catalogue.parquet'}'").fetchall()[0]
    assert got[0] == 5
    # sweep-status shows done and failed units with the message
    r = CliRunner().invoke(app, ["sweep-status", str(study / "ref")])
    assert r.exit_code == 0 and "4 done" in r.output and "1 failed" in r.output
    assert "could not load the weights" in r.output
    # a second sweep into the same directory needs --resume; with it, nothing is re-run
    with pytest.raises(bc.BlockCouplingError, match="--resume"):
        bc.run_sweep(study / "study.yaml", study / "ref", progress=False)


def _poll(cond: Any, timeout: float = 240.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _status(root: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted((root / "status").glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):  # being replaced right now
            pass
    return out


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_worker_killed_mid_unit(study: Path, reference: bc.Sweep) -> None:
    out = study / "killed_worker"
    result: dict[str, Any] = {}
    th = threading.Thread(target=lambda: result.update(
        s=bc.run_sweep(study / "neox.yaml", out, progress=False, retries=2)))
    th.start()

    def running_with_a_part() -> dict[str, Any] | None:
        for rec in _status(out):
            parts = out / "units" / rec["unit"]["unit_id"] / "parts"
            if rec["status"] == "running" and parts.is_dir() and any(
                    p.name.startswith("part-") for p in parts.iterdir()):
                return rec
        return None

    victim = _poll(running_with_a_part, what="a unit with a finished part")
    os.kill(victim["pid"], signal.SIGKILL)
    th.join(timeout=300)
    assert not th.is_alive()
    s = result["s"]
    assert s.catalogue["status"].tolist() == ["done"] * 3
    rec = s.catalogue.set_index("unit_id").loc[victim["unit"]["unit_id"]]
    assert rec["attempts"] >= 2  # Ray ran it again ...
    manifest = json.loads((out / "units" / victim["unit"]["unit_id"] / "manifest.json").read_text())
    assert manifest.get("resumed")  # ... and it continued from its run directory
    _assert_same(s, reference, s.catalogue["unit_id"].tolist())


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_driver_killed_and_resumed(study: Path, reference: bc.Sweep, ray_cluster: str) -> None:
    out = study / "killed_driver"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "blockcoupling", "-q", "sweep", str(study / "neox.yaml"),
         "--out", str(out), "--address", ray_cluster],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _poll(lambda: proc.poll() is not None or any(
            r["status"] == "done" for r in _status(out)), what="the first unit")
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        # two sweeps on one directory are refused
        with pytest.raises(bc.BlockCouplingError, match="in use by another sweep"):
            bc.run_sweep(study / "neox.yaml", out, resume=True, progress=False)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    st = sweep_status(out)
    assert "done" in set(st["status"]) and set(st["status"]) - {"done", "failed"}
    s = bc.run_sweep(study / "neox.yaml", out, resume=True, progress=False)
    assert s.catalogue["status"].tolist() == ["done"] * 3
    assert len(json.loads((out / "sweep.json").read_text())["sessions"]) == 2
    _assert_same(s, reference, s.catalogue["unit_id"].tolist())  # identical rows, none twice


# ------------------------------------------------------------------------- without Ray
def test_local_executor_and_spec_resume_rules(study: Path, tmp_path: Path) -> None:
    spec = {"models": [{"label": "g", "model": str(study / "models" / "gpt2")}],
            "prompts": [str(study / "prompts.txt"),
                        {"name": "mine", "texts": ["the cat sat", "a dog ran", "the mat"]}],
            "limit": 2, "measure": MEASURE}
    s = bc.run_sweep(spec, tmp_path / "s", executor="local", progress=False)
    assert s.catalogue["status"].tolist() == ["done", "done"]
    assert s.catalogue["n_prompts"].tolist() == [2, 2]
    assert s.catalogue["prompt_set"].tolist()[1] == "inline:mine"
    texts = s.prompts
    assert texts[texts["prompt_set"] == "inline:mine"]["text"].tolist() == ["the cat sat",
                                                                             "a dog ran"]
    again = bc.run_sweep(spec, tmp_path / "s", executor="local", resume=True, progress=False)
    assert again.catalogue["attempts"].tolist() == [1, 1]  # done units are not re-run
    with pytest.raises(SpecError, match="limit"):
        bc.run_sweep({**spec, "limit": 0}, tmp_path / "s", executor="local", resume=True)
    with pytest.raises(bc.BlockCouplingError, match="another spec"):
        bc.run_sweep({**spec, "limit": 3}, tmp_path / "s", executor="local", resume=True)


def test_units_and_steps(study: Path) -> None:
    assert parse_step("step143000") == 143000 and parse_step("checkpoint-500") == 500
    assert parse_step("main") is None and parse_step("v1.0") is None
    sp = bc.load_spec(study / "study.yaml")
    ids = [u.unit_id for u in expand(sp)]
    assert ids == [u.unit_id for u in expand(bc.load_spec(study / "study.yaml"))]  # stable
    assert len(set(ids)) == 5
    # hub revisions: Pythia stepN names give the step; the id depends on the revision
    hub = bc.load_spec({"models": [{"model": "EleutherAI/pythia-70m", "steps": [0, 1000],
                                    "revisions": ["main"]}], "prompts": "builtin:capital"})
    units = expand(hub)
    assert [u.revision for u in units] == ["main", "step0", "step1000"]
    assert [u.step for u in units] == [None, 0, 1000]
    assert units[0].label == "pythia-70m" and units[0].model == "EleutherAI/pythia-70m"
    # a changed config changes every id
    other = bc.load_spec({"models": ["EleutherAI/pythia-70m"], "prompts": "builtin:capital",
                          "measure": {"k": [3]}})
    assert expand(other)[0].unit_id != units[0].unit_id


@pytest.mark.parametrize("spec, match", [
    ({"models": [{"model": "gpt2"}], "prompts": "builtin:capital", "measur": {}},
     "unknown key 'measur'"),
    ({"models": [{"model": "gpt2", "revison": ["a"]}], "prompts": "builtin:capital"},
     r"unknown key 'revison' \(in models\[0\]\)"),
    ({"models": [], "prompts": "builtin:capital"}, "models"),
    ({"models": ["gpt2"]}, "prompts"),
    ({"models": ["gpt2"], "prompts": "builtin:capital", "measure": {"k": "x"}}, "measure"),
    ({"models": ["gpt2"], "prompts": "builtin:capital", "measure": {"coupling": ["deep"]}},
     "measure: coupling 'deep': choose from depth"),
    ({"models": [{"label": "a", "model": "gpt2"}, {"label": "a", "model": "gpt2"}],
      "prompts": "builtin:capital"}, "used twice"),
    ({"models": [{"checkpoints": "/nonexistent/checkpoint-*"}], "prompts": "builtin:capital"},
     "no checkpoint folder"),
    ({"models": [{"model": "gpt2", "steps": [-1]}], "prompts": "builtin:capital"}, "steps"),
    ({"models": ["gpt2"], "prompts": [{"name": "x", "texts": []}]}, r"prompts\[0\].texts"),
    ({"models": ["gpt2"], "prompts": [{"name": "x", "text": ["a"]}]}, "unknown key 'text'"),
    # a loading key is named where it is written: a top-level default as itself, an entry's
    # own value under its entry
    ({"device": "gpu", "models": [{"model": "a", "device": "cpu"}, "b"],
      "prompts": "builtin:capital"}, r"^device 'gpu'"),
    ({"init_seed": -2, "models": ["gpt2"], "prompts": "builtin:capital"}, r"^init_seed must"),
    ({"device": "cpu", "models": [{"model": "a", "device": "gpu"}],
      "prompts": "builtin:capital"}, r"^models\[0\]\.device 'gpu'"),
])
def test_spec_errors(spec: dict[str, Any], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        expand(bc.load_spec(spec))


def test_cli_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    for text, match in (("models: [\n", "not valid YAML at line 2"),
                        ("models: [gpt2]\nprompts: builtin:capital\nmeasure: {kk: 1}\n",
                         "unknown key 'kk' (in measure)")):
        bad.write_text(text)
        r = runner.invoke(app, ["sweep", str(bad), "--out", str(tmp_path / "o")])
        assert r.exit_code == 2, r.output  # a spec refused: bad usage, as an option
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0]
    r = runner.invoke(app, ["sweep", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not found" in r.output
    r = runner.invoke(app, ["sweep", str(bad), "--out", str(tmp_path / "o"), "--executor", "x"])
    assert r.exit_code == 2 and "--executor 'x': choose from ray, local" in r.output
    r = runner.invoke(app, ["sweep-status", str(tmp_path)])
    assert r.exit_code == 1 and "not a sweep directory" in r.output


def test_stored_spec_and_units_of_the_loading_options_are_pinned(tmp_path: Path) -> None:
    """A spec with every loading option, top-level defaults and per-model overrides: its
    stored form (``sweep.json``'s spec), its unit ids and a unit's record are the literals
    written before the options moved onto ``ModelSource`` (old sweeps resume unchanged)."""
    spec = bc.load_spec({
        "models": [{"label": "a", "model": "org/a", "revisions": ["step1", "main"],
                    "dtype": "float16", "quantize": "bnb-8bit", "trust_remote_code": True,
                    "resources": {"num_gpus": 1}},
                   {"label": "b", "model": "org/b", "init": "random", "init_seed": 3,
                    "device": "cpu", "allow_missing_weights": True},
                   {"label": "c", "model": "org/c", "device_map": "auto",
                    "max_memory": "0=1GiB,cpu=2GiB", "offload_folder": "/tmp/off"}],
        "prompts": ["builtin:capital"], "limit": 2, "dtype": "bfloat16",
        "allow_missing_weights": False,
        "resources": {"num_cpus": 2}, "measure": {"k": [3]}})
    common = {"checkpoints": None, "trust_remote_code": False}
    assert json.loads(json.dumps(spec.to_dict()["models"])) == [
        {"label": "a", "model": "org/a", "revisions": ["step1", "main"], "checkpoints": None,
         "dtype": "float16", "device": "auto", "resources": {"num_cpus": 2, "num_gpus": 1},
         "trust_remote_code": True, "loading": [["quantize", "bnb-8bit"]]},
        {"label": "b", "model": "org/b", "revisions": [], **common, "dtype": "bfloat16",
         "device": "cpu", "resources": {"num_cpus": 2, "num_gpus": 0.0},
         "loading": [["allow_missing_weights", True]],
         "init": "random", "init_seed": 3},
        {"label": "c", "model": "org/c", "revisions": [], **common, "dtype": "bfloat16",
         "device": "auto", "resources": {"num_cpus": 2, "num_gpus": 0.0},
         "loading": [["device_map", "auto"], ["max_memory", "0=1GiB,cpu=2GiB"],
                     ["offload_folder", "/tmp/off"]]}]
    units = expand(spec)
    assert [u.unit_id for u in units] == [
        "a-step1-capital-910628a3de8a", "a-main-capital-7d15b71db2d9",
        "b-main-capital-3c4b08568b77", "c-main-capital-a54e8a24f419"]
    record = {k: v for k, v in units[1].to_dict().items() if k not in ("config", "config_hash")}
    assert record == {
        "unit_id": "a-main-capital-7d15b71db2d9", "label": "a", "model": "org/a",
        "revision": "main", "step": None, "prompt_set": "builtin:capital", "limit": 2,
        "dtype": "float16", "device": "auto", "num_cpus": 2, "num_gpus": 1,
        "trust_remote_code": True, "prompt_texts": (),
        "loading": {"quantize": "bnb-8bit"}, "inputs": {},
        "run": "", "init": "pretrained", "init_seed": 0}
