"""The cross-coupling figure and page (``blockcoupling cross``): a layer x layer heatmap of run
A's Jacobians in run B's bases, and the principal angles between the runs' top-K subspaces.

Takes what [`blockcoupling.studies.cross.cross_coupling`][blockcoupling.studies.cross.cross_coupling] returns (anything with its
``coupling`` and ``angles`` tables and ``matrix()``); no computation beyond means."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.report.figures.base import HEATMAP_CMAP, fmt_p, matrix_ticks, new_figure
from blockcoupling.report.summaries import REPORT_RULE, short_name


class CrossResult(Protocol):
    coupling: pd.DataFrame
    angles: pd.DataFrame

    def matrix(self, rule: StatisticRule = ...) -> pd.DataFrame: ...


def _names(res: CrossResult) -> tuple[str, str]:
    """The two runs' names as pages show them (a local path: its folder name)."""
    df = res.coupling
    return (", ".join(short_name(str(x)) for x in df["run_a"].unique()),
            ", ".join(short_name(str(x)) for x in df["run_b"].unique()))


def plot_cross_heatmap(res: CrossResult, rule: StatisticRule = REPORT_RULE) -> Figure:
    """Left: mean coupling of run A's J^l (rows) in run B's basis of layer l' (columns), the
    rule's variant, K, p and orientation. Right: mean principal-angle cosine between the
    top-K subspaces (U and V averaged)."""
    mat = res.matrix(rule)
    variant, p, orientation = rule.variant, rule.p, rule.orientation
    k = int(res.coupling["k"].min()) if rule.k is None else int(rule.k)
    ang = res.angles[res.angles["k"] == k].pivot_table(
        index="layer_a", columns="layer_b", values="cosine", aggfunc="mean")
    name_a, name_b = _names(res)
    fig = new_figure(8.4, 4.0)
    axes = fig.subplots(1, 2)
    for ax, m, title, label in (
            (axes[0], mat, f"{variant} (K={k}, p={fmt_p(p)}, {orientation})", variant),
            (axes[1], ang, f"principal-angle cosine (K={k})", "mean cosine")):
        image = ax.imshow(m.to_numpy(dtype=float), cmap=HEATMAP_CMAP, origin="upper",
                          interpolation="nearest")
        matrix_ticks(ax, list(m.index), list(m.columns))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"layer l' of {name_b} (basis)")
        ax.set_ylabel(f"layer l of {name_a}")
        fig.colorbar(image, ax=ax, label=label, shrink=0.85)
    return fig


def caption_cross_heatmap(res: CrossResult, rule: StatisticRule = REPORT_RULE) -> str:
    name_a, name_b = _names(res)
    k, variant, p, orientation = rule.k, rule.variant, rule.p, rule.orientation
    n = res.coupling["prompt_id"].nunique()
    return (f"Cross-coupling: the Jacobians J^l_tt of {name_a} (rows, layer l) in the top-K "
            f"singular vectors of the Jacobians of {name_b} (columns, layer l'), {variant} "
            f"with K={k if k is not None else int(res.coupling['k'].min())}, p={fmt_p(p)}, "
            f"{orientation}, mean over {n} prompt(s) and their measured tokens; right: the "
            "mean cosine of the principal angles between the two top-K subspaces (U and V "
            "averaged; 1 = the same subspace).")


def write_cross_report(res: CrossResult, out: str | Path,
                       rule: StatisticRule = REPORT_RULE) -> Path:
    """A self-contained HTML page: the heatmap figure and the layer x layer table of the
    rule's variant, K, p and orientation."""
    from blockcoupling.report.page import Section, figure_html, table_html, write_page

    fig = plot_cross_heatmap(res, rule)
    mat = res.matrix(rule)
    sections = [
        Section("heatmap", "Layer x layer", figure_html(fig, caption_cross_heatmap(
            res, rule), number=1)),
        Section("table", "Mean cross-coupling", table_html(mat.round(4))),
    ]
    name_a, name_b = _names(res)
    return write_page(out, f"Cross-coupling: {name_a} in the bases of {name_b}", sections)


__all__ = ["caption_cross_heatmap", "plot_cross_heatmap", "write_cross_report"]
