"""Figures and a self-contained HTML page for the correlation study (paper fig. 1a, 8, 9).

- :func:`plot_predictors`: one panel per predictor (coupling first, then parameters, depth,
  d_model, training tokens, log10 parameters), score against predictor, every model labelled,
  the least-squares line with its 95% confidence band for the mean (statsmodels OLS
  ``get_prediction``) and n, R^2, p in the panel title.
- :func:`plot_exponential`: score against coupling with the linear and the exponential fit.
- :func:`write_correlation_html`: both figures embedded as base64 PNGs, the statistic used,
  the tables of results (overall and per group) and the models; no external resource.

The page takes any :class:`CorrelationData` (the study's
:class:`~blockcoupling.studies.correlate.CorrelationResult` is one): the report layer imports
nothing from the studies.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


class _Described(Protocol):
    def describe(self) -> str: ...


class CorrelationData(Protocol):
    """What the correlation page draws: one row per model in ``table`` (``label``, ``score``
    and one column per predictor), the statistics ``overall`` and per group, the coupling
    statistic used and the study's settings."""

    @property
    def table(self) -> pd.DataFrame: ...
    @property
    def statistic(self) -> _Described: ...
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
        ax.annotate(lab, (xi, yi), xytext=(3, 3), textcoords="offset points", fontsize=6,
                    alpha=0.85)


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


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return base64.b64encode(buf.getvalue()).decode()


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return html.escape(str(v))


def _stats_table(block: dict[str, Any]) -> str:
    head = ("<tr><th>predictor</th><th>n</th><th>slope</th><th>intercept</th><th>R²</th>"
            "<th>95% CI of R² (bootstrap)</th><th>p</th><th>Pearson r</th><th>Spearman ρ</th>"
            "<th>Spearman p</th></tr>")
    rows = []
    for name, r in block.get("predictors", {}).items():
        if "skipped" in r:
            rows.append(f"<tr><td>{html.escape(name)}</td><td colspan=9>skipped: "
                        f"{html.escape(r['skipped'])}</td></tr>")
            continue
        lo, hi = r["r2_ci"]
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{r['n']}</td><td>{_fmt(r['slope'])}</td>"
            f"<td>{_fmt(r['intercept'])}</td><td>{_fmt(r['r2'])}</td>"
            f"<td>[{_fmt(lo, 2)}, {_fmt(hi, 2)}]</td><td>{_fmt(r['p'])}</td>"
            f"<td>{_fmt(r['r'])}</td><td>{_fmt(r['spearman_rho'])}</td>"
            f"<td>{_fmt(r['spearman_p'])}</td></tr>")
    out = f"<table>{head}{''.join(rows)}</table>"
    ex = block.get("exponential", {})
    if "a" in ex:
        out += (f"<p>Exponential fit score = a·exp(b·raw c_K): a = {_fmt(ex['a'])}, "
                f"b = {_fmt(ex['b'])}, R² = {_fmt(ex['r2'])} (n = {ex['n']}).</p>")
    elif "skipped" in ex:
        out += f"<p>Exponential fit skipped: {html.escape(ex['skipped'])}</p>"
    rows = []
    for pc in block.get("partial_correlations", []):
        given = html.escape(" + ".join(pc["controlling_for"]))
        cells = (f"<td>{pc['n']}</td><td>{_fmt(pc['r'])}</td><td>{_fmt(pc['p'])}</td>"
                 f"<td>{pc['df']}</td>" if "r" in pc else
                 f"<td colspan=4>skipped: {html.escape(pc['skipped'])}</td>")
        rows.append(f"<tr><td>{html.escape(pc['x'])}</td><td>{given}</td>{cells}</tr>")
    if rows:
        out += ("<p>Partial correlations with the score (statsmodels OLS):</p><table><tr>"
                "<th>predictor</th><th>controlling for</th><th>n</th><th>partial r</th>"
                "<th>p</th><th>df</th></tr>" + "".join(rows) + "</table>")
    fl = block.get("floor")
    if fl is not None and "skipped" not in fl:
        sc, rg = fl["score_on_chance"], fl["raw_given_chance"]
        out += ("<p>Floor: the score regressed on the measured chance level of raw c_K: "
                + (f"R² = {_fmt(sc['r2'])}, p = {_fmt(sc['p'])}" if "r2" in sc
                   else html.escape(sc["skipped"]))
                + "; raw c_K given its chance level: "
                + (f"partial r = {_fmt(rg['r'])}, p = {_fmt(rg['p'])}" if "r" in rg
                   else html.escape(rg["skipped"])) + ".</p>")
    elif fl is not None:
        out += f"<p>Floor skipped: {html.escape(fl['skipped'])}</p>"
    return out


def _models_table(result: CorrelationData) -> str:
    cols = [c for c in ("label", "score_model", "group", "k", "n_prompts",
                        "coupling_vs_rotated_mean", "coupling_vs_rotated_se",
                        "coupling_vs_null_mean", "coupling_vs_null_se", "coupling_mean",
                        "coupling_se", "coupling_chance", "score", "params_b", "layers",
                        "d_model", "train_tokens_t")
            if c in result.table.columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_fmt(row[c], 4) if isinstance(row[c], float) else _fmt(row[c])}"
                         "</td>" for c in cols) + "</tr>"
        for _, row in result.table[cols].astype(object).iterrows())
    return f"<table><tr>{head}</tr>{body}</table>"


def write_correlation_html(result: CorrelationData, out: str | Path, *,
                           title: str = "Coupling and generalisation",
                           intro: str = "") -> Path:
    """Write one self-contained HTML page (figures inline) and return its path."""
    from blockcoupling.engine.statistic import FLOOR_NOTE

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figs = [("Score against each predictor (paper fig. 1a, 9)", plot_predictors(result)),
            ("Linear and exponential fit (arXiv v1 fig. 8)", plot_exponential(result))]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:"
        "1100px;margin:auto}table{border-collapse:collapse;font-size:12px;margin:8px 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
        "</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(intro)}</p>" if intro else "",
        f"<p><b>Coupling statistic:</b> {html.escape(result.statistic.describe())}.<br>"
        f"<b>Width floor:</b> {html.escape(FLOOR_NOTE)}<br>"
        f"<b>Scores:</b> {html.escape(result.scores_source)}. <b>Models:</b> {len(result.table)}. "
        f"Bootstrap: {result.n_boot} resamples, seed {result.seed}. Statistics: scipy.stats "
        "(linregress, spearmanr, bootstrap), statsmodels (OLS).</p>",
    ]
    if result.excluded:
        parts.append("<p>Excluded: " + "; ".join(
            f"{html.escape(e['label'])} ({html.escape(e['reason'])})" for e in result.excluded)
            + "</p>")
    for caption, fig in figs:
        parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,"
                     f"{_png(fig)}'><figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("<h2>All models</h2>" + _stats_table(result.overall))
    for g, block in result.groups.items():
        if "skipped" in block:
            parts.append(f"<h2>Group {html.escape(g)}</h2><p>n = {block['n']}: skipped "
                         f"({html.escape(block['skipped'])})</p>")
        else:
            parts.append(f"<h2>Group {html.escape(g)}</h2>" + _stats_table(block))
    parts.append("<h2>Models</h2>" + _models_table(result))
    parts.append("</body></html>")
    out.write_text("\n".join(parts), encoding="utf-8")
    return out


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
            ax.annotate(str(lab), (xi, yi), xytext=(3, 3), textcoords="offset points",
                        fontsize=5.5, alpha=0.8)
    ax.set_xlabel("chance level of raw c_K for a flat spectrum, 1 - sqrt(1/d + 1/K)")
    ax.set_ylabel("score")
    ax.legend(fontsize=7)
    return fig


def write_chance_floor_html(result: ChanceFloorData, out: str | Path) -> Path:
    """One self-contained page: the floor figure, the regressions and the rows used."""
    from blockcoupling.engine.statistic import FLOOR_NOTE

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    k = "K = round(d/10)" if result.k_rule == "d/10" else f"K = {result.k_rule}"
    def side(r: dict[str, Any]) -> str:
        """The width's own fit and the fit without the family it leans on most."""
        w = r.get("width") or {}
        width = (f"<td>{_fmt(w['r2'])}</td><td>{_fmt(w['p'])}</td>" if "r2" in w else
                 "<td colspan=2>-</td>")
        fam = r.get("most_influential_family")
        if not fam:
            return width + "<td colspan=3>-</td>"
        f = r["without_family"][fam]
        return (width + f"<td>{html.escape(fam)} (n = {f['n']})</td><td>{_fmt(f['r2'])}</td>"
                f"<td>{_fmt(f['p'])}</td>")

    fits = "".join(
        f"<tr><td>{html.escape(name)}</td>" + (
            f"<td>{r['n']}</td><td>{_fmt(r['slope'])}</td><td>{_fmt(r['r2'])}</td>"
            f"<td>{_fmt(r['p'])}</td>" + side(r) if "r2" in r else
            f"<td>{r.get('n', 0)}</td><td colspan=8>skipped: {html.escape(r['skipped'])}</td>")
        + "</tr>" for name, r in [("all", result.overall), *result.groups.items()])
    rows = "".join(
        f"<tr><td>{html.escape(str(r.get('name', r['model'])))}</td>"
        f"<td>{html.escape(str(r.get('group', '')))}</td><td>{int(r['d_model'])}</td>"
        f"<td>{int(r['k'])}</td><td>{r['floor']:.4f}</td><td>{_fmt(float(r['score']), 4)}</td></tr>"
        for _, r in result.table.iterrows())
    excluded = "; ".join(f"{html.escape(e['model'])} ({html.escape(e['reason'])})"
                         for e in result.excluded)
    page = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Width floor of raw c_K</title>"
        "<style>body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:"
        "collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        "img{max-width:100%}</style></head><body><h1>Width floor of raw c_K</h1>",
        f"<p>Scores: {html.escape(result.scores_source)}. No model was measured: each row's "
        f"floor is the flat-spectrum chance level of raw c_K at {k} from its d_model alone."
        f"</p><p>{html.escape(FLOOR_NOTE)}</p>",
        f"<figure><img alt='score against the floor' src='data:image/png;base64,"
        f"{_png(plot_chance_floor(result))}'></figure>",
        "<h2>Regressions of the score on the floor</h2><p>Beside each: the score on log10 "
        "d_model (the width itself), and the floor's fit without the model family whose "
        "removal lowers R² most.</p><table><tr><th>rows</th><th>n</th>"
        "<th>slope</th><th>R²</th><th>p</th><th>width R²</th><th>width p</th>"
        f"<th>without</th><th>R²</th><th>p</th></tr>{fits}</table>",
        f"<p>Excluded: {excluded}</p>" if excluded else "",
        "<h2>Rows</h2><table><tr><th>model</th><th>group</th><th>d_model</th><th>K</th>"
        f"<th>floor</th><th>score</th></tr>{rows}</table></body></html>"]
    out.write_text("\n".join(page), encoding="utf-8")
    return out


__all__ = ["fit_band", "plot_chance_floor", "plot_exponential", "plot_predictors",
           "write_chance_floor_html", "write_correlation_html"]
