"""Depth profiles [paper fig. 24]: norm, windowed LSS, step length and logit-lens entropy
against the layer; and per-model trajectory metrics in a chosen order [fig. 23, 37 and the
paper's lss-all / expo-all panels]. Data from `blockcoupling.report.summaries.profiles`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from blockcoupling.report.figures.base import (
    TICK_CHARS,
    FigureUnavailable,
    Runs,
    clip,
    fit_run_ticks,
    median_band,
    new_figure,
    run_ticks,
    tokens_text,
)
from blockcoupling.report.summaries import as_runs, robust_stats, run_labels
from blockcoupling.report.summaries.profiles import (
    PROFILE_COLUMNS,
    RUN_METRICS,
    depth_profiles,
    metric_by_run,
)

__all__ = ["caption_depth_profiles", "caption_metrics_by_run", "plot_depth_profiles",
           "plot_metrics_by_run"]

_METRIC_NAMES = {"lss": "LSS (1 = straight)", "expodistance": "expodistance (0 = exponential)",
                 "equidistance_cv": "equidistance CV (0 = equal steps)"}


def plot_depth_profiles(runs: Runs, *, token: int | None = None,
                        labels: Sequence[str] | None = None) -> Figure:
    """Four rows against the layer l (0 = input of block 1), one line per run (median over
    prompts and tokens, the inter-quartile range as a band): the norm ||x^l||, the windowed
    LSS, the step length ||x^l - x^{l-1}|| and the logit-lens entropy; a row no run measured
    (the logit lens without --logit-lens) is left out (the caption says so), never empty."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    profs = [depth_profiles(m, token) for m in ms]
    if all(p.empty for p in profs):
        raise FigureUnavailable("no trajectory table; measure with trajectory=True")
    rows = {col: name for col, name in PROFILE_COLUMNS.items()
            if any(len(p) and (p[f"{col}_n"] > 0).any() for p in profs)}
    if not rows:
        raise FigureUnavailable("no trajectory values; measure with trajectory=True")
    fig = new_figure(7.0, 2.25 * len(rows))
    axes = fig.subplots(len(rows), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (col, name) in zip(axes, rows.items(), strict=True):
        for i, (p, lab) in enumerate(zip(profs, labs, strict=True)):
            p = p[p[f"{col}_n"] > 0] if len(p) else p
            if p.empty:
                continue
            median_band(ax, p, col, i, lab)
        if col == "norm":
            vals = np.concatenate([p["norm_median"].to_numpy(dtype=float) for p in profs])
            if robust_stats(vals[vals > 0]).spans_decades(1.5):
                ax.set_yscale("log")
        ax.set_ylabel(name, fontsize="small")
        ax.grid(alpha=0.3)
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("layer l (0 = input of block 1)")
    handles, names = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside right upper", fontsize="small")
    return fig


def caption_depth_profiles(runs: Runs, *, token: int | None = None,
                           labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    lensless = [lab for m, lab in zip(ms, labs, strict=True)
                if m.trajectory["logit_entropy"].isna().all()]
    wins = sorted({int(m.config.lss_window) for m in ms})
    text = ("Against depth (the paper's fig. 24), medians over prompts and tokens with the "
            "inter-quartile range as a band: the norm ||x^l||; the line-shape score on a "
            f"centred window of {', '.join(map(str, wins))} layers; the step length "
            "||x^l - x^(l-1)|| (equal steps = equidistant); the logit-lens entropy "
            "H = -sum p log p of p = softmax(W_U N(x^l)) with N the final norm and W_U the "
            "unembedding (nats; at the last layer the model's own output). "
            + "; ".join(sorted({tokens_text(m, token) for m in ms})) + ".")
    if lensless:
        text += f" No logit lens for {', '.join(lensless)} (measured without --logit-lens)."
    return text


def plot_metrics_by_run(runs: Runs, *, metrics: Sequence[str] = RUN_METRICS,
                        labels: Sequence[str] | None = None,
                        order_name: str = "in the order given") -> Figure:
    """One panel per per-token metric, one point per run in the order given (the caller sorts
    the runs): the median over prompts and tokens with the inter-quartile range; a log axis
    where the medians span more than two decades."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    data = {}
    for metric in metrics:  # a metric no run has gets no panel (never an empty one)
        try:
            data[metric] = metric_by_run(ms, metric)
        except FigureUnavailable:
            continue
    if not data:
        raise FigureUnavailable("no per-token trajectory metrics; measure with trajectory=True")
    fig = new_figure(max(7.0, 3.2 * len(data) + 0.25 * len(ms)), 3.8)
    axes = fig.subplots(1, len(data), squeeze=False)[0]
    x = np.arange(len(ms), dtype=float)
    for ax, (metric, d) in zip(axes, data.items(), strict=True):
        ax.set_title(_METRIC_NAMES[metric], fontsize="medium")
        y = d["median"].to_numpy(dtype=float)
        err = np.vstack([y - d["q25"].to_numpy(dtype=float), d["q75"].to_numpy(dtype=float) - y])
        ax.errorbar(x, y, yerr=np.nan_to_num(err), fmt="o", capsize=3)
        if robust_stats(y[y > 0]).spans_decades():
            ax.set_yscale("log")
        run_ticks(ax, x, [clip(lab, TICK_CHARS) for lab in labs])
        ax.set_xlabel(f"model ({order_name})", fontsize="small")
        ax.grid(alpha=0.3)
    fit_run_ticks(fig)
    return fig


def caption_metrics_by_run(runs: Runs, *, metrics: Sequence[str] = RUN_METRICS,
                           labels: Sequence[str] | None = None,
                           order_name: str = "in the order given") -> str:
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    nans = [f"{lab}: {n}" for lab, n in zip(
        labs, metric_by_run(ms, "expodistance")["n_nan"], strict=True) if n] \
        if "expodistance" in metrics else []
    text = ("Per model, " + order_name + " (the paper's lss-all, expo-all, fig. 23 and fig. 37 "
            "panels): the median over prompts and tokens of each token's "
            + ", ".join(_METRIC_NAMES[m] for m in metrics)
            + ", the bars the inter-quartile range.")
    if nans:
        text += " Tokens without an expodistance (norms that do not grow): " + "; ".join(nans) + "."
    return text
