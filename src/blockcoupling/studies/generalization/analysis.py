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

__all__ = ["analyse", "cell_table", "comparison_point", "control_contrast", "factor_effects",
           "factor_slope", "mixed_model", "positive_control", "within_between", "within_factor"]

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


def _one_sided(z: float, alternative: str) -> float:
    st, _ = stats_modules()
    return float(st.norm.sf(z) if alternative == "greater" else st.norm.cdf(z))


def within_between(runs: pd.DataFrame, variant: str, bound: float, alpha: float = 0.05
                   ) -> dict[str, Any]:
    """W1 and EW: the Mundlak split of the mixed model over runs, ``variant ~ (accuracy -
    cell mean) + cell mean`` with a random intercept per cell (statsmodels MixedLM, REML):
    the within coefficient (seed to seed inside a cell, one-sided Wald p), the between
    coefficient (across cell means); beside it the fixed-effects OLS slope (cell dummies;
    the same estimate in a balanced design) with its t-test, the pooled within-cell
    correlation, and the TOST of the within slope against +-``bound`` (both one-sided t-tests
    of the fixed-effects slope)."""
    st, _ = stats_modules()
    import statsmodels.formula.api as smf

    df = runs[["cell", "test_accuracy", variant]].dropna().rename(
        columns={variant: "y", "test_accuracy": "x"})
    if len(df) - df["cell"].nunique() < 3 or df["cell"].nunique() < 2:
        return {"skipped": f"{len(df)} run(s) in {df['cell'].nunique()} cell(s)"}
    df["x_between"] = df.groupby("cell")["x"].transform("mean")
    df["x_within"] = df["x"] - df["x_between"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = smf.mixedlm("y ~ x_within + x_between", df, groups=df["cell"]).fit(reml=True)
    out: dict[str, Any] = {"n_runs": int(len(df)), "n_cells": int(df["cell"].nunique()),
                           "converged": bool(fit.converged),
                           "warnings": sorted({str(w.message).splitlines()[0]
                                               for w in caught})}
    for part in ("within", "between"):
        b, se = float(fit.params[f"x_{part}"]), float(fit.bse[f"x_{part}"])
        z = b / se if se > 0 else math.nan
        out[part] = {"slope": b, "slope_stderr": se, "z": z,
                     "p_greater": _one_sided(z, "greater")}
    fe = smf.ols("y ~ x + C(cell)", df).fit()
    b, se, dof = float(fe.params["x"]), float(fe.bse["x"]), float(fe.df_resid)
    yw = df["y"] - df.groupby("cell")["y"].transform("mean")
    r = float(np.corrcoef(df["x_within"], yw)[0, 1])
    p_low = float(st.t.sf((b + bound) / se, dof))
    p_high = float(st.t.cdf((b - bound) / se, dof))
    out["fixed_effects"] = {
        "slope": b, "slope_stderr": se, "df": int(dof), "p_greater": float(st.t.sf(b / se, dof)),
        "ci95": [b - st.t.ppf(0.975, dof) * se, b + st.t.ppf(0.975, dof) * se],
        "within_r": r}
    out["equivalence"] = {"bound": bound, "p_tost": max(p_low, p_high),
                          "equivalent": bool(max(p_low, p_high) < alpha),
                          "ci_tost": [b - st.t.ppf(1 - alpha, dof) * se,
                                      b + st.t.ppf(1 - alpha, dof) * se],
                          "ci_tost_level": 1 - 2 * alpha}
    out["method"] = ("statsmodels MixedLM (REML), random intercept per cell, the Mundlak "
                     "split (accuracy - cell mean, cell mean); one-sided Wald z. Beside it: "
                     "OLS with cell dummies (t with n - cells - 1 df) and its TOST")
    return out


def factor_slope(cells: pd.DataFrame, y: str, factor: str, fixed: str | None = None,
                 alternative: str = "two-sided") -> dict[str, Any]:
    """The OLS slope over cell means of ``y`` on ``factor`` (``ln_size`` = ln(n_train), or
    ``label_noise``), with the levels of ``fixed`` as fixed effects (statsmodels OLS): slope,
    se, df, the p of ``alternative``, a 95 % interval."""
    st, _ = stats_modules()
    import statsmodels.formula.api as smf

    df = cells.assign(ln_size=np.log(cells["n_train"].astype(float)))
    formula = f"Q('{y}') ~ {factor}" + (f" + C({fixed})" if fixed else "")
    n_par = 2 + (df[fixed].nunique() - 1 if fixed else 0)
    if len(df) - n_par < 1 or df[factor].nunique() < 2:
        return {"skipped": f"{len(df)} cell(s) for {n_par} coefficients"}
    fit = smf.ols(formula, df).fit()
    b, se, dof = float(fit.params[factor]), float(fit.bse[factor]), int(fit.df_resid)
    t = b / se if se > 0 else math.nan
    p = {"greater": st.t.sf(t, dof), "less": st.t.cdf(t, dof),
         "two-sided": 2 * st.t.sf(abs(t), dof)}[alternative]
    q = float(st.t.ppf(0.975, dof))
    return {"slope": b, "slope_stderr": se, "df": dof, "alternative": alternative,
            "p": float(p), "ci95": [b - q * se, b + q * se], "n_cells": int(len(df)),
            "fixed": fixed}


def factor_effects(cells: pd.DataFrame, variant: str) -> dict[str, Any]:
    """S1 (size with clean labels), S2 (size, noise levels fixed), N1 (noise, size levels
    fixed): each factor's own slope on the cell means of ``variant`` (one-sided in the
    claim's direction) and of test accuracy (two-sided); per noise level the size slopes
    (exploratory); and accuracy's slope once both factors are known (exploratory: what
    accuracy adds to the manipulated factors)."""
    y, acc = f"{variant}_mean", "test_accuracy_mean"
    clean = cells[cells["label_noise"] == 0.0]
    many = cells["label_noise"].nunique() > 1
    out: dict[str, Any] = {
        "S1": {"coupling": factor_slope(clean, y, "ln_size", alternative="greater"),
               "accuracy": factor_slope(clean, acc, "ln_size")} if len(clean)
        else {"skipped": "no clean-label cells"},
        "S2": {"coupling": factor_slope(cells, y, "ln_size", "label_noise" if many else None,
                                        alternative="greater"),
               "accuracy": factor_slope(cells, acc, "ln_size",
                                        "label_noise" if many else None)},
        "N1": {"coupling": factor_slope(cells, y, "label_noise", "n_train", alternative="less"),
               "accuracy": factor_slope(cells, acc, "label_noise", "n_train")} if many
        else {"skipped": "one label-noise level"}}
    out["size_by_noise"] = {f"{float(e):g}": {"coupling": factor_slope(g, y, "ln_size"),
                                              "accuracy": factor_slope(g, acc, "ln_size")}
                            for e, g in cells.groupby("label_noise")}
    import statsmodels.formula.api as smf

    if many and len(cells) - cells["n_train"].nunique() - cells["label_noise"].nunique() > 1:
        fit = smf.ols(f"Q('{y}') ~ Q('{acc}') + C(n_train) + C(label_noise)", cells).fit()
        key = f"Q('{acc}')"
        out["accuracy_beyond_factors"] = {
            "slope": float(fit.params[key]), "slope_stderr": float(fit.bse[key]),
            "p": float(fit.pvalues[key]), "df": int(fit.df_resid),
            "note": "exploratory: OLS of the cell means on accuracy with both factors' "
                    "levels as fixed effects"}
    return out


def control_contrast(control: pd.DataFrame, design_cell: pd.DataFrame, variant: str,
                     direction: str) -> dict[str, Any]:
    """PC: the design's cell (its drop-path rate) minus the control's runs (the contrast
    rate), at the same data and seeds: Welch's t-test of ``variant`` (``direction``:
    greater or less) and of test accuracy (two-sided), with both arms' seed-level means."""
    st, _ = stats_modules()

    def arm(t: pd.DataFrame, c: str) -> dict[str, Any]:
        x = t[c].to_numpy(float)
        return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if len(x) > 1 else
                math.nan, "n": int(len(x))}

    out: dict[str, Any] = {"method": "scipy.stats.ttest_ind(design, control, equal_var=False)"}
    for c, alt in ((variant, direction), ("test_accuracy", "two-sided")):
        a, b = design_cell[c].to_numpy(float), control[c].to_numpy(float)
        if len(a) < 2 or len(b) < 2:
            out[c] = {"skipped": f"{len(a)} and {len(b)} runs"}
            continue
        t = st.ttest_ind(a, b, equal_var=False, alternative=alt)
        out[c] = {"design": arm(design_cell, c), "control": arm(control, c),
                  "difference": float(a.mean() - b.mean()), "t": float(t.statistic),
                  "df": float(t.df), "p": float(t.pvalue), "alternative": alt}
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
            bound: float = 0.5, checkpoints: pd.DataFrame | None = None,
            within_bound: float = 0.057, control: pd.DataFrame | None = None,
            control_direction: str = "greater") -> dict[str, Any]:
    """Every statistic of the study: the comparison point and its positive control, the
    cells at the seed level, W1 and EW within cells (`within_between`, equivalence bound
    ``within_bound``), each factor's effect (`factor_effects`), H1 and E1 over the cells
    (`blockcoupling.studies.regression.correlation_tests` of the cell-mean coupling of
    ``variants[0]`` on the cell-mean test accuracy; the other variants beside it), H1b
    (`mixed_model`), and with ``control`` (the contrast runs at the control cell, the
    largest size with clean labels) PC (`control_contrast` against the design's runs there,
    at the end of training)."""
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
    tests["W1_EW"] = within_between(table, primary, within_bound, alpha)
    tests["factors"] = factor_effects(cells, primary)
    if control is not None and len(control):
        n = int(control["n_train"].iloc[0])
        mine = final[(final["n_train"] == n) & (final["label_noise"] == 0.0)]
        tests["PC"] = control_contrast(control, mine, primary, control_direction)
    tests["exploratory"] = within_factor(cells, primary)
    if "train_accuracy_mean" in cells:
        try:
            tests["exploratory"]["train_accuracy"] = correlation_tests(
                cells["train_accuracy_mean"].to_numpy(float),
                cells[f"{primary}_mean"].to_numpy(float), bound=bound, alpha=alpha)
        except BlockCouplingError as err:
            tests["exploratory"]["train_accuracy"] = {"skipped": str(err)}
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
