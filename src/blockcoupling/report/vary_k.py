"""The correlation at several K on one page (the paper's ``alignment_vary_k`` figure): the
score against each model's coupling at every K, and R^2 against K per predictor. Drawn from
any `VaryKData` (``studies.vary_k.VaryKResult`` satisfies it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.report.figures.base import new_figure

__all__ = ["VaryKData", "plot_r2_vs_k", "plot_vary_k", "write_vary_k_html"]

_NAMES = {"coupling_mean": "raw c_K (the paper's)",
          "coupling_vs_null_mean": "coupling_vs_null (chance corrected)"}


class VaryKData(Protocol):
    """One correlation per K: ``ks``, ``table()`` (k, predictor, n, r2, r2_lo, r2_hi, p, ...)
    and ``results[k].table`` (one row per model: score and the coupling columns)."""

    results: Mapping[int, Any]

    @property
    def ks(self) -> list[int]: ...

    def table(self) -> pd.DataFrame: ...


def plot_vary_k(result: VaryKData, predictor: str = "coupling_mean") -> Figure:
    """One panel per K: each model's score against its ``predictor``, with the least-squares
    line and its R^2 and p."""
    ks = result.ks
    fig = new_figure(3.4 * len(ks), 3.4)
    axes = fig.subplots(1, len(ks), squeeze=False)[0]
    t = result.table().set_index(["k", "predictor"])
    for ax, k in zip(axes, ks, strict=True):
        models = result.results[k].table
        x = models[predictor].to_numpy(dtype=float)
        y = models["score"].to_numpy(dtype=float)
        ax.scatter(x, y, s=18)
        for xi, yi, lab in zip(x, y, models["label"], strict=True):
            ax.annotate(str(lab), (xi, yi), fontsize="xx-small", alpha=0.7)
        row = t.loc[(k, predictor)] if (k, predictor) in t.index else None
        if row is not None and np.isfinite(row.get("slope", np.nan)):
            xs = np.linspace(np.nanmin(x), np.nanmax(x), 20)
            ax.plot(xs, row["slope"] * xs + (np.nanmean(y) - row["slope"] * np.nanmean(x)),
                    "--", color="C1")
            ax.set_title(f"K={k}: R^2={row['r2']:.2f}, p={row['p']:.2g}", fontsize="small")
        else:
            ax.set_title(f"K={k}", fontsize="small")
        ax.set_xlabel(_NAMES.get(predictor, predictor), fontsize="small")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("benchmark score")
    return fig


def plot_r2_vs_k(result: VaryKData) -> Figure:
    """R^2 of the score on each coupling predictor against K, with the bootstrap 95% CI."""
    t = result.table()
    t = t[t["r2"].notna()] if "r2" in t else t
    fig = new_figure(5.5, 3.6)
    ax = fig.subplots()
    for i, (name, g) in enumerate(t.groupby("predictor", sort=False)):
        g = g.sort_values("k")
        k = g["k"].to_numpy(dtype=float) * (1 + 0.03 * i)  # side by side on the log axis
        r2 = g["r2"].to_numpy(dtype=float)
        err = np.vstack([r2 - g["r2_lo"].to_numpy(dtype=float),
                         g["r2_hi"].to_numpy(dtype=float) - r2])
        ax.errorbar(k, r2, yerr=np.nan_to_num(np.abs(err)), fmt="o-", capsize=3,
                    label=_NAMES.get(str(name), str(name)))
    ax.set_xscale("log")
    ax.set_xticks(result.ks, [str(k) for k in result.ks])
    ax.set_xlabel("K (top singular vectors)")
    ax.set_ylabel("R^2 of the score")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def write_vary_k_html(result: VaryKData, out: str | Path) -> Path:
    """The page: the statistic, both figures and the table of every K."""
    from blockcoupling.report.html import Section, esc, figure_html, table_html, write_page

    first = result.results[result.ks[0]]
    lead = (f"<p>{esc(len(first.table))} models at K = {esc(', '.join(map(str, result.ks)))} "
            f"(the same K for every model). Statistic: {esc(first.describe_statistic())}. "
            f"Scores: {esc(first.scores_source)}.</p>")
    sections = [
        Section("scatter", "Score against raw coupling at each K",
                figure_html(plot_vary_k(result), "Each model's benchmark score against its mean "
                            "depth-wise raw c_K at each K (the paper's alignment_vary_k), the "
                            "least-squares line dashed.", number=1)),
        Section("r2", "R^2 against K",
                figure_html(plot_r2_vs_k(result), "R^2 of the score on each coupling predictor "
                            "at each K, bars the percentile-bootstrap 95% interval over models.",
                            number=2)),
        Section("table", "Every K", table_html(result.table(), index=False)),
    ]
    return write_page(Path(out), "Coupling and generalisation at several K", sections, lead=lead)
