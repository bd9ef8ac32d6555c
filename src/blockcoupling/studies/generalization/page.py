"""``study.html`` of ``study generalization``: the report style's page skeleton
(``report.html``) with the statement, the design, the figures and the tables."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from blockcoupling.report.figures.base import new_figure
from blockcoupling.studies.generalization.design import HYPOTHESES, describe_design

if TYPE_CHECKING:
    from blockcoupling.studies.generalization.result import GeneralizationResult

__all__ = ["plot_cells", "write_study_page"]


def _noise_colour(noise: float, noises: list[float]) -> Any:
    i = noises.index(noise)
    return colormaps["viridis"](i / max(len(noises) - 1, 1) * 0.85)


def plot_cells(result: GeneralizationResult) -> Figure:
    """Left: cell-mean coupling against cell-mean test accuracy (error bars: seed-level se in
    both directions; faint: the runs), the cell-level OLS line with r and one-sided p. Middle
    and right: coupling and test accuracy against the training-set size (log axis), one line
    per label-noise level, seed-level se bars."""
    spec, cells, runs = result.spec, result.cells, result.runs
    v = spec.variants[0]
    noises = sorted(float(x) for x in cells["label_noise"].unique())
    fig = new_figure(13.0, 3.9)
    ax0, ax1, ax2 = fig.subplots(1, 3)
    for noise in noises:
        c = cells[cells["label_noise"] == noise].sort_values("n_train")
        r = runs[runs["label_noise"] == noise]
        col = _noise_colour(noise, noises)
        ax0.scatter(r["test_accuracy"], r[v], s=8, color=col, alpha=0.35, lw=0)
        ax0.errorbar(c["test_accuracy_mean"], c[f"{v}_mean"], xerr=c["test_accuracy_se"],
                     yerr=c[f"{v}_se"], fmt="o", ms=5, capsize=2, color=col,
                     label=f"label noise {100 * noise:g} %")
        for ax, y in ((ax1, v), (ax2, "test_accuracy")):
            ax.errorbar(c["n_train"], c[f"{y}_mean"], yerr=c[f"{y}_se"], fmt="o-", ms=4,
                        capsize=2, color=col, label=f"noise {100 * noise:g} %")
    h = result.analysis["tests"]["H1_E1"]
    if "slope" in h:
        xs = np.linspace(cells["test_accuracy_mean"].min(), cells["test_accuracy_mean"].max(),
                         20)
        ax0.plot(xs, h["intercept"] + h["slope"] * xs, "k--", lw=1,
                 label=f"cells: r = {h['r']:+.2f}, one-sided p = {h['p_greater']:.2g}")
    ax0.axhline(0.0, color="0.5", lw=0.8, ls=":")
    ax0.set_xlabel("test accuracy (cell mean)")
    ax0.set_ylabel(f"{v} (cell mean)")
    ax0.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("training images")
    ax1.set_ylabel(v)
    ax1.axhline(0.0, color="0.5", lw=0.8, ls=":")
    ax2.set_ylabel("test accuracy")
    ax2.legend(fontsize=7)
    for ax in (ax0, ax1, ax2):
        ax.grid(alpha=0.3)
    return fig


def _control_table(ctrl: dict[str, Any]) -> pd.DataFrame:
    """The positive control per cell: each variant's cell mean and one-sided p."""
    cells = next(iter(ctrl["variants"].values()))["cells"]
    return pd.DataFrame([{"cell": c["cell"], **{f"{name} mean": r["cells"][i]["mean"]
                                                for name, r in ctrl["variants"].items()},
                          **{f"{name} one-sided p": r["cells"][i]["p"]
                             for name, r in ctrl["variants"].items()}}
                         for i, c in enumerate(cells)])


def write_study_page(result: GeneralizationResult, path: Path) -> Path:
    """The study's page: what it found, the design and its power, the figure, the positive
    control, the cells (seed level) and the runs (within-model se, run directories)."""
    from blockcoupling.report.html import (
        Section,
        esc,
        figure_html,
        paragraphs_html,
        table_html,
        write_page,
    )

    spec, a = result.spec, result.analysis
    v = spec.variants[0]
    where = "the end of training" if a["point"] == "final" else f"step {a['point']}"
    ctrl = a["control"]
    cell_cols = ["cell", "n_train", "label_noise", "n_seeds", "test_accuracy_mean",
                 "test_accuracy_se", "train_accuracy_mean", *(
                     c for name in spec.variants for c in (f"{name}_mean", f"{name}_se",
                                                           f"{name}_within_se"))]
    run_cols = ["name", "cell", "seed", "test_accuracy", "train_accuracy",
                *(c for name in spec.variants for c in (name, f"{name}_se")), "run_dir"]
    sections = [
        Section("result", "What the study found", paragraphs_html(result.statement)),
        Section("design", "Design and hypotheses (fixed before the data)",
                paragraphs_html(describe_design(spec)) + "".join(
                    f"<p><b>{esc(k)}</b>: {esc(t)}</p>" for k, t in HYPOTHESES.items())),
        Section("figure", "Coupling and accuracy across the cells", figure_html(
            plot_cells(result), f"At {where}. Left: {v} against test accuracy, one large "
            "point per cell (the mean over its seeds; error bars: the seed-level standard "
            "error, runs as the unit of replication) and one faint point per run; the dashed "
            "line is the cell-level OLS fit of H1. Middle and right: coupling and test "
            "accuracy against the training-set size, one line per label-noise level.")),
        Section("control", "Positive control", "<p>" + esc(
            f"At {where}: {ctrl['rule']}. {'Passed' if ctrl['passed'] else 'Failed'}. "
            f"{a['reason']}.") + "</p>" + table_html(_control_table(ctrl), index=False)),
        Section("cells", "Cells (seed level)", "<p>" + esc(
            "_mean, _se: over the cell's runs (seeds), runs as the unit of replication; "
            "_within_se: what the measured images alone give the cell mean (sqrt of the sum "
            "of its runs' squared standard errors over their images / n), within the trained "
            "models.") + "</p>" + table_html(result.cells[
                [c for c in cell_cols if c in result.cells.columns]], index=False)),
        Section("runs", "Runs", "<p>" + esc(
            "One row per training run; <variant>_se is the standard error over its measured "
            "images (within-model); run_dir is its final measurement (`blockcoupling show "
            "RUN_DIR`).") + "</p>" + table_html(result.runs[
                [c for c in run_cols if c in result.runs.columns]], index=False)),
    ]
    return write_page(path, "Coupling and generalisation at one architecture", sections,
                      lead="blockcoupling study generalization")
