"""``study generalization``: its statistics against scipy/statsmodels and by simulation, its
design checks (one line before any training), its quick version end to end (the tests equal
scipy/statsmodels on the study's own values, runs show-able, a rerun reuses every run), and
(slow) kill + rerun gives the same result."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.generalization import parse_spec, quick_spec
from blockcoupling.studies.generalization.analysis import (
    analyse,
    comparison_point,
    mixed_model,
    positive_control,
)
from blockcoupling.studies.regression import (
    correlation_density,
    correlation_power,
    correlation_tests,
    tost_power,
)
from tests.helpers.threads import one_torch_thread  # noqa: E402,F401 - autouse: one torch thread


def _simulated_r(n: int, rho: float, sims: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sims, n))
    y = rho * x + math.sqrt(1 - rho ** 2) * rng.standard_normal((sims, n))
    xc, yc = x - x.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
    return (xc * yc).sum(1) / np.sqrt((xc ** 2).sum(1) * (yc ** 2).sum(1))


# ---------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("n", [6, 24])
def test_power_equals_the_simulated_rejection_rate_of_the_test(n: int) -> None:
    """The exact power of the one-sided Pearson test (and of the TOST) equals the rejection
    rate of that very test on simulated bivariate-normal data (40,000 seeded samples: MC se
    <= 0.0025), at rho = 0.5 and, for the size, at rho = 0."""
    from scipy import integrate

    assert integrate.quad(correlation_density, -1, 1, args=(n, 0.3))[0] == pytest.approx(1.0)
    r = _simulated_r(n, 0.5, 40_000, seed=n)
    t = (r * np.sqrt((n - 2) / (1 - r ** 2)))
    reject = stats.t.sf(t, n - 2) < 0.05  # what pearsonr(alternative="greater") decides
    assert correlation_power(n, 0.5) == pytest.approx(reject.mean(), abs=0.01)
    assert correlation_power(n, 0.0) == pytest.approx(0.05, abs=1e-6)
    r0 = _simulated_r(n, 0.0, 40_000, seed=100 + n)
    z, se = np.arctanh(r0), 1 / math.sqrt(n - 3)
    half = stats.norm.isf(0.05) * se
    equivalent = (z - half > np.arctanh(-0.5)) & (z + half < np.arctanh(0.5))
    assert tost_power(n, 0.5) == pytest.approx(equivalent.mean(), abs=0.01)
    assert correlation_power(24, 0.5) > 0.8 > correlation_power(15, 0.5)  # the design's choice


def test_correlation_tests_equal_scipy() -> None:
    rng = np.random.default_rng(3)
    for n, rho in ((24, 0.0), (24, 0.6), (8, -0.3)):
        x = rng.standard_normal(n)
        y = rho * x + rng.standard_normal(n)
        t = correlation_tests(x, y, bound=0.5, alpha=0.05)
        ref = stats.pearsonr(x, y, alternative="greater")
        lr = stats.linregress(x, y)
        assert t["r"] == pytest.approx(ref.statistic) and t["p_greater"] == pytest.approx(ref.pvalue)
        assert t["slope"] == pytest.approx(lr.slope) and t["slope_stderr"] == pytest.approx(lr.stderr)
        # the OLS slope's one-sided t-test is the same test
        assert t["p_greater"] == pytest.approx(lr.pvalue / 2 if lr.slope > 0 else 1 - lr.pvalue / 2)
        # TOST at alpha = the Fisher (1 - 2 alpha) interval (scipy's) inside the bounds
        ci = stats.pearsonr(x, y).confidence_interval(confidence_level=0.90)
        assert t["ci_tost"] == pytest.approx([ci.low, ci.high])
        assert t["equivalent"] == (ci.low > -0.5 and ci.high < 0.5)
        assert t["p_tost"] == pytest.approx(max(t["p_tost_lower"], t["p_tost_upper"]))
    with pytest.raises(BlockCouplingError, match="at least 4"):
        correlation_tests([1, 2, 3], [1, 2, 4])


def test_cells_are_seed_level_t_intervals_over_runs() -> None:
    """A cell's se and interval are over its runs (seeds), the unit of replication: scipy's
    sem and t interval; its within_se is what the images alone give (within-model)."""
    from blockcoupling.studies.generalization.analysis import cell_table

    runs = _table({"a": 0.08, "b": 0.05}, seeds=4, seed=5)
    cells = cell_table(runs, ["coupling_vs_null"]).set_index("cell")
    for name, g in runs.groupby("cell"):
        x = g["coupling_vs_null"].to_numpy()
        ref = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        row = cells.loc[name]
        assert row["n_seeds"] == 4 and row["coupling_vs_null_mean"] == pytest.approx(x.mean())
        assert row["coupling_vs_null_se"] == pytest.approx(stats.sem(x))
        assert row["coupling_vs_null_sd"] == pytest.approx(x.std(ddof=1))
        assert [row["coupling_vs_null_ci_low"], row["coupling_vs_null_ci_high"]] == \
            pytest.approx(list(ref))
        assert row["coupling_vs_null_within_se"] == pytest.approx(
            math.sqrt((g["coupling_vs_null_se"] ** 2).sum()) / 4)
        assert row["test_accuracy_se"] == pytest.approx(stats.sem(g["test_accuracy"]))


def _table(means: dict[str, float], seeds: int = 3, sd: float = 0.01, seed: int = 0,
           acc_slope: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i, (cell, m) in enumerate(means.items()):
        for s in range(seeds):
            acc = 0.5 + 0.05 * i + 0.01 * rng.standard_normal()
            rows.append({"cell": cell, "n_train": 10 * (i + 1), "label_noise": 0.0, "seed": s,
                         "test_accuracy": acc, "train_accuracy": 1.0,
                         "coupling_vs_null": m + acc_slope * acc + sd * rng.standard_normal(),
                         "coupling_vs_null_se": 0.001})
    return pd.DataFrame(rows)


def test_positive_control_and_the_comparison_point() -> None:
    above = _table({f"c{i}": 0.08 for i in range(5)})
    at_chance = _table({f"c{i}": (0.08 if i else 0.0) for i in range(5)}, seed=1)
    c = positive_control(above, ["coupling_vs_null"])
    assert c["passed"] and c["variants"]["coupling_vs_null"]["cells_passing"] == 5
    g = above[above["cell"] == "c0"]["coupling_vs_null"]
    want = stats.ttest_1samp(g, 0.0, alternative="greater").pvalue
    assert c["variants"]["coupling_vs_null"]["cells"][0]["p"] == pytest.approx(want)
    assert not positive_control(at_chance, ["coupling_vs_null"])["passed"]
    with pytest.raises(BlockCouplingError, match="lacks coupling_vs_rotated"):
        positive_control(above, ["coupling_vs_null", "coupling_vs_rotated"])
    assert comparison_point(above, None, ["coupling_vs_null"], 0.05)["point"] == "final"
    # fails at the end, holds at step 40 (not at 80): the tests compare at step 40
    cps = pd.concat([at_chance.assign(step=80), above.assign(step=40),
                     above.assign(step=0)], ignore_index=True)
    cp = comparison_point(at_chance, cps, ["coupling_vs_null"], 0.05)
    assert cp["point"] == 40 and "matched progress" in cp["reason"]
    assert not cp["control_final"]["passed"] and cp["control"]["passed"]
    cp = comparison_point(at_chance, cps[cps["step"] == 80], ["coupling_vs_null"], 0.05)
    assert cp["point"] == "final" and "fails" in cp["reason"]


@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.ConvergenceWarning")
def test_analysis_tests_equal_scipy_and_statsmodels_on_its_values() -> None:
    import statsmodels.formula.api as smf

    runs = _table({f"c{i}": 0.05 + 0.002 * i for i in range(8)}, seed=2, acc_slope=0.1)
    a = analyse(runs, ["coupling_vs_null"], alpha=0.05, bound=0.5)
    cells = runs.groupby("cell", sort=False)[["test_accuracy", "coupling_vs_null"]].mean()
    h = a["tests"]["H1_E1"]
    ref = stats.pearsonr(cells["test_accuracy"], cells["coupling_vs_null"], alternative="greater")
    assert h["n"] == 8 and h["r"] == pytest.approx(ref.statistic)
    assert h["p_greater"] == pytest.approx(ref.pvalue)
    fit = smf.mixedlm("coupling_vs_null ~ test_accuracy", runs, groups=runs["cell"]).fit(reml=True)
    m = a["tests"]["H1b"]
    assert m["slope"] == pytest.approx(fit.params["test_accuracy"])
    assert m["slope_stderr"] == pytest.approx(fit.bse["test_accuracy"])
    assert m["p_greater"] == pytest.approx(stats.norm.sf(fit.tvalues["test_accuracy"]))
    assert mixed_model(runs.iloc[:2], "coupling_vs_null").get("skipped")
    sd = runs.groupby("cell", sort=False)["coupling_vs_null"].std(ddof=1)
    np.testing.assert_allclose(a["cells"]["coupling_vs_null_se"], sd / math.sqrt(3))


def _grid_table(seed: int = 0, within: float = 0.3, seeds: int = 3) -> pd.DataFrame:
    """Runs of a 4 size x 3 noise design with a known within-cell slope of coupling on
    accuracy, a size effect on accuracy only and a noise effect on both."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (90, 199, 438, 967):
        for e in (0.0, 0.2, 0.4):
            acc_cell = 0.3 + 0.1 * math.log(n / 90) - 0.5 * e
            cpl_cell = 0.08 - 0.05 * e + 0.003 * rng.standard_normal()
            for s in range(seeds):
                dx = 0.04 * rng.standard_normal()
                rows.append({"cell": f"n{n}-noise{e:g}", "n_train": n, "label_noise": e,
                             "seed": s, "test_accuracy": acc_cell + dx,
                             "train_accuracy": 0.9 - e + 0.01 * rng.standard_normal(),
                             "coupling_vs_rotated": cpl_cell + within * dx
                             + 0.005 * rng.standard_normal(),
                             "coupling_vs_rotated_se": 0.001})
    return pd.DataFrame(rows)


@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.ConvergenceWarning")
def test_within_cell_split_equals_an_independent_computation() -> None:
    """W1/EW: the Mundlak within coefficient equals the within-cell (demeaned) slope computed
    with numpy; the fixed-effects t-test, its interval and the TOST equal scipy on that
    slope; the pooled within-cell r is numpy's; the between coefficient is the slope of the
    cell means (balanced design)."""
    from blockcoupling.studies.generalization.analysis import within_between

    runs = _grid_table(seed=3, within=0.3)
    w = within_between(runs, "coupling_vs_rotated", bound=0.057)
    xd = runs["test_accuracy"] - runs.groupby("cell")["test_accuracy"].transform("mean")
    yd = runs["coupling_vs_rotated"] - runs.groupby("cell")["coupling_vs_rotated"].transform(
        "mean")
    b = float((xd * yd).sum() / (xd ** 2).sum())
    dof = len(runs) - runs["cell"].nunique() - 1
    se = math.sqrt(float(((yd - b * xd) ** 2).sum()) / dof / float((xd ** 2).sum()))
    assert w["within"]["slope"] == pytest.approx(b, rel=1e-6)
    fe = w["fixed_effects"]
    assert fe["slope"] == pytest.approx(b) and fe["slope_stderr"] == pytest.approx(se)
    assert fe["df"] == dof and fe["p_greater"] == pytest.approx(stats.t.sf(b / se, dof))
    assert fe["within_r"] == pytest.approx(np.corrcoef(xd, yd)[0, 1])
    eq = w["equivalence"]
    assert eq["p_tost"] == pytest.approx(max(stats.t.sf((b + 0.057) / se, dof),
                                             stats.t.cdf((b - 0.057) / se, dof)))
    cm = runs.groupby("cell")[["test_accuracy", "coupling_vs_rotated"]].mean()
    between = stats.linregress(cm["test_accuracy"], cm["coupling_vs_rotated"]).slope
    assert w["between"]["slope"] == pytest.approx(between, rel=1e-3)
    assert w["within"]["p_greater"] < 0.05  # the planted within slope is found
    flat = within_between(_grid_table(seed=4, within=0.0), "coupling_vs_rotated", 0.057)
    assert abs(flat["within"]["slope"]) < 4 * flat["within"]["slope_stderr"]


def test_factor_effects_equal_ols_and_welch_on_their_cells() -> None:
    """S1 (clean cells), S2 (noise fixed), N1 (size fixed): numpy least squares and scipy's t
    on the cell means; PC: scipy's Welch t-test; the planted effects are found (size moves
    accuracy, not coupling; noise lowers both)."""
    from blockcoupling.studies.generalization.analysis import (
        cell_table,
        control_contrast,
        factor_effects,
    )

    runs = _grid_table(seed=5)
    cells = cell_table(runs, ["coupling_vs_rotated"])
    f = factor_effects(cells, "coupling_vs_rotated")
    clean = cells[cells["label_noise"] == 0.0]
    ref = stats.linregress(np.log(clean["n_train"]), clean["coupling_vs_rotated_mean"])
    s1 = f["S1"]["coupling"]
    assert s1["slope"] == pytest.approx(ref.slope) and s1["slope_stderr"] == pytest.approx(
        ref.stderr)
    assert s1["p"] == pytest.approx(stats.t.sf(ref.slope / ref.stderr, len(clean) - 2))
    X = np.column_stack([np.ones(len(cells)), cells["label_noise"],
                         *((cells["n_train"] == n).astype(float) for n in (199, 438, 967))])
    beta, res, *_ = np.linalg.lstsq(X, cells["coupling_vs_rotated_mean"], rcond=None)
    dof = len(cells) - X.shape[1]
    se = math.sqrt(res[0] / dof * np.linalg.inv(X.T @ X)[1, 1])
    n1 = f["N1"]["coupling"]
    assert n1["slope"] == pytest.approx(beta[1]) and n1["slope_stderr"] == pytest.approx(se)
    assert n1["p"] == pytest.approx(stats.t.cdf(beta[1] / se, dof)) and n1["df"] == dof
    assert f["S2"]["accuracy"]["p"] < 0.01 and n1["p"] < 0.01
    assert f["N1"]["accuracy"]["slope"] < 0 and "accuracy_beyond_factors" in f
    assert set(f["size_by_noise"]) == {"0", "0.2", "0.4"}
    design = runs[(runs["n_train"] == 967) & (runs["label_noise"] == 0.0)]
    control = design.assign(coupling_vs_rotated=design["coupling_vs_rotated"] - 0.04)
    pc = control_contrast(control, design, "coupling_vs_rotated", "greater")
    ref = stats.ttest_ind(design["coupling_vs_rotated"], control["coupling_vs_rotated"],
                          equal_var=False, alternative="greater")
    c = pc["coupling_vs_rotated"]
    assert c["p"] == pytest.approx(ref.pvalue) and c["difference"] == pytest.approx(0.04)
    assert pc["test_accuracy"]["p"] == pytest.approx(1.0)


def test_design_powers_are_stated_for_every_test() -> None:
    """Every pre-registered test beside H1 has a simulated power at a stated effect; the full
    design's within test is powered at the planned slope (the number the docs quote)."""
    from blockcoupling.studies.generalization.design import (
        HYPOTHESES,
        design_powers,
        full_spec,
        power_effects,
    )

    p = design_powers(full_spec(), reps=300)
    assert set(p) == set(power_effects()) and {"W1", "S1", "S2", "N1", "PC"} <= set(HYPOTHESES)
    assert all(0.0 <= r["power"] <= 1.0 and r["effect"] and r["model"] for r in p.values())
    assert p["W1"]["power"] > 0.7 and p["PC"]["power"] > 0.95


def test_each_seed_draws_its_own_training_subset() -> None:
    """subset_per_seed: two seeds at one size share only what chance gives (about n^2/N
    images), one seed's sizes are drawn independently, and without it the subsets are the
    nested prefixes every run shares."""
    from blockcoupling.studies.vit.data import subset_indices

    a, b = subset_indices(1437, 300, 0), subset_indices(1437, 300, 1)
    big = subset_indices(1437, 600, 0)
    assert a is not None and b is not None and big is not None
    shared = len(set(a.tolist()) & set(b.tolist()))
    assert shared < 3 * 300 * 300 / 1437
    assert len(set(a.tolist()) & set(big.tolist())) < 3 * 300 * 600 / 1437
    fixed_small, fixed_big = subset_indices(1437, 300), subset_indices(1437, 600)
    assert fixed_small is not None and fixed_big is not None
    assert fixed_small.tolist() == fixed_big[:300].tolist()
    assert subset_indices(1437, 2000, 3) is None
    assert subset_indices(1437, 300, 0).tolist() == a.tolist()  # a pure function of its seed


# ---------------------------------------------------------------------------- the design
@pytest.mark.parametrize("data, message", [
    ({"train_sizes": [90, 180, 360, 720, 1437]},
     "15 cells .* power 0.63 .* below the stated 0.8; give at least 23 cells"),
    ({"seeds": [0, 1]}, "2 seed\\(s\\) per cell; the design needs at least 3"),
    ({"train_sizes": [90, 180]}, "at least 3 training-set sizes"),
    ({"train_sizes": [90, 180, 5000]}, "exceeds the digits training split"),
    ({"train": {"seed": 1}}, "train.seed is set by the design"),
    ({"train": {"steps": None}}, "train.steps"),
    ({"variants": ["coupling"]}, "not a chance-corrected variant"),
    ({"seeds": [0, 0, 1]}, "repeats a value"),
    ({"train_sizes": [90, 180, 360], "label_noises": [0.0], "power": 0.0}, "need at least 4"),
    ({"bogus": 1}, "unknown key 'bogus'"),
    ({"control_drop_path": 0.1}, "control_drop_path 0.1 is the design's own"),
])
def test_bad_designs_are_one_line(data: dict, message: str) -> None:
    with pytest.raises(BlockCouplingError, match=message) as err:
        parse_spec(data)
    assert "\n" not in str(err.value)


def test_cli_refuses_an_underpowered_design_before_any_training(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    spec = tmp_path / "s.yaml"
    spec.write_text("train_sizes: [90, 180, 360, 720, 1437]\nlabel_noises: [0, 0.2, 0.4]\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["study", "generalization", "--out", str(out), "--spec",
                                   str(spec)])
    assert res.exit_code == 2 and res.output.startswith("error:")  # a design refused: usage
    assert len(res.output.strip().splitlines()) == 1 and "power 0.63" in res.output
    assert not out.exists()
    res = CliRunner().invoke(app, ["study", "generalization", "--out", str(out), "--quick",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "21 training runs" in res.output and "power of H1" in res.output  # 18 + 3 control
    assert "W1 " in res.output and "power by simulation" in res.output
    assert not out.exists()


# ---------------------------------------------------------------------------- end to end
def _without_costs(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("seconds",)}


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.ConvergenceWarning")
def test_quick_study_end_to_end(tmp_path: Path) -> None:
    """``--quick`` (18 tiny runs): study.json's tests equal scipy/statsmodels recomputed from
    its own runs, the cells are seed-level, the runs are show-able, a rerun reuses every run
    and gives the same study.json."""
    import statsmodels.formula.api as smf
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    out = tmp_path / "study"
    res = CliRunner().invoke(app, ["study", "generalization", "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "[study] run 18 of 18 done" in res.output and "power 0.28 at r = 0.5" in res.output
    doc = json.loads((out / "study.json").read_text())
    assert doc["design"]["cells"] == 6 and len(doc["runs"]) == 18
    assert doc["design"]["power"]["H1"] == pytest.approx(correlation_power(6, 0.5))
    runs = pd.DataFrame(doc["runs"])
    v = doc["tests"]["variant"]
    cells = runs.groupby("cell", sort=False)[["test_accuracy", v]].mean()
    ref = stats.pearsonr(cells["test_accuracy"], cells[v], alternative="greater")
    h = doc["tests"]["H1_E1"]
    assert h["r"] == pytest.approx(ref.statistic) and h["p_greater"] == pytest.approx(ref.pvalue)
    ci = stats.pearsonr(cells["test_accuracy"], cells[v]).confidence_interval(0.90)
    assert h["ci_tost"] == pytest.approx([ci.low, ci.high])
    fit = smf.mixedlm(f"{v} ~ test_accuracy", runs, groups=runs["cell"]).fit(reml=True)
    assert doc["tests"]["H1b"]["slope"] == pytest.approx(fit.params["test_accuracy"])
    cm = pd.DataFrame(doc["cells"])
    for fixed in ("label_noise", "n_train"):
        ref = smf.ols(f"{v}_mean ~ test_accuracy_mean + C({fixed})", cm).fit()
        ex = doc["tests"]["exploratory"][fixed]
        assert ex["slope"] == pytest.approx(ref.params["test_accuracy_mean"])
        assert ex["p"] == pytest.approx(ref.pvalues["test_accuracy_mean"])
    for c in doc["positive_control"]["variants"][v]["cells"]:
        x = runs[runs["cell"] == c["cell"]][v]
        assert c["p"] == pytest.approx(stats.ttest_1samp(x, 0.0, alternative="greater").pvalue)
    cell = pd.DataFrame(doc["cells"]).set_index("cell")
    for name, g in runs.groupby("cell"):
        assert cell.loc[name, f"{v}_se"] == pytest.approx(stats.sem(g[v]))
        assert cell.loc[name, "n_seeds"] == 3
    # the runs at the end are the final measurements' statistics, show-able
    final = pd.DataFrame(doc["final"] or doc["runs"])
    import blockcoupling as bc

    row = final.iloc[0]
    st = bc.open_run(row["run_dir"]).coupling_statistic(n_boot=0).set_index("variant")
    assert st.loc[v, "mean"] == pytest.approx(row[v]) and st.loc[v, "se"] == pytest.approx(
        row[f"{v}_se"])
    shown = CliRunner().invoke(app, ["show", row["run_dir"]])
    assert shown.exit_code == 0 and "first measured token" in shown.output
    assert (out / "study.html").read_text().count("<figure") >= 1
    assert len(pd.read_csv(out / "cells.csv")) == 6
    status = CliRunner().invoke(app, ["sweep-status", str(out / "grid")])
    assert "18 units: 18 done" in status.output
    # a rerun trains nothing and states the same result
    again = CliRunner().invoke(app, ["study", "generalization", "--quick", "--out", str(out)])
    assert again.exit_code == 0 and "18 of 18 runs were already trained" in again.output
    assert _without_costs(json.loads((out / "study.json").read_text())) == _without_costs(doc)


@pytest.mark.slow
def test_killed_study_resumes_to_the_same_result(tmp_path: Path) -> None:
    """Kill the quick study while it trains (after a few runs), run it again: the same
    study.json as an uninterrupted run (every run trains with one thread, a pure function of
    its config)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "blockcoupling", "-q", "study", "generalization", "--quick",
           "--out"]
    straight = tmp_path / "straight"
    subprocess.run([*cmd, str(straight)], env=env, check=True, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        done = list((killed / "grid" / "status").glob("*.json")) if (
            killed / "grid" / "status").is_dir() else []
        if sum('"done"' in p.read_text() for p in done) >= 5:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "study.json").exists()
    subprocess.run([*cmd, str(killed)], env=env, check=True, capture_output=True)
    a = json.loads((straight / "study.json").read_text())
    b = json.loads((killed / "study.json").read_text())

    def strip(doc: dict) -> dict:  # paths differ by the folder; costs by the session
        text = json.dumps(_without_costs(doc)).replace(str(straight), "OUT").replace(
            str(killed), "OUT")
        return json.loads(text)

    assert strip(a) == strip(b)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.ConvergenceWarning")
def test_quick_study_on_ray_equals_this_process(tmp_path: Path, ray_cluster: str) -> None:
    """One Ray task per run (one thread each) gives the study that one process gives."""
    from blockcoupling.studies.generalization import run_study

    local = run_study(tmp_path / "local", quick=True, progress=False).to_dict()
    ray = run_study(tmp_path / "ray", quick=True, executor="ray", address=ray_cluster,
                    progress=False).to_dict()

    def strip(doc: dict, root: Path) -> dict:
        return json.loads(json.dumps(_without_costs(doc), default=str).replace(str(root), "OUT"))

    assert strip(local, tmp_path / "local") == strip(ray, tmp_path / "ray")


def test_quick_spec_is_the_documented_one() -> None:
    q = quick_spec()
    assert (q.n_cells, q.n_runs, q.train.steps) == (6, 18, 96)
    assert q.power <= correlation_power(q.n_cells, q.bound, q.alpha)


def test_runs_measured_without_a_variant_of_the_spec_are_one_line(tmp_path: Path) -> None:
    """A grid trained before a variant existed cannot give it: one line saying what to do."""
    from blockcoupling.studies.generalization.run import final_table
    from blockcoupling.studies.vit.grid import run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig

    base = VitTrainConfig(epochs=1, monitor_every=0, preset="tiny", hidden_size=16, depth=2,
                          heads=2, image_size=8, train_limit=32, test_limit=16, batch_size=32,
                          k=2, final_images=2)
    runs = run_grid(base, tmp_path / "g", drop_paths=(0.1,), weight_decays=(0.05,),
                    executor="local", progress=False)
    runs["n_train"], runs["label_noise"] = 32, 0.0
    spec = quick_spec()
    table = final_table(tmp_path / "g", runs, spec)
    assert table["coupling_vs_null"].notna().all()
    # issue 40: a run the collection measured nothing for is one line (was a KeyError)
    extra = pd.concat([runs, runs.assign(name="never-measured")], ignore_index=True)
    with pytest.raises(BlockCouplingError, match=r"only the grid's runs has \('never-measured',"):
        final_table(tmp_path / "g", extra, spec)
    object.__setattr__(spec, "variants", ("coupling_vs_null", "coupling_vs_nothing"))
    with pytest.raises(BlockCouplingError, match="measured without coupling_vs_nothing"):
        final_table(tmp_path / "g", runs, spec)


def _shipped() -> tuple[Path, dict, pd.DataFrame, pd.DataFrame]:
    root = Path(__file__).resolve().parents[2]
    shipped = root / "docs" / "results" / "generalization"
    return (root, json.loads((shipped / "study.json").read_text()),
            pd.read_csv(shipped / "runs.csv"), pd.read_csv(shipped / "control.csv"))


def test_the_shipped_full_run_is_what_the_docs_quote() -> None:
    """The full design's rerun of 2026-11-29, shipped in docs/results/generalization: its tests
    re-derive from the shipped runs.csv and control.csv with today's code (no number drifts
    from what was published), and the how-to page quotes the study's own statement."""
    from blockcoupling.studies.generalization import full_spec
    root, study, runs, control = _shipped()
    spec = full_spec()
    assert study["spec"]["train_sizes"] == list(spec.train_sizes)
    assert len(runs) == spec.n_runs and len(control) == len(spec.seeds)
    a = analyse(runs, spec.variants, alpha=spec.alpha, bound=spec.bound, control=control)
    assert a["point"] == "final"
    h, s = a["tests"]["H1_E1"], study["tests"]["H1_E1"]
    for key in ("r", "p_greater", "slope", "p_tost", "power"):
        assert h[key] == pytest.approx(s[key], rel=1e-9, abs=1e-12), key
    assert a["tests"]["H1b"]["slope"] == pytest.approx(study["tests"]["H1b"]["slope"], rel=1e-6)
    for key in ("slope", "slope_stderr", "p_greater"):
        assert a["tests"]["W1_EW"]["within"][key] == pytest.approx(
            study["tests"]["W1_EW"]["within"][key], rel=1e-6), key
    for name in ("S1", "S2", "N1"):
        assert a["tests"]["factors"][name]["coupling"]["slope"] == pytest.approx(
            study["tests"]["factors"][name]["coupling"]["slope"], rel=1e-9), name
    assert a["tests"]["PC"]["coupling_vs_rotated"]["p"] == pytest.approx(
        study["tests"]["PC"]["coupling_vs_rotated"]["p"], rel=1e-9)
    page = " ".join((root / "docs" / "how-to" / "generalization.md").read_text().split())
    for line in study["statement"]:
        assert " ".join(line.split()) in page, line


def test_the_readme_and_how_to_claims_re_derive_from_the_shipped_tables() -> None:
    """Every number the README's bullet and the how-to's reading quote, computed from the
    shipped runs.csv and control.csv with scipy and statsmodels directly (not the study's
    code): the assay's control (Welch), the within-cell slope (MixedLM of the Mundlak split),
    the across-cell r, the size and noise slopes (OLS with the other factor's levels as fixed
    effects), accuracy beyond both factors, the fit to the noisy labels; the powers are the
    study's own (stated, simulated before the data)."""
    import statsmodels.formula.api as smf

    root, study, runs, control = _shipped()
    v = "coupling_vs_rotated"
    design = runs[(runs["n_train"] == runs["n_train"].max()) & (runs["label_noise"] == 0.0)]
    pc = stats.ttest_ind(design[v], control[v], equal_var=False, alternative="greater")
    pc_diff = design[v].mean() - control[v].mean()
    r = runs.assign(acc_mean=runs.groupby("cell")["test_accuracy"].transform("mean"))
    r = r.assign(acc_within=r["test_accuracy"] - r["acc_mean"])
    fit = smf.mixedlm(f"{v} ~ acc_within + acc_mean", r, groups=r["cell"]).fit(reml=True)
    w_slope, w_se = fit.params["acc_within"], fit.bse["acc_within"]
    w_p = stats.norm.sf(w_slope / w_se)
    cells = runs.groupby("cell").agg(acc=("test_accuracy", "mean"), c=(v, "mean"),
                                     tr=("train_accuracy", "mean"), n=("n_train", "first"),
                                     noise=("label_noise", "first")).reset_index()
    cells["ln_n"] = np.log(cells["n"])
    across = stats.pearsonr(cells["acc"], cells["c"], alternative="greater")
    s2c = smf.ols("c ~ ln_n + C(noise)", cells).fit()
    s2a = smf.ols("acc ~ ln_n + C(noise)", cells).fit()
    n1c = smf.ols("c ~ noise + C(n)", cells).fit()
    beyond = smf.ols("c ~ acc + C(n) + C(noise)", cells).fit()
    fit_noisy = stats.pearsonr(cells["tr"], cells["c"]).statistic
    sim, exact = study["design"]["power_simulated"], study["design"]["power"]
    readme = " ".join((root / "README.md").read_text().split())
    how_to = " ".join((root / "docs" / "how-to" / "generalization.md").read_text().split())
    quoted = {
        readme: [f"slope {w_slope:+.3f} ± {w_se:.3f} per unit",
                 f"p = {w_p:.4f}, power {sim['W1']['power']:.2f};",
                 f"cells r = {across.statistic:+.2f}",
                 f"power {exact['H1']:.2f} at r = 0.5",
                 f"power {sim['S2']['power']:.2f} at the slope tracking predicts",
                 f"one-sided p = {across.pvalue:.1e}".replace("e-03", "e-3"),
                 f"accuracy ({s2a.params['ln_n']:+.2f} per ln images, p = "
                 f"{s2a.pvalues['ln_n']:.1e}".replace("e-06", "e-6"),
                 f"not coupling ({s2c.params['ln_n']:+.4f} ± {s2c.bse['ln_n']:.4f}, p = "
                 f"{stats.t.sf(s2c.tvalues['ln_n'], s2c.df_resid):.2f}"],
        how_to: [f"difference {pc_diff:+.4f}", f"one-sided p = {pc.pvalue:.2g}",
                 f"(r = {across.statistic:+.2f})",
                 f"{s2a.params['ln_n']:.2f} per ln(images)",
                 f"(+{s2c.params['ln_n']:.4f} ± {s2c.bse['ln_n']:.4f} per ln(images)",
                 f"accuracy adds nothing (p = {beyond.pvalues['acc']:.2f})",
                 f"(r = {fit_noisy:+.2f})"],
    }
    for text, pieces in quoted.items():
        for piece in pieces:
            assert piece in text, piece
    assert n1c.params["noise"] < 0 and stats.t.cdf(n1c.tvalues["noise"], n1c.df_resid) < 0.05
    assert s2a.params["ln_n"] > 0  # the size manipulation moves accuracy (its check)
    ws = study["tests"]["W1_EW"]["within"]
    assert ws["slope"] == pytest.approx(w_slope, rel=1e-4)
    assert ws["p_greater"] == pytest.approx(w_p, rel=1e-3)
