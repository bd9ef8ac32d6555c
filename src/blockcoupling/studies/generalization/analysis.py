"""The statistics of ``study generalization``: pure functions over the runs' table, no I/O.

The table has one row per training run (the unit of replication) with its cell (``cell``:
training-set size ``n_train`` x ``label_noise``), ``seed``, ``test_accuracy``, and for each
coupling variant ``v`` of the spec its value ``v`` at the comparison point and ``v_se``, the
standard error over the measured images *within* that one trained model (not a replication
se). Every cell statistic is at the seed level (`blockcoupling.engine.statistic.
seed_level`: runs as the unit, a Student t interval); every test is scipy.stats or
statsmodels.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine.statistic import seed_level
from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import joins
from blockcoupling.studies.regression import correlation_tests, stats_modules

__all__ = ["analyse", "cell_table", "comparison_point", "mixed_model", "positive_control",
           "within_factor"]

#: the columns every run of the table needs beside its variants
RUN_COLUMNS = ("cell", "n_train", "label_noise", "seed", "test_accuracy")


def _check(runs: pd.DataFrame, variants: Sequence[str]) -> None:
    missing = [c for c in (*RUN_COLUMNS, *variants) if c not in runs.columns]
    if missing:
        raise BlockCouplingError(f"the runs' table lacks {', '.join(missing)}")


def cell_table(runs: pd.DataFrame, variants: Sequence[str],
               metrics: Sequence[str] = ("test_accuracy", "train_accuracy")) -> pd.DataFrame:
    """One row per cell (size, noise): ``n_seeds`` and, for each metric and variant, the
    seed-level ``<col>_mean, _sd, _se, _ci_low, _ci_high`` (``engine.statistic.seed_level``:
    the runs as the unit, a Student t interval), and for each variant ``<v>_within_se``: what
    the measured images alone give the cell mean (within-model: how precisely the trained
    models were measured, not how much other seeds would change them)."""
    _check(runs, variants)
    cols = [c for c in (*metrics, *variants) if c in runs.columns]
    keys = ["n_train", "label_noise"]
    out = runs.groupby(keys, sort=True).agg(cell=("cell", "first"),
                                            n_seeds=("seed", "size")).reset_index()
    for c in cols:
        lvl = seed_level(runs, by=keys, value=c, within_se=f"{c}_se")
        keep = {"mean": f"{c}_mean", "sd": f"{c}_sd", "se": f"{c}_se",
                "ci_low": f"{c}_ci_low", "ci_high": f"{c}_ci_high"}
        if c in variants:
            keep["within_se"] = f"{c}_within_se"
        out = joins.join_on(out, lvl[[*keys, *keep]].rename(columns=keep), keys,
                            names=("the cells", f"the seed level of {c}"),
                            what="the runs table is inconsistent")
    return out[["cell", *keys, "n_seeds", *(c for c in out.columns
                                            if c not in ("cell", *keys, "n_seeds"))]]


def positive_control(runs: pd.DataFrame, variants: Sequence[str], alpha: float = 0.05
                     ) -> dict[str, Any]:
    """Is coupling above chance in every cell under every null? Per variant and cell the
    one-sided one-sample t-test of the runs' values (``scipy.stats.ttest_1samp``,
    ``alternative="greater"``, H0: mean <= 0): the variant passes when every cell's p <
    ``alpha``; the control passes when every variant does."""
    st, _ = stats_modules()
    _check(runs, variants)
    out: dict[str, Any] = {"alpha": alpha, "variants": {}, "rule": (
        "in every cell, the seed-level one-sided t-test of mean > 0 (scipy.stats.ttest_1samp, "
        f"alternative='greater') has p < {alpha:g}, for every variant")}
    for v in variants:
        cells: list[dict[str, Any]] = []
        for cell, g in runs.groupby("cell", sort=False):
            x = g[v].to_numpy(float)
            x = x[np.isfinite(x)]
            if len(x) >= 2 and np.ptp(x) > 0:
                p = float(st.ttest_1samp(x, 0.0, alternative="greater").pvalue)
            else:
                p = 0.0 if len(x) >= 2 and x.min() > 0 else math.nan
            cells.append({"cell": str(cell), "mean": float(x.mean()) if len(x) else math.nan,
                          "n": int(len(x)), "p": p})
        ps = np.array([c["p"] for c in cells], dtype=float)
        passing = int(np.sum(ps < alpha))
        out["variants"][v] = {
            "passed": bool(passing == len(cells) and len(cells) > 0),
            "cells_passing": passing, "n_cells": len(cells),
            "min_cell_mean": float(np.nanmin([c["mean"] for c in cells])) if cells
            else math.nan,
            "max_p": float(np.nanmax(ps)) if np.isfinite(ps).any() else math.nan,
            "runs": seed_level(runs, by=(), value=v, within_se=f"{v}_se").iloc[0].to_dict(),
            "cells": cells}
    out["passed"] = bool(out["variants"]) and all(r["passed"] for r in out["variants"].values())
    return out


def mixed_model(runs: pd.DataFrame, variant: str) -> dict[str, Any]:
    """H1b: ``variant ~ test_accuracy`` over runs with a random intercept per cell
    (``statsmodels`` MixedLM, REML): the slope, its se, z, and the one-sided p
    (``norm.sf(z)``, H0: slope <= 0); ``converged`` and any fitting warning are reported."""
    st, _ = stats_modules()
    import statsmodels.formula.api as smf

    df = runs[["cell", "test_accuracy", variant]].dropna().rename(
        columns={variant: "y", "test_accuracy": "x"})
    if len(df) < 4 or df["cell"].nunique() < 2:
        return {"skipped": f"{len(df)} run(s) in {df['cell'].nunique()} cell(s)"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = smf.mixedlm("y ~ x", df, groups=df["cell"]).fit(reml=True)
    slope, se = float(fit.params["x"]), float(fit.bse["x"])
    z = slope / se if se > 0 else math.nan
    return {"n_runs": int(len(df)), "n_cells": int(df["cell"].nunique()), "slope": slope,
            "slope_stderr": se, "z": z, "p_greater": float(st.norm.sf(z)),
            "intercept": float(fit.params["Intercept"]),
            "cell_variance": float(fit.cov_re.iloc[0, 0]), "residual_variance": float(fit.scale),
            "converged": bool(fit.converged),
            "warnings": sorted({str(w.message).splitlines()[0] for w in caught}),
            "method": "statsmodels MixedLM (REML), random intercept per cell; one-sided Wald z"}


def within_factor(cells: pd.DataFrame, variant: str) -> dict[str, Any]:
    """Exploratory (not pre-registered): the cell-level slope of ``variant`` on test accuracy
    with each manipulated factor held fixed (statsmodels OLS of the cell means with one
    dummy per level of the factor): ``label_noise`` fixed (the slope from the size
    manipulation) and ``n_train`` fixed (from the noise manipulation); slope, se, two-sided
    p, residual df."""
    import statsmodels.formula.api as smf

    df = cells[["n_train", "label_noise", "test_accuracy_mean", f"{variant}_mean"]].rename(
        columns={"test_accuracy_mean": "x", f"{variant}_mean": "y"})
    out: dict[str, Any] = {"note": "exploratory, not pre-registered: OLS of the cell means "
                                   "with the other factor's levels as fixed effects"}
    for fixed, moved in (("label_noise", "training-set size"), ("n_train", "label noise")):
        if df[fixed].nunique() < 2 or len(df) - df[fixed].nunique() - 1 < 1:
            out[fixed] = {"skipped": f"too few cells to hold {fixed} fixed"}
            continue
        fit = smf.ols(f"y ~ x + C({fixed})", df).fit()
        out[fixed] = {"moved_by": moved, "slope": float(fit.params["x"]),
                      "slope_stderr": float(fit.bse["x"]), "p": float(fit.pvalues["x"]),
                      "df": int(fit.df_resid)}
    return out


def comparison_point(final: pd.DataFrame, checkpoints: pd.DataFrame | None,
                     variants: Sequence[str], alpha: float) -> dict[str, Any]:
    """Where the tests compare: ``final`` when the positive control passes there; otherwise
    the latest monitored checkpoint of matched steps (``checkpoints``: the runs' table with a
    ``step`` column, one row per run and step) where it passes; otherwise ``final``, with the
    control failed. Returns ``point`` ("final" or the step), ``control`` (its
    `positive_control` there), ``control_final`` and ``table`` (the runs at the point)."""
    control_final = positive_control(final, variants, alpha)
    chosen: dict[str, Any] = {"point": "final", "control": control_final,
                              "control_final": control_final, "table": final,
                              "reason": "the positive control holds at the end of training"}
    if control_final["passed"]:
        return chosen
    chosen["reason"] = ("the positive control fails at the end of training and at every "
                        "monitored checkpoint: the tests are made at the end, where coupling "
                        "is not above chance in every cell under every null")
    if checkpoints is None or checkpoints.empty:
        chosen["reason"] = ("the positive control fails at the end of training and no "
                            "checkpoint was monitored: the tests are made at the end")
        return chosen
    for step in sorted({int(s) for s in checkpoints["step"] if int(s) > 0}, reverse=True):
        at = checkpoints[checkpoints["step"] == step]
        control = positive_control(at, variants, alpha)
        if control["passed"]:
            return {"point": step, "control": control, "control_final": control_final,
                    "table": at, "reason": (
                        f"the positive control fails at the end of training; it holds at "
                        f"step {step} (matched progress: every run's coupling and test "
                        "accuracy at the end of the epoch in which that step falls, on the "
                        "monitored images), the latest such checkpoint: the tests compare "
                        "there")}
    return chosen


def analyse(final: pd.DataFrame, variants: Sequence[str], *, alpha: float = 0.05,
            bound: float = 0.5, checkpoints: pd.DataFrame | None = None) -> dict[str, Any]:
    """Every statistic of the study: the comparison point and its positive control, the
    cells at the seed level, H1 and E1 over the cells (`blockcoupling.studies.
    regression.correlation_tests` of the cell-mean coupling of ``variants[0]`` on the
    cell-mean test accuracy; the other variants beside it) and H1b (`mixed_model`)."""
    _check(final, variants)
    point = comparison_point(final, checkpoints, variants, alpha)
    table = point.pop("table")
    cells = cell_table(table, variants)
    primary = variants[0]
    tests: dict[str, Any] = {"variant": primary, "unit": "cell (mean over its seeds)"}
    x = cells["test_accuracy_mean"].to_numpy(float)
    try:
        tests["H1_E1"] = correlation_tests(x, cells[f"{primary}_mean"].to_numpy(float),
                                           bound=bound, alpha=alpha)
    except BlockCouplingError as err:
        tests["H1_E1"] = {"skipped": str(err)}
    tests["H1b"] = mixed_model(table, primary)
    tests["exploratory"] = within_factor(cells, primary)
    tests["other_variants"] = {}
    for v in variants[1:]:
        try:
            tests["other_variants"][v] = correlation_tests(
                x, cells[f"{v}_mean"].to_numpy(float), bound=bound, alpha=alpha)
        except BlockCouplingError as err:
            tests["other_variants"][v] = {"skipped": str(err)}
    spread = {"accuracy_between_cell_sd": float(np.std(x, ddof=1)) if len(x) > 1 else math.nan,
              "accuracy_seed_sd": float(np.sqrt(np.nanmean(cells["test_accuracy_sd"] ** 2))),
              f"{primary}_between_cell_sd": float(np.std(cells[f"{primary}_mean"], ddof=1))
              if len(cells) > 1 else math.nan,
              f"{primary}_seed_sd": float(np.sqrt(np.nanmean(cells[f"{primary}_sd"] ** 2))),
              f"{primary}_within_model_se": float(np.nanmean(table[f"{primary}_se"]))
              if f"{primary}_se" in table else math.nan}
    return {**point, "cells": cells, "runs": table, "tests": tests, "spread": spread}
