"""Trajectory figures: token trajectories in the PCA plane [paper fig. 17] and the trajectory
metrics (norms, windowed LSS, LSS, expodistance) [fig. 24]. Robust summaries (medians and
inter-quartile ranges) throughout: expodistance of post-LN models is heavy-tailed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from blockcoupling.report.figures.base import (
    LEGEND_CHARS,
    TICK_CHARS,
    TITLE_CHARS,
    FigureUnavailable,
    Runs,
    clip,
    colormap,
    fit_run_ticks,
    median_band,
    missing_text,
    new_figure,
    panels,
    present,
    prompt_named,
    run_parts,
    run_ticks,
    tokens_text,
)
from blockcoupling.report.summaries import (
    EXPODISTANCE_NAN_REASON,
    as_runs,
    n_layers,
    pca_data,
    robust_stats,
    run_labels,
    trajectory_summary,
    window_covers_model,
)

__all__ = ["caption_pca_trajectories", "caption_trajectory_metrics", "plot_pca_trajectories",
           "plot_trajectory_metrics"]


# ====================================================================== PCA
def plot_pca_trajectories(runs: Runs, *, prompt_id: str | None = None,
                          labels: Sequence[str] | None = None) -> Figure:
    """Token trajectories in the 2-D PCA plane (paper fig. 17), one panel per run.

    One line per token through layers 0..L (circle = layer 0, square = last layer); the last
    token is black and thicker, the others coloured by position. Lines are added token by
    token in increasing order, so ``ax.lines[i]`` is token i's trajectory."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    found = [pca_data(m, prompt_id) for m in ms]
    if all(x is None for x in found):
        raise FigureUnavailable("no PCA coordinates in the trajectory table; measure with "
                                "trajectory=True")
    data, labs = present(found, labs)
    fig, axes = panels(len(data), 3.8, 4.0, extra_width=0.4)
    for ax, item, lab in zip(axes, data, labs, strict=True):
        ax.set_title(f"{clip(lab, TITLE_CHARS)}\nprompt {item[0]}", fontsize="medium")
        rows = item[1]
        tokens = sorted(int(t) for t in rows["token"].unique())
        last = tokens[-1]
        cmap = colormap("viridis")
        color: Any
        name: str | None
        for t in tokens:
            r = rows[rows["token"] == t]
            x, y = r["pca_x"].to_numpy(dtype=float), r["pca_y"].to_numpy(dtype=float)
            if t == last:
                color, lw, z, name = "black", 2.2, 3, f"last token ({t})"
            else:
                color = cmap(0.85 * t / max(1, last))
                lw, z, name = 1.0, 2, (f"token {t}" if len(tokens) <= 6 else None)
            ax.plot(x, y, color=color, lw=lw, zorder=z, label=name)
            ax.scatter(x[:1], y[:1], s=14, color=color, marker="o", zorder=z)
            ax.scatter(x[-1:], y[-1:], s=18, color=color, marker="s", zorder=z)
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", loc="best", framealpha=0.6)
    return fig


def caption_pca_trajectories(runs: Runs, *, prompt_id: str | None = None,
                             labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    data = [pca_data(m, prompt_id) for m in ms]
    if all(x is None for x in data):
        raise FigureUnavailable("no PCA coordinates in the trajectory table")
    parts = run_parts(ms, data, labs, lambda m, item: f"{prompt_named(m, item[0])}, "
                      f"{item[1]['token'].nunique()} tokens, layers "
                      f"{int(item[1]['layer'].min())}..{int(item[1]['layer'].max())}")
    return ("Hidden trajectories x^0_i .. x^L_i of every token of one prompt, projected on "
            "the 2-component PCA fitted to the last layer's token embeddings (circle = layer "
            "0, square = last layer; the last token in black). " + parts + "."
            + missing_text(data, labs))


# ====================================================================== metrics
def _box(ax: Any, vals: list[np.ndarray], labs: list[str], nans: list[int], col: str) -> None:
    """One box per run with the individual values as dots (dot i of run r is
    ``ax.collections[r]``); log scale where the positive values span more than 2 decades."""
    pos = [i + 1 for i, v in enumerate(vals) if v.size]
    ax.boxplot([v for v in vals if v.size], positions=pos, widths=0.5, showfliers=False)
    for i, v in enumerate(vals):
        if v.size:
            jitter = np.linspace(-0.15, 0.15, v.size) if v.size > 1 else np.zeros(1)
            ax.scatter(i + 1 + jitter, v, s=8, color=f"C{i % 10}", alpha=0.7, zorder=3)
    st = robust_stats(np.concatenate(vals))
    if st.spans_decades():
        ax.set_yscale("log")
    names = [clip(lab, TICK_CHARS) if not n else f"{clip(lab, TICK_CHARS)} ({n} NaN)"
             for lab, n in zip(labs, nans, strict=True)]
    run_ticks(ax, range(1, len(labs) + 1), names)
    ax.set_xlim(0.4, len(labs) + 0.6)
    ax.set_ylabel(f"per-token {col}" + (" (log scale)" if st.spans_decades() else ""))
    ax.grid(alpha=0.3, axis="y")


#: the panels of `plot_trajectory_metrics`, in order: (column, title, kind)
_METRIC_PANELS = (("norm", "norms", "line"), ("lss_window", "windowed line-shape score", "line"),
                  ("lss", "LSS of whole trajectories", "box"),
                  ("expodistance", "expodistance", "box"))


def _metric_data(ms: Sequence[Any], labs: Sequence[str], token: int | None
                 ) -> tuple[list[pd.DataFrame], list[pd.DataFrame], list[str], list[str]]:
    """(per-layer summaries, per-token metrics, labels of runs whose LSS window covers the
    model, the panel columns that have something to draw)."""
    summaries = [trajectory_summary(m, token) for m in ms]
    tms = [m.token_metrics if token is None else
           m.token_metrics[m.token_metrics["token"] == token] for m in ms]
    covered = [lab for m, lab in zip(ms, labs, strict=True) if window_covers_model(m)]
    drawn = []
    for col, _, kind in _METRIC_PANELS:
        if kind == "line":
            ok = any(not s.empty and s[col].notna().any() and not (col == "lss_window"
                                                                   and lab in covered)
                     for s, lab in zip(summaries, labs, strict=True))
        else:
            ok = any(np.isfinite(t[col].to_numpy(dtype=float)).any() for t in tms)
        if ok:
            drawn.append(col)
    return summaries, tms, covered, drawn


def _per_layer_panel(ax: Any, col: str, summaries: list[pd.DataFrame], labs: list[str],
                     covered: list[str]) -> None:
    """A per-layer panel (``norm`` or ``lss_window``): each run's median with its quartile
    band; the runs whose LSS window covers the whole model named, not drawn; the norm on a
    log scale where the medians span decades."""
    ax.ticklabel_format(axis="y", useOffset=False)  # plain values, no "+1.8e0" offset
    for i, (sm, lab) in enumerate(zip(summaries, labs, strict=True)):
        if sm.empty or sm[col].isna().all() or (col == "lss_window" and lab in covered):
            continue
        median_band(ax, sm.dropna(subset=[col]), col, i, lab)  # windowed LSS: not at the ends
    if col == "lss_window" and covered:
        ax.text(0.02, 0.98, "window covers the whole model (not drawn):\n"
                + ", ".join(clip(c, LEGEND_CHARS) for c in covered),
                transform=ax.transAxes, va="top", fontsize="x-small", color="0.35")
    if col == "norm":
        norms = np.concatenate([sm["norm_median"].to_numpy(dtype=float)
                                for sm in summaries if not sm.empty])
        if robust_stats(norms).spans_decades(1.5):
            ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer l (0 = input of block 1)")
    ax.set_ylabel(f"median {'norm ||x^l||' if col == 'norm' else 'windowed LSS'}")
    ax.grid(alpha=0.3)


def plot_trajectory_metrics(runs: Runs, *, token: int | None = None,
                            labels: Sequence[str] | None = None) -> Figure:
    """Up to four panels, each drawn only where some run has its data (lettered in order):
    median norm ||x^l|| per layer with its inter-quartile band (log scale where norms span
    decades); median windowed LSS per layer (runs whose window covers the whole model are
    left out: their windowed LSS is the whole trajectory's, see the next panel), one line
    per run; per-token LSS and per-token expodistance, one box per run with the individual
    (prompt, token) values as dots, NaN counts in the tick labels, log scale where values
    span decades."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    summaries, tms, covered, drawn = _metric_data(ms, labs, token)
    if not drawn:
        raise FigureUnavailable("no trajectory metrics; measure with trajectory=True")
    many = len(ms) > 3
    grid = (2, 2) if len(drawn) == 4 else (1, len(drawn))
    fig = new_figure(11.0 if len(drawn) > 1 else 6.5,
                     (7.4 if many else 6.6) if grid[0] == 2 else (4.4 if many else 3.8))
    axes = list(np.ravel(fig.subplots(*grid, squeeze=False)))
    titles = {col: title for col, title, _ in _METRIC_PANELS}
    for letter, (ax, col) in zip("abcd", zip(axes, drawn, strict=True), strict=False):
        ax.set_title(f"({letter}) {titles[col]}", fontsize="medium", loc="left")
        if col in ("norm", "lss_window"):
            _per_layer_panel(ax, col, summaries, labs, covered)
            continue
        vals = [t[col].to_numpy(dtype=float) for t in tms]
        nans = [int(np.isnan(v).sum()) for v in vals]
        _box(ax, [v[np.isfinite(v)] for v in vals], labs, nans, col)
    handles, names = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside right upper", fontsize="small")
    fit_run_ticks(fig)
    return fig


def caption_trajectory_metrics(runs: Runs, *, token: int | None = None,
                               labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    if all(m.trajectory.empty and m.token_metrics.empty for m in ms):
        raise FigureUnavailable("no trajectory metrics")
    win = sorted({int(m.config.lss_window) for m in ms})
    covered = [f"{lab} (L={n_layers(m)})" for m, lab in zip(ms, labs, strict=True)
               if window_covers_model(m)]
    nan_ed = [(lab, int(m.token_metrics["expodistance"].isna().sum()), len(m.token_metrics))
              for m, lab in zip(ms, labs, strict=True)]
    nan_text = "; ".join(f"{lab}: {n} of {tot}" for lab, n, tot in nan_ed if n)
    drawn = _metric_data(ms, labs, token)[3]
    what = {"norm": "norm ||x^l_i|| per layer",
            "lss_window": ("line-shape score on a centred window of "
                           f"{', '.join(map(str, win))} layers, per layer"),
            "lss": "line-shape score LSS of each whole trajectory (1 = straight line)",
            "expodistance": ("expodistance Var(alpha)/Mean(alpha)^2 of alpha^l = "
                             "ln(||x^l|| / ||x^(l-1)||) (0 = exact exponential growth)")}
    panels_text = "; ".join(f"({letter}) {what[col]}"
                            for letter, col in zip("abcd", drawn, strict=False))
    text = ("Trajectory metrics of the hidden states, medians over prompts and tokens with "
            f"the inter-quartile range as a band or box: {panels_text}; per-token values "
            "one dot per (prompt, token); a log axis where values span decades. "
            f"{'; '.join(sorted({tokens_text(m, token) for m in ms}))}.")
    if covered:
        text += (" The LSS window is at least as long as the trajectory of "
                 + ", ".join(covered) + ": its windowed LSS is the whole trajectory's LSS "
                 "clipped at the ends, a flat line, so it is not drawn"
                 + (" (no panel)" if "lss_window" not in drawn else "") + ".")
    if nan_text:
        text += (f" Tokens without an expodistance (NaN: {EXPODISTANCE_NAN_REASON}): "
                 f"{nan_text}.")
    return text
