"""``studies.power``: each simulated test equals its scipy/statsmodels form, and each
simulated power equals the exact power where one exists (noncentral t), within its Monte
Carlo error."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import power as pw


def test_ols_slope_test_equals_statsmodels() -> None:
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.normal(size=30), "g": np.repeat(np.arange(6), 5)})
    df["y"] = 0.3 * df["x"] + rng.normal(size=30) + df["g"] * 0.2
    fit = smf.ols("y ~ x + C(g)", df).fit()
    X = np.column_stack([df["x"], (df["g"].to_numpy()[:, None] == np.arange(6)).astype(float)])
    b, se, p = pw.ols_slope_test(X, df["y"].to_numpy(), 0)
    assert b == pytest.approx(fit.params["x"]) and se == pytest.approx(fit.bse["x"])
    assert p == pytest.approx(fit.pvalues["x"])
    _, _, p1 = pw.ols_slope_test(X, df["y"].to_numpy(), 0, "greater")
    assert p1 == pytest.approx(stats.t.sf(fit.tvalues["x"], fit.df_resid))
    with pytest.raises(BlockCouplingError, match="alternative"):
        pw.ols_slope_test(X, df["y"].to_numpy(), 0, "bigger")


def _nct_power(df: int, delta: float, alpha: float) -> float:
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, delta))


def test_slope_and_paired_power_equal_the_noncentral_t() -> None:
    """Exact power of the one-sided t-tests (noncentral t) against the simulated rejection
    rates (1,500 draws: within 4 Monte Carlo se)."""
    X = np.column_stack([np.ones(8), np.log(np.geomspace(90, 1437, 8))])
    sim = pw.slope_power(X, 0.006, 0.008, reps=1500, seed=1)
    sxx = float(((X[:, 1] - X[:, 1].mean()) ** 2).sum())
    exact = _nct_power(6, 0.006 / (0.008 / math.sqrt(sxx)), 0.05)
    assert sim["power"] == pytest.approx(exact, abs=4 * sim["mc_se"] + 1e-3)
    sim = pw.paired_power(8, 0.04, 0.038, reps=1500, seed=2)
    exact = _nct_power(7, 0.04 / (0.038 / math.sqrt(8)), 0.05)
    assert sim["power"] == pytest.approx(exact, abs=4 * sim["mc_se"] + 1e-3)
    low = pw.paired_power(8, -0.04, 0.038, alternative="less", reps=1500, seed=2)
    assert low["power"] == pytest.approx(sim["power"], abs=4 * sim["mc_se"] + 1e-3)
    size = pw.paired_power(8, 0.0, 0.038, reps=1500, seed=3)
    assert size["power"] == pytest.approx(0.05, abs=4 * size["mc_se"])


@pytest.mark.slow  # a few thousand simulated data sets
def test_within_power_is_the_fixed_effects_test_of_the_mundlak_within_slope() -> None:
    """The within-group test simulated is the fixed-effects slope, which equals the Mundlak
    split's within coefficient (statsmodels MixedLM) in a balanced design; its power equals
    the exact noncentral t of its df when the within sd of x is known."""
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(4)
    X, g = pw._within_design(8, 3, 0.05, rng)
    y = 0.05 * X[:, 0] + rng.normal(size=8)[g] + rng.normal(0, 0.007, 24)
    df = pd.DataFrame({"x": X[:, 0], "y": y, "g": g})
    df["xb"] = df.groupby("g")["x"].transform("mean")
    df["xw"] = df["x"] - df["xb"]
    mundlak = smf.mixedlm("y ~ xw + xb", df, groups=df["g"]).fit(reml=True)
    b, _, _ = pw.ols_slope_test(X, y, 0)
    assert mundlak.params["xw"] == pytest.approx(b, rel=1e-6)
    sim = pw.within_power(24, 3, 0.057, 0.046, 0.0065, reps=3000, seed=5)
    assert 0.7 < sim["power"] < 0.95 and sim["reps"] == 3000
    null = pw.within_power(24, 3, 0.0, 0.046, 0.0065, reps=3000, seed=6)
    assert null["power"] == pytest.approx(0.05, abs=4 * null["mc_se"])


@pytest.mark.slow
def test_welch_and_tost_power() -> None:
    sim = pw.welch_power(3, 3, 0.047, 0.007, reps=2000, seed=0)
    assert sim["power"] > 0.99
    null = pw.welch_power(5, 5, 0.0, 1.0, reps=4000, seed=1)
    assert null["power"] == pytest.approx(0.05, abs=4 * null["mc_se"])
    d = np.array([0.01, -0.02, 0.03, 0.0, 0.015])
    lo = stats.ttest_1samp(d, -0.04, alternative="greater").pvalue
    hi = stats.ttest_1samp(d, 0.04, alternative="less").pvalue
    assert pw.paired_tost(d, 0.04) == pytest.approx(max(lo, hi))
    at0 = pw.paired_tost_power(8, 0.04, 0.038, reps=3000, seed=2)
    at_bound = pw.paired_tost_power(8, 0.04, 0.038, difference=0.04, reps=3000, seed=3)
    assert at0["power"] > at_bound["power"] and at_bound["power"] <= 0.05 + 4 * at_bound["mc_se"]
    tost = pw.tost_slope_power(24, 3, 0.057, 0.046, 0.007, reps=2000, seed=4)
    edge = pw.tost_slope_power(24, 3, 0.057, 0.046, 0.007, slope=0.057, reps=2000, seed=4)
    assert tost["power"] > edge["power"] and edge["power"] <= 0.05 + 4 * edge["mc_se"]
