"""Coupling across runs (studies/cross.py): a run against itself is its own depth-wise
coupling; checkpoints give a table, principal angles and a figure; mismatched runs are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import blockcoupling as bc
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.cross import cross_coupling, cross_sweep
from tests.helpers.tiny_models import tiny_inputs, tiny_model

OPTS = dict(coupling=("depth",), k=(2, 4), tokens="0,-1", dtype=torch.float64, progress=False)
KEYS = ["prompt_id", "layer_a", "layer_b", "token_out_a", "k", "variant", "p", "orientation"]


def _own_vs_cross(own: pd.DataFrame, cross: pd.DataFrame) -> None:
    got = cross.drop(columns=["run_a", "run_b"]).sort_values(KEYS).reset_index(drop=True)
    want = own.sort_values(KEYS).reset_index(drop=True)
    assert len(got) == len(want) > 0
    for col in KEYS[:5] + ["token_in_a", "token_in_b", "token_out_b", "kind"]:
        assert (got[col] == want[col]).all(), col
    np.testing.assert_allclose(got["value"], want["value"], rtol=1e-9, atol=1e-9)


def test_a_run_against_itself_is_its_own_depth_coupling(tmp_path: Path) -> None:
    model = tiny_model("gpt2")
    inputs = tiny_inputs("gpt2", n=5, batch=2)
    run = bc.measure_to_dir(model, None, inputs, tmp_path / "run", save_bases=True,
                            save_jacobians=True, **OPTS)
    res = cross_coupling(tmp_path / "run", tmp_path / "run")
    _own_vs_cross(run.coupling, res.coupling)
    # identical subspaces: every principal-angle cosine is 1 on the diagonal layer pairs
    diag = res.angles.query("layer_a == layer_b")
    np.testing.assert_allclose(diag["cosine"], 1.0, atol=1e-10)
    assert set(res.angles["side"]) == {"U", "V"} and len(res.angles) == 2 * 2 * 9 * 2 * (2 + 4)
    # without stored Jacobians, run A's model measures them again (in memory)
    bc.measure_to_dir(model, None, inputs, tmp_path / "bases_only", save_bases=True, **OPTS)
    res2 = cross_coupling(tmp_path / "bases_only", tmp_path / "run", model_a=model,
                          inputs_a=inputs)
    _own_vs_cross(run.coupling, res2.coupling)
    with pytest.raises(BlockCouplingError, match="save_jacobians"):
        cross_coupling(tmp_path / "bases_only", tmp_path / "run")
    with pytest.raises(BlockCouplingError, match="weights hash"):
        cross_coupling(tmp_path / "bases_only", tmp_path / "run", model_a=tiny_model("gpt2", 1),
                       inputs_a=inputs)


def test_two_checkpoints_give_a_table_and_a_figure(tmp_path: Path) -> None:
    from blockcoupling.report.cross import plot_cross_heatmap, write_cross_report

    inputs = tiny_inputs("llama", n=4, batch=2)
    dirs = []
    for seed in (0, 1, 2):
        d = tmp_path / f"ckpt{seed}"
        bc.measure_to_dir(tiny_model("llama", seed), None, inputs, d, save_bases=True,
                          save_jacobians=True, **OPTS)
        dirs.append(d)
    res = cross_coupling(dirs[0], dirs[1])
    mat = res.matrix(StatisticRule(k=4))
    assert mat.shape == (3, 3) and np.isfinite(mat.to_numpy()).all()
    # other weights: the subspaces are not the same
    assert res.angles.query("layer_a == layer_b")["cosine"].min() < 0.99
    fig = plot_cross_heatmap(res, StatisticRule(k=4))
    assert len(fig.axes) >= 1
    page = write_cross_report(res, tmp_path / "cross.html", StatisticRule(k=4))
    assert "Cross-coupling" in page.read_text()
    # the rotated null uses run B's basis (its U^T V), not run A's own: against the oracle
    from tests.helpers.oracles import oracle_value

    a, b = bc.open_run(dirs[0]), bc.open_run(dirs[1])
    rows = res.coupling.query("variant == 'coupling_vs_rotated' and layer_a != layer_b")
    assert len(rows) > 0
    for r in rows.head(6).itertuples():
        J1 = a.jacobian(r.prompt_id, r.layer_a, r.token_in_a, r.token_out_a).double().numpy()
        J2 = b.jacobian(r.prompt_id, r.layer_b, r.token_in_b, r.token_out_b).double().numpy()
        want = oracle_value(J1, J2, r.k, "coupling_vs_rotated", None, r.orientation)
        assert r.value == pytest.approx(want, abs=1e-6)
    sweep = cross_sweep(dirs, labels=["a", "b", "c"])
    assert set(sweep.coupling["run_a"]) == {"a", "b"} and set(sweep.coupling["run_b"]) == {"c"}


def test_runs_that_differ_are_refused_with_one_line(tmp_path: Path) -> None:
    model = tiny_model("gpt2")
    a = bc.measure_to_dir(model, None, tiny_inputs("gpt2", n=5), tmp_path / "a",
                          save_bases=True, save_jacobians=True, **OPTS)
    b = bc.measure_to_dir(model, None, tiny_inputs("gpt2", n=5, seed=1), tmp_path / "b",
                          save_bases=True, **OPTS)
    with pytest.raises(BlockCouplingError, match="other prompts"):
        cross_coupling(a, b)
    c = bc.measure_to_dir(model, None, tiny_inputs("gpt2", n=5), tmp_path / "c",
                          save_bases=True, layers="1..2", **{**OPTS, "tokens": "last"})
    with pytest.raises(BlockCouplingError, match="same layers and tokens") as err:
        cross_coupling(a, c)
    assert "\n" not in str(err.value)
    plain = bc.measure_to_dir(model, None, tiny_inputs("gpt2", n=5), tmp_path / "plain", **OPTS)
    with pytest.raises(BlockCouplingError, match="save_bases"):
        cross_coupling(a, plain)


def test_cli_cross_writes_json_and_page_and_refuses_bad_input(tmp_path: Path) -> None:
    import json

    from tests.helpers.tiny_runs import PROMPTS, cli, save_tiny_lm, write_prompts

    folder = save_tiny_lm(tmp_path / "lm")
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:2])
    common = ["--model", str(folder), "--prompts", str(prompts), "--k", "2,4", "--tokens",
              "0,-1", "--save-bases"]
    assert cli("measure", *common, "--out", str(tmp_path / "a")).exit_code == 0
    assert cli("measure", *common, "--save-jacobians", "--out", str(tmp_path / "b")).exit_code == 0
    res = cli("cross", str(tmp_path / "b"), str(tmp_path / "a"), "--json",
              str(tmp_path / "x.json"), "--out", str(tmp_path / "x.html"))
    assert res.exit_code == 0, res.output
    assert "same layer 1.0000" in res.output
    data = json.loads((tmp_path / "x.json").read_text())
    assert {"matrices", "coupling", "angles"} <= set(data)
    assert (tmp_path / "x.html").is_file()
    # run A without Jacobians: measured again from its model
    res = cli("cross", str(tmp_path / "a"), str(tmp_path / "b"), "--model-a", str(folder))
    assert res.exit_code == 0, res.output
    res = cli("cross", str(tmp_path / "a"), str(tmp_path / "b"))
    assert res.exit_code == 1 and "save_jacobians" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_sweep_directory_compares_every_checkpoint_with_the_last(tmp_path: Path) -> None:
    from tests.helpers.tiny_runs import PROMPTS, cli, save_tiny_lm

    for step, seed in ((0, 0), (10, 1), (20, 2)):
        folder = save_tiny_lm(tmp_path / "train" / f"checkpoint-{step}")
        torch.manual_seed(seed)
        tiny_model("gpt2", seed).save_pretrained(folder)  # other weights per checkpoint
    spec = {"models": [{"label": "lm", "checkpoints": str(tmp_path / "train" / "checkpoint-*")}],
            "prompts": [{"name": "p", "texts": PROMPTS[:2]}],
            "measure": {"k": [2], "coupling": ["depth"], "save_bases": True,
                        "save_jacobians": True, "variants": ["coupling"]}}
    bc.run_sweep(spec, tmp_path / "sweep", executor="local", progress=False)
    res = cross_sweep(tmp_path / "sweep")
    assert set(res.coupling["run_a"]) == {"lm-step0", "lm-step10"}
    assert set(res.coupling["run_b"]) == {"lm-step20"}
    out = cli("cross", str(tmp_path / "sweep"), "--out", str(tmp_path / "sweep.html"))
    assert out.exit_code == 0, out.output
    assert "lm-step0 in the bases of lm-step20" in out.output
