"""One collection format (issue 18, item 2): a sweep, a monitor directory and a ViT grid are
read by one reader (``open_collection``) and shown by the same ``sweep-status`` / ``report``
/ ``correlate`` code path; unit ids follow one rule (the ids of directories written before
are unchanged, so their resume goes on); the old ViT grid layout and unknown kinds are one
line; ``blockcoupling collection upgrade`` converts the old layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

import blockcoupling as bc
from blockcoupling.cli import app
from blockcoupling.errors import BlockCouplingError
from blockcoupling.hashing import canonical_hash
from blockcoupling.store import collection as store
from blockcoupling.store.collection import collection_unit_id
from blockcoupling.store.collection import slug as _slug
from blockcoupling.studies.sweep.units import unit_id

WORDS = "the a cat dog sat on mat ran far".split()
TEXTS = ["the cat sat on the mat", "a dog ran far"]
MEASURE = {"k": [2], "coupling": ["depth"], "variants": ["coupling", "coupling_vs_null"],
           "orientations": ["ujv"], "batch_size": 1}
VIT_TINY = dict(preset="tiny", hidden_size=16, depth=2, heads=2, image_size=8, train_limit=96,
                test_limit=32, batch_size=32, k=2, monitor_images=1, final_images=2,
                monitor_every=0, epochs=1)


def _tokenizer() -> tf.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")


def _gpt2(seed: int) -> tf.GPT2Model:
    torch.manual_seed(seed)
    return tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=32,
                                      n_positions=32))


def _sweep_spec(root: Path) -> dict:
    return {"models": [{"label": "g", "model": str(root / "models" / "gpt2")}],
            "prompts": [{"name": "two", "texts": TEXTS}], "measure": MEASURE}


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished collection of each kind: a sweep (local), a monitor (two steps, other
    weights) and a 2 x 2 ViT grid (digits, tiny, one epoch)."""
    from blockcoupling.studies.vit.grid import run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    root = tmp_path_factory.mktemp("collections")
    model_dir = root / "models" / "gpt2"
    _gpt2(0).save_pretrained(model_dir)
    _tokenizer().save_pretrained(model_dir)
    bc.run_sweep(_sweep_spec(root), root / "sweep", executor="local", progress=False)
    model, tok = _gpt2(1), _tokenizer()
    with bc.CouplingMonitor(tok, TEXTS, every=None, steps=[0, 1], out=root / "monitor",
                            k=(2,), coupling=("depth",), orientations=("ujv",)) as mon:
        mon.step(model, 0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        mon.step(model, 1)
    run_grid(VitTrainConfig(**VIT_TINY), root / "grid", drop_paths=(0.0, 0.1),
             weight_decays=(0.01, 0.1), executor="local", progress=False)
    return {"sweep": root / "sweep", "monitor": root / "monitor", "vit-grid": root / "grid"}


@pytest.mark.parametrize("kind,n", [("sweep", 1), pytest.param("monitor", 2, marks=pytest.mark.slow),
                                    pytest.param("vit-grid", 4, marks=pytest.mark.slow)])  # CI: all
def test_one_reader_status_report_and_correlate_for_every_kind(
        kinds: dict[str, Path], kind: str, n: int, tmp_path: Path) -> None:
    from blockcoupling.studies.model_units import load_units

    path = kinds[kind]
    c = bc.open_collection(path)
    assert c.kind == kind and bc.open_sweep is bc.open_collection
    assert c.catalogue["status"].tolist() == ["done"] * n
    assert c.catalogue["unit_id"].str.fullmatch(r"[A-Za-z0-9._-]+-[0-9a-f]{12}").all()
    c.verify()
    summ = c.summary()
    assert len(summ) == n and summ["coupling_vs_null_mean"].notna().all()
    # the tables are each unit's own run: the summary's number is its run's statistic
    # (a ViT grid's headline is at its own token, [CLS] = position 0: the ViT page's number)
    first = str(c.catalogue["unit_id"].iloc[0])
    tokens = "first" if kind == "vit-grid" else "last"
    assert c.default_tokens == tokens
    stat = bc.coupling_statistic(c.open_unit(first), variant="coupling_vs_null", n_boot=0,
                                 tokens=tokens)
    headline = summ.set_index("unit_id").loc[first, "coupling_vs_null_mean"]
    assert headline == pytest.approx(float(stat["mean"].iloc[0]), rel=1e-12)
    if kind == "vit-grid":
        from blockcoupling.studies.vit.train import token_statistic

        m, k = c.open_unit(first), int(summ.set_index("unit_id").loc[first, "k"])
        assert headline == pytest.approx(token_statistic(m, k, "cls")["coupling_vs_null"],
                                         rel=1e-12)
        last = bc.coupling_statistic(m, variant="coupling_vs_null", n_boot=0, tokens="last")
        assert float(last["mean"].iloc[0]) != pytest.approx(headline)  # both were measured
    by_path = bc.coupling_statistic(path, variant="coupling_vs_null", n_boot=0)
    assert by_path["mean"].tolist() == pytest.approx(summ["coupling_vs_null_mean"].tolist())
    st = bc.studies.sweep_status(path)
    assert st["status"].tolist() == ["done"] * n
    runner = CliRunner()
    r = runner.invoke(app, ["sweep-status", str(path)])
    assert r.exit_code == 0, r.output
    assert f"({kind}): {n} units: {n} done" in r.output and "depth-wise coupling" in r.output
    r = runner.invoke(app, ["sweep-status", str(path), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["kind"] == kind
    html = tmp_path / f"{kind}.html"
    r = runner.invoke(app, ["-q", "report", str(path), "--out", str(html)])
    assert r.exit_code == 0, r.output
    page = html.read_text()
    assert ("stochastic-depth rate" in page) == (kind == "vit-grid")
    # correlate's reader: one model unit per done unit, named by the catalogue
    units = load_units([path])
    assert len(units) == n and {u.label for u in units} >= set(
        c.catalogue["label"]) - {"g", "monitor"}


def test_unit_ids_follow_one_rule_and_keep_earlier_ids() -> None:
    """The ids directories got before the one rule are unchanged (their resume goes on)."""
    h = canonical_hash(["m", None, "builtin:capital", 5, "abc"], digits=12, compact=False,
                       strict=False)
    assert unit_id(model="m", revision=None, prompt_set="builtin:capital", limit=5,
                   cfg_hash="abc", label="Pythia 70m", step=1000) == \
        f"{_slug('Pythia 70m', 24)}-step1000-capital-{h}"
    ident = ["monitor", 3, "prompts:x", "cfg"]
    assert collection_unit_id([("monitor", 64), ("step3", 24)], ident) == \
        "monitor-step3-" + canonical_hash(ident, digits=12, compact=False, strict=False)


def test_monitor_ids_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mon = bc.CouplingMonitor(_tokenizer(), TEXTS, every=1, out=tmp_path / "m", k=(2,))
    try:
        u = mon.unit(7)
        old = canonical_hash(["monitor", 7, mon.prompt_set, mon._hash], digits=12,
                             compact=False, strict=False)
        assert u.unit_id == f"monitor-step7-{old}"
    finally:
        mon.close()
    # a label that is no file-name slug ("tiny LM", the demo's): new directories get the
    # slug; a directory written before the rule (label as is) keeps its ids, so its measured
    # steps are not measured again
    with bc.CouplingMonitor(_tokenizer(), TEXTS, every=1, out=tmp_path / "new", k=(2,),
                            label="tiny LM") as mon:
        new_id = mon.unit(0).unit_id
        assert new_id.startswith("tiny-LM-step0-")

    def before_the_rule(readable: list, identity: list) -> str:  # the code of earlier versions
        return (f"{readable[0][0]}-{readable[1][0]}-"
                + canonical_hash(identity, digits=12, compact=False, strict=False))

    model = _gpt2(2)
    with monkeypatch.context() as mp:
        mp.setattr("blockcoupling.studies.monitor.collection_unit_id", before_the_rule)
        with bc.CouplingMonitor(_tokenizer(), TEXTS, every=1, out=tmp_path / "t", k=(2,),
                                label="tiny LM") as mon:
            assert mon.step(model, 0) is not None
    earlier = "tiny LM-step0-" + new_id.rsplit("-", 1)[1]
    assert bc.open_collection(tmp_path / "t").catalogue["unit_id"].tolist() == [earlier]
    with bc.CouplingMonitor(_tokenizer(), TEXTS, every=1, out=tmp_path / "t", k=(2,),
                            label="tiny LM") as mon:
        assert mon.unit(0).unit_id == earlier
        assert mon.step(model, 0) is None  # measured already
        assert mon.step(model, 1) is not None
    cat = bc.open_collection(tmp_path / "t").catalogue
    assert cat["unit_id"].iloc[0] == earlier  # and a new step by the rule:
    assert cat["unit_id"].iloc[1].startswith("tiny-LM-step1-")
    assert cat["attempts"].tolist() == [1, 1]


def _one_line(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    return lines[0]


def _to_old_grid(grid: Path, old: Path) -> None:
    """The layout run_grid wrote before the grid became a collection: grid.json + runs/."""
    c = bc.open_collection(grid)
    base = c.manifest["spec"]["vit-grid"]["base"]
    (old / "runs").mkdir(parents=True)
    runs = {}
    for r in c.catalogue.itertuples():
        shutil.copytree(grid / "units" / r.unit_id, old / "runs" / r.label)
        rec = store.read_status(grid, r.unit_id)
        cfg = rec["unit"]["config"]
        runs[r.label] = {"drop_path": cfg["drop_path"], "weight_decay": cfg["weight_decay"],
                         "seed": cfg["seed"], "status": "done", "message": None}
    runs["dp0.2-wd0.01-s0"] = {"drop_path": 0.2, "weight_decay": 0.01, "seed": 0,
                               "status": "failed", "message": "boom"}  # failed, no folder
    (old / "grid.json").write_text(json.dumps({"format": "blockcoupling-vit-grid",
                                               "base": base, "runs": runs}))


def test_old_grid_layout_is_one_line_then_upgraded(kinds: dict[str, Path],
                                                   tmp_path: Path) -> None:
    from blockcoupling.studies.vit.grid import run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    old = tmp_path / "old"
    _to_old_grid(kinds["vit-grid"], old)
    runner = CliRunner()
    with pytest.raises(bc.RunDirError, match="collection upgrade"):
        bc.open_collection(old)
    for args in (["sweep-status", str(old)], ["report", str(old), "--out",
                                              str(tmp_path / "x.html")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 1
        assert "blockcoupling collection upgrade" in _one_line(r.output)
    with pytest.raises(bc.BlockCouplingError, match="collection upgrade"):
        run_grid(VitTrainConfig(**VIT_TINY), old, drop_paths=(0.0,), weight_decays=(0.01,),
                 executor="local", progress=False)
    r = runner.invoke(app, ["collection", "upgrade", str(old)])
    assert r.exit_code == 0 and "a vit-grid collection of 5 units" in r.output, r.output
    assert not (old / "grid.json").exists() and not (old / "runs").exists()
    up, ref = bc.open_collection(old), bc.open_collection(kinds["vit-grid"])
    assert up.kind == "vit-grid"
    st = up.catalogue.set_index("label")
    assert st.loc["dp0.2-wd0.01-s0", "status"] == "failed"
    assert st.loc["dp0.2-wd0.01-s0", "message"] == "boom"
    done = up.catalogue[up.catalogue["status"] == "done"]
    # the same units (ids by the one rule) and the same numbers
    assert sorted(done["unit_id"]) == sorted(ref.catalogue["unit_id"])
    cols = ["unit_id", "coupling_vs_null_mean", "coupling_mean"]
    pd.testing.assert_frame_equal(up.summary()[cols].sort_values("unit_id", ignore_index=True),
                                  ref.summary()[cols].sort_values("unit_id", ignore_index=True))
    # again: nothing to do; the grid then continues (every run skipped)
    assert runner.invoke(app, ["collection", "upgrade", str(old)]).exit_code == 0
    runs = run_grid(VitTrainConfig(**VIT_TINY), old, drop_paths=(0.0, 0.1),
                    weight_decays=(0.01, 0.1), executor="local", progress=False)
    assert set(runs["status"]) == {"complete"} and len(runs) == 4
    cat = bc.open_collection(old).catalogue
    assert cat.loc[cat["status"] == "done", "attempts"].tolist() == [0] * 4  # none run again


def test_format_one_sweep_is_read_and_resumed(kinds: dict[str, Path], tmp_path: Path) -> None:
    """A sweep directory written before (format 1, no kind for sweeps) is read as it is (its
    kind: the registry's default), told apart from the other kinds, and resumed without
    measuring anything again; ``collection upgrade`` then writes the version and the kind."""
    from blockcoupling.studies.vit.grid import collect_runs, run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    path = tmp_path / "s"
    shutil.copytree(kinds["sweep"], path)
    m = json.loads((path / "sweep.json").read_text())
    m["format_version"] = 1
    del m["kind"], m["digest"]  # as written before manifests were sealed
    (path / "sweep.json").write_text(json.dumps(m))
    c = bc.open_collection(path)
    assert c.kind == "sweep" and c.catalogue["status"].tolist() == ["done"]
    r = CliRunner().invoke(app, ["sweep-status", str(path)])
    assert r.exit_code == 0 and f"{path} (sweep): 1 units: 1 done" in r.output, r.output
    with pytest.raises(bc.BlockCouplingError, match="is a sweep collection, not a ViT grid"):
        collect_runs(path)
    with pytest.raises(bc.BlockCouplingError, match="holds a sweep, not a vit-grid"):
        run_grid(VitTrainConfig(**VIT_TINY), path, drop_paths=(0.0,), weight_decays=(0.01,),
                 executor="local", progress=False)
    again = bc.run_sweep(_sweep_spec(kinds["sweep"].parent), path, executor="local", resume=True, progress=False)
    assert again.catalogue["attempts"].tolist() == [1]
    m = json.loads((path / "sweep.json").read_text())  # resumed: still format 1, as it was
    assert m["format_version"] == 1 and "kind" not in m and len(m["sessions"]) == 2
    r = CliRunner().invoke(app, ["collection", "upgrade", str(path)])
    m = json.loads((path / "sweep.json").read_text())
    assert r.exit_code == 0 and (m["format_version"], m["kind"]) == (store.FORMAT_VERSION,
                                                                      "sweep")


def test_unknown_kind_and_non_collections_are_one_line(kinds: dict[str, Path],
                                                       tmp_path: Path) -> None:
    path = tmp_path / "zoo"
    shutil.copytree(kinds["monitor"], path)
    m = json.loads((path / "sweep.json").read_text())
    m["kind"] = "zoo"
    del m["digest"]  # written so, unsealed (a sealed record edited by hand is named as such)
    (path / "sweep.json").write_text(json.dumps(m))
    with pytest.raises(bc.RunDirError, match="unknown collection kind 'zoo'"):
        bc.open_collection(path)
    runner = CliRunner()
    for args in (["sweep-status", str(path)], ["report", str(path)],
                 ["collection", "upgrade", str(tmp_path / "empty")]):
        (tmp_path / "empty").mkdir(exist_ok=True)
        r = runner.invoke(app, args)
        assert r.exit_code == 1
        _one_line(r.output)
    # a ViT grid into a monitor directory, and vit-figures on a sweep: refused by the kind
    from blockcoupling.studies.vit.grid import collect_runs, run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    with pytest.raises(bc.BlockCouplingError, match="holds a monitor, not a vit-grid"):
        run_grid(VitTrainConfig(**VIT_TINY), kinds["monitor"], drop_paths=(0.0,),
                 weight_decays=(0.01,), executor="local", progress=False)
    with pytest.raises(bc.BlockCouplingError, match="is a sweep collection, not a ViT grid"):
        collect_runs(kinds["sweep"])


def test_grid_takes_the_collection_lock_and_rebuilds_a_lost_manifest(
        kinds: dict[str, Path], tmp_path: Path) -> None:
    from blockcoupling.studies.vit.grid import run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    path = tmp_path / "g"
    shutil.copytree(kinds["vit-grid"], path)
    args = dict(drop_paths=(0.0, 0.1), weight_decays=(0.01, 0.1), executor="local",
                progress=False)
    with store.sweep_lock(path), pytest.raises(bc.RunDirError,
                                               match="in use by another vit-grid"):
        run_grid(VitTrainConfig(**VIT_TINY), path, **args)
    (path / "sweep.json").write_text("{")  # corrupt: rebuilt from the status files
    # and one unit's final measurement damaged: named by sweep-status, trained again
    c = bc.open_collection(kinds["vit-grid"])
    victim = str(c.catalogue["unit_id"].iloc[0])
    part = path / "units" / victim / "coupling" / "final" / "coupling.parquet"
    part.write_bytes(part.read_bytes()[:-8])
    r = CliRunner().invoke(app, ["sweep-status", str(path)])
    assert r.exit_code == 1 and "is not valid JSON" in _one_line(r.output)
    runs = run_grid(VitTrainConfig(**VIT_TINY), path, **args)
    assert set(runs["status"]) == {"complete"}
    c = bc.open_collection(path)
    assert c.kind == "vit-grid" and "rebuilt" in c.manifest
    assert c.manifest["sessions"][-1]["repaired"].keys() == {victim}
    assert c.catalogue["status"].tolist() == ["done"] * 4
    assert c.catalogue.set_index("unit_id")["attempts"].to_dict() == {
        u: 2 if u == victim else 1 for u in c.catalogue["unit_id"]}
    c.verify()
    pd.testing.assert_frame_equal(c.summary(), bc.open_collection(kinds["vit-grid"]).summary())


def test_a_spec_says_its_kind(tmp_path: Path) -> None:
    """`blockcoupling sweep SPEC` runs what the spec's `kind:` says; a grid spec without it,
    an unknown kind, or a kind given to the other kind's parser: one line, nothing written."""
    runner = CliRunner()
    cases = {"nokind": ("drop_path: [0.0]\ntrain: {epochs: 1}\n",
                        "add the line 'kind: vit-grid'"),
             "unknown": ("kind: monitor\nmodels: [{label: a, model: x}]\n",
                         "unknown kind 'monitor'")}
    for name, (text, message) in cases.items():
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(text)
        out = tmp_path / f"out-{name}"
        r = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--executor", "local"])
        assert r.exit_code == 2 and message in r.output, r.output  # a spec refused: usage
        assert len(r.output.strip().splitlines()) == 1 and not out.exists()
    from blockcoupling.studies.sweep.spec import parse_spec
    from blockcoupling.studies.vit.grid import load_grid_spec

    with pytest.raises(BlockCouplingError, match="not a sweep spec"):
        parse_spec({"kind": "vit-grid", "models": [{"label": "a", "model": "x"}]})
    with pytest.raises(BlockCouplingError, match="not a ViT grid spec"):
        load_grid_spec({"kind": "sweep", "train": {"epochs": 1}})


# Pinned before the collection format moved into ``store/`` (issue 33): the ids and hashes
# of existing collections, written as literals, so that a move that changed one fails here.
_SWEEP_CFG = "21b200ab213d7620706c60385537c46057caf4125e2cedb158fd17bef4ee52bf"
PINNED_SWEEP_IDS = [("pythia-step1000-capital-5cab6fba1696", _SWEEP_CFG),
                    ("pythia-step1000-two-c5f814f0e13e", _SWEEP_CFG),
                    ("pythia-main-capital-461a33ab6035", _SWEEP_CFG),
                    ("pythia-main-two-76b203c1b67b", _SWEEP_CFG)]
_MON_CFG = "20fbe6c045ce3c5eaf671eaffc5afabfe9e905bb5140f9fa458dadd020ff35cd"
_VIT_CFG = "eda150226077232073e5882e896495726ccc2a47bce328ad826acb8bb00777de"
PINNED_KIND_IDS = {
    "sweep": (["g-main-two"], [_SWEEP_CFG]),
    "monitor": (["monitor-step0-e3044ea33a45", "monitor-step1-18c060eaf71d"], [_MON_CFG] * 2),
    "vit-grid": (["dp0-wd0.01-s0-aa1a4c33fa12", "dp0.1-wd0.01-s0-9bba60e294fb",
                  "dp0-wd0.1-s0-c27fd160e48f", "dp0.1-wd0.1-s0-6043a4c96152"], [_VIT_CFG] * 4)}


def test_pinned_unit_ids_and_hashes_of_existing_collections(kinds: dict[str, Path]) -> None:
    """Unit ids and config hashes of a tiny collection of each kind, and of a hub sweep spec,
    are the literals the directories were written with (a resume finds its units again)."""
    from blockcoupling.studies.sweep import expand, parse_spec

    spec = parse_spec({"models": [{"label": "pythia", "model": "EleutherAI/pythia-70m",
                                   "revisions": ["step1000", "main"]}],
                       "prompts": ["builtin:capital", {"name": "two", "texts": TEXTS}],
                       "limit": 2, "measure": MEASURE})
    got_sweep = [(u.unit_id, u.config_hash) for u in expand(spec)]
    got_kinds = {}
    for kind, path in kinds.items():
        cat = bc.open_collection(path).catalogue
        ids = cat["unit_id"].tolist()
        if kind == "sweep":  # the id's hash covers the model's tmp path: pin its readable part
            ids = [i.rsplit("-", 1)[0] for i in ids]
        got_kinds[kind] = (ids, cat["config_hash"].tolist())
    assert got_sweep == PINNED_SWEEP_IDS
    assert got_kinds == PINNED_KIND_IDS
    for kind, path in kinds.items():  # the manifest's name and format, for every kind
        m = json.loads((path / "sweep.json").read_text())
        assert (m["format"], m["format_version"], m["kind"]) == ("blockcoupling-sweep", 2, kind)


def test_a_new_kind_is_a_package_and_one_registration(tmp_path: Path) -> None:
    """The recipe "add a collection kind" (docs/DESIGN.md), followed once for a trivial kind
    written from a spec file (two tiny GPT-2 units): its units, the work of one unit, and
    its ``run`` as one call of the run protocol (``runs.protocol.run_collection``), no code
    of its own for the folder. One registration, and ``blockcoupling sweep SPEC``
    (``--dry-run``: its plan; a run, then ``--resume``, which measures nothing again), the
    reader, ``sweep-status``, ``report`` (of its collection and of a folder of its loose
    outputs) and the repair line take it; the protocol refuses a changed spec (4 units into
    the folder of 2, nothing written) and rebuilds a lost manifest (nothing measured
    again); unregistered, its directory is the one unknown-kind line."""
    import yaml

    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.runs import kinds
    from blockcoupling.runs.integrity import repair_command
    from blockcoupling.runs.plans import RunPlan, StudyPlan
    from blockcoupling.runs.protocol import run_collection
    from blockcoupling.store.record import plan_run

    measured: list[str] = []

    def parse_spec(data: Any) -> dict:
        if not isinstance(data, dict) or not isinstance(data.get("n"), int):
            raise BlockCouplingError("a toy spec is {kind: toy, n: <number of units>}")
        return {"n": data["n"]}

    def toy_units(spec: Any) -> list[store.UnitRecord]:
        data = parse_spec(yaml.safe_load(Path(spec).read_text()) if isinstance(spec, Path)
                          else spec)
        cfg = MeasureConfig.parse(**MEASURE)
        return [store.UnitRecord(
            unit_id=store.collection_unit_id([("toy", 8), (f"n{i}", 8)], ["toy", i]),
            label=f"toy{i}", model=f"toy-gpt2-{i}", revision=None, step=None,
            prompt_set="inline:two", limit=None, config=cfg.to_dict(),
            config_hash=cfg.config_hash()) for i in range(data["n"])]

    def measure_unit(u: store.UnitRecord, folder: Path) -> Any:  # the work of one unit
        measured.append(u.unit_id)
        return bc.measure_to_dir(_gpt2(int(u.label[3:])), _tokenizer(), TEXTS, folder,
                                 config=MeasureConfig.from_dict(u.config), resume=True,
                                 meta={"unit_id": u.unit_id, "label": u.label,
                                       "model": u.model}, progress=False)

    def plan(spec: Any) -> StudyPlan:
        return StudyPlan(study="toy", runs=[RunPlan(name=u.label, measure=plan_run(
            _gpt2(0), _tokenizer(), TEXTS, config=MeasureConfig.from_dict(u.config)))
            for u in toy_units(spec)])

    def run(spec: Any, out: Path, **options: Any) -> bc.Sweep:
        units = toy_units(spec)
        return run_collection(out, kind="toy", spec={"toy": {"n": len(units)}}, units=units,
                              work=measure_unit, **options)

    def page(collection: bc.Sweep, out: Path) -> Path:
        out.write_text(f"<p>toy page of {len(collection.catalogue)} units</p>")
        return out

    def folder_page(folder: Path, out: Path) -> Path:
        out.write_text(f"<p>toy folder {folder.name}</p>")
        return out

    toy = kinds.register(kinds.CollectionKind(
        name="toy", page=page, repair=lambda root: f"run the toy again in {root}",
        parse_spec=parse_spec, plan=plan, run=run,
        recognises=lambda folder: (folder / "toy.txt").is_file(), folder_page=folder_page))
    root = tmp_path / "toy"
    spec = tmp_path / "toy.yaml"
    spec.write_text("kind: toy\nn: 2\n")
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "toy.txt").write_text("a toy output")
    runner = CliRunner()
    try:
        r = runner.invoke(app, ["sweep", str(spec), "--out", str(root), "--dry-run"])
        assert r.exit_code == 0 and "toy0" in r.output and "toy1" in r.output, r.output
        assert not root.exists() and measured == []  # a plan writes and measures nothing
        r = runner.invoke(app, ["sweep", str(spec), "--out", str(root), "--executor", "local"])
        assert r.exit_code == 0 and "2 of 2 units done, 0 failed" in r.output, r.output
        assert len(measured) == 2
        c = bc.open_collection(root)
        assert c.kind == "toy" and c.catalogue["status"].tolist() == ["done"] * 2
        lines = []
        for uid in c.catalogue["unit_id"]:  # the reader's statistic is each unit's run's
            mine = bc.coupling_statistic(c.open_unit(str(uid)), n_boot=0)
            theirs = c.coupling_statistic(n_boot=0)
            theirs = theirs[theirs["unit_id"] == uid]
            assert theirs["mean"].tolist() == mine["mean"].tolist()
            lead = mine.set_index("variant").loc["coupling_vs_null"]
            lines.append(f"K=2, 2 prompts: above chance (coupling_vs_null) {lead['mean']:.4f} "
                         f"± {lead['se']:.4f}")
        r = runner.invoke(app, ["sweep", str(spec), "--out", str(root), "--executor", "local",
                                "--resume"])
        assert r.exit_code == 0 and "2 of 2 units done" in r.output and len(measured) == 2
        spec.write_text("kind: toy\nn: 4\n")  # a changed spec: refused, nothing written
        before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        for flags in ([], ["--resume"]):
            r = runner.invoke(app, ["sweep", str(spec), "--out", str(root), "--executor",
                                    "local", *flags])
            assert r.exit_code == 1 and "another spec" in r.output, r.output
            assert "toy.n: stored 2, now 4" in r.output and len(r.output.splitlines()) == 1
        assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
        assert len(measured) == 2
        spec.write_text("kind: toy\nn: 2\n")
        (root / store.MANIFEST).unlink()  # a lost manifest: --resume rebuilds it
        r = runner.invoke(app, ["sweep", str(spec), "--out", str(root), "--executor", "local"])
        assert r.exit_code == 1 and "--resume" in r.output, r.output
        r = runner.invoke(app, ["sweep", str(spec), "--out", str(root), "--executor", "local",
                                "--resume"])
        assert r.exit_code == 0 and "2 of 2 units done" in r.output, r.output
        assert len(measured) == 2 and "rebuilt" in bc.open_collection(root).manifest
        assert repair_command(root, "toy") == f"run the toy again in {root}"
        r = runner.invoke(app, ["sweep-status", str(root)])
        assert r.exit_code == 0 and "(toy): 2 units: 2 done" in r.output, r.output
        assert all(line in r.output for line in lines), (lines, r.output)
        r = runner.invoke(app, ["-q", "report", str(root), "--out", str(tmp_path / "t.html")])
        assert r.exit_code == 0, r.output
        assert (tmp_path / "t.html").read_text() == "<p>toy page of 2 units</p>"
        r = runner.invoke(app, ["-q", "report", str(loose), "--out", str(tmp_path / "f.html")])
        assert r.exit_code == 0, r.output
        assert (tmp_path / "f.html").read_text() == "<p>toy folder loose</p>"
        assert kinds.get("toy") is toy
    finally:
        kinds.unregister("toy")
    with pytest.raises(BlockCouplingError, match="unknown collection kind 'toy'"):
        bc.open_collection(root)
    r = CliRunner().invoke(app, ["report", str(loose), "--out", str(tmp_path / "g.html")])
    assert r.exit_code == 1 and not (tmp_path / "g.html").exists()  # no kind takes it now
    r = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "unknown kind 'toy'" in r.output, r.output


def test_one_default_kind_for_kindless_specs_and_format_one() -> None:
    """The registry, not a generic module, says which kind a spec without ``kind:`` and a
    manifest of format 1 are: exactly one kind is the default; a second is refused, and so
    is a kind that recognises loose folders without a page for them."""
    from blockcoupling.runs import kinds
    from blockcoupling.runs.collection import spec_kind

    assert kinds.default().name == "sweep" and kinds.default() is kinds.get("sweep")
    assert kinds.manifest_kind({"format_version": 1}) == "sweep"
    assert kinds.manifest_kind({"kind": "monitor"}) == "monitor"
    assert spec_kind({"models": []}) == "sweep" and spec_kind(None) == "sweep"
    page = lambda c, out: out  # noqa: E731
    with pytest.raises(ValueError, match="'sweep' is already the default kind"):
        kinds.register(kinds.CollectionKind(name="toy", page=page, repair=str, default=True))
    with pytest.raises(ValueError, match="both recognises and folder_page"):
        kinds.register(kinds.CollectionKind(name="toy", page=page, repair=str,
                                            recognises=lambda p: True))
    assert "toy" not in kinds.names()
