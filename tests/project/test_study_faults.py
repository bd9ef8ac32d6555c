"""Faults and bad input for the study layer (sweeps, monitors, ViT options, correlate).

Like ``test_faults.py`` for run directories: a sweep (executor local, two tiny checkpoints)
is killed (SIGKILL) at a seeded random occurrence of a point and resumed; the result must
equal an uninterrupted sweep bit for bit. Unit files damaged, truncated, deleted or replaced
are caught by every reader and re-measured by ``--resume``; a lost manifest is rebuilt;
inputs edited between a kill and a resume are refused with the difference; malformed specs
and numeric options (0, negatives, nan, inf, wrong types) are one line, never a traceback,
and leave no directory that refuses the corrected spec.

The kill points are drawn from ``BLOCKCOUPLING_FAULT_SEED`` (default 20261122) and printed;
to replay a failure, run the failing test with the seed it printed.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

import blockcoupling as bc
from blockcoupling.store import collection as store
from blockcoupling.studies.sweep import expand, load_spec, sweep_status
from blockcoupling.validate import OptionError, number, whole
from tests.helpers import child_env
from tests.helpers.faults import SEED, child, one_error_line
from tests.helpers.tiny_runs import (
    assert_identical_runs,
    cli,
    install_probes,
    save_tiny_lm,
    write_prompts,
)

MEASURE = {"k": [2], "coupling": ["depth"], "variants": ["coupling", "coupling_vs_null"],
           "orientations": ["ujv"], "batch_size": 1, "trajectory": False}
TABLES = ("coupling", "prompts", "spectra")


def _checkpoints(base: Path) -> Path:
    """runs/checkpoint-0 and runs/checkpoint-10: tiny GPT-2s with different weights."""
    from tests.helpers.tiny_models import tiny_model

    first = save_tiny_lm(base / "runs" / "checkpoint-0")
    second = base / "runs" / "checkpoint-10"
    shutil.copytree(first, second)
    tiny_model("gpt2", seed=1).save_pretrained(second)
    return base


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = _checkpoints(tmp_path_factory.mktemp("study"))
    write_prompts(base / "prompts.txt", ["the cat sat on the mat", "a dog ran far"])
    spec = {"models": [{"label": "lm", "checkpoints": "runs/checkpoint-*"}],
            "prompts": ["prompts.txt"], "measure": MEASURE}
    (base / "spec.yaml").write_text(yaml.safe_dump(spec))
    ref = base / "ref"
    counts: dict[str, int] = {}  # how often each kill point occurs in an uninterrupted sweep
    uninstall = install_probes(lambda p: counts.__setitem__(p, counts.get(p, 0) + 1))
    try:
        r = cli("--quiet", "sweep", str(base / "spec.yaml"), "--out", str(ref), "--executor",
                "local")
    finally:
        uninstall()
    assert r.exit_code == 0, r.output
    return {"base": base, "spec": base / "spec.yaml", "ref": ref, "dict": spec,
            "counts": counts}


def sweep_args(study: dict[str, Any], out: Path, *extra: str) -> list[str]:
    return ["--quiet", "sweep", str(study["spec"]), "--out", str(out), "--executor", "local",
            *extra]


def assert_same_sweep(got: Path, want: Path) -> None:
    """Every unit bit-identical, and the collection's tables equal."""
    a, b = bc.open_sweep(got), bc.open_sweep(want)
    assert list(a.catalogue["unit_id"]) == list(b.catalogue["unit_id"])
    assert (a.catalogue["status"] == "done").all()
    for uid in a.catalogue["unit_id"]:
        assert_identical_runs(store.unit_dir(got, uid), store.unit_dir(want, uid))
    for name in TABLES:
        pd.testing.assert_frame_equal(a.table(name), b.table(name), check_exact=True)
    # DuckDB's parallel aggregates may sum in another order: equal up to rounding
    pd.testing.assert_frame_equal(a.summary(), b.summary(), check_exact=False, rtol=1e-12)


def copy_ref(study: dict[str, Any], tmp_path: Path) -> Path:
    out = tmp_path / "sweep"
    shutil.copytree(study["ref"], out)
    return out


# ---------------------------------------------------------------------------- kills
@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
@pytest.mark.parametrize("point", ["part_commit", "consolidate"])
def test_sweep_killed_at_a_random_point_resumes_bit_identically(study: dict[str, Any],
                                                                point: str,
                                                                tmp_path: Path) -> None:
    total = study["counts"][point]
    nth = random.Random(f"{SEED}/sweep/{point}").randint(1, total)
    info = (f"kill point: {point} #{nth} of {total} (replay with BLOCKCOUPLING_FAULT_SEED="
            f"{SEED} pytest tests/project/test_study_faults.py -k {point})")
    print(info)
    out = tmp_path / "sweep"
    res = child(point, nth, "SIGKILL", sweep_args(study, out))
    assert res.returncode == -signal.SIGKILL, f"{info}\n{res.stderr[-3000:]}"
    st = cli("sweep-status", str(out))
    assert "Traceback" not in st.output, f"{info}\n{st.output}"
    r = cli(*sweep_args(study, out, "--resume"))
    assert r.exit_code == 0, f"{info}\n{r.output}"
    assert_same_sweep(out, study["ref"])


# ---------------------------------------------------------------------------- damaged units
def _damage(path: Path, how: str, other: Path) -> None:
    if how == "flipped":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    elif how == "deleted":
        path.unlink()
    elif how == "replaced":  # the other unit's file: a valid Parquet file of other numbers
        shutil.copy(other, path)


@pytest.mark.parametrize("how", ["flipped", "truncated", "deleted", "replaced"])
def test_damaged_unit_is_caught_by_every_reader_and_resume_measures_it_again(
        study: dict[str, Any], how: str, tmp_path: Path) -> None:
    out = copy_ref(study, tmp_path)
    first, second = list(bc.open_sweep(out).catalogue["unit_id"])
    target = store.unit_dir(out, first) / "coupling.parquet"
    _damage(target, how, store.unit_dir(out, second) / "coupling.parquet")
    s = bc.open_sweep(out)
    for read in (s.summary, lambda: s.table("coupling"), lambda: s.coupling):
        with pytest.raises(store.UnitDamagedError, match=first) as err:
            read()
        assert "--resume" in str(err.value) and "\n" not in str(err.value)
    st = sweep_status(out)
    assert st.set_index("unit_id").loc[first, "status"] == "damaged"
    assert st.set_index("unit_id").loc[second, "status"] == "done"
    if how == "flipped":  # the commands say the same (once: a report is not cheap)
        shown = cli("sweep-status", str(out))
        assert "damaged" in shown.output and "Traceback" not in shown.output
        rep = cli("report", str(out), "--out", str(tmp_path / "report.html"))
        assert rep.exit_code == 1 and first in one_error_line(rep.output)
    r = cli(*sweep_args(study, out, "--resume"))  # the advice: measures the unit again
    assert r.exit_code == 0, r.output
    assert f"measured {first} again" in r.output  # said even under -q
    assert_same_sweep(out, study["ref"])


def test_replaced_unit_directory_and_edited_status_are_caught(study: dict[str, Any],
                                                             tmp_path: Path) -> None:
    out = copy_ref(study, tmp_path)
    first, second = list(bc.open_sweep(out).catalogue["unit_id"])
    shutil.rmtree(store.unit_dir(out, first))
    shutil.copytree(store.unit_dir(out, second), store.unit_dir(out, first))
    with pytest.raises(store.UnitDamagedError, match="copied or replaced"):
        bc.open_sweep(out).summary()
    r = cli(*sweep_args(study, out, "--resume"))
    assert r.exit_code == 0, r.output
    assert_same_sweep(out, study["ref"])


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
def test_lost_manifest_is_rebuilt_by_resume(study: dict[str, Any], how: str,
                                            tmp_path: Path) -> None:
    out = copy_ref(study, tmp_path)
    if how == "deleted":
        (out / store.MANIFEST).unlink()
    else:
        (out / store.MANIFEST).write_text("{not json")
    shown = cli("sweep-status", str(out))
    line = one_error_line(shown.output)
    assert "--resume" in line and "rebuilt" in line
    r = cli(*sweep_args(study, out, "--resume"))
    assert r.exit_code == 0, r.output
    assert_same_sweep(out, study["ref"])


# ---------------------------------------------------------------------------- inputs
def test_edited_prompt_file_between_kill_and_resume_is_refused(study: dict[str, Any],
                                                               tmp_path: Path) -> None:
    base = tmp_path / "b"
    shutil.copytree(study["base"] / "runs", base / "runs")
    write_prompts(base / "prompts.txt", ["the cat sat on the mat", "a dog ran far"])
    (base / "spec.yaml").write_text(yaml.safe_dump(study["dict"]))
    args = ["--quiet", "sweep", str(base / "spec.yaml"), "--out", str(base / "s"),
            "--executor", "local"]
    assert cli(*args).exit_code == 0
    before = sorted(p.name for p in (base / "s" / store.STATUS).iterdir())
    write_prompts(base / "prompts.txt", ["the cat sat on the mat", "the dog sat"])
    r = cli(*args, "--resume")
    line = one_error_line(r.output)
    assert r.exit_code == 1 and "prompts.txt: content was" in line
    assert sorted(p.name for p in (base / "s" / store.STATUS).iterdir()) == before
    # the unit ids follow the content: the edited file is other units
    spec = load_spec(base / "spec.yaml")
    assert not {u.unit_id + ".json" for u in expand(spec)} & set(before)


def test_listed_inputs_are_never_dropped(study: dict[str, Any], tmp_path: Path) -> None:
    base = study["base"]
    (base / "runs" / "notes").mkdir(exist_ok=True)
    cases = [
        ({"checkpoints": ["runs/checkpoint-0", "runs/checkpoint-99"]}, "checkpoint-99 does not exist"),
        ({"checkpoints": "runs/*"}, "no config.json"),
    ]
    for entry, match in cases:
        spec = {**study["dict"], "models": [{"label": "lm", **entry}]}
        path = base / "bad.yaml"
        path.write_text(yaml.safe_dump(spec))
        r = cli("--quiet", "sweep", str(path), "--out", str(tmp_path / "x"), "--executor",
                "local")
        assert r.exit_code == 2 and match in one_error_line(r.output), r.output  # spec keys
        assert not (tmp_path / "x").exists()


def test_quiet_sweep_still_prints_its_failures(study: dict[str, Any], tmp_path: Path) -> None:
    base = tmp_path / "b"
    shutil.copytree(study["base"] / "runs" / "checkpoint-0", base / "runs" / "checkpoint-0")
    for f in (base / "runs" / "checkpoint-0").glob("*.safetensors"):
        f.unlink()
    write_prompts(base / "prompts.txt", ["the cat sat"])
    (base / "spec.yaml").write_text(yaml.safe_dump(study["dict"]))
    r = cli("--quiet", "sweep", str(base / "spec.yaml"), "--out", str(base / "s"),
            "--executor", "local")
    assert r.exit_code == 1
    assert "failed lm-step0" in r.output and "unexpected error" not in r.output, r.output


# ---------------------------------------------------------------------------- bad specs
BAD_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"limit": 0}, "limit must be a whole number >= 1"),
    ({"limit": -3}, "limit"),
    ({"limit": 1.5}, "limit"),
    ({"limit": float("nan")}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"seed": 0.5}, "seed"),
    ({"seed": -1}, "seed"),
    ({"retries": -1}, "retries"),
    ({"retries": float("inf")}, "retries"),
    ({"resources": {"num_cpus": float("nan")}}, "num_cpus"),
    ({"resources": {"num_cpus": -1}}, "num_cpus"),
    ({"resources": {"num_gpus": "one"}}, "num_gpus"),
    ({"resources": [1, 2]}, "resources"),
    ({"dtype": "float8"}, "dtype"),
    ({"device": "tpu"}, "device"),
    ({"device": 3}, "device"),
    ({"models": {"label": "x"}}, "models"),
    ({"models": [5]}, "models[0]"),
    ({"models": [{"label": "lm", "checkpoints": {"a": 1}}]}, "checkpoints"),
    ({"prompts": 5}, "prompts"),
    ({"prompts": [["a"]]}, "prompts[0]"),
    ({"measure": [1]}, "measure"),
    ({"measure": {"k": "ten"}}, "measure"),
    ({"measure": {"k": [0]}}, "measure"),
    ({"measure": {"nonsense": 1}}, "nonsense"),
    ({"name": 5}, "name"),
]


@pytest.mark.parametrize("change,match", BAD_SPECS, ids=[str(i) for i in range(len(BAD_SPECS))])
def test_bad_spec_is_one_line_and_leaves_nothing(study: dict[str, Any], change: dict[str, Any],
                                                 match: str, tmp_path: Path) -> None:
    spec = {**study["dict"], **change}
    spec["models"] = spec["models"] if "models" in change else [
        {"label": "lm", "checkpoints": str(study["base"] / "runs" / "checkpoint-0")}]
    if "prompts" not in change:
        spec["prompts"] = [str(study["base"] / "prompts.txt")]
    if "dtype" in change or "device" in change:
        spec["models"] = [{**spec["models"][0], **change}]
    with pytest.raises(bc.BlockCouplingError, match=re.escape(match)) as err:
        bc.run_sweep(spec, tmp_path / "s", executor="local", progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "s").exists()


def test_refused_spec_leaves_no_directory_that_refuses_the_corrected_one(
        study: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    bad = {**study["dict"], "models": [{"label": "lm", "checkpoints": str(
        study["base"] / "runs" / "checkpoint-0"), "dtype": "float8"}],
           "prompts": [str(study["base"] / "prompts.txt")]}
    path.write_text(yaml.safe_dump(bad))
    r = cli("--quiet", "sweep", str(path), "--out", str(tmp_path / "s"), "--executor", "local")
    assert r.exit_code == 2 and "float8" in one_error_line(r.output)  # a spec key refused
    bad["models"][0]["dtype"] = "float32"
    path.write_text(yaml.safe_dump(bad))
    r = cli("--quiet", "sweep", str(path), "--out", str(tmp_path / "s"), "--executor", "local")
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------------------- numeric options
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), -float("inf"), 1.5, "3",
                                   True, None, [1]])
def test_whole_number_options_refuse_bad_values(value: Any) -> None:
    with pytest.raises(OptionError, match="every"):
        whole(value, "every", minimum=1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.1, 1.0, "0.1", True, None])
def test_rate_options_refuse_bad_values(value: Any) -> None:
    with pytest.raises(OptionError, match="drop-path"):
        number(value, "drop-path", minimum=0, below=1)


def test_validators_accept_good_values() -> None:
    assert whole(3, "n", minimum=1) == 3 and whole(4.0, "n") == 4
    assert number(0, "r", minimum=0, below=1) == 0.0 and math.isfinite(number(1e-3, "r"))


VIT_BAD = [("drop_path", float("nan")), ("drop_path", 1.0), ("weight_decay", float("nan")),
           ("weight_decay", -1.0), ("epochs", 0), ("epochs", 2.5), ("lr", 0.0),
           ("lr", float("inf")), ("batch_size", 0), ("image_size", 0), ("train_limit", 0),
           ("test_limit", -5), ("mixup", float("nan")), ("seed", 0.5), ("monitor_every", -1),
           ("k", 0), ("warmup_epochs", float("inf")), ("eval_train_limit", 0),
           ("hidden_size", "64")]


@pytest.mark.parametrize("name,value", VIT_BAD, ids=[f"{n}={v}" for n, v in VIT_BAD])
def test_vit_training_options_are_checked_at_parse_time(name: str, value: Any) -> None:
    from blockcoupling.studies.vit.train import VitTrainConfig

    with pytest.raises(bc.BlockCouplingError, match=name.replace("_", "-")) as err:
        VitTrainConfig(**{name: value})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag,value", [("--epochs", "0"), ("--drop-path", "nan"),
                                        ("--train-limit", "-1"), ("--image-size", "0"),
                                        ("--weight-decay", "inf")])
def test_vit_train_cli_refuses_bad_numbers_before_writing(flag: str, value: str,
                                                          tmp_path: Path) -> None:
    r = cli("vit-train", "--out", str(tmp_path / "v"), flag, value)
    assert r.exit_code == 2 and flag.lstrip("-") in one_error_line(r.output)  # as parsed
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("kw", [{"every": 0}, {"every": -5}, {"every": 2.5},
                                {"every": float("nan")}, {"every": True},
                                {"every": None, "steps": [1.5]}, {"limit": 0}])
def test_monitor_options_are_checked(kw: dict[str, Any], tmp_path: Path) -> None:
    from blockcoupling.studies.monitor import CouplingMonitor

    with pytest.raises(bc.BlockCouplingError):
        CouplingMonitor(None, ["a b"], out=tmp_path / "m", **kw)
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------------------- monitor
def test_monitor_refuses_a_new_trainings_weights_unless_overwrite(study: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    import transformers as tf

    from blockcoupling.studies.monitor import CouplingMonitor
    from tests.helpers.tiny_models import tiny_model

    tok = tf.AutoTokenizer.from_pretrained(study["base"] / "runs" / "checkpoint-0")
    opts = {k: v for k, v in MEASURE.items() if k != "batch_size"}
    with CouplingMonitor(tok, ["the cat sat"], every=1, out=tmp_path / "m", **opts) as mon:
        assert mon.step(tiny_model("gpt2", seed=0), 1) is not None
    with CouplingMonitor(tok, ["the cat sat"], every=1, out=tmp_path / "m", **opts) as mon:
        assert mon.step(tiny_model("gpt2", seed=0), 1) is None  # same weights: kept
        with pytest.raises(bc.BlockCouplingError, match="other weights"):
            mon.step(tiny_model("gpt2", seed=5), 1)
    with CouplingMonitor(tok, ["the cat sat"], every=1, out=tmp_path / "m", overwrite=True,
                         **opts) as mon:
        assert mon.step(tiny_model("gpt2", seed=5), 1) is not None
    s = bc.open_sweep(tmp_path / "m")
    assert len(s.summary()) == 1
    uid = s.catalogue["unit_id"][0]
    (store.unit_dir(tmp_path / "m", uid) / "prompts.parquet").unlink()
    with pytest.raises(store.UnitDamagedError, match="CouplingMonitor"):
        bc.open_sweep(tmp_path / "m").summary()
    with CouplingMonitor(tok, ["the cat sat"], every=1, out=tmp_path / "m", **opts) as mon:
        assert mon.step(tiny_model("gpt2", seed=5), 1) is not None  # damaged: measured again
    assert len(bc.open_sweep(tmp_path / "m").summary()) == 1


# ---------------------------------------------------------------------------- data, scores
def _images(root: Path, layout: dict[str, dict[str, int]]) -> Path:
    from PIL import Image

    for split, classes in layout.items():
        for cls, n in classes.items():
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new("RGB", (4, 4), (i * 40, 0, 0)).save(folder / f"{i}.png")
    return root


@pytest.mark.parametrize("layout,match", [
    ({"train": {"a": 2, "b": 2}, "test": {"a": 1}}, "lacks the class folder"),
    ({"train": {"a": 2, "b": 0}, "test": {"a": 1, "b": 1}}, "holds no images"),
])
def test_image_folder_classes_are_never_dropped(layout: dict[str, dict[str, int]], match: str,
                                                tmp_path: Path) -> None:
    from blockcoupling.studies.vit.data import load_image_folder

    with pytest.raises(bc.BlockCouplingError, match=match):
        load_image_folder(_images(tmp_path / "img", layout))


def test_nonfinite_scores_are_listed_as_excluded() -> None:
    from blockcoupling.studies.correlate import ModelUnit, match_scores

    units = [ModelUnit(label=x, model=x, coupling=pd.DataFrame(), hidden_size=16,
                       num_layers=2) for x in ("a", "b", "c")]
    models = pd.DataFrame({"label": ["a", "b", "c"], "model": ["a", "b", "c"],
                           "layers_run": [2, 2, 2], "d_model_run": [16, 16, 16]})
    scores = pd.DataFrame({"model": ["a", "b", "c"],
                           "score": [float("inf"), 50.0, float("nan")]})
    table, excluded = match_scores(models, units, scores)
    assert list(table["label"]) == ["b"]
    assert [e["label"] for e in excluded] == ["a", "c"]
    assert "not a finite number" in excluded[0]["reason"]


def test_training_into_a_measurement_run_is_refused(study: dict[str, Any]) -> None:
    from blockcoupling.studies.vit.train import VitTrainConfig, train_vit

    unit = next((study["ref"] / store.UNITS).iterdir())
    with pytest.raises(bc.BlockCouplingError, match="not a (ViT )?training"):
        train_vit(VitTrainConfig(epochs=1), unit, progress=False)
    with pytest.raises(bc.BlockCouplingError, match="not a (ViT )?training"):
        train_vit(VitTrainConfig(epochs=1), study["ref"], progress=False)



@pytest.mark.parametrize("spec,match", [
    ({"drop_path": [float("nan")]}, "drop_path"), ({"drop_path": [1.5]}, "drop_path"),
    ({"weight_decay": ["x"]}, "weight_decay"), ({"weight_decay": [-1]}, "weight_decay"),
    ({"seeds": [0.5]}, "seeds"), ({"seeds": [-1]}, "seeds"), ({"train": [1]}, "train"),
    ({"train": {"epochs": 0}}, "epochs"), ({"cpus_per_run": 0}, "cpus_per_run"),
    ({"threads": 1.5}, "threads"), ({"executor": 3}, "executor"), ({"drop_path": []}, "drop_path"),
])
def test_bad_grid_spec_is_one_line(spec: dict[str, Any], match: str) -> None:
    from blockcoupling.studies.vit.grid import load_grid_spec

    with pytest.raises(bc.BlockCouplingError, match=match) as err:
        load_grid_spec(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag,value", [("--retries", "-1"), ("--cluster-cpus", "0")])
def test_sweep_cli_refuses_bad_numbers_before_writing(study: dict[str, Any], flag: str,
                                                      value: str, tmp_path: Path) -> None:
    r = cli(*sweep_args(study, tmp_path / "s", flag, value))
    assert r.exit_code == 2 and flag.lstrip("-") in one_error_line(r.output)  # as parsed
    assert not (tmp_path / "s").exists()


def test_sweep_without_results_is_replaced_by_the_corrected_spec(study: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    broken = tmp_path / "runs" / "checkpoint-0"  # its weights lost: every unit fails to load
    shutil.copytree(study["base"] / "runs" / "checkpoint-0", broken)
    for f in broken.glob("*.safetensors"):
        f.unlink()
    spec = {**study["dict"], "prompts": [str(study["base"] / "prompts.txt")],
            "models": [{"label": "lm", "checkpoints": str(broken)}]}
    s = bc.run_sweep(spec, tmp_path / "s", executor="local", progress=False)
    assert (s.catalogue["status"] == "failed").all()  # every unit failed: nothing measured
    spec["models"][0]["checkpoints"] = str(study["base"] / "runs" / "checkpoint-0")
    s = bc.run_sweep(spec, tmp_path / "s", executor="local", progress=False)
    assert (s.catalogue["status"] == "done").all() and len(s.catalogue) == 1
    spec["models"][0]["label"] = "other"  # now it holds results: refused with the difference
    with pytest.raises(bc.BlockCouplingError, match="another spec"):
        bc.run_sweep(spec, tmp_path / "s", executor="local", progress=False, resume=True)


def test_vit_training_refuses_changed_images_and_names_a_damaged_record(tmp_path: Path) -> None:
    import json

    from blockcoupling.studies.vit.train import VitTrainConfig, train_vit

    data = _images(tmp_path / "img", {"train": {"a": 2, "b": 2}, "test": {"a": 1, "b": 1}})
    cfg = VitTrainConfig(dataset="cifar10", data_dir=str(data), epochs=1)
    out = tmp_path / "run"
    out.mkdir()
    record = {"format": "blockcoupling-vit-train", "status": "running", "config_key": cfg.key(),
              "data": {"content": "sha256:" + "0" * 64}}  # a killed training on other images
    (out / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(bc.BlockCouplingError, match="changed since"):
        train_vit(cfg, out, progress=False)
    (out / "metrics.json").write_text("{broken")
    with pytest.raises(bc.BlockCouplingError, match="metrics.json"):
        train_vit(cfg, out, progress=False)


def test_monitor_rebuilds_a_lost_manifest(study: dict[str, Any], tmp_path: Path) -> None:
    import transformers as tf

    from blockcoupling.studies.monitor import CouplingMonitor
    from tests.helpers.tiny_models import tiny_model

    tok = tf.AutoTokenizer.from_pretrained(study["base"] / "runs" / "checkpoint-0")
    opts = {k: v for k, v in MEASURE.items() if k != "batch_size"}
    with CouplingMonitor(tok, ["the cat sat"], every=1, out=tmp_path / "m", **opts) as mon:
        mon.step(tiny_model("gpt2", seed=0), 1)
    (tmp_path / "m" / store.MANIFEST).write_text("[")
    with pytest.raises(bc.BlockCouplingError, match="rebuilt from the status files"):
        bc.open_sweep(tmp_path / "m")
    with CouplingMonitor(tok, ["the cat sat"], every=1, out=tmp_path / "m", **opts) as mon:
        assert mon.step(tiny_model("gpt2", seed=0), 1) is None  # kept: same weights
    assert len(bc.open_sweep(tmp_path / "m").summary()) == 1


@pytest.mark.parametrize("kw,match", [({"n_boot": -1}, "n-boot"), ({"n_boot": 2.5}, "n-boot"),
                                      ({"seed": -3}, "seed"), ({"seed": float("nan")}, "seed")])
def test_correlate_numeric_options_are_checked_first(kw: dict[str, Any], match: str) -> None:
    from blockcoupling.studies.correlate import correlate

    with pytest.raises(bc.BlockCouplingError, match=match):
        correlate(["does-not-matter"], "paper", **kw)


@pytest.mark.parametrize("key,value", [("svd_tol", float("nan")), ("svd_tol", float("inf")),
                                       ("svd_tol", -1.0), ("seed", -1), ("k", [0]),
                                       ("batch_size", 0), ("lss_window", 4)])
def test_measure_options_of_a_spec_are_checked(key: str, value: Any) -> None:
    base = {"models": [{"label": "a", "model": "gpt2"}], "prompts": ["builtin:capital"]}
    with pytest.raises(bc.BlockCouplingError, match=key):
        load_spec({**base, "measure": {key: value}})


@pytest.mark.parametrize("flag,value", [("--seeds", "0.5"), ("--seeds", "nan"),
                                        ("--drop-path", "0.1,inf"), ("--cpus-per-run", "0"),
                                        ("--threads", "0")])
def test_vit_grid_cli_refuses_bad_numbers_before_writing(flag: str, value: str,
                                                         tmp_path: Path) -> None:
    r = cli("vit-grid", "--out", str(tmp_path / "g"), "--executor", "local", flag, value)
    assert r.exit_code == 2, r.output  # refused as the options are parsed
    one_error_line(r.output)
    assert not (tmp_path / "g").exists()


def test_damaged_grid_record_is_one_line(tmp_path: Path) -> None:
    from blockcoupling.studies.vit.grid import run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "grid.json").write_text("{")
    with pytest.raises(bc.BlockCouplingError, match="grid.json"):
        run_grid(VitTrainConfig(epochs=1), tmp_path / "g", drop_paths=(0.0,),
                 weight_decays=(0.0,), executor="local", progress=False)


@pytest.mark.parametrize("content,match", [
    (b"\xff\xfe{", "not UTF-8 text"), (b"{", "JSON"), (b"[1]", "results"),
    (b'{"results": [1, 2], "config": 5}', "results"),
])
def test_malformed_lmeval_folder_is_one_line_naming_the_file(content: bytes, match: str,
                                                             tmp_path: Path) -> None:
    from blockcoupling.studies.correlate import read_scores

    (tmp_path / "lm" / "run").mkdir(parents=True)
    (tmp_path / "lm" / "run" / "results.json").write_bytes(content)
    with pytest.raises(bc.BlockCouplingError, match=match) as err:
        read_scores(str(tmp_path / "lm"))
    assert "results.json" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content,match", [
    (b"model,score\na,\xff\n", "score file"), (b"model\na\n", "score"),
    (b"model,score\na,ten\n", "not a number"), (b"model,score\na,1\na,2\n", "twice"),
])
def test_malformed_score_file_is_one_line(content: bytes, match: str, tmp_path: Path) -> None:
    from blockcoupling.studies.correlate import read_scores

    (tmp_path / "s.csv").write_bytes(content)
    with pytest.raises(bc.BlockCouplingError, match=match) as err:
        read_scores(str(tmp_path / "s.csv"))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- the lm-family study
def _study_child(argv: list[str], env: dict[str, str], point: str | None = None, nth: int = 0,
                 counts: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``blockcoupling`` in a new process on one thread that SIGKILLs itself at the ``nth``
    ``point`` (with ``counts``, it writes how often each point occurred, and the block calls
    up to the end of the last training as ``trained``, to that JSON file at its end)."""
    code = textwrap.dedent(f"""
        import atexit, json, os, signal, sys
        from tests.helpers.tiny_runs import install_probes
        seen = {{}}
        def trip(point):
            seen[point] = seen.get(point, 0) + 1
            if point == {point!r} and seen[point] == {nth}:
                os.kill(os.getpid(), signal.SIGKILL)
        install_probes(trip)
        from blockcoupling.studies.lm_study import run as lm_study
        train = lm_study.train_tiny_lm
        def trained(*a, **k):
            out = train(*a, **k)
            seen["trained"] = seen.get("block", 0)
            return out
        lm_study.train_tiny_lm = trained
        if {str(counts) if counts else None!r}:
            atexit.register(lambda: open({str(counts)!r}, "w").write(json.dumps(seen)))
        from blockcoupling.cli import main
        sys.argv = ["blockcoupling", *{argv!r}]
        main()
    """)
    # one thread: with two, torch's CPU kernels gave another last bit in some processes (a
    # padded forward pass: 7 of 30; docs/how-to/faults.md), which is not a resume's doing
    full_env = child_env(**env, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=full_env)


@pytest.fixture(scope="module")
def lm_family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted ``study lm-family --quick`` (its own training cache) and how often each
    kill point occurred in it. It ran in ``work/`` and was moved to ``ref/``: a killed run
    later uses the same paths, so its checkpoints and units are named alike."""
    base = tmp_path_factory.mktemp("lmfamily")
    work = base / "work"
    res = _study_child(["-q", "study", "lm-family", "--quick", "--out", str(work / "out")],
                       {"BLOCKCOUPLING_CACHE": str(work / "cache")}, counts=base / "counts.json")
    assert res.returncode == 0, res.stderr[-3000:]
    counts = json.loads((base / "counts.json").read_text())
    shutil.move(str(work), str(base / "ref"))
    return {"base": base, "counts": counts}


def _study_record(out: Path) -> dict[str, Any]:
    rec = json.loads((out / "study.json").read_text())
    rec.pop("seconds")  # wall and CPU seconds of the run
    return rec


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["training", "measuring"])
def test_lm_family_study_killed_at_a_random_point_resumes_bit_identically(
        lm_family: dict[str, Any], phase: str) -> None:
    """SIGKILL at a seeded block call of the training (the first ``trained`` block calls) or
    at a seeded committed part of the measuring, then the same command again: the study's
    record and every table of its sweep equal the uninterrupted run's, bit for bit."""
    base, counts = lm_family["base"], lm_family["counts"]
    point, total = (("block", counts["trained"]) if phase == "training"
                    else ("part_commit", counts["part_commit"]))
    nth = random.Random(f"{SEED}/lm-family/{phase}").randint(1, total)
    info = (f"kill point: {point} #{nth} of {total} in {phase} (replay with "
            f"BLOCKCOUPLING_FAULT_SEED={SEED} pytest -m slow tests/project/test_study_faults.py -k "
            f"'lm_family and {phase}')")
    print(info)
    work = base / "work"
    shutil.rmtree(work, ignore_errors=True)
    argv = ["-q", "study", "lm-family", "--quick", "--out", str(work / "out")]
    env = {"BLOCKCOUPLING_CACHE": str(work / "cache")}
    try:
        seen = base / "seen.json"  # written only if the child was not killed
        seen.unlink(missing_ok=True)
        res = _study_child(argv, env, point, nth, counts=seen)
        assert res.returncode == -signal.SIGKILL, (
            f"{info}\nexit {res.returncode}; points seen "
            f"{seen.read_text() if seen.exists() else '?'} (the reference: {counts})"
            f"\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
        res = _study_child(argv, env)
        assert res.returncode == 0, f"{info}\n{res.stderr[-3000:]}"
        ref = base / "ref" / "out"
        assert _study_record(work / "out") == _study_record(ref), info
        assert_same_sweep(work / "out" / "sweep", ref / "sweep")
    finally:
        shutil.rmtree(work, ignore_errors=True)
