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
from tiny_models import tiny_inputs, tiny_model
from tiny_runs import PROMPTS, cli, save_tiny_lm, write_prompts


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
