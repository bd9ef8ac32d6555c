"""Spectral figures: the top singular value of J^l_tt against depth with the paper's
sigma ~ a / l + b fit. Data from `blockcoupling.report.summaries.top_singular_values`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from blockcoupling.report.figures.base import (
    LEGEND_CHARS,
    FigureUnavailable,
    Runs,
    clip,
    new_figure,
    tokens_text,
)
from blockcoupling.report.summaries import (
    as_runs,
    inverse_depth_fit,
    robust_stats,
    run_labels,
    top_singular_values,
)

__all__ = ["MIN_FIT_R2", "caption_singular_values", "plot_singular_values"]

#: a 1/depth fit is drawn only where it explains at least this share of the variance
MIN_FIT_R2 = 0.5


def plot_singular_values(runs: Runs, *, rank: int = 1, token: int | None = None,
                         labels: Sequence[str] | None = None) -> Figure:
    """sigma_rank of J^l_tt against depth l, one line per run (log axis where the values span
    more than a decade), with the dashed least-squares fit sigma ~ a / l + b drawn only where
    it describes the data (R^2 >= ``MIN_FIT_R2`` and positive on every measured layer); the
    legend (outside the axes) gives every fit's R^2, drawn or not."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    tables = [top_singular_values(m, rank, token) for m in ms]
    if all(t.empty for t in tables):
        raise FigureUnavailable("no singular values stored; measure with spectra=True")
    fig = new_figure(8.0, 4.0)
    ax = fig.subplots()
    for i, (t, lab) in enumerate(zip(tables, labs, strict=True)):
        if t.empty:
            continue
        x = t["layer"].to_numpy(dtype=float)
        y = t["sigma"].to_numpy(dtype=float)
        ax.plot(x, y, marker="o", color=f"C{i % 10}", label=clip(lab, LEGEND_CHARS))
        fit = inverse_depth_fit(t)
        if fit is None:
            continue
        text = f"{fit.a:.3g}/l {'+' if fit.b >= 0 else '-'} {abs(fit.b):.3g}, R²={fit.r2:.2f}"
        if fit.describes_data(MIN_FIT_R2):
            xs = np.linspace(x.min(), x.max(), 200)
            ax.plot(xs, fit(xs), ls="--", color=f"C{i % 10}", alpha=0.8, label=f"fit {text}")
        else:  # a legend entry without a line: the fit does not describe these values
            ax.plot([], [], ls="none", label=f"fit {text} (not drawn)")
    allv = np.concatenate([t["sigma"].to_numpy(dtype=float) for t in tables])
    if robust_stats(allv).spans_decades(1.0):
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer l")
    ax.set_ylabel(f"σ_{rank}(J^l_tt), mean over prompts")
    ax.grid(alpha=0.3, which="both")
    fig.legend(loc="outside right upper", fontsize="x-small")
    return fig


def caption_singular_values(runs: Runs, *, rank: int = 1, token: int | None = None,
                            labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    tables = [top_singular_values(m, rank, token) for m in ms]
    if all(t.empty for t in tables):
        raise FigureUnavailable("no singular values stored")
    return (f"Singular value sigma_{rank} of the block Jacobians J^l_tt against depth l, mean "
            "over prompts (and tokens), log axis where the values span more than a decade. "
            "Dashed: the least-squares fit sigma ~ a/l + b of the paper, drawn only where "
            f"it describes the data (R^2 >= {MIN_FIT_R2} and positive at every layer); the "
            "legend gives every fit. "
            f"{'; '.join(sorted({tokens_text(m, token) for m in ms}))}.")
