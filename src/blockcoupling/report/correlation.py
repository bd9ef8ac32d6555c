"""Figures and pages of the correlation study (paper fig. 1a, 8, 9) and of the width floor:
the score against each predictor with its least-squares line and 95% band (statsmodels OLS),
the exponential fit, and the tables of results overall and per group. Draws any
`CorrelationData` / `ChanceFloorData` (the report layer imports nothing from the studies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from blockcoupling.report.figures.base import TICK_CHARS, clip
from blockcoupling.report.summaries import short_name

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


class CorrelationData(Protocol):
    """What the correlation page draws: one row per model in ``table`` (``label``, ``score``
    and one column per predictor), the statistics ``overall`` and per group, the coupling
    statistic used and the study's settings."""

    @property
    def table(self) -> pd.DataFrame: ...
    def describe_statistic(self) -> str: ...
    @property
    def scores_source(self) -> str: ...
    @property
    def overall(self) -> dict[str, Any]: ...
    @property
    def groups(self) -> dict[str, dict[str, Any]]: ...
    @property
    def excluded(self) -> list[dict[str, str]]: ...
    @property
    def n_boot(self) -> int: ...
    @property
    def seed(self) -> int: ...


class ChanceFloorData(Protocol):
    """What the chance-floor page draws: one row per scored model in ``table`` (``model``,
    ``d_model``, ``k``, ``floor``, ``score``, optional ``name``/``group``), the regressions
    ``overall`` and per group, the K rule, the scores' source and the excluded rows."""

    @property
    def table(self) -> pd.DataFrame: ...
    @property
    def overall(self) -> dict[str, Any]: ...
    @property
    def groups(self) -> dict[str, dict[str, Any]]: ...
    @property
    def k_rule(self) -> str | int: ...
    @property
    def scores_source(self) -> str: ...
    @property
    def excluded(self) -> list[dict[str, str]]: ...


PRETTY = {
    "coupling_mean": "raw c_K (mean depth-wise coupling)",
    "coupling_vs_rotated_mean": "coupling above chance (coupling_vs_rotated)",
    "coupling_vs_null_mean": "coupling vs independent bases (coupling_vs_null)",
    "coupling_chance": "chance level of raw c_K",
    "log_d_model": "log10 d_model",
    "params_b": "parameters (billions)",
    "layers": "layers L",
    "d_model": "d_model",
    "train_tokens_t": "training tokens (T)",
    "log_params": "log10 parameters",
}


def fit_band(x: np.ndarray, y: np.ndarray, grid: np.ndarray, level: float = 0.95
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OLS line of y on x evaluated on ``grid`` with the ``level`` confidence band of the mean.
    Returns (mean, lower, upper), each (len(grid),)."""
    import statsmodels.api as sm

    fit = sm.OLS(y, sm.add_constant(x)).fit()
    pred = fit.get_prediction(sm.add_constant(grid, has_constant="add"))
    lo, hi = pred.conf_int(alpha=1 - level).T
    return pred.predicted_mean, lo, hi


def _xy(result: CorrelationData, name: str
        ) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray | None]:
    """x, y, labels and the x error bars (the statistic's se, where the predictor has one)."""
    t = result.table
    x, y = t[name].to_numpy(dtype=float), t["score"].to_numpy(dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    se_col = name[: -len("_mean")] + "_se" if name.endswith("_mean") else None
    se = t[se_col].to_numpy(dtype=float)[keep] if se_col in t.columns else None
    return x[keep], y[keep], [str(v) for v in t.loc[keep, "label"]], se


def _scatter(ax: Any, x: np.ndarray, y: np.ndarray, labels: Sequence[str],
             xerr: np.ndarray | None = None) -> None:
    if xerr is not None and np.isfinite(xerr).any():
        ax.errorbar(x, y, xerr=np.nan_to_num(xerr), fmt="none", ecolor="C0", alpha=0.6,
                    lw=0.8, capsize=2, zorder=2)
    ax.scatter(x, y, s=18, color="C0", zorder=3)
    for xi, yi, lab in zip(x, y, labels, strict=True):
        ax.annotate(clip(short_name(lab), TICK_CHARS), (xi, yi), xytext=(3, 3),
                    textcoords="offset points", fontsize=6, alpha=0.85)


def plot_predictors(result: CorrelationData) -> Figure:
    """One panel per regressed predictor: labelled points, OLS line and 95% band."""
    from matplotlib.figure import Figure

    stats = result.overall["predictors"]
    names = [n for n, r in stats.items() if "skipped" not in r]
    cols = min(3, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig = Figure(figsize=(4.2 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        x, y, labels, se = _xy(result, name)
        grid = np.linspace(x.min(), x.max(), 100)
        mean, lo, hi = fit_band(x, y, grid)
        ax.fill_between(grid, lo, hi, color="C1", alpha=0.2, lw=0, label="95% CI of the fit")
        ax.plot(grid, mean, color="C1", lw=1.5, label="least squares")
        _scatter(ax, x, y, labels, se)
        r = stats[name]
        ax.set_title(f"{PRETTY.get(name, name)}\nn={r['n']}  R²={r['r2']:.2f}  p={r['p']:.2g}",
                     fontsize=9)
        ax.set_xlabel(PRETTY.get(name, name), fontsize=8)
        ax.set_ylabel("score", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if names:
        axes[0].legend(fontsize=6, loc="best")
    return fig


def plot_exponential(result: CorrelationData) -> Figure:
    """Score against coupling with the straight line and the fit score = a exp(b coupling)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2, 4.0), layout="constrained")
    ax = fig.subplots()
    x, y, labels, se = _xy(result, "coupling_mean")
    grid = np.linspace(x.min(), x.max(), 100)
    lin = result.overall["predictors"].get("coupling_mean", {})
    if "slope" in lin:
        mean, lo, hi = fit_band(x, y, grid)
        ax.fill_between(grid, lo, hi, color="C1", alpha=0.2, lw=0)
        ax.plot(grid, mean, color="C1", label=f"linear, R²={lin['r2']:.2f}")
    ex = result.overall.get("exponential", {})
    if ex.get("converged"):
        ax.plot(grid, ex["a"] * np.exp(ex["b"] * grid), color="C2", ls="--",
                label=f"a·exp(b·c), R²={ex['r2']:.2f}")
    _scatter(ax, x, y, labels, se)
    ax.set_xlabel(PRETTY["coupling_mean"])
    ax.set_ylabel("score")
    ax.legend(fontsize=7)
    return fig


def _ci(r: dict[str, Any]) -> str:
    lo, hi = r["r2_ci"]
    return "-" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:.2f}, {hi:.2f}]"


def stats_frame(block: dict[str, Any]) -> pd.DataFrame:
    """The regressions of one block (``overall`` or a group) as a table, one row per
    predictor: n, slope, intercept, R^2, its bootstrap interval (or '-', see the notes), p and
    Spearman rho and p."""
    import pandas as pd

    rows = []
    for name, r in block.get("predictors", {}).items():
        if "skipped" in r:
            rows.append({"predictor": PRETTY.get(name, name), "n": None, "slope": None,
                         "intercept": None, "R²": None, "95% CI of R²": f"skipped: {r['skipped']}",
                         "p": None, "Pearson r": None, "Spearman ρ": None, "Spearman p": None})
            continue
        rows.append({"predictor": PRETTY.get(name, name), "n": r["n"], "slope": r["slope"],
                     "intercept": r["intercept"], "R²": r["r2"], "95% CI of R²": _ci(r),
                     "p": r["p"], "Pearson r": r["r"], "Spearman ρ": r["spearman_rho"],
                     "Spearman p": r["spearman_p"]})
    return pd.DataFrame(rows).set_index("predictor") if rows else pd.DataFrame()


def block_notes(block: dict[str, Any]) -> list[str]:
    """Which test gave the p-values of a block, and why an interval is missing."""
    stats = [r for r in block.get("predictors", {}).values() if "skipped" not in r]
    out = sorted({f"p-values (slope and Spearman): {r['p_method']}." for r in stats
                  if r.get("p_method")})
    out += sorted({f"R² interval: {r['r2_ci_note']}." for r in stats if r.get("r2_ci_note")})
    return out


def _block_html(block: dict[str, Any]) -> str:
    from blockcoupling.report.page import esc, notes_html, table_html

    parts = [table_html(stats_frame(block)), notes_html(block_notes(block))]
    ex = block.get("exponential", {})
    if "a" in ex:
        parts.append(f"<p>Exponential fit score = a·exp(b·raw c_K): a = {esc(_fmt(ex['a']))}, "
                     f"b = {esc(_fmt(ex['b']))}, R² = {esc(_fmt(ex['r2']))} (n = {ex['n']}).</p>")
    elif "skipped" in ex:
        parts.append(f"<p>Exponential fit skipped: {esc(ex['skipped'])}</p>")
    pcs = block.get("partial_correlations", [])
    if pcs:
        import pandas as pd

        frame = pd.DataFrame([{
            "predictor": PRETTY.get(pc["x"], pc["x"]),
            "controlling for": " + ".join(PRETTY.get(c, c) for c in pc["controlling_for"]),
            "n": pc.get("n"), "partial r": pc.get("r"), "p": pc.get("p"), "df": pc.get("df"),
            "note": pc.get("skipped") or pc.get("p_method")} for pc in pcs])
        parts.append("<h3>Partial correlations with the score</h3>"
                     + table_html(frame, index=False))
    fl = block.get("floor")
    if fl is not None and "skipped" not in fl:
        sc, rg = fl["score_on_chance"], fl["raw_given_chance"]
        parts.append("<p>Floor: the score regressed on the measured chance level of raw c_K: "
                     + (f"R² = {_fmt(sc['r2'])}, p = {_fmt(sc['p'])}" if "r2" in sc
                        else esc(sc["skipped"]))
                     + "; raw c_K given its chance level: "
                     + (f"partial r = {_fmt(rg['r'])}, p = {_fmt(rg['p'])}" if "r" in rg
                        else esc(rg["skipped"])) + ".</p>")
    elif fl is not None:
        parts.append(f"<p>Floor skipped: {esc(fl['skipped'])}</p>")
    return "".join(parts)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def write_correlation_html(result: CorrelationData, out: str | Path, *,
                           title: str = "Coupling and generalisation",
                           intro: str = "") -> Path:
    """Write the correlation page (the report template of `blockcoupling.report.page`:
    figures inline, the statistic used, the tables of results overall and per group, the
    models) and return its path."""
    from blockcoupling.engine.statistic import FLOOR_NOTE
    from blockcoupling.report.page import (
        Section,
        esc,
        figure_html,
        notes_html,
        paragraphs_html,
        table_html,
        write_page,
    )

    notes = getattr(result, "notes", None)
    lead = (paragraphs_html([intro]) if intro else "") + paragraphs_html([
        f"Coupling statistic: {result.describe_statistic()}.",
        f"Width floor: {FLOOR_NOTE}",
        f"Scores: {result.scores_source}. Models: {len(result.table)}. Bootstrap: "
        f"{result.n_boot} resamples, seed {result.seed}. Statistics: scipy.stats (linregress, "
        "spearmanr, permutation_test, bootstrap), statsmodels (OLS)."])
    if callable(notes):
        lead += notes_html(notes())
    if result.excluded:
        lead += paragraphs_html(["Excluded: " + "; ".join(
            f"{e['label']} ({e['reason']})" for e in result.excluded)])
    sections = []
    for i, (name, head, make, caption) in enumerate((
            ("predictors", "Score against each predictor", lambda: plot_predictors(result),
             "The score against each predictor (paper fig. 1a, 9): one point per model "
             "(labelled; horizontal bars one standard error of the statistic over prompts), "
             "the least-squares line and its 95% confidence band of the mean (statsmodels "
             "OLS); n, R² and p of the slope (see the notes for the test) above each panel."),
            ("exponential", "Linear and exponential fit", lambda: plot_exponential(result),
             "The score against raw c_K with the straight line and the fit score = "
             "a·exp(b·c) (arXiv v1 fig. 8).")), start=1):
        sections.append(Section(name, f"{i}. {head}",
                                figure_html(make(), caption, title=head, number=i)))
    sections.append(Section("all-models", "All models", _block_html(result.overall)))
    for g, block in result.groups.items():
        body = (f"<p>n = {block['n']}: skipped ({esc(block['skipped'])})</p>"
                if "skipped" in block else _block_html(block))
        sections.append(Section(f"group-{g}", f"Group {g}", body))
    sections.append(Section("models", "Models", table_html(_models_frame(result), index=False)))
    return write_page(Path(out), title, sections, lead=lead)


def _models_frame(result: CorrelationData) -> pd.DataFrame:
    cols = [c for c in ("label", "score_model", "group", "k", "n_prompts",
                        "coupling_vs_rotated_mean", "coupling_vs_rotated_se",
                        "coupling_vs_null_mean", "coupling_vs_null_se", "coupling_mean",
                        "coupling_se", "coupling_chance", "score", "params_b", "layers",
                        "d_model", "train_tokens_t")
            if c in result.table.columns]
    return result.table[cols].astype(object).where(result.table[cols].notna(), None)


def plot_chance_floor(result: ChanceFloorData) -> Figure:
    """Score against the width floor of raw c_K, one colour and least-squares line per group
    (all rows in one line where the table has no group)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6, 4.2), layout="constrained")
    ax = fig.subplots()
    t = result.table
    groups = (t.groupby(t["group"].fillna("(none)").astype(str), sort=True)
              if "group" in t.columns and t["group"].notna().any() else [("all", t)])
    for i, (g, sub) in enumerate(groups):
        x, y = sub["floor"].to_numpy(dtype=float), sub["score"].to_numpy(dtype=float)
        fit = result.groups.get(str(g), result.overall)
        label = str(g) + (f": R²={fit['r2']:.2f}, p={fit['p']:.2g}, n={fit['n']}"
                          if "r2" in fit else f" (n={len(sub)})")
        ax.scatter(x, y, s=18, color=f"C{i}", label=label, zorder=3)
        if "slope" in fit:
            grid = np.linspace(x.min(), x.max(), 50)
            ax.plot(grid, fit["intercept"] + fit["slope"] * grid, color=f"C{i}", lw=1.2)
        names = sub["name"] if "name" in sub.columns else sub["model"]
        for xi, yi, lab in zip(x, y, names, strict=True):
            ax.annotate(clip(short_name(str(lab)), TICK_CHARS), (xi, yi), xytext=(3, 3),
                        textcoords="offset points", fontsize=5.5, alpha=0.8)
    ax.set_xlabel("chance level of raw c_K for a flat spectrum, 1 - sqrt(1/d + 1/K)")
    ax.set_ylabel("score")
    ax.legend(fontsize=7)
    return fig


def write_chance_floor_html(result: ChanceFloorData, out: str | Path) -> Path:
    """The chance-floor page (the report template): the floor figure, the regressions and
    the rows used."""
    import pandas as pd

    from blockcoupling.engine.statistic import FLOOR_NOTE
    from blockcoupling.report.page import (
        Section,
        figure_html,
        paragraphs_html,
        table_html,
        write_page,
    )

    k = "K = round(d/10)" if result.k_rule == "d/10" else f"K = {result.k_rule}"
    def side(r: dict[str, Any]) -> dict[str, Any]:
        """The width's own fit and the fit without the family it leans on most."""
        w = r.get("width") or {}
        fam = r.get("most_influential_family")
        f = r["without_family"][fam] if fam else {}
        return {"width R²": w.get("r2"), "width p": w.get("p"),
                "without": f"{fam} (n = {f['n']})" if fam else None,
                "R² without": f.get("r2"), "p without": f.get("p")}

    fits = pd.DataFrame([
        {"rows": name, "n": r.get("n"), "slope": r.get("slope"), "R²": r.get("r2"),
         "p": r.get("p"), **side(r), "note": r.get("skipped")}
        for name, r in [("all", result.overall), *result.groups.items()]])
    t = result.table
    rows = pd.DataFrame({"model": t["name"] if "name" in t.columns else t["model"],
                         "group": t["group"] if "group" in t.columns else None,
                         "d_model": t["d_model"].astype(int), "K": t["k"].astype(int),
                         "floor": t["floor"], "score": t["score"]})
    lead = paragraphs_html([
        f"Scores: {result.scores_source}. No model was measured: each row's floor is the "
        f"flat-spectrum chance level of raw c_K at {k} from its d_model alone.", FLOOR_NOTE]
        + (["Excluded: " + "; ".join(f"{e['model']} ({e['reason']})" for e in result.excluded)]
           if result.excluded else []))
    caption = ("The score of each model against the chance level of raw c_K for a flat "
               f"spectrum, 1 - sqrt(1/d + 1/K) ({k}), one colour and least-squares line per "
               "group; R², p and n of each group's regression in the legend.")
    sections = [
        Section("floor", "1. Score against the width floor",
                figure_html(plot_chance_floor(result), caption,
                            title="score against the floor", number=1)),
        Section("regressions", "Regressions of the score on the floor",
                paragraphs_html(["Beside each: the score on log10 d_model (the width itself), "
                                 "and the floor's fit without the model family whose removal "
                                 "lowers R² most."]) + table_html(fits, index=False)),
        Section("rows", "Rows", table_html(rows, index=False)),
    ]
    return write_page(Path(out), "Width floor of raw c_K", sections, lead=lead)


__all__ = ["block_notes", "fit_band", "plot_chance_floor", "plot_exponential",
           "plot_predictors", "stats_frame", "write_chance_floor_html",
           "write_correlation_html"]
