"""The statistics of the correlation study, on plain tables (one row per model).

Pure functions over numbers, no I/O: `regression` (OLS line, Pearson r with a seeded
percentile-bootstrap CI of R^2, Spearman rho; scipy.stats), `exponential_fit`
(scipy.optimize.curve_fit), `partial_correlation` / `partial_correlations`
(statsmodels OLS residuals, given log10 d_model, log10 parameters and both),
`floor_analysis` (what the measured chance level of raw c_K explains) and
`analyse` (all of them on one table). scipy and statsmodels are the optional extra
``blockcoupling[study]``; `stats_modules` names it when they are missing.

Small samples: below `SMALL_N` models the correlation study (`analyse`) gives
exact permutation p-values (every one of the n! orderings of the scores, scipy.stats; for a
partial correlation the Freedman-Lane permutation of the score's residuals), not the t or
normal approximations, and `regression` gives no bootstrap interval of R^2 below
`SMALL_N` models or where the bootstrap degenerates (most resamples of a few models
repeat a model, and their R^2 is 1 or undefined): such an interval would look precise and
mean nothing.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine.statistic import FLOOR_NOTE
from blockcoupling.errors import BlockCouplingError, require

__all__ = [
    "CONTROLS",
    "COUPLING_PREDICTORS",
    "MIN_MODELS",
    "PREDICTORS",
    "SMALL_N",
    "analyse",
    "correlation_density",
    "fit_text",
    "correlation_power",
    "correlation_tests",
    "exponential_fit",
    "floor_analysis",
    "partial_correlation",
    "partial_correlations",
    "regression",
    "stats_modules",
    "tost_power",
]

#: Predictors regressed against the score, in output order: the headline statistic
#: (coupling_vs_rotated first, coupling_vs_null beside it, then raw c_K as the paper), then
#: the models' shape. ``log_params`` = log10(params_b * 1e9), ``log_d_model`` = log10(d_model).
COUPLING_PREDICTORS: tuple[str, ...] = ("coupling_vs_rotated_mean", "coupling_vs_null_mean",
                                        "coupling_mean")
PREDICTORS: tuple[str, ...] = (*COUPLING_PREDICTORS, "params_b", "layers", "d_model",
                               "train_tokens_t", "log_params", "log_d_model")
#: the controls of the partial correlations, alone and together
CONTROLS: tuple[tuple[str, ...], ...] = (("log_d_model",), ("log_params",),
                                         ("log_d_model", "log_params"))
MIN_MODELS = 3
#: below this many models: exact permutation p-values in `analyse`, no bootstrap CI
SMALL_N = 10
#: the most bootstrap resamples that may be degenerate (constant x or y) for an interval
MAX_DEGENERATE = 0.01


def stats_modules() -> tuple[Any, Any]:
    """scipy.stats and statsmodels.api, or a clear error naming the extra to install."""
    st, sm = (require(m, what="the correlation study", install="'blockcoupling[study]'")
              for m in ("scipy.stats", "statsmodels.api"))
    return st, sm


def _clean_xy(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xa) & np.isfinite(ya)
    return xa[keep], ya[keep]


def _permutation_p(v: np.ndarray, corr: Any) -> float:
    """Two-sided exact permutation p of a correlation: the share of all n! orderings of ``v``
    whose |corr| reaches the observed one (scipy's ``permutation_test``, which compares with
    a relative tolerance for rounding)."""
    st, _ = stats_modules()

    def stat(w: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.abs(corr(np.moveaxis(w, axis, -1)))

    return float(st.permutation_test((v,), stat, permutation_type="pairings", vectorized=True,
                                     n_resamples=math.inf, alternative="greater").pvalue)


def _centred_unit(v: np.ndarray) -> np.ndarray:
    c = v - v.mean(axis=-1, keepdims=True)
    return c / np.linalg.norm(c, axis=-1, keepdims=True)


def _exact_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided exact permutation p of Pearson's r of x and y (all n! orderings of y)."""
    zx = _centred_unit(np.asarray(x, dtype=float))
    return _permutation_p(np.asarray(y, dtype=float), lambda w: _centred_unit(w) @ zx)


def _r2_interval(st: Any, xa: np.ndarray, ya: np.ndarray, n_boot: int, seed: int,
                 confidence: float) -> tuple[float, float, int, str | None]:
    """`regression`'s percentile-bootstrap interval of R^2: (lo, hi, degenerate resamples,
    why there is none)."""
    lo = hi = float("nan")
    degenerate = 0
    note: str | None = None
    if n_boot > 0 and len(xa) < SMALL_N:
        note = (f"no bootstrap interval for {len(xa)} models (below {SMALL_N}, most resamples "
                "repeat a model and the interval degenerates)")
    elif n_boot > 0:
        def r2(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
            return st.pearsonr(a, b, axis=axis).statistic ** 2

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            boot = st.bootstrap((xa, ya), r2, paired=True, vectorized=True, n_resamples=n_boot,
                                method="percentile", confidence_level=confidence,
                                random_state=np.random.default_rng(seed))
        dist = np.asarray(boot.bootstrap_distribution, dtype=float)
        degenerate = int((~np.isfinite(dist)).sum())
        alpha = (1 - confidence) / 2
        if degenerate <= MAX_DEGENERATE * len(dist):
            lo, hi = (float(v) for v in np.nanpercentile(dist, [100 * alpha, 100 * (1 - alpha)]))
        if degenerate > MAX_DEGENERATE * len(dist) or not lo < hi:
            lo = hi = float("nan")
            note = (f"no bootstrap interval: {degenerate} of {len(dist)} resamples had a "
                    "constant x or y" if degenerate else "no bootstrap interval: every "
                    "resample gave the same R^2")
    return lo, hi, degenerate, note


def regression(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *,
               n_boot: int = 2000, seed: int = 0, confidence: float = 0.95,
               exact_below: int = 0) -> dict[str, Any]:
    """Least-squares line y = slope x + intercept and rank correlation (rows with NaN dropped).

    Returns n, slope, intercept, slope_stderr, r (Pearson), r2, p (two-sided, slope = 0),
    r2_ci (percentile bootstrap over models, ``n_boot`` resamples from
    ``numpy.random.default_rng(seed)``; resamples with a constant x or y are left out and
    counted in ``n_boot_degenerate``), spearman_rho, spearman_p, and ``p_method`` /
    ``spearman_p_method``. Below ``exact_below`` models both p-values are exact permutation
    p-values (all n! orderings; the slope's test is the test of r), else the t-test of the
    slope (scipy.stats.linregress) and Spearman's t approximation. The interval is NaN, with
    the reason in ``r2_ci_note``, below `SMALL_N` models or where more than
    `MAX_DEGENERATE` of the resamples, or the whole interval, degenerate. Needs
    n >= 3 and non-constant x and y (raises otherwise).
    """
    st, _ = stats_modules()
    xa, ya = _clean_xy(x, y)
    if len(xa) < MIN_MODELS:
        raise BlockCouplingError(f"a regression needs at least {MIN_MODELS} models with values, "
                                 f"got {len(xa)}")
    if np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise BlockCouplingError("a regression needs values that vary; "
                                 f"{'x' if np.ptp(xa) == 0 else 'y'} is constant")
    lr = st.linregress(xa, ya)
    rho = st.spearmanr(xa, ya)
    exact = len(xa) < exact_below
    p, p_method = float(lr.pvalue), "t-test of the slope"
    sp, sp_method = float(rho.pvalue), "t approximation"
    if exact:
        p, p_method = _exact_p(xa, ya), f"exact permutation ({math.factorial(len(xa))} orderings)"
        sp = _exact_p(st.rankdata(xa), st.rankdata(ya))
        sp_method = p_method
    lo, hi, degenerate, note = _r2_interval(st, xa, ya, n_boot, seed, confidence)
    return {
        "n": int(len(xa)), "slope": float(lr.slope), "intercept": float(lr.intercept),
        "slope_stderr": float(lr.stderr), "r": float(lr.rvalue), "r2": float(lr.rvalue ** 2),
        "p": p, "p_method": p_method, "r2_ci": [lo, hi], "r2_ci_note": note,
        "ci_level": confidence, "n_boot": int(n_boot), "n_boot_degenerate": degenerate,
        "seed": int(seed), "spearman_rho": float(rho.statistic), "spearman_p": sp,
        "spearman_p_method": sp_method,
    }


def fit_text(fit: Any, template: str) -> str:
    """A fit in a summary line: ``skipped (why)`` where it was skipped (its ``skipped`` a
    string), else ``template`` filled from its fields (``str.format``)."""
    why = fit.get("skipped")
    return f"skipped ({why})" if isinstance(why, str) else template.format(**fit)


def exponential_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """Least-squares fit of y = a exp(b x) (arXiv v1 fig. 8) with scipy.optimize.curve_fit.

    Started from the straight line through log y when every y > 0. Returns n, a, b, their
    standard errors, r2 (1 - SS_res / SS_tot on the y scale, comparable with the linear R^2)
    and ``converged``.
    """
    stats_modules()
    from scipy.optimize import curve_fit

    xa, ya = _clean_xy(x, y)
    if len(xa) < MIN_MODELS or np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise BlockCouplingError("the exponential fit needs at least 3 models with varying values")
    xc = xa.mean()  # centring keeps a and b well conditioned; a is reported at x = 0

    def f(t: np.ndarray, a: float, b: float) -> np.ndarray:
        return a * np.exp(b * (t - xc))

    if (ya > 0).all():
        b0, la0 = np.polyfit(xa - xc, np.log(ya), 1)
        p0 = [math.exp(la0), b0]
    else:
        p0 = [float(ya.mean()), 0.0]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            (a_c, b), cov = curve_fit(f, xa, ya, p0=p0, maxfev=20000)
        converged = bool(np.isfinite([a_c, b]).all())
    except (RuntimeError, ValueError):
        a_c, b, cov, converged = float("nan"), float("nan"), np.full((2, 2), np.nan), False
    pred = f(xa, a_c, b)
    r2 = 1.0 - float(np.sum((ya - pred) ** 2) / np.sum((ya - ya.mean()) ** 2))
    a = a_c * math.exp(-b * xc) if converged else float("nan")
    se = np.sqrt(np.clip(np.diag(cov), 0, None)) if np.isfinite(cov).all() else [np.nan, np.nan]
    return {"n": int(len(xa)), "model": "score = a * exp(b * coupling)", "a": float(a),
            "b": float(b), "a_stderr": float(se[0] * math.exp(-b * xc)) if converged else float("nan"),
            "b_stderr": float(se[1]), "r2": r2 if converged else float("nan"),
            "converged": converged}


def partial_correlation(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                        covariates: Sequence[float] | Sequence[Sequence[float]], *,
                        exact_below: int = 0) -> dict[str, Any]:
    """Partial correlation of x and y controlling for one covariate or several (statsmodels OLS).

    ``covariates``: one sequence (n,) or several (m sequences of n). Fits
    y ~ 1 + x + covariates; the partial r is the correlation of the residuals of x and y on
    (1, covariates), its p-value the t-test of x's coefficient (n - 2 - m degrees of freedom);
    below ``exact_below`` models the Freedman-Lane permutation p instead (y's residuals on
    the controls permuted in all n! orders, residualised again, correlated with x's; scipy's
    ``permutation_test``), named in ``p_method``. Rows with NaN in any column are dropped;
    needs n >= m + 3 (and at least 4).
    """
    _, sm = stats_modules()
    cov = np.asarray(covariates, dtype=float)
    cov = cov[None, :] if cov.ndim == 1 else cov  # (m, n)
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xa) & np.isfinite(ya) & np.isfinite(cov).all(axis=0)
    xa, ya, ca = xa[keep], ya[keep], cov[:, keep].T  # ca (n, m)
    need = max(MIN_MODELS + 1, ca.shape[1] + 3)
    if len(xa) < need:
        raise BlockCouplingError(f"a partial correlation with {ca.shape[1]} control(s) needs at "
                                 f"least {need} models with all values, got {len(xa)}")
    if (np.ptp(ca, axis=0) == 0).any():
        raise BlockCouplingError("a control is constant over the models; nothing to control for")
    c = sm.add_constant(ca, has_constant="add")
    if np.linalg.matrix_rank(c) < c.shape[1]:
        raise BlockCouplingError("the controls are collinear over these models (e.g. log "
                                 "parameters a function of log d_model); use one of them")
    rx = sm.OLS(xa, c).fit().resid
    ry = sm.OLS(ya, c).fit().resid
    if np.allclose(rx, 0) or np.allclose(ry, 0):
        raise BlockCouplingError("after removing the controls nothing varies")
    full = sm.OLS(ya, sm.add_constant(np.column_stack([xa, ca]), has_constant="add")).fit()
    r = float(np.corrcoef(rx, ry)[0, 1])
    p, method = float(full.pvalues[1]), "t-test of the coefficient"
    if len(xa) < exact_below:
        resid = np.eye(len(xa)) - c @ np.linalg.pinv(c)  # residualises on (1, controls)
        zx = _centred_unit(rx)
        p = _permutation_p(ry, lambda w: _centred_unit(w @ resid.T) @ zx)
        method = f"Freedman-Lane permutation ({math.factorial(len(xa))} orderings)"
    return {"n": int(len(xa)), "r": r, "p": p, "p_method": method, "df": int(full.df_resid),
            "coef": float(full.params[1]), "coef_stderr": float(full.bse[1])}


def partial_correlations(table: pd.DataFrame, y: np.ndarray,
                         predictors: Sequence[str] = COUPLING_PREDICTORS,
                         controls: Sequence[Sequence[str]] = CONTROLS, *,
                         exact_below: int = 0) -> list[dict[str, Any]]:
    """Each coupling predictor's partial correlation with the score given each set of controls
    (``log_d_model``, ``log_params``, both): one dict each, ``skipped`` with the reason where
    it cannot be computed (``exact_below`` as `partial_correlation`)."""
    out = []
    for x in predictors:
        if x not in table.columns:
            continue
        for ctrl in controls:
            entry: dict[str, Any] = {"x": x, "y": "score", "controlling_for": list(ctrl)}
            try:
                missing = [c for c in ctrl if c not in table.columns]
                if missing:
                    raise BlockCouplingError(f"no {', '.join(missing)} in the table")
                entry.update(partial_correlation(table[x], y, [table[c] for c in ctrl],
                                                 exact_below=exact_below))
            except BlockCouplingError as err:
                entry["skipped"] = str(err)
            out.append(entry)
    return out


def floor_analysis(table: pd.DataFrame, y: np.ndarray, *, exact_below: int = 0
                   ) -> dict[str, Any]:
    """What the measured chance level of raw c_K explains (``correlate --floor``): the
    regression of the score on ``coupling_chance``, the correlation of raw c_K with the
    score, and its partial correlation given the chance level (what survives the floor)."""
    out: dict[str, Any] = {"x": "coupling_chance", "note": FLOOR_NOTE}
    if "coupling_chance" not in table.columns or table["coupling_chance"].notna().sum() < 3:
        out["skipped"] = ("the chance level was not measured (measure the variant "
                          "coupling_vs_null beside coupling)")
        return out
    for key, fn in (("score_on_chance", lambda: regression(
                        table["coupling_chance"], y, n_boot=0, exact_below=exact_below)),
                    ("raw_on_score", lambda: regression(table["coupling_mean"], y, n_boot=0,
                                                        exact_below=exact_below)),
                    ("raw_given_chance", lambda: partial_correlation(
                        table["coupling_mean"], y, table["coupling_chance"],
                        exact_below=exact_below))):
        try:
            out[key] = fn()
        except BlockCouplingError as err:
            out[key] = {"skipped": str(err)}
    return out


def analyse(table: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0,
            floor: bool = False) -> dict[str, Any]:
    """All statistics of one table (columns ``score`` and any of `PREDICTORS`).

    Returns ``{"n", "predictors": {name: regression or {"skipped": why}}, "exponential",
    "partial_correlations"}`` (and ``"floor"`` with ``floor``: `floor_analysis`).
    Below `SMALL_N` models every p-value is an exact permutation p-value. Raises for
    fewer than 3 models or constant scores.
    """
    y = table["score"].to_numpy(dtype=float)
    if len(table) < MIN_MODELS:
        raise BlockCouplingError(f"the correlation needs at least {MIN_MODELS} models with a "
                                 f"score, got {len(table)}")
    if np.ptp(y[np.isfinite(y)]) == 0:
        raise BlockCouplingError(f"all scores are equal ({y[0]:g}); a correlation needs "
                                 "scores that vary")
    out: dict[str, Any] = {"n": int(len(table)), "predictors": {}}
    for name in PREDICTORS:
        if name not in table.columns:
            continue
        x = table[name].to_numpy(dtype=float)
        ok = np.isfinite(x)
        if ok.sum() < MIN_MODELS:
            out["predictors"][name] = {"skipped": f"{int(ok.sum())} model(s) with a value"}
            continue
        if np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
            out["predictors"][name] = {"skipped": "constant over the models with a value"}
            continue
        out["predictors"][name] = regression(x, y, n_boot=n_boot, seed=seed,
                                             exact_below=SMALL_N)
    try:
        out["exponential"] = exponential_fit(table["coupling_mean"], y)
    except (BlockCouplingError, KeyError) as err:
        out["exponential"] = {"skipped": str(err)}
    out["partial_correlations"] = partial_correlations(table, y, exact_below=SMALL_N)
    if floor:
        out["floor"] = floor_analysis(table, y, exact_below=SMALL_N)
    return out


# ---------------------------------------------------------------------------- correlations
def correlation_density(r: float | np.ndarray, n: int, rho: float) -> np.ndarray:
    """The exact density of Pearson's sample correlation of ``n`` bivariate-normal pairs with
    population correlation ``rho`` (Hotelling's form, with the Gauss hypergeometric function
    of ``scipy.special``)."""
    from scipy import special

    r = np.asarray(r, dtype=float)
    log_c = (math.log(n - 2) + special.gammaln(n - 1) - 0.5 * math.log(2 * math.pi)
             - special.gammaln(n - 0.5))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_f = (log_c + (n - 1) / 2 * math.log1p(-rho ** 2) + (n - 4) / 2 * np.log1p(-r ** 2)
                 - (n - 1.5) * np.log1p(-rho * r))
        return np.exp(log_f) * special.hyp2f1(0.5, 0.5, n - 0.5, (rho * r + 1) / 2)


def _r_probability(lo: float, hi: float, n: int, rho: float) -> float:
    """P(lo < r < hi) for the sample correlation of ``n`` pairs at correlation ``rho``."""
    from scipy import integrate

    lo, hi = max(lo, -1.0), min(hi, 1.0)
    if hi <= lo:
        return 0.0
    return float(min(1.0, max(0.0, integrate.quad(correlation_density, lo, hi,
                                                  args=(n, rho), limit=200)[0])))


def _critical_r(n: int, alpha: float) -> float:
    """The r above which the one-sided t-test of a correlation (n - 2 df) rejects at alpha."""
    st, _ = stats_modules()
    t = float(st.t.isf(alpha, n - 2))
    return t / math.sqrt(n - 2 + t * t)


def correlation_power(n: int, rho: float, alpha: float = 0.05) -> float:
    """The exact power of the one-sided test of a positive Pearson correlation (the t-test
    with n - 2 df, ``scipy.stats.pearsonr(..., alternative="greater")``) over ``n``
    bivariate-normal pairs whose population correlation is ``rho``."""
    if n < 4:
        raise BlockCouplingError(f"a correlation test needs at least 4 points, got {n}")
    return _r_probability(_critical_r(n, alpha), 1.0, n, rho)


def _tost_region(n: int, bound: float, alpha: float) -> tuple[float, float]:
    """The sample correlations for which the TOST of `correlation_tests` declares
    equivalence within +-``bound``: the Fisher-z (1 - 2 alpha) interval inside the bounds."""
    st, _ = stats_modules()
    half = float(st.norm.isf(alpha)) / math.sqrt(n - 3)
    z = math.atanh(bound)
    return math.tanh(-z + half), math.tanh(z - half)


def tost_power(n: int, bound: float, alpha: float = 0.05, rho: float = 0.0) -> float:
    """The exact probability that the equivalence test of `correlation_tests` (TOST on
    Fisher's z against +-``bound``) declares equivalence for ``n`` bivariate-normal pairs of
    population correlation ``rho`` (its power at ``rho = 0``)."""
    if n < 4:
        raise BlockCouplingError(f"a correlation test needs at least 4 points, got {n}")
    lo, hi = _tost_region(n, bound, alpha)
    return _r_probability(lo, hi, n, rho)


def correlation_tests(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *,
                      bound: float = 0.5, alpha: float = 0.05) -> dict[str, Any]:
    """The pre-registered tests of a positive association of y with x over independent units:

    * ``p_greater``: Pearson's r, one-sided (``scipy.stats.pearsonr``, ``alternative=
      "greater"``: the t-test of the OLS slope, n - 2 df); ``slope``, ``slope_stderr``;
    * the equivalence test (TOST) against the smallest correlation of interest ``bound``:
      two one-sided tests on Fisher's z = atanh(r) with se 1 / sqrt(n - 3),
      ``p_tost = max(p_lower, p_upper)``; equivalent (|rho| < bound) when ``p_tost < alpha``,
      i.e. when the Fisher (1 - 2 alpha) interval ``ci_tost`` lies inside (-bound, bound);
    * ``power`` and ``tost_power``: the design's exact power to detect rho = ``bound`` and to
      declare equivalence at rho = 0 (`correlation_power`, `tost_power`).

    Needs n >= 4 and values that vary."""
    st, _ = stats_modules()
    xa, ya = _clean_xy(x, y)
    n = int(len(xa))
    if n < 4:
        raise BlockCouplingError(f"the correlation tests need at least 4 units, got {n}")
    if np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise BlockCouplingError("the correlation tests need values that vary; "
                                 f"{'x' if np.ptp(xa) == 0 else 'y'} is constant")
    res = st.pearsonr(xa, ya, alternative="greater")
    r = float(res.statistic)
    lr = st.linregress(xa, ya)
    se = 1.0 / math.sqrt(n - 3)
    z = math.atanh(min(max(r, -1 + 1e-15), 1 - 1e-15))
    p_lower = float(st.norm.sf((z - math.atanh(-bound)) / se))   # H0: rho <= -bound
    p_upper = float(st.norm.cdf((z - math.atanh(bound)) / se))   # H0: rho >= +bound
    half = float(st.norm.isf(alpha)) * se
    p_tost = max(p_lower, p_upper)
    return {"n": n, "r": r, "p_greater": float(res.pvalue), "slope": float(lr.slope),
            "intercept": float(lr.intercept), "slope_stderr": float(lr.stderr),
            "bound": bound, "alpha": alpha, "p_tost_lower": p_lower, "p_tost_upper": p_upper,
            "p_tost": p_tost, "equivalent": bool(p_tost < alpha),
            "ci_tost": [math.tanh(z - half), math.tanh(z + half)],
            "ci_tost_level": 1 - 2 * alpha,
            "power": correlation_power(n, bound, alpha),
            "tost_power": tost_power(n, bound, alpha)}
