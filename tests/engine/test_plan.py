"""The measurement plan (engine/plan.py): its counts equal what measure() then computes, and
``measure --dry-run`` prints it and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

import blockcoupling as bc
from blockcoupling.engine.blocks import find_blocks
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.plan import plan_measure
from blockcoupling.store.record import plan_run
from tests.helpers.tiny_models import tiny_inputs, tiny_model
from tests.helpers.tiny_runs import PROMPTS, cli, save_tiny_lm, write_prompts


@pytest.mark.parametrize("arch, kinds, tokens", [
    ("gpt2", ("depth", "self", "fixed_input"), "all"),
    ("llama", ("depth", "fixed_output"), "0,-1"),
    ("bert", ("depth", "self"), "all"),
])
def test_plan_counts_what_measure_computes(arch: str, kinds: tuple[str, ...], tokens: str) -> None:
    model = tiny_model(arch)
    inputs = tiny_inputs(arch, n=5, batch=2)
    cfg = MeasureConfig.parse(coupling=",".join(kinds), k="2,3", tokens=tokens, p="1,2",
                              layers="1..2")
    plan = plan_run(model, None, inputs, config=cfg, model_name=arch)
    m = bc.measure(model, None, inputs, config=cfg, progress=False)
    assert plan.prompts == 2 and plan.tokens == 10
    assert plan.coupling_rows == len(m.coupling)
    for kind in kinds:
        rows = m.coupling[(m.coupling["kind"] == kind)]
        per_pair = rows.groupby(["prompt_id", "layer_a", "layer_b", "token_in_a", "token_out_a",
                                 "token_in_b", "token_out_b"]).ngroups
        assert plan.pairs[kind] == per_pair, kind
    # one diagnostics row per Jacobian block and its top-K SVD
    assert plan.jacobians == len(m.diagnostics)
    assert plan.peak_jacobian_bytes > 0 and plan.estimated_seconds > 0
    assert "nothing is written" in plan.describe()


def test_plan_scales_with_the_prompt_length() -> None:
    spec = find_blocks(tiny_model("gpt2"))
    cfg = MeasureConfig.parse(coupling="depth,fixed_output", tokens="last")
    short, long = plan_measure(cfg, spec, [4]), plan_measure(cfg, spec, [16])
    assert long.pairs["fixed_output"] == 16 * short.pairs["fixed_output"]  # (t1, t1') <= t2
    assert long.pairs["depth"] == short.pairs["depth"] == 9  # 3 x 3 layers, one token


def test_measure_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    model = save_tiny_lm(tmp_path / "model")
    prompts = write_prompts(tmp_path / "prompts.txt", PROMPTS)
    out = tmp_path / "run"
    r = cli("measure", "--model", str(model), "--prompts", str(prompts), "--out", str(out),
            "--coupling", "depth", "--k", "2", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "plan for" in r.output and f"prompts {len(PROMPTS)}" in r.output
    assert "estimated time" in r.output
    assert not out.exists()
    bad = cli("measure", "--model", str(model), "--prompts", str(prompts), "--out", str(out),
              "--k", "99", "--dry-run")  # checked like a real run: K > d
    assert bad.exit_code == 1 and not out.exists()


@pytest.mark.parametrize("custom", [False, True])
@pytest.mark.parametrize("entry", ["measure", "measure_to_dir"])
def test_every_measurement_check_runs_once_per_call(entry: str, custom: bool, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One call normalises its inputs once, finds the blocks once and checks the options
    against the model once (issue 33), for a transformers model and for a custom module whose
    width is learnt from the first capture; two prompts in batches of one, so a check made
    per batch would count twice."""
    import blockcoupling.engine.blocks as blocks_mod
    import blockcoupling.engine.causality as causality_mod
    import blockcoupling.engine.inputs as inputs_mod
    import blockcoupling.engine.measure as measure_mod
    import blockcoupling.store.preflight as preflight_mod
    import blockcoupling.store.record as record_mod

    calls = {"normalise_inputs": 0, "find_blocks": 0, "check_model": 0}

    def counted(name: str, fn: object) -> object:
        def wrapper(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            return fn(*args, **kwargs)  # type: ignore[operator]
        return wrapper

    originals = {"normalise_inputs": inputs_mod.normalise_inputs,
                 "find_blocks": blocks_mod.find_blocks}
    for mod in (inputs_mod, measure_mod, record_mod, preflight_mod, causality_mod, blocks_mod):
        for name, fn in originals.items():
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, counted(name, fn))
    monkeypatch.setattr(MeasureConfig, "check_model",
                        counted("check_model", MeasureConfig.check_model))
    if custom:
        import torch

        from tests.helpers.tiny_models import EncoderStack

        torch.manual_seed(0)
        model: torch.nn.Module = EncoderStack(2).eval()
        inputs: dict = {"x": torch.randn(2, 3, 8)}
        opts: dict = dict(blocks_path="layers")
    else:
        model, inputs, opts = tiny_model("gpt2"), tiny_inputs("gpt2", n=3, batch=2), {}
    opts.update(coupling="depth", k=2, tokens="0", batch_size=1, progress=False)
    if entry == "measure":
        m = bc.measure(model, None, inputs, **opts)
    else:
        m = bc.measure_to_dir(model, None, inputs, tmp_path / "run", **opts)
    assert m.prompts["prompt_id"].nunique() == 2
    assert calls == {"normalise_inputs": 1, "find_blocks": 1, "check_model": 1}, calls


def test_dry_run_and_the_size_check_read_one_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``measure --dry-run`` and the stored-size check read the one `MeasurePlan` of the call
    (issue 33): one plan and one work list per distinct prompt length per CLI call, and the
    sizes the dry run prints are the ones the run checks, prints and then stores."""
    import json

    import blockcoupling.engine.plan as plan_mod
    import blockcoupling.store.preflight as preflight_mod
    from blockcoupling.loading import load_model
    from blockcoupling.store import bases as stored

    calls = {"plan_measure": 0, "prompt_work": 0}

    def counted(name: str, fn: object) -> object:
        def wrapper(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            return fn(*args, **kwargs)  # type: ignore[operator]
        return wrapper

    once = counted("plan_measure", plan_mod.plan_measure)
    for mod in (plan_mod, preflight_mod):
        monkeypatch.setattr(mod, "plan_measure", once)
    monkeypatch.setattr(plan_mod, "prompt_work", counted("prompt_work", plan_mod.prompt_work))
    model = save_tiny_lm(tmp_path / "model")
    prompts = write_prompts(tmp_path / "prompts.txt", PROMPTS)
    opts = ("--coupling", "depth", "--k", "2", "--tokens", "all", "--save-bases",
            "--save-jacobians")
    r = cli("measure", "--model", str(model), "--prompts", str(prompts), "--out",
            str(tmp_path / "dry"), *opts, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert calls == {"plan_measure": 1, "prompt_work": len(set(plan["lengths"]))}, calls
    n_jac = sum(3 * n for n in plan["lengths"])  # J_tt per layer and measured token
    assert plan["stored_jacobians"] == n_jac and plan["stores"] == ["bases", "jacobians"]
    assert plan["jacobian_bytes"] == n_jac * 16 * 16 * 4
    assert plan["bases_bytes"] == n_jac * (2 * 16 * 2 + 2) * 4
    text = cli("measure", "--model", str(model), "--prompts", str(prompts), "--out",
               str(tmp_path / "dry"), *opts, "--dry-run")
    assert f"stored: {n_jac:,} Jacobians, bases about" in text.stdout, text.stdout
    # the run checks and prints the same numbers, and stores that many Jacobians
    net, tok = load_model(str(model), device="cpu")
    capsys.readouterr()
    m = bc.measure_to_dir(net, tok, PROMPTS, tmp_path / "run", coupling="depth", k=2,
                          tokens="all", save_bases=True, save_jacobians=True)
    err = capsys.readouterr().err
    assert f"bases: {n_jac} Jacobians x (U, V of 2 x d, S) = about " \
           f"{stored.human(plan['bases_bytes'])}" in err, err
    assert f"jacobians: {n_jac} Jacobians of d x d = about " \
           f"{stored.human(plan['jacobian_bytes'])}" in err, err
    assert len(m.diagnostics) == n_jac
