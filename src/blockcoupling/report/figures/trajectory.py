"""Trajectory figures: token trajectories in the PCA plane [paper fig. 17] and the trajectory
metrics (norms, windowed LSS, LSS, expodistance) [fig. 24]. Robust summaries (medians and
inter-quartile ranges) throughout: expodistance of post-LN models is heavy-tailed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from blockcoupling.report.figures.base import (
    FigureUnavailable,
    Runs,
    colormap,
    missing_text,
    new_figure,
    no_data,
    panels,
    present,
    tokens_text,
)
from blockcoupling.report.figures.depth import prompt_text
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
        ax.set_title(f"{lab}\nprompt {item[0]}", fontsize="medium")
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
    parts = []
    for m, item, lab in zip(ms, data, labs, strict=True):
        if item is None:
            continue
        parts.append(f"{lab}: prompt {item[0]}{prompt_text(m, item[0])}, "
                     f"{item[1]['token'].nunique()} tokens, layers "
                     f"{int(item[1]['layer'].min())}..{int(item[1]['layer'].max())}")
    return ("Hidden trajectories x^0_i .. x^L_i of every token of one prompt, projected on "
            "the 2-component PCA fitted to the last layer's token embeddings (circle = layer "
            "0, square = last layer; the last token in black). " + "; ".join(parts) + "."
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
    names = [lab if not n else f"{lab}\n({n} NaN)" for lab, n in zip(labs, nans, strict=True)]
    many = len(labs) > 3
    ax.set_xticks(range(1, len(labs) + 1), names, rotation=30 if many else 0,
                  ha="right" if many else "center", fontsize="small")
    ax.set_xlim(0.4, len(labs) + 0.6)
    ax.set_ylabel(f"per-token {col}" + (" (log scale)" if st.spans_decades() else ""))
    ax.grid(alpha=0.3, axis="y")


def plot_trajectory_metrics(runs: Runs, *, token: int | None = None,
                            labels: Sequence[str] | None = None) -> Figure:
    """Four panels: (a) median norm ||x^l|| per layer with its inter-quartile band (log scale
    where norms span decades), (b) median windowed LSS per layer (runs whose window covers
    the whole model are left out and named in the panel), one line per run; (c) per-token LSS
    and (d) per-token expodistance, one box per run with the individual (prompt, token)
    values as dots, NaN counts in the tick labels, log scale where values span decades."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    summaries = [trajectory_summary(m, token) for m in ms]
    tms = [m.token_metrics if token is None else
           m.token_metrics[m.token_metrics["token"] == token] for m in ms]
    if all(s.empty for s in summaries) and all(t.empty for t in tms):
        raise FigureUnavailable("no trajectory metrics; measure with trajectory=True")
    many = len(ms) > 3
    fig = new_figure(11.0, 7.4 if many else 6.6)
    (ax_n, ax_w), (ax_l, ax_e) = fig.subplots(2, 2)
    covered = [lab for m, lab in zip(ms, labs, strict=True) if window_covers_model(m)]
    for ax, col, ylabel in ((ax_n, "norm", "median norm ||x^l||"),
                            (ax_w, "lss_window", "median windowed LSS")):
        ax.ticklabel_format(axis="y", useOffset=False)  # plain values, no "+1.8e0" offset
        drawn = False
        for i, (s, lab) in enumerate(zip(summaries, labs, strict=True)):
            if s.empty or s[col].isna().all():
                continue
            if col == "lss_window" and lab in covered:
                continue
            s = s.dropna(subset=[col])  # windowed LSS is undefined near the ends
            x = s["layer"].to_numpy(dtype=float)
            ax.plot(x, s[f"{col}_median"].to_numpy(dtype=float), marker=".",
                    color=f"C{i % 10}", label=lab)
            ax.fill_between(x, s[f"{col}_q25"].to_numpy(dtype=float),
                            s[f"{col}_q75"].to_numpy(dtype=float), color=f"C{i % 10}",
                            alpha=0.12, linewidth=0)
            drawn = True
        if not drawn:
            why = ("the LSS window covers every layer of "
                   + ("every run" if len(covered) == len(ms) else ", ".join(covered))
                   + ": see (c)") if col == "lss_window" and covered else "no data"
            no_data(ax, why)
            continue
        if col == "norm":
            norms = np.concatenate([s["norm_median"].to_numpy(dtype=float) for s in summaries])
            if robust_stats(norms).spans_decades(1.5):
                ax.set_yscale("log")
        if col == "lss_window" and covered:
            ax.text(0.02, 0.98, "window covers the whole model (not drawn):\n"
                    + ", ".join(covered), transform=ax.transAxes, va="top", fontsize="x-small",
                    color="0.35")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer l (0 = input of block 1)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax, col in ((ax_l, "lss"), (ax_e, "expodistance")):
        vals = [t[col].to_numpy(dtype=float) for t in tms]
        nans = [int(np.isnan(v).sum()) for v in vals]
        vals = [v[np.isfinite(v)] for v in vals]
        if all(v.size == 0 for v in vals):
            no_data(ax, f"no finite {col} ({sum(nans)} NaN)" if sum(nans) else "no data")
            continue
        _box(ax, vals, labs, nans, col)
    ax_n.set_title("(a) norms", fontsize="medium", loc="left")
    ax_w.set_title("(b) windowed line-shape score", fontsize="medium", loc="left")
    ax_l.set_title("(c) LSS of whole trajectories", fontsize="medium", loc="left")
    ax_e.set_title("(d) expodistance", fontsize="medium", loc="left")
    handles, names = ax_n.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside right upper", fontsize="small")
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
    text = ("Trajectory metrics of the hidden states, medians over prompts and tokens with "
            "the inter-quartile range as a band or box: (a) norm ||x^l_i|| per layer and "
            f"(b) line-shape score on a centred window of {', '.join(map(str, win))} layers; "
            "(c) line-shape score LSS of each whole trajectory (1 = straight line) and "
            "(d) expodistance Var(alpha)/Mean(alpha)^2 of alpha^l = ln(||x^l|| / ||x^(l-1)||) "
            "(0 = exact exponential growth), one dot per (prompt, token); a log axis where "
            f"values span decades. {'; '.join(sorted({tokens_text(m, token) for m in ms}))}.")
    if covered:
        text += (" The LSS window is at least as long as the trajectory of "
                 + ", ".join(covered) + ": its windowed LSS is the whole trajectory's LSS "
                 "clipped at the ends, a flat line, so it is not drawn (see (c)).")
    if nan_text:
        text += (f" Tokens without an expodistance (NaN: {EXPODISTANCE_NAN_REASON}): "
                 f"{nan_text}.")
    return text
