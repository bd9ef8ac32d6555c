"""The statistics of ``study intervention``: pure functions over the runs' table, no I/O.

The table has one row per training run with its ``strength`` (of the coupling term),
``seed``, ``test_accuracy``, the reached coupling of the design's variant (and the other
measured variants) with its within-model se, and the other trajectory metrics. The arms of one
seed share its initialisation and batches, so every comparison of arms is paired by seed
(the one-sample t-test of the per-seed differences, what ``scipy.stats.ttest_rel`` gives).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
from scipy import stats

from blockcoupling.engine.statistic import seed_level
from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.joins import join_on
from blockcoupling.studies.power import paired_tost

__all__ = ["analyse", "arm_table", "manipulation_check", "paired_difference"]

#: what else the term changes, reported per arm beside the coupling and the accuracy
SIDE_METRICS = ("train_accuracy", "train_ce", "train_loss", "test_loss", "weight_norm",
                "alignment", "coupling_term", "lss", "expodistance", "equidistance_cv")


def arm_table(runs: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """One row per strength: ``n_seeds`` and for each column its seed-level ``_mean, _sd,
    _se, _ci_low, _ci_high`` (``engine.statistic.seed_level``: the runs as the unit)."""
    out = runs.groupby("strength", sort=True).agg(n_seeds=("seed", "size")).reset_index()
    keep = ("mean", "sd", "se", "ci_low", "ci_high")
    for c in columns:
        if c not in runs or runs[c].isna().all():
            continue
        lvl = seed_level(runs, by=["strength"], value=c)
        arm = lvl[["strength", *keep]].rename(columns={k: f"{c}_{k}" for k in keep})
        out = join_on(out, arm, ["strength"], names=("the arms", f"{c}'s seed level"),
                      what="each arm once")
    return out


def paired_difference(runs: pd.DataFrame, high: float, low: float, column: str,
                      alternative: str = "two-sided", bound: float | None = None
                      ) -> dict[str, Any]:
    """``column`` at strength ``high`` minus at ``low``, paired by seed (seeds present in
    both): the mean difference, its se, a 95 % t interval, the paired t-test's p for
    ``alternative`` and with ``bound`` the TOST p against +-bound."""
    wide = runs.pivot_table(index="seed", columns="strength", values=column, aggfunc="first")
    if high not in wide or low not in wide:
        return {"skipped": f"no runs at strength {high:g} or {low:g}"}
    d = (wide[high] - wide[low]).dropna().to_numpy(float)
    if len(d) < 2:
        return {"skipped": f"{len(d)} seed(s) with both arms"}
    t = stats.ttest_1samp(d, 0.0, alternative=alternative)
    se = float(d.std(ddof=1) / math.sqrt(len(d)))
    q = float(stats.t.ppf(0.975, len(d) - 1))
    out = {"high": high, "low": low, "column": column, "n_seeds": int(len(d)),
           "difference": float(d.mean()), "se": se, "ci95": [float(d.mean()) - q * se,
                                                             float(d.mean()) + q * se],
           "t": float(t.statistic), "df": int(len(d) - 1), "p": float(t.pvalue),
           "alternative": alternative, "differences": d.tolist()}
    if bound is not None:
        out["bound"] = bound
        out["p_tost"] = paired_tost(d, bound)
    return out


def manipulation_check(runs: pd.DataFrame, variant: str, alpha: float) -> dict[str, Any]:
    """H1: every adjacent pair of strengths, the paired one-sided t-test of the higher arm's
    ``variant`` minus the lower's (> 0); ``monotone`` when every pair rejects at ``alpha``
    (intersection-union); Spearman's rho of strength and ``variant`` over all runs
    (one-sided, greater) beside it."""
    arms = sorted(runs["strength"].unique())
    pairs = [paired_difference(runs, float(hi), float(lo), variant, "greater")
             for lo, hi in zip(arms[:-1], arms[1:], strict=True)]
    rho = stats.spearmanr(runs["strength"], runs[variant], alternative="greater")
    ok = all("p" in p and p["p"] < alpha for p in pairs)
    return {"pairs": pairs, "monotone": bool(ok), "largest_p": float(max(
        (p.get("p", math.nan) for p in pairs), default=math.nan)),
            "spearman": {"rho": float(rho.statistic), "p_greater": float(rho.pvalue),
                         "n": int(len(runs))},
            "rule": f"every adjacent pair: paired one-sided t-test p < {alpha:g} "
                    "(intersection-union test)"}


def dose_response(runs: pd.DataFrame, variant: str) -> dict[str, Any]:
    """Exploratory: the slope of test accuracy on the coupling reached, within seeds (OLS
    with seed fixed effects over every run; statsmodels), and the surrogate's agreement
    with the engine across runs (Pearson and Spearman r of ``alignment`` and ``variant``)."""
    import statsmodels.formula.api as smf

    out: dict[str, Any] = {}
    df = runs[["seed", "test_accuracy", variant]].dropna().rename(columns={variant: "c"})
    if len(df) - df["seed"].nunique() - 1 >= 1 and df["c"].nunique() > 1:
        fit = smf.ols("test_accuracy ~ c + C(seed)", df).fit()
        out["accuracy_on_coupling"] = {
            "slope": float(fit.params["c"]), "slope_stderr": float(fit.bse["c"]),
            "p": float(fit.pvalues["c"]), "df": int(fit.df_resid),
            "note": "exploratory: OLS with seed fixed effects over all runs (two-sided)"}
    if "alignment" in runs and runs["alignment"].notna().sum() > 2:
        ok = runs[["alignment", variant]].dropna()
        out["surrogate_vs_engine"] = {
            "pearson": float(stats.pearsonr(ok["alignment"], ok[variant]).statistic),
            "spearman": float(stats.spearmanr(ok["alignment"], ok[variant]).statistic),
            "n": int(len(ok)),
            "note": "the exact traceless alignment (engine.surrogate, all d directions) of "
                    "the final images against the engine's coupling of the same images, "
                    "across runs"}
    return out


def analyse(runs: pd.DataFrame, variant: str, *, alpha: float = 0.05, bound: float = 0.04,
            variants: Sequence[str] = ()) -> dict[str, Any]:
    """Every statistic of the study: the arms at the seed level, H1 (`manipulation_check`),
    H2/E2 and H3/E3 (`paired_difference` of test accuracy, the extreme arms against 0),
    the same differences for every other metric (what else the term changes), and the
    exploratory dose response."""
    for c in ("strength", "seed", "test_accuracy", variant):
        if c not in runs:
            raise BlockCouplingError(f"the runs' table lacks {c}")
    arms = sorted(float(s) for s in runs["strength"].unique())
    if 0.0 not in arms or arms[0] >= 0 or arms[-1] <= 0:
        raise BlockCouplingError("the runs need strength 0 and one of each sign")
    lo, hi = arms[0], arms[-1]
    cols = [variant, *(v for v in variants if v != variant), "test_accuracy", *SIDE_METRICS]
    tests: dict[str, Any] = {"variant": variant, "H1": manipulation_check(runs, variant, alpha),
                             "H2_E2": paired_difference(runs, hi, 0.0, "test_accuracy",
                                                        "greater", bound),
                             "H3_E3": paired_difference(runs, lo, 0.0, "test_accuracy", "less",
                                                        bound)}
    side = {}
    for c in cols:
        if c in runs and runs[c].notna().any() and c != "test_accuracy":
            side[c] = {f"{s:+g}": paired_difference(runs, s, 0.0, c)
                       for s in arms if s != 0.0}
    tests["other_metrics"] = side
    tests["exploratory"] = dose_response(runs, variant)
    return {"arms": arm_table(runs, [c for c in cols if c in runs]), "tests": tests,
            "strengths": arms, "seeds": sorted(int(s) for s in runs["seed"].unique()),
            "alpha": alpha, "bound": bound}

