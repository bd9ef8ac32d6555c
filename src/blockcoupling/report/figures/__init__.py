"""The paper's figures, drawn from stored measurements only, one module per figure family
(`depth`, `tokens`, `mosaics`, `trajectory`, `profiles`, `spectra`, `runs`; `base`: what they
share).

Every ``plot_*`` function takes one [`Measurement`][blockcoupling.engine.results.Measurement]
or a sequence of them and returns a `matplotlib.figure.Figure`; its ``caption_*`` twin takes
the same arguments and says what was measured, naming runs by their labels. The numbers come
from `blockcoupling.report.summaries` (re-exported here); where the data a figure needs is
absent both raise `FigureUnavailable` (= ``summaries.NoData``).
"""

from blockcoupling.engine.spectra import fit_inverse_depth
from blockcoupling.report.figures.base import (
    DPI,
    FORMATS,
    FigureUnavailable,
    Runs,
    png_bytes,
    rendered_png,
    save_figure,
)
from blockcoupling.report.figures.depth import (
    caption_coupling_by_distance,
    caption_coupling_grid,
    caption_depth_heatmap,
    caption_layer_graph,
    layer_graph_variant,
    plot_coupling_by_distance,
    plot_coupling_grid,
    plot_depth_heatmap,
    plot_layer_graph,
)
from blockcoupling.report.figures.mosaics import caption_token_grid, plot_token_grid
from blockcoupling.report.figures.profiles import (
    caption_depth_profiles,
    caption_metrics_by_run,
    plot_depth_profiles,
    plot_metrics_by_run,
)
from blockcoupling.report.figures.runs import caption_across_runs, plot_across_runs
from blockcoupling.report.figures.spectra import caption_singular_values, plot_singular_values
from blockcoupling.report.figures.tokens import caption_token_heatmap, plot_token_heatmap
from blockcoupling.report.figures.trajectory import (
    caption_pca_trajectories,
    caption_trajectory_metrics,
    plot_pca_trajectories,
    plot_trajectory_metrics,
)
from blockcoupling.report.summaries import (
    HIGHER_IS_COUPLED,
    P_VARIANTS,
    REPORT_RULE,
    TOKEN_KINDS,
    GridPick,
    TokenPick,
    across_runs_data,
    as_runs,
    coupling_grid_data,
    depth_matrices,
    grid_mosaic,
    layer_graph_weights,
    n_prompts,
    pca_data,
    resolve_k,
    run_label,
    run_labels,
    token_heatmap_data,
    top_singular_values,
    trajectory_summary,
)

#: the data drawn by `plot_depth_heatmap` (kept under its former name)
depth_heatmap_data = depth_matrices

__all__ = [
    "caption_depth_profiles", "caption_metrics_by_run", "plot_depth_profiles",
    "plot_metrics_by_run", "caption_token_grid", "plot_token_grid",
    "DPI", "FORMATS", "HIGHER_IS_COUPLED", "P_VARIANTS", "REPORT_RULE", "TOKEN_KINDS",
    "FigureUnavailable",
    "GridPick", "Runs", "TokenPick", "across_runs_data", "as_runs",
    "caption_across_runs", "caption_coupling_by_distance", "caption_coupling_grid",
    "caption_depth_heatmap", "caption_layer_graph", "caption_pca_trajectories",
    "caption_singular_values", "caption_token_heatmap", "caption_trajectory_metrics",
    "coupling_grid_data", "depth_heatmap_data", "depth_matrices", "fit_inverse_depth",
    "grid_mosaic", "layer_graph_variant", "layer_graph_weights", "n_prompts", "pca_data",
    "plot_across_runs", "plot_coupling_by_distance", "plot_coupling_grid",
    "plot_depth_heatmap", "plot_layer_graph", "plot_pca_trajectories",
    "plot_singular_values", "plot_token_heatmap", "plot_trajectory_metrics", "png_bytes",
    "rendered_png",
    "resolve_k", "run_label", "run_labels", "save_figure", "token_heatmap_data",
    "top_singular_values", "trajectory_summary",
]
