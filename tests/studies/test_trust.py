"""Trust on the newer surfaces (issue 35): every file read is verified, inputs are checked
before work starts, and no silent wrong number comes from models, scores or tables.

Each test reproduces one problem found by trying the study layer, stored bases, ``cross``,
``chance-floor``, lm-eval scores, offload, full and read-only disks as a careful and an
unlucky user would, and checks what happens now: one line and exit 1 for bad input,
detection and repair for damage, identical results after the repair.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import blockcoupling as bc
from blockcoupling.errors import BlockCouplingError
from tests.helpers.tiny_runs import (
    assert_identical_runs,
    assert_user_error,
    cli,
    save_tiny_lm,
    write_prompts,
)

# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny GPT-2 folder (3 blocks), broken copies of it, and a prompt file."""
    root = tmp_path_factory.mktemp("trust")
    model = save_tiny_lm(root / "model")
    out = {"root": root, "model": model,
           "prompts": write_prompts(root / "prompts.txt", ["the cat sat", "a dog ran far"])}

    def variant(name: str, config: dict[str, Any] | None = None,
                drop: str | None = None) -> None:
        folder = root / name
        shutil.copytree(model, folder)
        if config:
            cfg = json.loads((folder / "config.json").read_text())
            cfg.update(config)
            (folder / "config.json").write_text(json.dumps(cfg))
        if drop is not None:
            from safetensors.torch import load_file, save_file

            tensors = {k: v.clone() for k, v in load_file(folder / "model.safetensors").items()
                       if not k.startswith(drop)}
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        out[name] = folder

    variant("no_block", drop="h.2.")  # the weights lack block 3
    variant("more_layers", {"n_layer": 4})  # the config names a block the weights lack
    variant("fewer_layers", {"n_layer": 2})  # the weights hold a block the config lacks
    variant("wider", {"n_embd": 32})  # every tensor has another shape
    variant("bad_heads", {"n_head": 5})  # no model can be built from this config
    variant("unknown_type", {"model_type": "no-such-model"})
    variant("no_weights")
    (out["no_weights"] / "model.safetensors").unlink()
    return out


def measure_args(base: dict[str, Path], out: Path, *extra: str, model: str = "model") -> list[str]:
    return ["--quiet", "measure", "--model", str(base[model]), "--prompts",
            str(base["prompts"]), "--out", str(out), "--k", "2", "--coupling", "depth", *extra]


# ---------------------------------------------------------------------------- item 1: loading
@pytest.mark.parametrize(("model", "pieces"), [
    ("no_block", ["lack 12 tensors", "h.2 (12 tensors)", "--allow-missing-weights"]),
    ("more_layers", ["lack 12 tensors", "h.3", "number of layers"]),
    ("fewer_layers", ["tensors the config does not describe", "h.2"]),
    ("wider", ["config", "does not match its weights", "other shapes"]),
    ("bad_heads", ["config", "divisible", "fix config.json"]),
    ("unknown_type", ["architecture", "no-such-model"]),
    ("no_weights", ["weights", "missing or damaged"]),
])
def test_a_checkpoint_that_does_not_load_completely_is_one_line_naming_the_cause(
        base: dict[str, Path], tmp_path: Path, model: str, pieces: list[str]) -> None:
    """Before: missing block weights were initialised at random (unseeded) and measured with
    exit 0; every failure read "damaged weights". Now: one line naming what is missing or
    extra (and the cause: config, architecture or weights); nothing is written."""
    out = tmp_path / "run"
    r = cli(*measure_args(base, out, model=model))
    assert_user_error(r, *pieces)
    assert not out.exists()


def test_missing_weights_accepted_knowingly_are_seeded_and_recorded(base: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    runs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        torch.manual_seed(1000 + i)  # whatever the global RNG holds: the same model
        r = cli(*measure_args(base, out, "--allow-missing-weights", model="no_block"))
        assert r.exit_code == 0, r.output
        runs.append(out)
    assert_identical_runs(runs[0], runs[1])
    from blockcoupling.loading import load_model

    state = torch.get_rng_state()
    load_model(str(base["no_block"]), device="cpu", progress=False, allow_missing_weights=True)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is left as it was
    meta = bc.open_run(runs[0]).meta
    assert meta["loading"]["accepted"] is True
    assert len(meta["loading"]["missing"]) == 12
    assert all(k.startswith("h.2.") for k in meta["loading"]["missing"])


def test_a_complete_checkpoint_reports_nothing_missing_and_a_head_is_not_block_weights(
        base: dict[str, Path], tmp_path: Path) -> None:
    from blockcoupling.loading import load_model, load_report

    model, _ = load_model(str(base["model"]), device="cpu", progress=False)
    assert load_report(model) == {"missing": [], "unexpected": [], "accepted": False}
    causal = save_tiny_lm(tmp_path / "causal", head=True)  # LlamaForCausalLM: an lm_head
    model, _ = load_model(str(causal), device="cpu", progress=False)
    assert load_report(model) == {"missing": [], "unexpected": [], "accepted": False}


def test_load_report_rules() -> None:
    """The rules on transformers' report, as any version returns it (sets, lists, tuples)."""
    from blockcoupling.loading import check_load_report
    from tests.helpers.tiny_models import tiny_model

    model = tiny_model("gpt2")
    ok = check_load_report(model, {"missing_keys": ["pooler.dense.weight"],
                                   "unexpected_keys": {"lm_head.weight", "cls.bias"}}, "m")
    assert ok == {"missing": ["pooler.dense.weight"], "unexpected": [], "accepted": False}
    with pytest.raises(BlockCouplingError, match=r"h\.1 \(2 tensors\)"):
        check_load_report(model, {"missing_keys": ["h.1.ln_1.weight", "h.1.ln_1.bias"]}, "m")
    with pytest.raises(BlockCouplingError, match="other shapes"):
        check_load_report(model, {"mismatched_keys": [("wte.weight", (4, 2), (4, 3))]}, "m",
                          allow_missing_weights=True)
    got = check_load_report(model, {"unexpected_keys": ["h.5.attn.c_attn.weight"]}, "m",
                            allow_missing_weights=True)
    assert got["accepted"] and got["unexpected"] == ["h.5.attn.c_attn.weight"]


def test_sweep_spec_allow_missing_weights_is_a_boolean() -> None:
    from blockcoupling.studies.sweep import load_spec

    base = {"models": [{"label": "a", "model": "gpt2"}], "prompts": ["builtin:capital"]}
    spec = load_spec({**base, "allow_missing_weights": True})
    assert dict(spec.models[0].loading)["allow_missing_weights"] is True
    with pytest.raises(BlockCouplingError, match="allow_missing_weights must be true or false"):
        load_spec({**base, "allow_missing_weights": "yes"})


# ---------------------------------------------------------------------------- item 2: bases
@pytest.fixture(scope="module")
def bases_ref(base: dict[str, Path]) -> Path:
    """A finished run with stored bases and Jacobians (two prompts: two bases files)."""
    out = base["root"] / "bases_ref"
    r = cli(*measure_args(base, out, "--save-bases", "--save-jacobians"))
    assert r.exit_code == 0, r.output
    assert len(list((out / "bases").iterdir())) == 2
    return out


def _flip(path: Path, where: int = -5) -> None:
    data = bytearray(path.read_bytes())
    data[where] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flipped", "deleted", "folder deleted"])
def test_damaged_stored_bases_are_reported_and_rebuilt_by_resume(
        base: dict[str, Path], bases_ref: Path, tmp_path: Path, how: str) -> None:
    """Before: with bases/ deleted or a bit flipped, ``show`` said complete and
    ``--resume`` repaired nothing. Now: ``show`` and a collection's check name the damage;
    ``--resume`` measures the prompts of the damaged files again and rebuilds them, bit for
    bit the files first written."""
    from blockcoupling.errors import RunDirError
    from blockcoupling.store.integrity import verify_complete

    out = tmp_path / "run"
    shutil.copytree(bases_ref, out)
    first = sorted((out / "bases").iterdir())[0]
    if how == "flipped":
        _flip(first)
    elif how == "deleted":
        first.unlink()
    else:
        shutil.rmtree(out / "bases")
    r = cli("show", str(out))
    assert_user_error(r, "stored bases", "--resume")
    with pytest.raises(RunDirError, match="stored bases"):
        verify_complete(out)  # what sweep-status and a sweep's --resume check for each unit
    dry = cli(*measure_args(base, out, "--save-bases", "--save-jacobians", "--resume",
                            "--dry-run"))
    assert dry.exit_code == 0, dry.output
    r = cli(*measure_args(base, out, "--save-bases", "--save-jacobians", "--resume"))
    assert r.exit_code == 0, r.output
    for f in sorted((bases_ref / "bases").iterdir()):
        assert (out / "bases" / f.name).read_bytes() == f.read_bytes(), f.name
    assert_identical_runs(out, bases_ref)
    verify_complete(out)
    assert cli("show", str(out)).exit_code == 0


# ---------------------------------------------------------------------------- item 2: caches
def _tiny_lm_cfg() -> Any:
    from blockcoupling.studies.tiny_lm import TinyLMConfig

    return TinyLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=4,
                        max_steps=4, checkpoints=(0, 4), warmup_steps=1, val_windows=2)


@pytest.fixture(scope="module")
def lm_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A trained tiny LM in its own cache and the bytes of every file of it."""
    from blockcoupling.studies.tiny_lm import tiny_lm_dir, train_tiny_lm

    cache = tmp_path_factory.mktemp("lmcache")
    cfg = _tiny_lm_cfg()
    train_tiny_lm(cfg, cache, progress=False, monitor=False)
    target = tiny_lm_dir(cfg, cache)
    files = {p.relative_to(target).as_posix(): p.read_bytes()
             for p in target.rglob("*") if p.is_file()}
    return {"cache": cache, "cfg": cfg, "target": target, "files": files}


def _damage_cache(target: Path, how: str) -> None:
    if how == "weights flipped":
        _flip(target / "step-000004" / "model.safetensors", -3)
    elif how == "accuracy edited":
        log = json.loads((target / "training.json").read_text())
        log["checkpoints"]["4"]["val_accuracy"] = 99.0
        (target / "training.json").write_text(json.dumps(log, indent=1))
    elif how == "log truncated":
        (target / "training.json").write_bytes((target / "training.json").read_bytes()[:50])
    elif how == "checkpoint deleted":
        shutil.rmtree(target / "step-000000")
    elif how == "file added":
        (target / "step-000004" / "pytorch_model.bin").write_bytes(b"x")
    elif how == "no checksums (older cache)":
        (target / "checksums.json").unlink()
    elif how == "checksums edited":
        sums = json.loads((target / "checksums.json").read_text())
        sums["files"]["training.json"] = "sha256:" + "0" * 64
        (target / "checksums.json").write_text(json.dumps(sums))


CACHE_DAMAGE = ["weights flipped", "accuracy edited", "log truncated", "checkpoint deleted",
                "file added", "no checksums (older cache)", "checksums edited"]


@pytest.mark.parametrize("how", CACHE_DAMAGE)
def test_a_damaged_training_cache_is_trained_again_identically(lm_cache: dict[str, Any],
                                                               tmp_path: Path, how: str) -> None:
    """Before: a cache holding ``training.json`` was reused unchecked (an edited accuracy
    changed H1's slope, an altered weight changed a run's coupling, a truncated log was a
    traceback). Now: every file is checked against the sealed checksums written with it; a
    damaged cache is named in one warning and trained again, into the same bytes."""
    from blockcoupling.studies.tiny_lm import cache_problem, train_tiny_lm, training_log

    cache = tmp_path / "cache"
    shutil.copytree(lm_cache["cache"], cache)
    target = cache / lm_cache["target"].name
    _damage_cache(target, how)
    assert cache_problem(target) is not None
    if how in ("accuracy edited", "log truncated", "checksums edited"):
        with pytest.raises(BlockCouplingError, match="damaged"):  # a reader never uses it
            training_log(lm_cache["cfg"], cache)
    with pytest.warns(UserWarning, match="cannot be reused"):
        train_tiny_lm(lm_cache["cfg"], cache, progress=False, monitor=False)
    assert cache_problem(target) is None
    got = {p.relative_to(target).as_posix(): p.read_bytes()
           for p in target.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(lm_cache["files"])
    for name, data in lm_cache["files"].items():  # timings aside, the same bytes
        if name not in ("training.json", "checksums.json"):
            assert got[name] == data, name
    log, ref = json.loads(got["training.json"]), json.loads(lm_cache["files"]["training.json"])
    for key in ("seconds", "monitor_seconds"):
        log.pop(key), ref.pop(key)
    assert log == ref


def test_a_full_or_read_only_training_cache_is_one_line_and_the_next_run_trains_identically(
        lm_cache: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a full disk under the study cache was a ``SafetensorError`` traceback. Now:
    the error safetensors reports (``os error 28``) is an OSError and one line that says
    what to do; nothing half-written stays, and the next run trains the same bytes."""
    from transformers import PreTrainedModel

    from blockcoupling.studies import tiny_lm

    real_save = PreTrainedModel.save_pretrained
    calls = {"n": 0}

    class FullDisk(Exception):  # what safetensors' Rust writer raises
        pass

    def failing_save(model: Any, *a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint
            raise FullDisk("Error while serializing: I/O error: No space left on device "
                           "(os error 28)")
        return real_save(model, *a, **k)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", failing_save)
    cache = tmp_path / "cache"
    with pytest.raises(BlockCouplingError, match="no space left.*free some space") as err:
        tiny_lm.train_tiny_lm(lm_cache["cfg"], cache, progress=False, monitor=False)
    assert "\n" not in str(err.value)
    assert not any(cache.iterdir())  # the temporary folder is gone, no cache was made
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real_save)
    tiny_lm.train_tiny_lm(lm_cache["cfg"], cache, progress=False, monitor=False)
    target = cache / lm_cache["target"].name
    assert (target / "step-000004" / "model.safetensors").read_bytes() == \
        lm_cache["files"]["step-000004/model.safetensors"]
    # a folder that cannot be written: one line naming BLOCKCOUPLING_CACHE
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(BlockCouplingError, match="BLOCKCOUPLING_CACHE|cannot write"):
        tiny_lm.train_tiny_lm(lm_cache["cfg"], blocked / "cache", progress=False,
                              monitor=False)


def test_os_error_of_reads_the_errno_safetensors_reports() -> None:
    from blockcoupling.loading import os_error_of

    err = os_error_of(RuntimeError("I/O error: Read-only file system (os error 30)"), "/x")
    assert isinstance(err, OSError) and err.errno == errno.EROFS and err.filename == "/x"
    plain = OSError(errno.ENOSPC, "full")
    assert os_error_of(plain) is plain and os_error_of(ValueError("other")) is None


# ---------------------------------------------------------------------------- item 2: grids
VIT_TINY = dict(preset="tiny", hidden_size=16, depth=2, heads=2, image_size=8, train_limit=64,
                test_limit=16, batch_size=32, k=2, monitor_images=1, final_images=2,
                monitor_every=0, epochs=1)


@pytest.mark.parametrize("how", ["accuracy edited", "model flipped"])
def test_an_edited_grid_record_is_refused_by_readers_and_trained_again(
        tmp_path: Path, how: str) -> None:
    """Before: a grid unit's ``metrics.json`` with an edited test accuracy was printed and
    plotted as it was. Now: the record is sealed (and holds the saved model's checksum); a
    reader refuses it in one line, ``sweep-status`` shows the point damaged, and the same
    vit-grid command trains it again, into the same numbers."""
    from blockcoupling.store import collection as store
    from blockcoupling.studies.sweep import sweep_status
    from blockcoupling.studies.vit.grid import collect_runs, run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    base = VitTrainConfig(**VIT_TINY)
    kw = dict(drop_paths=(0.1,), weight_decays=(0.01,), executor="local", progress=False,
              threads=1)
    root = tmp_path / "grid"
    first = run_grid(base, root, **kw)
    unit = next((root / store.UNITS).iterdir())
    if how == "accuracy edited":
        rec = json.loads((unit / "metrics.json").read_text())
        rec["final"]["test_accuracy"] = 0.99
        rec["epochs"][-1]["test_accuracy"] = 0.99
        (unit / "metrics.json").write_text(json.dumps(rec, indent=2))
    else:
        _flip(unit / "model" / "model.safetensors")
    with pytest.raises(BlockCouplingError, match="damaged.*same vit-grid") as err:
        collect_runs(root)
    assert "\n" not in str(err.value)
    assert set(sweep_status(root)["status"]) == {"damaged"}
    again = run_grid(base, root, **kw)
    cols = ["test_accuracy", "train_accuracy", "coupling", "coupling_vs_null"]
    pd.testing.assert_frame_equal(again[cols], first[cols], check_exact=True)
    assert set(sweep_status(root)["status"]) == {"done"}


# ---------------------------------------------------------------------------- item 4: studies
def _small_spec(**over: Any) -> Any:
    from blockcoupling.studies.lm_study import parse_study_spec

    data = {"runs": [{"name": "a", "n_layer": 2, "n_embd": 16, "batch_size": 4,
                      "max_steps": 16, "seeds": [0, 1]},
                     {"name": "b", "n_layer": 3, "n_embd": 16, "batch_size": 4, "max_steps": 16},
                     {"name": "c", "n_layer": 2, "n_embd": 16, "batch_size": 8,
                      "max_steps": 16}],
            "k": 2, "n_prompts": 2, "prompt_length": 16, "block_size": 16, "min_steps": 16}
    return parse_study_spec({**data, **over})


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any training is a failure of the test: the study must refuse before it."""
    from blockcoupling.studies.lm_study import run

    def train(*a: Any, **k: Any) -> None:
        raise AssertionError("the study trained before its checks")

    monkeypatch.setattr(run, "train_tiny_lm", train)


@pytest.mark.parametrize("case", ["executor", "out is a file", "out holds other files",
                                  "out in use", "another spec with results"])
def test_a_study_checks_everything_before_it_trains(no_training: None, tmp_path: Path,
                                                    case: str) -> None:
    """Before: prompts, their lengths and the executor were checked after training every
    run, and a refused second study on a running one's --out rewrote its prompts.txt. Now:
    every check runs first, and --out is written only under the study's lock."""
    from blockcoupling.store import collection as store
    from blockcoupling.store.fileio import dir_lock
    from blockcoupling.studies.lm_study import run_study

    out, executor = tmp_path / "out", "local"
    if case == "executor":
        executor = "rayy"
    elif case == "out is a file":
        out.write_text("")
    elif case == "out holds other files":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case in ("out in use", "another spec with results"):
        out.mkdir()
        (out / "prompts.txt").write_text("a running study's prompts\n")
    if case == "another spec with results":
        (out / "study-spec.json").write_text(json.dumps({"runs": []}))
        (out / "sweep" / store.STATUS).mkdir(parents=True)
        (out / "sweep" / store.MANIFEST).write_text("{}")
        (out / "sweep" / store.STATUS / "u.json").write_text(
            json.dumps({"unit": {"unit_id": "u"}, "status": "done"}))
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else None
    match = {"executor": "executor", "out is a file": "is a file|--out",
             "out holds other files": "other files", "out in use": "in use",
             "another spec with results": "another spec"}[case]
    if case == "out in use":
        with dir_lock(out), pytest.raises(BlockCouplingError, match=match):
            run_study(out, _small_spec(), progress=False, executor=executor,
                      cache_dir=tmp_path / "cache")
    else:
        with pytest.raises(BlockCouplingError, match=match):
            run_study(out, _small_spec(), progress=False, executor=executor,
                      cache_dir=tmp_path / "cache")
    if before is not None:
        assert sorted(p.name for p in out.iterdir()) == before
    if case == "out in use":
        assert (out / "prompts.txt").read_text() == "a running study's prompts\n"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("change", "match"), [
    ({"n_prompts": 10**9}, "n_prompts must be a whole number >= 2 and <= 1024"),
    ({"block_size": 10**8}, "block_size must be a whole number"),
    ({"prompt_length": 32}, "prompt_length 32 is longer than block_size 24"),
    ({"runs": [{"name": 5, "n_layer": 2, "n_embd": 16, "batch_size": 4, "max_steps": 16,
                "seeds": [0, 1, 2, 3]}]}, "name must be a name"),
    ({"runs": [{"name": "a", "n_layer": 1, "n_embd": 16, "batch_size": 4, "max_steps": 16,
                "seeds": [0, 1, 2, 3]}]}, "n_layer must be a whole number >= 2"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 10**6, "batch_size": 4, "max_steps": 16,
                "seeds": [0, 1, 2, 3]}]}, "n_embd must be a whole number"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 16, "batch_size": 4, "max_steps": 2**40,
                "seeds": [0, 1, 2, 3]}]}, "max_steps must be a whole number"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 16, "batch_size": 4, "max_steps": 16,
                "seeds": [0, 1, 2, 2**40]}]}, "seed must be a whole number"),
])
def test_every_study_spec_field_has_a_type_and_a_bound(change: dict[str, Any], match: str,
                                                       tmp_path: Path) -> None:
    """Before: a name that was not a string ended in a TypeError after the whole study, a
    huge width in a MemoryError in --dry-run, a huge prompt count in a long hang. Now: one
    line from the spec, in --dry-run as in the run, before anything is built."""
    import yaml

    from blockcoupling.studies.lm_study import quick_spec

    spec = {**quick_spec().to_dict(), **change}
    for run in spec["runs"]:
        run.pop("seed", None) if "seeds" in run else None
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(spec))
    for extra in (["--dry-run"], []):
        r = cli("study", "lm-family", "--runs", str(path), "--out", str(tmp_path / "o"), *extra)
        out = assert_user_error(r, code=2)  # a spec refused, by the run and its --dry-run
        assert match in out, out
    assert not (tmp_path / "o").exists()


def test_study_dry_run_checks_out_as_the_run_does(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    r = cli("-q", "study", "lm-family", "--quick", "--out", str(tmp_path / "afile" / "x"),
            "--dry-run")
    assert_user_error(r, "is a file")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("")
    r = cli("-q", "study", "lm-family", "--quick", "--out", str(tmp_path / "busy"), "--dry-run")
    assert_user_error(r, "other files")
    r = cli("-q", "study", "lm-family", "--quick", "--out", str(tmp_path / "new"), "--dry-run",
            "--executor", "rayy")
    assert_user_error(r, "--executor 'rayy': choose from ray, local", code=2)
    r = cli("-q", "study", "lm-family", "--quick", "--out", str(tmp_path / "new"), "--dry-run")
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_a_study_measures_again_what_was_trained_again(tmp_path: Path) -> None:
    """A run whose cache was damaged is trained again; where its weights came out other than
    those its sweep units were measured on (another thread count, say), those units are
    measured again, so a run's coupling and its accuracy always come from one training.
    Here the other weights are simulated by the study's record of what it measured."""
    from blockcoupling.store import collection as store
    from blockcoupling.studies.lm_study.run import TRAINED_FILE, run_study

    out, cache = tmp_path / "out", tmp_path / "cache"
    spec = _small_spec()
    first = run_study(out, spec, cache_dir=cache, progress=False).to_dict()
    # a flipped weight: trained again into the same bytes, so nothing is measured again
    target = next(p for p in cache.iterdir() if (p / "step-000016").is_dir())
    _flip(target / "step-000016" / "model.safetensors")
    with pytest.warns(UserWarning, match="cannot be reused"):
        again = run_study(out, spec, cache_dir=cache, progress=False).to_dict()
    for rec in (first, again):
        rec.pop("seconds")
    assert again == first
    assert not [r for r in store.all_status(out / "sweep") if r.get("repaired")]
    # the sweep's units of run a-s0 were measured on other weights: measured again
    from blockcoupling.store.verified import SEAL, write_sealed

    trained = json.loads((out / TRAINED_FILE).read_text())
    trained["a-s0"] = "0" * 16
    trained.pop(SEAL)
    write_sealed(out / TRAINED_FILE, trained)  # as the study writes it
    third = run_study(out, spec, cache_dir=cache, progress=False).to_dict()
    third.pop("seconds")
    assert third == first
    redone = {r["unit"]["label"] for r in store.all_status(out / "sweep") if r.get("repaired")}
    assert redone == {"a-s0"}


@pytest.mark.slow
def test_another_checkpoint_cache_is_refused_or_replaced(tmp_path: Path) -> None:
    """The same study into the same folder from another checkpoint cache (its sweep names
    other checkpoint paths): refused in one line that says why, or, with ``replace`` (the
    demo, which owns its folder; ``BLOCKCOUPLING_CACHE`` changed with ``demo_run/``
    present), measured afresh with the same numbers."""
    from blockcoupling.studies.lm_study import run_study

    out, spec = tmp_path / "out", _small_spec()
    first = run_study(out, spec, cache_dir=tmp_path / "a", progress=False).to_dict()
    with pytest.raises(BlockCouplingError, match="sweep of other checkpoints .*checkpoint "
                       "cache.*another --out"):
        run_study(out, spec, cache_dir=tmp_path / "b", progress=False)
    again = run_study(out, spec, cache_dir=tmp_path / "b", progress=False, replace=True).to_dict()
    for rec in (first, again):
        rec.pop("seconds")
    assert again == first


# ---------------------------------------------------------------------------- item 3: identity
def test_cross_compares_prompt_texts_not_ids(tmp_path: Path) -> None:
    """Before: two runs of different prompt files with the same file stem (the same prompt
    ids) were cross-coupled with exit 0. Now: the texts are compared by their sha256."""
    from blockcoupling.studies.cross import cross_coupling
    from blockcoupling.studies.tiny_lm import build_tokenizer
    from tests.helpers.tiny_models import tiny_model

    model, tok = tiny_model("gpt2"), build_tokenizer("abcdefgh ")
    opts = dict(coupling=("depth",), k=(2,), progress=False, save_bases=True,
                save_jacobians=True)
    bc.measure_to_dir(model, tok, [("p:1", "abc def"), ("p:2", "fed cab")], tmp_path / "a",
                      **opts)
    bc.measure_to_dir(model, tok, [("p:1", "abc def"), ("p:2", "bad fed")], tmp_path / "b",
                      **opts)
    with pytest.raises(BlockCouplingError, match="only in run A: p:2; only in run B: p:2"):
        cross_coupling(tmp_path / "a", tmp_path / "b")
    own = cross_coupling(tmp_path / "a", tmp_path / "a").coupling
    assert len(own) > 0
    # issue 40: joined by the text, not the id: the same texts under other ids, in another
    # order, are the same prompts (run A's ids name the rows)
    bc.measure_to_dir(model, tok, [("q:2", "fed cab"), ("q:1", "abc def")], tmp_path / "c",
                      **opts)
    other = cross_coupling(tmp_path / "a", tmp_path / "c").coupling
    pd.testing.assert_frame_equal(other.drop(columns="run_b"), own.drop(columns="run_b"))


def _units(revisions: list[str | None], label: str | None = None) -> list[Any]:
    from blockcoupling.studies.correlate import ModelUnit

    return [ModelUnit(label=label or (f"org/m@{r}" if r else "org/m"), model="org/m", revision=r,
                      coupling=pd.DataFrame(), hidden_size=16, num_layers=2)
            for r in revisions]


def _models(units: list[Any], d: int = 16) -> pd.DataFrame:
    return pd.DataFrame({"label": [u.label for u in units], "layers_run": [2] * len(units),
                         "d_model_run": [d] * len(units), "score": np.nan})


def test_correlate_matches_revisions_exactly(tmp_path: Path) -> None:
    """Before: a run measured at --revision step1000 took the main revision's row (the bare
    model id). Now: only that revision's row, unless --any-revision (said in a warning)."""
    from blockcoupling.studies.correlate import match_scores

    scores = pd.DataFrame({"model": ["org/m", "org/m@step2000"], "score": [50.0, 40.0]})
    units = _units(["step1000"])
    with pytest.raises(BlockCouplingError, match="only that revision's row.*--any-revision"):
        match_scores(_models(units).drop(columns="score"), units, scores)
    for label in ("org/m", "m"):  # a label that is just the model id is no revision's name
        units = _units(["step1000"], label=label)
        with pytest.raises(BlockCouplingError, match="no score"):
            match_scores(_models(units).drop(columns="score"), units, scores)
    with pytest.warns(UserWarning, match="revision step1000.*takes the score of 'org/m'"):
        table, _ = match_scores(_models(units).drop(columns="score"), units, scores,
                                any_revision=True)
    assert table["score"].tolist() == [50.0]
    units = _units(["step2000", None])
    table, _ = match_scores(_models(units).drop(columns="score"), units, scores)
    assert table["score"].tolist() == [40.0, 50.0]


def test_correlate_uses_the_measured_shape_and_says_where_the_table_differs() -> None:
    """Before: d_model and layers came from the score table over the measured model's own.
    Now: the measured shape is used; a table that disagrees is named in a warning."""
    from blockcoupling.studies.correlate import match_scores

    units = _units([None])
    scores = pd.DataFrame({"model": ["org/m"], "score": [50.0], "d_model": [4096.0],
                           "layers": [2.0]})
    with pytest.warns(UserWarning, match="gives d_model 4096, the run measured 16"):
        table, _ = match_scores(_models(units).drop(columns="score"), units, scores)
    assert table["d_model"].tolist() == [16.0] and table["d_model_scores"].tolist() == [4096.0]
    assert table["log_d_model"].tolist() == [pytest.approx(np.log10(16))]
    unknown = _models(units, d=0).drop(columns="score")  # a run that does not know its width
    table, _ = match_scores(unknown, units, scores)
    assert table["d_model"].tolist() == [4096.0]


def test_lmeval_metrics_outside_zero_one_are_one_line(tmp_path: Path) -> None:
    """Before: a results file written in percent (30.0 for 0.30) became a score of 3000.
    Now: every metric is a fraction in [0, 1], or one line naming it."""
    from blockcoupling.studies.lmeval import LmEvalError, read_lmeval

    doc = {"results": {"arc_challenge": {"acc_norm,none": 30.0}},
           "config": {"model_args": "pretrained=org/m"}}
    (tmp_path / "results_2024.json").write_text(json.dumps(doc))
    with pytest.raises(LmEvalError, match=r"arc_challenge.*is 30, not a fraction") as err:
        read_lmeval(tmp_path)
    assert "\n" not in str(err.value)
    doc["results"]["arc_challenge"]["acc_norm,none"] = 0.3
    (tmp_path / "results_2024.json").write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 1 of the 6 Leaderboard tasks: said, not here
        assert read_lmeval(tmp_path)["score"].tolist() == [pytest.approx(30.0)]


# ---------------------------------------------------------------------------- item 5
@pytest.mark.parametrize(("d_model", "match"), [
    ("1e30", "is not a width"), ("inf", "is not a width"), ("768.5", "is not a width"),
    ("-5", "is not a width"), ("0", "is not a width"), ("1", "is not a width"),
])
def test_chance_floor_refuses_widths_that_are_not_widths(tmp_path: Path, d_model: str,
                                                         match: str) -> None:
    """Before: a huge d_model became a negative integer and was fitted (K = 1, floor 0), inf
    was a traceback. Now: one line naming the row."""
    csv = tmp_path / "s.csv"
    csv.write_text(f"model,score,d_model\na,1,{d_model}\nb,2,1024\nc,3,2048\nd,4,4096\n")
    r = cli("chance-floor", "--scores", str(csv))
    assert_user_error(r, "model a", match)


def test_chance_floor_refuses_k_not_below_d(tmp_path: Path) -> None:
    csv = tmp_path / "s.csv"
    csv.write_text("model,score,d_model\na,1,8\nb,2,1024\nc,3,2048\nd,4,4096\n")
    assert_user_error(cli("chance-floor", "--scores", str(csv), "--k-rule", "10"),
                      "K = 10 is not below d_model 8")
    r = cli("chance-floor", "--scores", str(csv))  # K = round(8/10) = 1 < 8: fine
    assert r.exit_code == 0, r.output
    csv.write_text("model,score,d_model\na,1,\nb,2,1024\nc,3,2048\nd,4,4096\ne,5,8192\n")
    r = cli("chance-floor", "--scores", str(csv))  # a blank width: listed as excluded
    assert r.exit_code == 0 and "excluded a: no d_model" in r.output, r.output


@pytest.mark.parametrize("flags", [["-qv"], ["-vq"], ["-q", "-v"]])
def test_combined_global_flags_after_a_command_work_as_before_it(
        bases_ref: Path, flags: list[str]) -> None:
    """Before: ``show r -qv`` was a usage error while ``-qv show r`` worked."""
    after, before = cli("show", str(bases_ref), *flags), cli(*flags, "show", str(bases_ref))
    assert after.exit_code == before.exit_code == 0, after.output
    assert after.output == before.output


def test_measure_dry_run_refuses_what_the_run_refuses(base: dict[str, Path],
                                                      bases_ref: Path, tmp_path: Path) -> None:
    """Before: ``measure --dry-run`` did not check --out: it printed a plan the run refused."""
    from blockcoupling.store.fileio import dir_lock

    args = ["--save-bases", "--save-jacobians"]
    r = cli(*measure_args(base, bases_ref, *args, "--dry-run"))
    assert_user_error(r, "already exists", "--resume")
    r = cli(*measure_args(base, bases_ref, "--dry-run", "--resume"))  # other settings
    assert r.exit_code == 1 and "cannot resume" in r.output, r.output
    out = tmp_path / "run"
    shutil.copytree(bases_ref, out)
    with dir_lock(out):
        r = cli(*measure_args(base, out, *args, "--dry-run", "--resume"))
        assert_user_error(r, "in use by another")
    r = cli(*measure_args(base, out, *args, "--dry-run", "--resume"))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in bases_ref.iterdir())


def test_a_model_offloaded_entirely_to_disk_is_measured(base: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """Before: ``NotImplementedError: Cannot copy out of meta tensor``. Now: its inputs go
    to the hooks' execution device and every block is materialised in turn; the numbers are
    the model's own."""
    pytest.importorskip("accelerate")
    ref, out = tmp_path / "plain", tmp_path / "offloaded"
    assert cli(*measure_args(base, ref)).exit_code == 0
    r = cli(*measure_args(base, out, "--device-map", "auto", "--max-memory", "cpu=0GiB",
                          "--offload-folder", str(tmp_path / "offload")))
    assert r.exit_code == 0, r.output
    assert "disk" in json.dumps(bc.open_run(out).meta.get("device_map"))
    pd.testing.assert_frame_equal(bc.open_run(out).coupling, bc.open_run(ref).coupling)


def _mount(where: Path, options: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                         capture_output=True)
    return res.returncode == 0


def test_a_full_or_read_only_offload_folder_is_one_line(base: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """Before: a full offload folder was reported as damaged weights. Now: one line naming
    the folder; with space freed the same command measures the model."""
    pytest.importorskip("accelerate")
    binary = tmp_path / "bin_model"  # a .bin checkpoint: accelerate writes offloaded weights
    shutil.copytree(base["model"], binary)
    from safetensors.torch import load_file

    torch.save(load_file(binary / "model.safetensors"), binary / "pytorch_model.bin")
    (binary / "model.safetensors").unlink()
    base = {**base, "bin": binary}
    offload = ["--device-map", "auto", "--max-memory", "cpu=0GiB", "--offload-folder"]
    blocked = tmp_path / "afile"
    blocked.write_text("")
    r = cli(*measure_args(base, tmp_path / "r0", *offload, str(blocked / "off"), model="bin"))
    assert_user_error(r, "--offload-folder", "cannot write there")
    full, ro = tmp_path / "full", tmp_path / "ro"
    if not (_mount(full, "size=16k") and _mount(ro, "ro,size=16k")):
        pytest.skip("cannot mount a tmpfs here (not root): the folder-under-a-file case ran")
    try:
        r = cli(*measure_args(base, tmp_path / "r1", *offload, str(full / "off"), model="bin"))
        assert_user_error(r, "no space left", "--offload-folder")
        assert not (tmp_path / "r1").exists()
        r = cli(*measure_args(base, tmp_path / "r2", *offload, str(ro / "off"), model="bin"))
        assert_user_error(r, "read-only")
        subprocess.run(["mount", "-o", "remount,size=4m", str(full)], check=True)
        r = cli(*measure_args(base, tmp_path / "r1", *offload, str(full / "off"), model="bin"))
        assert r.exit_code == 0, r.output
        assert cli(*measure_args(base, tmp_path / "plain")).exit_code == 0
        pd.testing.assert_frame_equal(bc.open_run(tmp_path / "r1").coupling,
                                      bc.open_run(tmp_path / "plain").coupling)
    finally:
        for mnt in (full, ro):
            subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_sweep_may_accept_missing_weights_knowingly(base: dict[str, Path],
                                                      tmp_path: Path) -> None:
    spec = {"models": [{"label": "partial", "model": str(base["no_block"]), "device": "cpu"}],
            "prompts": [str(base["prompts"])],
            "measure": {"coupling": ["depth"], "k": [2]}}
    sw = bc.run_sweep(spec, tmp_path / "refused", executor="local", progress=False)
    assert sw.catalogue["status"].tolist() == ["failed"]
    assert "--allow-missing-weights" in str(sw.catalogue["message"].iloc[0])
    spec["allow_missing_weights"] = True
    sw = bc.run_sweep(spec, tmp_path / "accepted", executor="local", progress=False)
    assert sw.catalogue["status"].tolist() == ["done"]
    run = bc.open_run(sw.run_dir(sw.catalogue["unit_id"].iloc[0]))
    assert run.meta["loading"]["accepted"] and len(run.meta["loading"]["missing"]) == 12


def test_a_grid_record_from_before_seals_is_read_with_a_warning(tmp_path: Path) -> None:
    from blockcoupling.studies.vit.train import FORMAT, read_metrics

    (tmp_path / "metrics.json").write_text(json.dumps({"format": FORMAT, "status": "running"}))
    with pytest.warns(UserWarning, match="no checksum.*unverified"):
        assert read_metrics(tmp_path)["status"] == "running"


def test_a_study_of_another_spec_that_measured_nothing_is_replaced(no_training: None,
                                                                   tmp_path: Path) -> None:
    from blockcoupling.store import collection as store
    from blockcoupling.studies.lm_study.run import SPEC_FILE, run_study

    out = tmp_path / "out"
    (out / "sweep" / store.STATUS).mkdir(parents=True)
    (out / "sweep" / store.MANIFEST).write_text("{}")
    (out / "sweep" / store.STATUS / "u.json").write_text(
        json.dumps({"unit": {"unit_id": "u"}, "status": "failed"}))
    (out / SPEC_FILE).write_text(json.dumps({"runs": []}))
    spec = _small_spec()
    with pytest.raises(AssertionError, match="trained before"):  # it went on to train
        run_study(out, spec, progress=False, cache_dir=tmp_path / "cache")
    assert not (out / "sweep").exists()
    written = json.loads((out / SPEC_FILE).read_text())
    assert written.pop("digest") and written == json.loads(json.dumps(spec.to_dict()))
    assert not (out / ".lock").exists()
