"""``blockcoupling study lm-family --quick``: independent runs, emergence curves, tests that
equal scipy/statsmodels on the same values, and bad specs refused before any training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as st
import statsmodels.api as sm
from typer.testing import CliRunner

import blockcoupling as bc
from blockcoupling.cli import app
from blockcoupling.studies import lm_study as S


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lmstudy")
    cache = root / "cache"
    r = CliRunner().invoke(app, ["-q", "study", "lm-family", "--quick", "--out",
                                 str(root / "out")], env={"BLOCKCOUPLING_CACHE": str(cache)})
    assert r.exit_code == 0, r.output
    return root / "out", cache


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_quick_study_writes_independent_runs_and_emergence(quick: tuple[Path, Path]) -> None:
    out, _ = quick
    data = json.loads((out / "study.json").read_text())
    ids = [m["run_id"] for m in data["models"]]
    assert len(ids) >= 4 and len(set(ids)) == len(ids)  # no run counted twice
    for m in data["models"]:
        points = data["emergence"][m["run_id"]]
        # the curve runs to the step the plateau rule stopped at (at most the cap) ...
        stop = m["stop_step"]
        assert stop == points[-1]["step"] <= m["config"]["max_steps"]
        assert m["plateau"]["step"] == stop and m["plateau_reached"] == m["plateau"][
            "reached"] and (m["plateau_reached"] or stop == m["config"]["max_steps"])
        assert [p["step"] for p in points] == [0, *(2 ** i for i in range(stop.bit_length()))]
        # ... and the one end point per run is the end of its plateau, with its numbers
        tol = data["spec"]["plateau_tol"]
        assert m["step"] == S.end_point({p["step"]: p["loss"] for p in points}, tol)
        end = next(p for p in points if p["step"] == m["step"])
        assert (m["accuracy"], m["coupling_vs_null_mean"]) == (end["accuracy"],
                                                               end["coupling_vs_null_mean"])
        for col in ("coupling_vs_null", "coupling"):
            assert np.isfinite(m[f"{col}_mean"]) and np.isfinite(m[f"{col}_se"])
        assert len(points) >= 6 and points[0]["step"] == 0
        assert all(np.isfinite(p["coupling_vs_null_se"]) and "accuracy" in p for p in points)
    assert set(data["hypotheses"]) == {"H1", "H2"} and data["statement"]
    assert "doubling" in data["stopping_rule"] and "plateau" in data["statement"][-2]
    assert data["statistic"]["k"] == data["spec"]["k"]  # one fixed K for every run
    repro = data["reproducibility"]
    assert repro["torch_threads"] >= 1 and repro["torch"] and "thread" in repro["note"]
    assert (out / "study.html").read_text().count("data:image/png;base64,") == 2
    # the emergence values are the statistic of each checkpoint's own run directory
    sw = bc.open_sweep(out / "sweep")
    stat = bc.coupling_statistic(sw, k=data["spec"]["k"], variant="coupling_vs_null")
    first = data["emergence"][ids[0]][-1]
    row = stat[(stat["label"] == ids[0]) & (stat["step"] == first["step"])]
    assert row["mean"].item() == first["coupling_vs_null_mean"]


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_tests_equal_scipy_and_statsmodels(quick: tuple[Path, Path]) -> None:
    out, _ = quick
    data = json.loads((out / "study.json").read_text())
    mt = pd.DataFrame(data["models"])
    y = mt["accuracy"].to_numpy()
    for x in ("coupling_vs_null_mean", "coupling_mean"):
        got = data["tests"]["predictors"][x]
        lr = st.linregress(mt[x], y)
        assert got["slope"] == pytest.approx(lr.slope, rel=1e-10)
        assert got["r2"] == pytest.approx(lr.rvalue ** 2, rel=1e-10)
        assert got["p"] == pytest.approx(lr.pvalue, rel=1e-8)
        one = lr.pvalue / 2 if lr.slope > 0 else 1 - lr.pvalue / 2
        assert got["p_one_sided"] == pytest.approx(one, rel=1e-8)
        ctrl = np.column_stack([np.log10(mt["params"]), np.log10(mt["d_model"]),
                                np.log10(mt["train_tokens"])])
        fit = sm.OLS(y, sm.add_constant(np.column_stack([mt[x], ctrl]))).fit()
        assert got["partial"]["p"] == pytest.approx(fit.pvalues[1], rel=1e-8)
        rx = sm.OLS(mt[x].to_numpy(), sm.add_constant(ctrl)).fit().resid
        ry = sm.OLS(y, sm.add_constant(ctrl)).fit().resid
        assert got["partial"]["r"] == pytest.approx(np.corrcoef(rx, ry)[0, 1], rel=1e-8)
    em = {rid: pd.DataFrame(p) for rid, p in data["emergence"].items()}
    init = [em[m["run_id"]]["coupling_vs_null_mean"].iloc[0] for m in data["models"]]
    final = [em[m["run_id"]].set_index("step").loc[m["step"], "coupling_vs_null_mean"]
             for m in data["models"]]  # each run's end point
    t = st.ttest_rel(final, init, alternative="greater")
    assert data["tests"]["H2_emergence"]["p_t"] == pytest.approx(t.pvalue, rel=1e-10)
    # the seeds of one configuration: runs are the unit of replication (scipy's sem and t)
    sl = data["noise_floor"]["seed_level"]
    seeds = mt[mt["name"] == data["noise_floor"]["config"]]["coupling_vs_null_mean"]
    assert sl["n_runs"] == len(seeds) >= 2 and sl["replication"] == "runs (seeds)"
    assert sl["mean"] == pytest.approx(seeds.mean(), rel=1e-12)
    assert sl["se"] == pytest.approx(st.sem(seeds), rel=1e-12)
    lo, hi = st.t.interval(0.95, len(seeds) - 1, loc=seeds.mean(), scale=st.sem(seeds))
    assert (sl["ci_low"], sl["ci_high"]) == (pytest.approx(lo), pytest.approx(hi))
    assert any("runs as the unit of replication" in line for line in data["statement"])


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_held_out_score_is_reproducible(quick: tuple[Path, Path]) -> None:
    out, cache = quick
    data = json.loads((out / "study.json").read_text())
    spec = S.quick_spec()
    run = spec.runs[0]
    cfg = S.tiny_config(spec, run)
    m = next(x for x in data["models"] if x["run_id"] == run.run_id)
    path = next(p for p in cache.rglob(f"step-{m['step']:06d}") if cfg.cache_key() in str(p))
    a, b = S.evaluate_checkpoint(path, cfg), S.evaluate_checkpoint(path, cfg)
    assert a == b and 0 <= a["score"] <= 100
    # the study's numbers (taken in the training loop) are the saved weights' numbers
    assert a["score"] == pytest.approx(m["accuracy"], rel=1e-6)
    assert a["val_loss"] == pytest.approx(m["loss"], rel=1e-6)


@pytest.mark.parametrize("spec, match", [
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4,
                "max_steps": 1024, "seeds": [0, 1]}]}, "at least 4 independent runs"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1024}] * 4},
     "listed twice"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1024,
                "seeds": [0, 1, 2, 3]}], "regulariser": 1}, "unknown key 'regulariser'"),
    ({"runs": [{"name": "a", "n_layer": 0, "n_embd": 32, "batch_size": 4, "max_steps": 1024,
                "seeds": [0, 1, 2, 3]}]}, "n_layer must be a whole number >= 2"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1024,
                "seeds": [0, 1, 2, 3]}], "alpha": float("nan")}, "alpha must be a finite number > 0 and < 0.5"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 16, "batch_size": 4, "max_steps": 1024,
                "seeds": [0, 1, 2, 3]}], "k": 8}, "n_embd 16 < 4 K"),
    ({"runs": "all of them"}, "non-empty list"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4,
                "seeds": [0, 1, 2, 3]}]}, "runs[0]: missing key max_steps"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1000,
                "seeds": [0, 1, 2, 3]}]}, "max_steps 1000 must be a power of two"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 512,
                "seeds": [0, 1, 2, 3]}]}, "max_steps 512 must be a power of two >= min_steps"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1024,
                "seeds": [0, 1, 2, 3]}], "min_steps": 8}, "min_steps must be a whole number >= 16"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1024,
                "seeds": [0, 1, 2, 3]}], "plateau_tol": 0}, "plateau_tol must be a finite number > 0 and < 1"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1024,
                "train_chars": 100, "seeds": [0, 1, 2, 3]}]}, "train_chars 100 is below"),
    ({"runs": [{"name": "a", "n_layer": 2, "n_embd": 32, "batch_size": 4, "max_steps": 1024,
                "seeds": [0, 1, 2, 3]}], "n_checkpoints": 7}, "unknown key 'n_checkpoints'"),
])
def test_bad_specs_are_one_line_before_training(spec: dict, match: str, tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["study", "lm-family", "--runs", str(path), "--out", str(out)])
    assert r.exit_code == 2  # a spec refused: bad usage, as an option
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], r.output
    assert not out.exists()  # refused before anything was written


def test_end_point_is_the_end_of_the_plateau() -> None:
    assert S.end_point({0: 4.5, 1024: 1.8711, 2048: 1.8715}, 0.02) == 2048  # flat: the stop
    assert S.end_point({0: 4.5, 1024: 2.0, 2048: 1.88, 4096: 2.2}, 0.02) == 2048  # overfit
    assert S.end_point({0: 4.5, 8: 3.0, 16: 2.0}, 0.02) == 16  # the cap, still improving


def test_runs_train_to_a_plateau_under_the_stated_rule() -> None:
    for spec in (S.full_spec(), S.quick_spec()):
        for run in spec.runs:
            cfg = S.tiny_config(spec, run)
            assert cfg.plateau_tol == spec.plateau_tol and cfg.min_steps == spec.min_steps
            assert cfg.lr_schedule == "constant" and cfg.val_windows == 0  # whole held-out split
            assert cfg.checkpoints[0] == 0 and cfg.checkpoints[-1] == run.max_steps
            # log-spaced, and at least 6 points up to any step the rule may stop at
            assert len([s for s in cfg.checkpoints if s <= spec.min_steps]) >= 6
    full = S.full_spec()
    assert full.plateau_tol == 0.02 and full.k == 8 and full.n_prompts == 16
    assert len({r.train_chars for r in full.runs}) >= 2  # data is one of the axes
