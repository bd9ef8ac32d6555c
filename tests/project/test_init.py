"""``--init random`` (measure and sweeps): the model's own config with seeded random weights,
the untrained baseline of the paper's figures 3, 4 and 23; recorded in meta and in the run's
identity. The weights are checked against transformers' initialisation run independently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf
import yaml

from blockcoupling.loading import load_model, random_init
from blockcoupling.store import open_run
from blockcoupling.studies.sweep.spec import SpecError, parse_spec
from blockcoupling.studies.sweep.units import expand, unit_id
from tests.helpers.tiny_runs import cli, save_tiny_lm, write_prompts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("init") / "tiny-gpt2")


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_random_init_is_the_configs_own_initialisation_under_the_seed(model_dir: Path) -> None:
    before = torch.random.get_rng_state()
    got, tok = load_model(str(model_dir), init="random", init_seed=7, progress=False)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is untouched
    assert tok is not None  # the checkpoint's tokenizer
    torch.manual_seed(7)  # independently: what transformers does under the seed
    want = tf.AutoModel.from_config(tf.AutoConfig.from_pretrained(model_dir))
    ws, gs = _state(want), _state(got)
    assert ws.keys() == gs.keys() and all(torch.equal(ws[k], gs[k]) for k in ws)
    trained, _ = load_model(str(model_dir), progress=False)
    assert not torch.equal(_state(trained)["h.0.attn.c_attn.weight"], gs["h.0.attn.c_attn.weight"])
    other = random_init(tf.AutoConfig.from_pretrained(model_dir), 8)
    assert not torch.equal(_state(other)["h.0.attn.c_attn.weight"], gs["h.0.attn.c_attn.weight"])


def test_measure_init_random_records_it_and_resume_keeps_it(model_dir: Path,
                                                            tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.txt")
    base = ["-q", "measure", "--model", str(model_dir), "--prompts", str(prompts), "--k", "2",
            "--limit", "2"]
    r = cli(*base, "--out", str(tmp_path / "rand"), "--init", "random", "--init-seed", "3")
    assert r.exit_code == 0, r.output
    r = cli(*base, "--out", str(tmp_path / "trained"))
    assert r.exit_code == 0, r.output
    rand, trained = open_run(tmp_path / "rand"), open_run(tmp_path / "trained")
    assert rand.meta["init"] == "random" and rand.meta["init_seed"] == 3
    assert trained.meta["init"] == "pretrained" and "init_seed" not in trained.meta
    assert rand.meta["weights_hash"] != trained.meta["weights_hash"]
    manifest = json.loads((tmp_path / "rand" / "manifest.json").read_text())
    assert manifest["meta"]["init_seed"] == 3
    # resuming the random run with the checkpoint's weights (or another seed) is refused
    for extra in ([], ["--init", "random", "--init-seed", "4"]):
        r = cli(*base, "--out", str(tmp_path / "rand"), "--resume", *extra)
        assert r.exit_code != 0 and "init" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args, match", [
    (["--init", "trained"], "--init 'trained': choose pretrained"),
    (["--init", "random", "--init-seed", "-1"], "--init-seed must be a whole number"),
])
def test_bad_init_is_one_line(model_dir: Path, tmp_path: Path, args: list[str],
                              match: str) -> None:
    r = cli("measure", "--model", str(model_dir), "--prompts", "builtin:capital", "--k", "2",
            "--out", str(tmp_path / "x"), *args)
    assert r.exit_code in (1, 2) and match in r.output
    assert "Traceback" not in r.output and not (tmp_path / "x").exists()


def test_sweep_spec_init_random_is_its_own_unit(model_dir: Path, tmp_path: Path) -> None:
    spec = {"models": [{"label": "tiny", "model": str(model_dir)},
                       {"label": "tiny-random", "model": str(model_dir), "init": "random",
                        "init_seed": 1}],
            "prompts": ["builtin:capital"], "measure": {"k": 2}}
    units = expand(parse_spec(spec))
    assert [u.init for u in units] == ["pretrained", "random"] and units[1].init_seed == 1
    same = {"model": "m", "revision": None, "prompt_set": "p", "limit": None, "cfg_hash": "h",
            "label": "tiny", "step": None}  # the same label and all: init is in the identity
    assert len({unit_id(**same), unit_id(**same, init="random"),
                unit_id(**same, init="random", init_seed=1)}) == 3
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    r = cli("-q", "sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "sw"),
            "--executor", "local")
    assert r.exit_code == 0, r.output
    metas = sorted(open_run(p).meta["init"] for p in (tmp_path / "sw" / "units").iterdir())
    assert metas == ["pretrained", "random"]
    for bad, match in (({"init": "untrained"}, r"models\[0\]\.init 'untrained'"),
                       ({"init": "random", "init_seed": 1.5}, r"models\[0\]\.init_seed"),
                       ({"init": "random", "quantize": "bnb-8bit"}, "checkpoints only")):
        with pytest.raises(SpecError, match=match):
            parse_spec({"models": [{"model": str(model_dir), **bad}],
                        "prompts": ["builtin:capital"]})


def test_runs_and_sweeps_made_before_these_options_still_resume(model_dir: Path) -> None:
    """A stored config without logit_lens (made before it existed) is the default; a sweep
    spec's JSON names init only where it is random, as before init existed."""
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.store.manifest import resume_differences

    cfg = MeasureConfig().to_dict()
    old = {k: v for k, v in cfg.items() if k != "logit_lens"}
    manifest = {"config": old, "meta": {}, "prompts": []}
    assert resume_differences(manifest, cfg, {}, []) == []
    on = MeasureConfig.parse(logit_lens=True).to_dict()
    assert resume_differences(manifest, on, {}, []) == [
        "logit_lens: run has False, now True"]
    spec = parse_spec({"models": [{"label": "a", "model": str(model_dir)},
                                  {"label": "b", "model": str(model_dir), "init": "random"}],
                       "prompts": ["builtin:capital"]})
    models = spec.to_dict()["models"]
    assert "init" not in models[0] and models[1]["init"] == "random"

