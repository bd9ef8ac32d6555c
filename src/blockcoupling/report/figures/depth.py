"""Depth-wise coupling figures: the L x L heatmap, the |A| grid [paper fig. 3], the layer
graph [fig. 1c-e] and coupling against layer distance. Data from
`blockcoupling.report.summaries`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from blockcoupling.engine.names import NULL_VARIANTS
from blockcoupling.engine.statistic import LEAD_VARIANTS, StatisticRule
from blockcoupling.report.figures.base import (
    HEATMAP_CMAP,
    LEGEND_CHARS,
    TITLE_CHARS,
    FigureUnavailable,
    Runs,
    clip,
    matrix_ticks,
    missing_text,
    mosaic_panel,
    new_figure,
    panels,
    present,
    prompt_named,
    run_parts,
    selection_text,
)
from blockcoupling.report.summaries import (
    REPORT_RULE,
    as_runs,
    coupling_by_distance,
    coupling_grid_data,
    depth_matrices,
    edge_strength,
    has_variant,
    layer_graph_weights,
    run_labels,
)

__all__ = ["caption_coupling_by_distance", "caption_coupling_grid", "caption_depth_heatmap",
           "caption_layer_graph", "layer_graph_variant", "plot_coupling_by_distance",
           "plot_coupling_grid", "plot_depth_heatmap", "plot_layer_graph"]


# ====================================================================== L x L heatmap
def plot_depth_heatmap(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                       token: int | None = None,
                       labels: Sequence[str] | None = None) -> Figure:
    """L x L depth-wise coupling heatmaps, one panel per run, one shared colour scale.

    Rows are the measured layer l (side a), columns the basis layer l' (side b); each cell is
    the mean over prompts (and tokens) of ``Measurement.depth_matrix``."""
    ms = as_runs(runs)
    mats, labs = present(depth_matrices(ms, rule, token=token), run_labels(ms, labels))
    values = np.concatenate([m.to_numpy().ravel() for m in mats])
    norm = Normalize(float(np.nanmin(values)), float(np.nanmax(values)))
    fig, axes = panels(len(mats), 3.6, 4.0, extra_width=1.0)
    image = None
    for ax, mat, lab in zip(axes, mats, labs, strict=True):
        ax.set_title(clip(lab, TITLE_CHARS))
        image = ax.imshow(mat.to_numpy(dtype=float), cmap=HEATMAP_CMAP, norm=norm,
                          origin="upper", interpolation="nearest")
        matrix_ticks(ax, list(mat.index), list(mat.columns))
        ax.set_xlabel("basis layer l'")
        ax.set_ylabel("measured layer l")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=rule.variant, shrink=0.9)
    return fig


def caption_depth_heatmap(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                          token: int | None = None,
                          labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    mats = depth_matrices(ms, rule, token=token)
    return ("Depth-wise coupling between the block Jacobians J^l_tt of every pair of layers: "
            "rows = measured layer l, columns = basis layer l', mean over prompts; one colour "
            "scale for all panels. "
            + selection_text(ms, rule, token, labels)
            + missing_text(mats, run_labels(ms, labels)))


# ====================================================================== |A| grid
def plot_coupling_grid(runs: Runs, *, prompt_id: str | None = None, k: int | None = None,
                       orientation: str = "ujv",
                       labels: Sequence[str] | None = None) -> Figure:
    """Grid of |A| coupling matrices for a window of layers (paper fig. 3), one panel per run.

    Cell (row l, column l') of a panel is |A_{l l'}| = |U_{l'}^T J^l V_{l'}| (orientation
    ujv), the leading k x k block, divided by its own maximum so that the diagonal pattern is
    visible in every cell whatever the scale of the Jacobians."""
    ms = as_runs(runs)
    picks, labs = present(coupling_grid_data(ms, prompt_id=prompt_id, k=k,
                                             orientation=orientation), run_labels(ms, labels))
    fig, axes = panels(len(picks), 4.6, 4.8, extra_width=1.0)
    image = None
    for ax, pick, lab in zip(axes, picks, labs, strict=True):
        ax.set_title(clip(lab, TITLE_CHARS))
        image = mosaic_panel(ax, pick, pick.layers)
        ax.set_xlabel("basis layer l'")
        ax.set_ylabel("measured layer l")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="|A| / max |A| (per cell)", shrink=0.8)
    return fig


def _layers_text(layers: Sequence[int]) -> str:
    """'2..5' for a contiguous run of layers, else '3, 5, 7'."""
    if list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))


def caption_coupling_grid(runs: Runs, *, prompt_id: str | None = None, k: int | None = None,
                          orientation: str = "ujv",
                          labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    picks = coupling_grid_data(ms, prompt_id=prompt_id, k=k, orientation=orientation)
    formula = "U_l'^T J^l V_l'" if orientation == "ujv" else "V_l'^T J^l U_l'"
    parts = run_parts(ms, picks, labs, lambda m, pick: f"K={pick.k}, layers "
                      f"{_layers_text(pick.layers)}, {prompt_named(m, pick.prompt_id)}")
    return (f"Coupling matrices |A_ll'| = |{formula}| (orientation={orientation}) for every "
            "pair of layers in the figure window, leading K x K block, last measured token, "
            "each cell divided by its own maximum; a bright diagonal with a dark off-diagonal "
            "means the basis layer's singular vectors diagonalise the measured layer's "
            "Jacobian. " + parts + "."
            + missing_text(picks, labs, "Not stored (figure_window)"))


# ====================================================================== layer graph
def layer_graph_variant(runs: Runs, variant: str = "coupling", against_chance: bool = True
                        ) -> str:
    """The variant the layer graph draws: the leading chance-corrected variant
    (``coupling_vs_rotated``, else ``coupling_vs_null``) when ``against_chance`` and every run
    with depth-wise rows has it, else ``variant``."""
    ms = as_runs(runs)
    with_depth = [m for m in ms if (m.coupling["kind"] == "depth").any()]
    for lead in LEAD_VARIANTS:
        if against_chance and with_depth and all(has_variant(m, lead) for m in with_depth):
            return lead
    return variant


def _circle_graph(ax: Any, layers: list[int], w: dict[tuple[int, int], float],
                  variant: str) -> None:
    """Layers on a circle (the first at the top, clockwise), one edge per pair of ``w``: width
    and opacity from its `edge_strength`, one LineCollection."""
    ax.set_aspect("equal")
    ax.axis("off")
    n = len(layers)
    angle = {lay: math.pi / 2 - 2 * math.pi * i / n for i, lay in enumerate(layers)}
    pos = {lay: (math.cos(a), math.sin(a)) for lay, a in angle.items()}
    s = edge_strength(list(w.values()), variant)
    colors = [(0.12, 0.35, 0.70, 0.05 + 0.9 * x) for x in s]
    ax.add_collection(LineCollection([[pos[a], pos[b]] for a, b in w], linewidths=0.3 + 5.0 * s,
                                     colors=colors, zorder=1))
    xy = np.array([pos[lay] for lay in layers])  # (n, 2)
    ax.scatter(xy[:, 0], xy[:, 1], s=140 if n <= 24 else 40, c="white", edgecolors="0.2",
               zorder=2)
    if n <= 40:
        for lay in layers:
            ax.text(*pos[lay], str(lay), ha="center", va="center", fontsize=7, zorder=3)
    ax.set_xlim(-1.2, 1.2)
    ax.set_ylim(-1.2, 1.2)


def plot_layer_graph(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                     token: int | None = None, against_chance: bool = True,
                     labels: Sequence[str] | None = None) -> Figure:
    """Layer adjacency graph (paper fig. 1c-e), one panel per run.

    Layers are nodes on a circle (layer 1 at the top, clockwise). The edge between l and l'
    has width ``0.3 + 5 s`` and opacity ``0.05 + 0.9 s`` where ``s`` =
    `edge_strength` of its mean depth-wise value: a
    FIXED scale (for ``coupling_vs_null``, drawn when measured: s = 0 at the chance level,
    1 for perfect coupling), never the data's range, so a model at chance looks unstructured.
    Edges are drawn in the order of ``layer_graph_weights`` (l < l', lexicographic) as one
    LineCollection per panel."""
    ms = as_runs(runs)
    variant = layer_graph_variant(ms, rule.variant, against_chance)
    mats, labs = present(depth_matrices(ms, rule.with_variant(variant), token=token),
                         run_labels(ms, labels))
    weights = [layer_graph_weights(m) for m in mats]
    if not any(weights):
        raise FigureUnavailable("the depth-wise matrices have no off-diagonal pairs")
    fig, axes = panels(len(mats), 3.2, 3.6, extra_width=0.2)
    for ax, mat, w, lab in zip(axes, mats, weights, labs, strict=True):
        ax.set_title(clip(lab, TITLE_CHARS))
        _circle_graph(ax, sorted(set(mat.index) | set(mat.columns)), w, variant)
    if variant in NULL_VARIANTS:
        names = ("at chance (0)", "0.5", "perfect (1)")
    elif variant == "coupling":
        names = ("c_K 0", "c_K 0.5", "c_K 1")
    else:
        names = (f"{variant} 1", f"{variant} 0.5", f"{variant} 0")
    handles = [Line2D([], [], lw=0.3 + 5.0 * s, color=(0.12, 0.35, 0.70, 0.05 + 0.9 * s),
                      label=name) for s, name in zip((0.0, 0.5, 1.0), names, strict=True)]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False,
               fontsize="small")
    return fig


def caption_layer_graph(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                        token: int | None = None, against_chance: bool = True,
                        labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    variant = layer_graph_variant(ms, rule.variant, against_chance)
    rule = rule.with_variant(variant)
    mats = depth_matrices(ms, rule, token=token)
    scale = ("a fixed scale from the chance level (thinnest, 0) to perfect coupling "
             "(thickest, 1), so a model at chance looks unstructured"
             if variant in NULL_VARIANTS else
             f"a fixed scale of {variant} (not the data's range; the chance level was not "
             "measured, so thin edges are not necessarily at chance)")
    return ("Layer adjacency graph: each node is a layer (layer 1 at the top, clockwise); "
            "edge width and opacity grow with the mean depth-wise coupling of the two layers "
            f"(mean of both directions, mean over prompts), on {scale}. "
            + selection_text(ms, rule, token, labels)
            + missing_text(mats, run_labels(ms, labels)))


# ====================================================================== by distance
def plot_coupling_by_distance(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                              labels: Sequence[str] | None = None) -> Figure:
    """Locality: mean depth-wise coupling against |l - l'|, one line per run, +- one std."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    tables = coupling_by_distance(ms, rule)
    variant = rule.variant
    fig = new_figure(7.0, 3.8)
    ax = fig.subplots()
    for i, (t, lab) in enumerate(zip(tables, labs, strict=True)):
        if t is None:
            continue
        x = t["distance"].to_numpy(dtype=float)
        y = t["mean"].to_numpy(dtype=float)
        sd = t["std"].fillna(0.0).to_numpy(dtype=float)
        ax.plot(x, y, marker="o", color=f"C{i % 10}", label=clip(lab, LEGEND_CHARS))
        ax.fill_between(x, y - sd, y + sd, color=f"C{i % 10}", alpha=0.12, linewidth=0)
    if variant in NULL_VARIANTS:
        ax.axhline(0.0, color="0.3", lw=1, ls=":", label="chance level")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer distance |l - l'|")
    ax.set_ylabel(f"mean {variant}")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    return fig


def caption_coupling_by_distance(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                                 labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    coupling_by_distance(ms, rule)
    return ("Locality of coupling: mean depth-wise value over all layer pairs at distance "
            "|l - l'| (0 = the diagonal), over prompts and tokens; the band is +- one standard "
            "deviation. " + selection_text(ms, rule, None, labels))
