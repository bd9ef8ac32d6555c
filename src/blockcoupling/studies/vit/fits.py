"""The paper's conditional fits of the ViT grid: coupling against the drop-path rate at each
fixed weight decay, and against log10(weight decay) at each fixed drop-path rate; test
accuracy against coupling within each fixed drop-path rate and within each fixed weight decay
(the paper's conditional claim, "coupling correlates with accuracy when fixing SD rate", and
its fig. 12, per fixed weight decay); beside the pooled fits (coupling against each, over
every run, and test accuracy against coupling).

Each fit is ordinary least squares (``studies.regression.regression``, i.e.
``scipy.stats.linregress``: slope, its stderr, R^2, two-sided p) over the runs' values of
``column`` (default: the leading variant ``coupling_vs_rotated``, or ``coupling_vs_null`` for
runs trained before ``metrics.json`` carried it: `leading_column`), one point per run (seeds are separate points),
with each point's standard error (``<column>_se``, the statistic's se over the images) kept
for the error bars. The se is not used as a weight. A fit of fewer than 3 runs has no test:
with 2 distinct x it reports the line through the points (slope, intercept) and NaN R^2, p;
otherwise all NaN, with a ``note`` saying why.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.studies.regression import regression

FIT_KEYS = ("n", "slope", "intercept", "slope_stderr", "r2", "p")


def line_fit(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """``FIT_KEYS`` and a ``note`` of y on x (NaN-free values): linregress from 3 points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    out: dict[str, Any] = dict.fromkeys(FIT_KEYS, math.nan)
    out["n"] = int(len(x))
    if len(x) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0:
        res = regression(x.tolist(), y.tolist(), n_boot=0)
        out.update({k: res[k] for k in FIT_KEYS})
        out["note"] = None
    elif len(np.unique(x)) == 2 and len(x) == 2:
        out["slope"] = float((y[1] - y[0]) / (x[1] - x[0]))
        out["intercept"] = float(y[0] - out["slope"] * x[0])
        out["note"] = "2 points: the line through them, no R^2 or p"
    else:
        out["note"] = f"{len(x)} point(s) with {len(np.unique(x))} distinct x: no fit"
    return out


def _points(df: pd.DataFrame, xcol: str, column: str) -> list[dict[str, Any]]:
    se = df[f"{column}_se"] if f"{column}_se" in df else pd.Series(math.nan, index=df.index)
    return [{"name": str(n), "x": float(x), "y": float(y), "se": float(e)}
            for n, x, y, e in zip(df["name"], df[xcol], df[column], se, strict=True)]


def _accuracy_points(df: pd.DataFrame, column: str) -> list[dict[str, Any]]:
    """(x = coupling, its se ``x_se``, y = test accuracy) per run."""
    se = df[f"{column}_se"] if f"{column}_se" in df else pd.Series(math.nan, index=df.index)
    return [{"name": str(n), "x": float(x), "x_se": float(e), "y": float(y)}
            for n, x, e, y in zip(df["name"], df[column], se, df["test_accuracy"], strict=True)]


def leading_column(runs: pd.DataFrame) -> str:
    """The column every ViT fit and figure leads with: ``coupling_vs_rotated`` (the headline's
    leading variant) where every finished run has it, else ``coupling_vs_null``."""
    from blockcoupling.engine.statistic import LEAD_VARIANTS

    done = runs[runs["status"] == "complete"] if "status" in runs else runs
    return next((v for v in LEAD_VARIANTS if v in done and len(done)
                 and done[v].notna().all()), LEAD_VARIANTS[-1])


def conditional_fits(runs: pd.DataFrame, column: str | None = None) -> dict[str, Any]:
    """The fits of the finished runs (``collect_runs``): ``pooled`` (coupling ~ drop_path,
    coupling ~ log10 weight_decay, test_accuracy ~ coupling), ``by_weight_decay`` (one fit of
    coupling ~ drop_path per weight decay) and ``by_drop_path`` (coupling ~ log10 weight
    decay per drop-path rate), each with its points (x, y, se); and the paper's conditional
    accuracy fits, ``accuracy_by_drop_path`` and ``accuracy_by_weight_decay`` (test_accuracy ~
    coupling among the runs of one drop-path rate, of one weight decay), each with its
    points (x = coupling, x_se, y = test accuracy)."""
    column = column or leading_column(runs)
    df = runs[runs["status"] == "complete"].dropna(subset=[column]).copy()
    df["log10_weight_decay"] = np.log10(df["weight_decay"].clip(lower=1e-12))

    def fit(sub: pd.DataFrame, xcol: str, ycol: str = column) -> dict[str, Any]:
        return {"x": xcol, "y": ycol, **line_fit(sub[xcol].to_numpy(), sub[ycol].to_numpy()),
                "points": _points(sub, xcol, ycol) if ycol == column else None}

    return {
        "column": column, "n_runs": int(len(df)),
        "method": "OLS (scipy.stats.linregress) per group, one point per run; se = the "
                  "statistic's se over the measured images (error bars, not weights)",
        "pooled": {"drop_path": fit(df, "drop_path"),
                   "weight_decay": fit(df, "log10_weight_decay"),
                   "accuracy": {"x": column, "y": "test_accuracy",
                                **line_fit(df[column].to_numpy(),
                                           df["test_accuracy"].to_numpy())}},
        "by_weight_decay": [{"weight_decay": float(wd), **fit(g, "drop_path")}
                            for wd, g in df.groupby("weight_decay")],
        "by_drop_path": [{"drop_path": float(dp), **fit(g, "log10_weight_decay")}
                         for dp, g in df.groupby("drop_path")],
        **{f"accuracy_by_{fixed}": [
            {fixed: float(v), "x": column, "y": "test_accuracy",
             **line_fit(g[column].to_numpy(), g["test_accuracy"].to_numpy()),
             "points": _accuracy_points(g, column)}
            for v, g in df.groupby(fixed)] for fixed in ("drop_path", "weight_decay")},
    }


def fits_table(fits: dict[str, Any]) -> pd.DataFrame:
    """One row per fit of `conditional_fits` (group, fixed value, x, n, slope, R^2, p)."""
    rows = [{"fit": "pooled", "fixed": "-", **{k: f[k] for k in ("x", "y", *FIT_KEYS)}}
            for f in fits["pooled"].values()]
    for key, fixed in (("by_weight_decay", "weight_decay"), ("by_drop_path", "drop_path"),
                       ("accuracy_by_drop_path", "drop_path"),
                       ("accuracy_by_weight_decay", "weight_decay")):
        rows += [{"fit": key, "fixed": f"{fixed}={f[fixed]:g}",
                  **{k: f[k] for k in ("x", "y", *FIT_KEYS)}} for f in fits[key]]
    return pd.DataFrame(rows)


__all__ = ["FIT_KEYS", "conditional_fits", "fits_table", "leading_column", "line_fit"]
