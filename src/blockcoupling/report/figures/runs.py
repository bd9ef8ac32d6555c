"""Across runs [paper fig. 1b]: runs in the order given (checkpoints, models) on the x axis
with the mean depth-wise coupling, the coupling against its chance level, LSS and
expodistance. Data from `blockcoupling.report.summaries.across_runs_data`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.report.figures.base import (
    TICK_CHARS,
    FigureUnavailable,
    Runs,
    clip,
    fit_run_ticks,
    new_figure,
    run_ticks,
    selection_text,
)
from blockcoupling.report.summaries import REPORT_RULE, across_runs_data, as_runs, run_labels
from blockcoupling.report.summaries.common import robust_stats

__all__ = ["caption_across_runs", "plot_across_runs", "training_runs"]


def training_runs(ms: Sequence[Measurement]) -> list[list[int]]:
    """Positions of the runs that are checkpoints of one training run (the same meta
    ``model``, each with a ``step``), two or more, in step order: the only points the
    across-runs figure joins with a line."""
    groups: dict[str, list[tuple[float, int]]] = {}
    for i, m in enumerate(ms):
        model, step = m.meta.get("model"), m.meta.get("step")
        if model not in (None, "") and isinstance(step, int | float) and not isinstance(
                step, bool):
            groups.setdefault(str(model), []).append((float(step), i))
    return [[i for _, i in sorted(g)] for g in groups.values() if len(g) > 1]


def _values_and_errors(data: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """Per run: ``coupling``'s mean and one std; any other column's median and its
    inter-quartile range (as the distances below and above, (2, runs))."""
    if col == "coupling":
        return (data[f"{col}_mean"].to_numpy(dtype=float),
                data[f"{col}_std"].to_numpy(dtype=float))
    y = data[f"{col}_median"].to_numpy(dtype=float)
    return y, np.vstack([y - data[f"{col}_q25"].to_numpy(float),
                         data[f"{col}_q75"].to_numpy(float) - y])


def plot_across_runs(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                     labels: Sequence[str] | None = None) -> Figure:
    """Runs in the order given on the x axis: mean off-diagonal depth-wise ``variant`` (+- one
    std), the leading chance-corrected variant (``coupling_vs_rotated``, or
    ``coupling_vs_null`` for runs that predate it: median and inter-quartile range, a dotted
    line at the chance level 0) when measured, and the median LSS and expodistance (inter-quartile range; log
    axis where expodistance spans decades)."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    data = across_runs_data(ms, rule)
    panels = [("coupling", f"mean off-diagonal {rule.variant}")]
    if not data["null_median"].isna().all():
        panels.append(("null", f"{data['null_variant'].iloc[0]} (0 = chance)"))
    panels += [("lss", "median LSS"), ("expodistance", "median expodistance")]
    panels = [(col, name) for col, name in panels  # a panel only where something is drawn
              if np.isfinite(data[f"{col}_{'mean' if col == 'coupling' else 'median'}"]
                             .to_numpy(dtype=float)).any()]
    if not panels:
        raise FigureUnavailable("nothing to compare across runs (no depth-wise coupling or "
                                "trajectory metrics)")
    many = len(ms) > 3
    fig = new_figure(min(16.0, max(9.0, 1.0 + 2.4 * len(panels) + 0.6 * len(ms))),
                     4.4 if many else 3.6)
    axes = list(np.ravel(fig.subplots(1, len(panels), squeeze=False)))
    x = np.arange(len(ms), dtype=float)
    joined = training_runs(ms)
    ticks = [clip(lab, TICK_CHARS) for lab in labs]
    for ax, (col, name) in zip(axes, panels, strict=True):
        ax.set_title(name, fontsize="medium")
        y, e = _values_and_errors(data, col)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.errorbar(x, y, yerr=np.nan_to_num(e), fmt="o", capsize=3, color="C0")
        for run in joined:  # a line only through the checkpoints of one training run
            ax.plot(x[run], y[run], "-", color="C0", lw=1.2)
        if col == "null":
            ax.axhline(0.0, color="0.3", lw=1, ls=":")
        if col == "expodistance":
            if robust_stats(np.concatenate([data["expodistance_q25"].to_numpy(float), y,
                                            data["expodistance_q75"].to_numpy(float)])
                            ).spans_decades():
                ax.set_yscale("log")
        run_ticks(ax, x, ticks)
        ax.set_xlim(-0.5, len(ms) - 0.5)
        ax.grid(alpha=0.3)
    fit_run_ticks(fig)
    return fig


def caption_across_runs(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                        labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    data = across_runs_data(ms, rule)
    null = str(data["null_variant"].iloc[0])
    what = ("the same basis rotated at random" if null == "coupling_vs_rotated" else
            "independent random bases")
    joined = training_runs(ms)
    lines = ("Points of one training run (checkpoints of one model, by step) are joined by a "
             "line; other runs are separate points. " if joined else
             "The runs are separate points (no two are checkpoints of one training run). ")
    return ("Across runs, in the order given: mean depth-wise value over layer pairs l != l' "
            f"(over prompts and tokens, error bars one standard deviation); {null} "
            f"(0 = the chance level of {what}, 1 = perfect coupling; median over "
            "prompts and tokens with the inter-quartile range) when it was measured; the "
            "median per-token LSS and expodistance (inter-quartile range; expodistance is "
            "heavy-tailed where norms barely grow). " + lines
            + selection_text(ms, rule, None, labels))
