"""Figures of the ViT study (paper figs. 6, 11, 12), drawn from ``vit-train`` outputs only.

The tables come from `blockcoupling.studies.vit.grid.collect_runs` (one row per run)
and `collect_epochs` (one row per run and epoch);
``coupling`` is the mean depth-wise coupling at the [CLS] token over layer pairs l != l'
(K = the run's ``k``, p = 1, orientation ujv), averaged over the measured test images.

1. `plot_coupling_vs_drop_path` - coupling against the stochastic-depth rate, one line
   per weight decay (mean over seeds) [fig. 6 left].
2. `plot_coupling_vs_accuracy` - test accuracy against coupling, coloured by drop-path
   rate, with the least-squares line, R^2 and p-value (scipy.stats.linregress) [fig. 6 right].
3. `plot_coupling_epochs` - coupling and test accuracy across epochs, one line per run
   coloured by drop-path rate (epoch 0 = initialisation) [figs. 11, 12].
4. `plot_conditional_fits` - the paper's conditional fits (``studies.vit.fits``):
   coupling against drop-path rate at each fixed weight decay, and against log10 weight decay
   at each fixed drop-path rate, points with the statistic's se as error bars, the fitted
   lines, slope, R^2 and p in the legend.
5. `plot_accuracy_fits` - test accuracy against coupling within each fixed weight decay
   [fig. 12] and within each fixed drop-path rate (the paper's conditional claim): one panel
   per fixed value, points, OLS line, R^2 and p.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from blockcoupling.report.figures import FigureUnavailable, save_figure
from blockcoupling.report.figures.base import new_figure as _new_figure

_CMAP = "viridis"


def _finite(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    return df.dropna(subset=list(cols)) if not df.empty else df


def _colour_bar(fig: Figure, ax: Any, norm: Normalize, label: str) -> None:
    from matplotlib.cm import ScalarMappable

    fig.colorbar(ScalarMappable(norm=norm, cmap=colormaps[_CMAP]), ax=ax, label=label)


def _norm(values: pd.Series) -> Normalize:
    lo, hi = float(values.min()), float(values.max())
    return Normalize(lo, hi if hi > lo else lo + 1e-9)


def chance_level(df: pd.DataFrame, column: str) -> float | None:
    """The chance level of a coupling ``column``: 0 for a chance-corrected variant
    (``coupling_vs_rotated``, ``coupling_vs_null``, their ``_cls`` / ``_last`` forms), the
    runs' chance level c_null for raw c_K (``coupling_chance``, ``coupling_chance_cls``, ...;
    their mean: one per width and K); None where it was not recorded."""
    if column.startswith("coupling_vs_"):
        return 0.0
    if not column.startswith("coupling"):
        return None
    chance = "coupling_chance" + column[len("coupling"):]
    values = pd.to_numeric(df[chance], errors="coerce").dropna() if chance in df else None
    return float(values.mean()) if values is not None and len(values) else None


def _chance_line(ax: Any, df: pd.DataFrame, column: str, *, vertical: bool = False) -> None:
    """The chance level of ``column`` as a dotted grey line labelled ``chance``."""
    level = chance_level(df, column)
    if level is None:
        return
    line = ax.axvline if vertical else ax.axhline
    line(level, color="0.45", lw=1.0, ls=":", label=f"chance ({level:.3g})", zorder=1)


def plot_coupling_vs_drop_path(runs: pd.DataFrame, *, column: str = "coupling") -> Figure:
    """Coupling (``column``) against drop-path rate, one line per weight decay."""
    df = _finite(runs, column)
    if df.empty:
        raise FigureUnavailable("no finished ViT runs with a coupling value")
    fig = _new_figure(5.2, 3.6)
    ax = fig.subplots()
    norm = _norm(np.log10(df["weight_decay"].clip(lower=1e-12)))
    for wd, g in df.groupby("weight_decay"):
        agg = g.groupby("drop_path")[column].agg(["mean", "std", "count"]).reset_index()
        colour = colormaps[_CMAP](norm(math.log10(max(float(wd), 1e-12))))
        ax.plot(agg["drop_path"], agg["mean"], "o-", color=colour, label=f"wd {wd:g}")
        if (agg["count"] > 1).any():
            ax.fill_between(agg["drop_path"], agg["mean"] - agg["std"].fillna(0),
                            agg["mean"] + agg["std"].fillna(0), color=colour, alpha=0.15)
    _chance_line(ax, df, column)
    ax.set_xlabel("stochastic-depth (drop-path) rate")
    ax.set_ylabel("mean depth-wise coupling (CLS)")
    ax.legend(fontsize=7, title="weight decay", title_fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return fig


def coupling_accuracy_fit(runs: pd.DataFrame, *, column: str = "coupling") -> dict[str, float]:
    """Least squares of test accuracy on coupling: slope, intercept, r^2, p-value, n."""
    from scipy import stats

    df = _finite(runs, column, "test_accuracy")
    if len(df) < 3 or df[column].nunique() < 2:
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan, "p": math.nan,
                "n": float(len(df))}
    res = stats.linregress(df[column].to_numpy(float), df["test_accuracy"].to_numpy(float))
    return {"slope": float(res.slope), "intercept": float(res.intercept),
            "r2": float(res.rvalue**2), "p": float(res.pvalue), "n": float(len(df))}


def plot_coupling_vs_accuracy(runs: pd.DataFrame, *, column: str = "coupling") -> Figure:
    """Test accuracy against coupling, one point per run, coloured by drop-path rate."""
    df = _finite(runs, column, "test_accuracy")
    if df.empty:
        raise FigureUnavailable("no finished ViT runs with coupling and test accuracy")
    fig = _new_figure(5.2, 3.6)
    ax = fig.subplots()
    norm = _norm(df["drop_path"])
    ax.scatter(df[column], df["test_accuracy"], c=df["drop_path"], cmap=_CMAP, norm=norm,
               edgecolors="k", linewidths=0.4, zorder=3)
    fit = coupling_accuracy_fit(df, column=column)
    _chance_line(ax, df, column, vertical=True)
    if not math.isnan(fit["r2"]):
        xs = np.linspace(df[column].min(), df[column].max(), 50)
        ax.plot(xs, fit["intercept"] + fit["slope"] * xs, "k--", lw=1,
                label=f"fit: R$^2$ = {fit['r2']:.2f}, p = {fit['p']:.2g} (n = {int(fit['n'])})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    _colour_bar(fig, ax, norm, "drop-path rate")
    ax.set_xlabel("mean depth-wise coupling (CLS)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    return fig


def plot_coupling_epochs(epochs: pd.DataFrame) -> Figure:
    """Coupling and test accuracy against epoch, one line per run (colour = drop-path rate)."""
    df = _finite(epochs, "coupling")
    if df.empty:
        raise FigureUnavailable("no coupling was measured during training (monitor_every=0?)")
    fig = _new_figure(8.6, 3.4)
    ax_c, ax_a = fig.subplots(1, 2)
    norm = _norm(df["drop_path"])
    for _, g in df.groupby("name"):
        g = g.sort_values("epoch")
        colour = colormaps[_CMAP](norm(float(g["drop_path"].iloc[0])))
        ax_c.plot(g["epoch"], g["coupling"], "o-", ms=3, color=colour, lw=1)
    for _, g in epochs.groupby("name"):
        g = g.sort_values("epoch")
        colour = colormaps[_CMAP](norm(float(g["drop_path"].iloc[0])))
        ax_a.plot(g["epoch"], g["test_accuracy"], "-", color=colour, lw=1)
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_c, ax_a):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _chance_line(ax_c, df, "coupling")
    if ax_c.get_legend_handles_labels()[0]:
        ax_c.legend(fontsize=7)
    ax_c.set_xlabel("epoch")
    ax_c.set_ylabel("mean depth-wise coupling (CLS)")
    ax_a.set_xlabel("epoch")
    ax_a.set_ylabel("test accuracy")
    for ax in (ax_c, ax_a):
        ax.grid(alpha=0.3)
    _colour_bar(fig, ax_a, norm, "drop-path rate")
    return fig


def _fit_label(prefix: str, f: dict[str, Any]) -> str:
    if math.isnan(f["r2"]):
        return f"{prefix}: slope {f['slope']:.3g} (n = {f['n']}, no test)"
    return f"{prefix}: slope {f['slope']:.3g}, R$^2$ {f['r2']:.2f}, p {f['p']:.2g} (n = {f['n']})"


def plot_conditional_fits(fits: dict[str, Any]) -> Figure:
    """Two panels from a ``conditional_fits`` dict: coupling vs drop-path rate per weight
    decay, and coupling vs log10 weight decay per drop-path rate (points +- se, fit lines)."""
    if not fits.get("n_runs"):
        raise FigureUnavailable("no finished ViT runs with a coupling value")
    fig = _new_figure(9.0, 3.6)
    axes = fig.subplots(1, 2)
    panels = (("by_weight_decay", "weight_decay", "wd", "drop-path rate"),
              ("by_drop_path", "drop_path", "dp", "log10 weight decay"))
    for ax, (key, fixed, short, xlabel) in zip(axes, panels, strict=True):
        groups = fits[key]
        for i, f in enumerate(groups):
            colour = colormaps[_CMAP](i / max(len(groups) - 1, 1))
            pts = f["points"]
            xs = np.array([q["x"] for q in pts])
            ax.errorbar(xs, [q["y"] for q in pts], yerr=[q["se"] for q in pts], fmt="o",
                        color=colour, capsize=3, ms=4)
            if not math.isnan(f["slope"]):
                grid = np.linspace(xs.min(), xs.max(), 20)
                ax.plot(grid, f["intercept"] + f["slope"] * grid, "-", color=colour, lw=1,
                        label=_fit_label(f"{short} {f[fixed]:g}", f))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(fits["column"])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    return fig


_FIXED = {"weight_decay": ("weight decay", "wd"), "drop_path": ("drop-path rate", "dp")}


def plot_accuracy_fits(fits: dict[str, Any], fixed: str = "weight_decay") -> Figure:
    """The paper's conditional accuracy fits (fig. 12 for ``fixed="weight_decay"``; the main
    text's "fixing SD rate" for ``"drop_path"``): one panel per fixed value, test accuracy
    against coupling (``fits["column"]``), one point per run with the statistic's se as a
    horizontal error bar, the OLS line, and n, R^2 and p in the panel's title."""
    groups = fits.get(f"accuracy_by_{fixed}") or []
    if not fits.get("n_runs") or not groups:
        raise FigureUnavailable("no finished ViT runs with coupling and test accuracy")
    name, short = _FIXED[fixed]
    ncols = min(4, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig = _new_figure(2.6 * ncols, 2.3 * nrows)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, f in zip(axes, groups, strict=False):
        pts = f["points"]
        xs = np.array([q["x"] for q in pts])
        ax.errorbar(xs, [q["y"] for q in pts], xerr=[q["x_se"] for q in pts], fmt="o", ms=4,
                    capsize=2, color="C0")
        if not math.isnan(f["slope"]):
            grid = np.linspace(xs.min(), xs.max(), 20)
            ax.plot(grid, f["intercept"] + f["slope"] * grid, "-", color="C3", lw=1)
        stat = (f"R$^2$ {f['r2']:.2f}, p {f['p']:.2g}" if not math.isnan(f["r2"])
                else "no test")
        ax.set_title(f"{short} {f[fixed]:g}: {stat} (n = {f['n']})", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    fig.supxlabel(f"{fits['column']} (final, per run)", fontsize=8)
    fig.supylabel("test accuracy", fontsize=8)
    return fig


FIGURES = {
    "vit_coupling_vs_drop_path": lambda runs, epochs: plot_coupling_vs_drop_path(runs),
    "vit_coupling_vs_accuracy": lambda runs, epochs: plot_coupling_vs_accuracy(runs),
    "vit_coupling_epochs": lambda runs, epochs: plot_coupling_epochs(epochs),
}
FITS_FILE = "fits.json"


def _figures(runs: pd.DataFrame, epochs: pd.DataFrame, fits: dict[str, Any]
             ) -> list[tuple[str, Any]]:
    """(name, figure maker) of every ViT figure, the conditional fits' last."""
    return [*((n, lambda make=make: make(runs, epochs)) for n, make in FIGURES.items()),
            ("vit_conditional_fits", lambda: plot_conditional_fits(fits)),
            ("vit_accuracy_by_weight_decay", lambda: plot_accuracy_fits(fits, "weight_decay")),
            ("vit_accuracy_by_drop_path", lambda: plot_accuracy_fits(fits, "drop_path"))]


def _no_trainings(root: str | Path) -> NoReturn:
    """The line for a folder without ``vit-train`` outputs: what it is if another command
    wrote it (`store.folder.another_kind`)."""
    from blockcoupling.store.folder import VIT_TRAINING, another_kind

    if (other := another_kind(Path(root), VIT_TRAINING,
                              fix="give a vit-grid or a folder of vit-train outputs")):
        raise FigureUnavailable(str(other))
    raise FigureUnavailable(f"no vit-train outputs (metrics.json) under {root}")


def write_vit_figures(root: str | Path, out: str | Path, *,
                      formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """Every ViT figure for the ``vit-train`` outputs under ``root`` into ``out``, plus
    ``vit_runs.csv`` and ``vit_epochs.csv`` (the tables they are drawn from) and
    ``fits.json`` (the pooled and conditional fits; NaN written as null). A figure whose
    data is missing is skipped. Returns the paths written."""
    from blockcoupling.store.fileio import write_json
    from blockcoupling.studies.vit.fits import conditional_fits
    from blockcoupling.studies.vit.grid import collect_epochs, collect_runs

    runs = collect_runs(root)
    epochs = collect_epochs(root)
    if runs.empty:
        _no_trainings(root)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    written = []
    runs.to_csv(outp / "vit_runs.csv", index=False)
    epochs.to_csv(outp / "vit_epochs.csv", index=False)
    written += [outp / "vit_runs.csv", outp / "vit_epochs.csv"]
    fits = conditional_fits(runs)
    write_json(outp / FITS_FILE, fits)
    written.append(outp / FITS_FILE)
    for name, make in _figures(runs, epochs, fits):
        try:
            fig = make()
        except FigureUnavailable:
            continue
        written += save_figure(fig, outp / name, formats)
    return written


_CAPTIONS = {
    "vit_coupling_vs_drop_path": ("Coupling against the stochastic-depth rate",
                                  "Final mean depth-wise coupling at [CLS] of each run against its "
                                  "drop-path rate, one line per weight decay (paper figs. 6, 11); dotted: "
                                  "the chance level (c_null for raw c_K, 0 for a "
                                  "chance-corrected variant)."),
    "vit_coupling_vs_accuracy": ("Coupling against test accuracy",
                                 "Final coupling against test accuracy, colour = drop-path rate, "
                                 "with the least-squares line and its R^2 and p (paper fig. 12); "
                                 "dotted: the chance level of the coupling axis."),
    "vit_coupling_epochs": ("Coupling across epochs",
                            "Coupling on the fixed monitor images at every measured epoch "
                            "(epoch 0 = initialisation), one line per run; dotted: the chance "
                            "level."),
    "vit_conditional_fits": ("Conditional fits",
                             "coupling_vs_null against the drop-path rate at each fixed weight "
                             "decay (left) and against log10 weight decay at each fixed "
                             "drop-path rate (right): one point per run with the statistic's "
                             "se, OLS lines; the table above gives slope, R^2 and p."),
    "vit_accuracy_by_weight_decay": (
        "Accuracy against coupling at a fixed weight decay (paper fig. 12)",
        "Test accuracy against the final coupling_vs_null, one panel per weight decay (the "
        "runs of that decay: one per drop-path rate and seed), one point per run with the "
        "statistic's se over its images as a horizontal bar, the OLS line, n, R^2 and p "
        "(scipy.stats.linregress; the table above: accuracy_by_weight_decay)."),
    "vit_accuracy_by_drop_path": (
        "Accuracy against coupling at a fixed drop-path rate",
        "The paper's conditional claim (coupling correlates with accuracy when the "
        "stochastic-depth rate is fixed): test accuracy against the final coupling_vs_null, "
        "one panel per drop-path rate (its runs over the weight decays and seeds), OLS line, "
        "n, R^2 and p (the table above: accuracy_by_drop_path)."),
}


def write_vit_report(root: str | Path, out: str | Path, *,
                     formats: tuple[str, ...] = ("png",)) -> Path:
    """A self-contained HTML page for the ``vit-train`` / ``vit-grid`` outputs under ``root``:
    the runs table and every ViT figure whose data exists (figure files beside it in
    ``<out stem>_figures/``). Returns the HTML path."""
    from blockcoupling.report.page import Section, figure_html, table_html, write_page
    from blockcoupling.studies.vit.fits import conditional_fits, fits_table
    from blockcoupling.studies.vit.grid import collect_epochs, collect_runs

    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise FigureUnavailable(f"report path {out}: give a file name ending in .html")
    runs, epochs = collect_runs(root), collect_epochs(root)
    if runs.empty:
        _no_trainings(root)
    fig_dir = out.parent / f"{out.stem}_figures"
    fits = conditional_fits(runs)
    sections = [Section("runs", "Training runs", table_html(runs, index=False)),
                Section("fits", "Pooled and conditional fits",
                        table_html(fits_table(fits), index=False))]
    for i, (name, make) in enumerate(_figures(runs, epochs, fits), start=1):
        try:
            fig = make()
        except FigureUnavailable:
            continue
        title, caption = _CAPTIONS[name]
        sections.append(Section(name, title, figure_html(fig, caption, number=i,
                                                         stem=fig_dir / name, formats=formats)))
    lead = (f"{len(runs)} ViT training run(s) under {root}: coupling against the "
            "stochastic-depth rate, the weight decay and test accuracy.")
    return write_page(out, "ViT stochastic-depth study", sections, lead=lead)


__all__ = ["FIGURES", "FITS_FILE", "chance_level", "coupling_accuracy_fit", "plot_accuracy_fits",
           "plot_conditional_fits", "plot_coupling_epochs",
           "plot_coupling_vs_accuracy", "plot_coupling_vs_drop_path", "write_vit_figures",
           "write_vit_report"]
