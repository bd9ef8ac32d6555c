"""Power by simulation of the studies' pre-registered tests: pure numpy/scipy, seeded.

Each function draws data sets from a stated model (the planning values of a design), applies
the very test the analysis applies (in a fast numpy form whose equality with statsmodels /
scipy is tested: ``tests/studies/test_power.py``) and returns the rejection rate with its
Monte Carlo standard error: ``{"power", "mc_se", "reps", "model"}``.

- `ols_slope_test`: the OLS t-test of one coefficient (one- or two-sided), with fixed
  effects as extra columns: the test of the slope of a factor over cell means, and of the
  within-cell slope (cell dummies);
- `slope_power`: power of that test for a fixed design and a stated slope and residual sd;
- `within_power`: power of the within-cell (seed-to-seed) slope test (the Mundlak split's
  within coefficient equals the fixed-effects slope in a balanced design);
- `welch_power`: power of Welch's two-sample t-test (seeds as units);
- `paired_power`, `paired_tost_power`: the paired t-test and its TOST (`paired_tost`)
  over seeds (arms of one seed share its initialisation and batches);
- `tost_slope_power`: power of the two one-sided tests (equivalence within +-bound) of a
  slope, at a true slope (default 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from blockcoupling.errors import BlockCouplingError

__all__ = ["ols_slope_test", "paired_power", "paired_tost", "paired_tost_power",
           "rejection_rate", "slope_power", "tost_slope_power", "welch_power", "within_power"]

ALTERNATIVES = ("greater", "less", "two-sided")


def rejection_rate(draw: Callable[[np.random.Generator], bool], reps: int, seed: int,
                   model: str) -> dict[str, Any]:
    """The share of ``reps`` seeded draws in which ``draw`` (a data set and its test) rejects,
    with its Monte Carlo se."""
    if reps < 1:
        raise BlockCouplingError("reps must be at least 1")
    rng = np.random.default_rng(seed)
    hits = sum(bool(draw(rng)) for _ in range(reps))
    p = hits / reps
    return {"power": p, "mc_se": math.sqrt(p * (1 - p) / reps), "reps": reps, "seed": seed,
            "model": model}


def ols_slope_test(X: np.ndarray, y: np.ndarray, column: int = 1,
                   alternative: str = "two-sided") -> tuple[float, float, float]:
    """(coefficient, se, p) of column ``column`` of the design ``X`` (n, p; it holds the
    intercept or the dummies itself) in the OLS fit of ``y``: the t-test with n - rank df
    (what ``statsmodels.OLS(...).fit()`` reports; one-sided from the same t)."""
    if alternative not in ALTERNATIVES:
        raise BlockCouplingError(f"alternative {alternative!r}: choose {', '.join(ALTERNATIVES)}")
    beta, _, rank, _ = np.linalg.lstsq(X, y, rcond=None)
    df = len(y) - rank
    if df < 1:
        raise BlockCouplingError(f"{len(y)} points for {rank} coefficients: no residual df")
    resid = y - X @ beta
    cov = np.linalg.pinv(X.T @ X) * float(resid @ resid) / df
    se = math.sqrt(max(cov[column, column], 0.0))
    t = beta[column] / se if se > 0 else math.nan
    p = {"greater": stats.t.sf(t, df), "less": stats.t.cdf(t, df),
         "two-sided": 2 * stats.t.sf(abs(t), df)}[alternative]
    return float(beta[column]), se, float(p)


def slope_power(X: np.ndarray, slope: float, resid_sd: float, *, column: int = 1,
                alpha: float = 0.05, alternative: str = "greater", reps: int = 4000,
                seed: int = 0) -> dict[str, Any]:
    """Power of `ols_slope_test` on the fixed design ``X`` when the coefficient of
    ``column`` is ``slope`` (the others 0) and the residuals are N(0, resid_sd^2)."""
    X = np.asarray(X, float)
    mean = X[:, column] * slope

    def draw(rng: np.random.Generator) -> bool:
        y = mean + rng.normal(0.0, resid_sd, len(mean))
        return ols_slope_test(X, y, column, alternative)[2] < alpha

    return rejection_rate(draw, reps, seed, f"y = {slope:g} x + N(0, {resid_sd:g}^2) on the "
                                            f"design's {len(mean)} points, OLS t-test "
                                            f"({alternative}) at alpha {alpha:g}")


def _within_design(groups: int, per_group: int, x_sd: float, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
    g = np.repeat(np.arange(groups), per_group)
    x = rng.normal(0.0, x_sd, len(g)) + rng.normal(0.0, 1.0, groups)[g]  # cell levels vary
    X = np.column_stack([x, (g[:, None] == np.arange(groups)).astype(float)])
    return X, g


def within_power(groups: int, per_group: int, slope: float, x_sd: float, resid_sd: float, *,
                 alpha: float = 0.05, alternative: str = "greater", reps: int = 4000,
                 seed: int = 0) -> dict[str, Any]:
    """Power of the within-group slope test: ``groups`` cells of ``per_group`` runs, x
    varying within a cell with sd ``x_sd`` around a level of its own, y = slope x (within)
    + a cell level + N(0, resid_sd^2); the fixed-effects OLS t-test (cell dummies)."""
    def draw(rng: np.random.Generator) -> bool:
        X, g = _within_design(groups, per_group, x_sd, rng)
        y = slope * X[:, 0] + rng.normal(0.0, 1.0, groups)[g] + rng.normal(0.0, resid_sd, len(g))
        return ols_slope_test(X, y, 0, alternative)[2] < alpha

    return rejection_rate(draw, reps, seed, (
        f"{groups} cells x {per_group} runs: x within-cell sd {x_sd:g}, y = {slope:g} x + cell "
        f"level + N(0, {resid_sd:g}^2); fixed-effects OLS t-test ({alternative}) at alpha "
        f"{alpha:g}"))


def tost_slope_power(groups: int, per_group: int, bound: float, x_sd: float, resid_sd: float,
                     *, slope: float = 0.0, alpha: float = 0.05, reps: int = 4000,
                     seed: int = 0) -> dict[str, Any]:
    """Power of the equivalence test (TOST, +-``bound``) of the within-group slope, at a
    true slope ``slope`` (the model of `within_power`): both one-sided t-tests of the
    fixed-effects slope, against -bound and +bound, at ``alpha``."""
    def draw(rng: np.random.Generator) -> bool:
        X, g = _within_design(groups, per_group, x_sd, rng)
        y = slope * X[:, 0] + rng.normal(0.0, 1.0, groups)[g] + rng.normal(0.0, resid_sd, len(g))
        b, se, _ = ols_slope_test(X, y, 0)
        df = len(y) - np.linalg.matrix_rank(X)
        return max(stats.t.sf((b + bound) / se, df), stats.t.cdf((b - bound) / se, df)) < alpha

    return rejection_rate(draw, reps, seed, (
        f"TOST +-{bound:g} of the within-cell slope at a true slope {slope:g} ({groups} cells "
        f"x {per_group} runs, x sd {x_sd:g}, residual sd {resid_sd:g}), alpha {alpha:g}"))


def welch_power(n1: int, n2: int, difference: float, sd: float, *, alpha: float = 0.05,
                alternative: str = "greater", reps: int = 4000, seed: int = 0
                ) -> dict[str, Any]:
    """Power of Welch's t-test (``scipy.stats.ttest_ind(equal_var=False)``) of arm 2 minus
    arm 1 when the difference is ``difference`` and both arms have sd ``sd``."""
    def draw(rng: np.random.Generator) -> bool:
        a, b = rng.normal(0.0, sd, n1), rng.normal(difference, sd, n2)
        return stats.ttest_ind(b, a, equal_var=False, alternative=alternative).pvalue < alpha

    return rejection_rate(draw, reps, seed, (
        f"{n1} vs {n2} runs, difference {difference:g}, sd {sd:g} per run; Welch t-test "
        f"({alternative}) at alpha {alpha:g}"))


def paired_power(n: int, difference: float, sd: float, *, alpha: float = 0.05,
                 alternative: str = "greater", reps: int = 4000, seed: int = 0
                 ) -> dict[str, Any]:
    """Power of the paired t-test (``scipy.stats.ttest_rel``, i.e. the one-sample t-test of
    the ``n`` differences) when the differences are N(``difference``, ``sd``^2)."""
    def draw(rng: np.random.Generator) -> bool:
        d = rng.normal(difference, sd, n)
        return stats.ttest_1samp(d, 0.0, alternative=alternative).pvalue < alpha

    return rejection_rate(draw, reps, seed, (
        f"{n} paired differences N({difference:g}, {sd:g}^2); paired t-test ({alternative}) "
        f"at alpha {alpha:g}"))


def paired_tost(d: np.ndarray, bound: float) -> float:
    """The TOST p of paired differences ``d`` against +-``bound``: the larger of the two
    one-sided one-sample t-tests (mean > -bound, mean < +bound)."""
    lo = stats.ttest_1samp(d, -bound, alternative="greater").pvalue
    hi = stats.ttest_1samp(d, bound, alternative="less").pvalue
    return float(max(lo, hi))


def paired_tost_power(n: int, bound: float, sd: float, *, difference: float = 0.0,
                      alpha: float = 0.05, reps: int = 4000, seed: int = 0) -> dict[str, Any]:
    """Power of `paired_tost` at ``alpha`` when the ``n`` differences are
    N(``difference``, ``sd``^2)."""
    def draw(rng: np.random.Generator) -> bool:
        return paired_tost(rng.normal(difference, sd, n), bound) < alpha

    return rejection_rate(draw, reps, seed, (
        f"TOST +-{bound:g} of {n} paired differences N({difference:g}, {sd:g}^2) at alpha "
        f"{alpha:g}"))
