"""Pure pandas summaries of stored measurements: what the figures draw and the report states.

No matplotlib here (studies read these summaries without plotting) and no Jacobian is
recomputed: every function reads the tables and ``A/...`` arrays of a
[`Measurement`][blockcoupling.engine.results.Measurement]. Shared rules: ``runs`` is one
Measurement or a sequence (results in run order); the coupling rows are chosen by one
``engine.statistic.StatisticRule`` (``rule``, default `REPORT_RULE`; ``k=None``: each run's
smallest measured K); a run without the data gives ``None`` in a per-run list, and when no run
has it the function raises `NoData` saying what to measure. Medians and quartiles stand next
to means where a quantity is heavy-tailed; the chance-corrected variants are those of
``docs/conventions.md`` (`lead_of` says which one leads a page).
"""

from __future__ import annotations

from blockcoupling.report.summaries.common import (
    CHANCE_BAND,
    EXPODISTANCE_NAN_REASON,
    HIGHER_IS_COUPLED,
    P_VARIANTS,
    REPORT_RULE,
    TOKEN_KINDS,
    NoData,
    RobustStats,
    Runs,
    as_runs,
    at_run_k,
    check_variant,
    config_differences,
    fmt_number,
    is_empty,
    n_layers,
    n_prompts,
    resolve_k,
    robust_stats,
    run_label,
    run_labels,
    short_name,
    token_metric_stats,
)
from blockcoupling.report.summaries.depth import (
    chance_coupling_rows,
    coupling_by_distance,
    depth_matrices,
    depth_matrix,
    depth_rows,
    edge_strength,
    has_variant,
    headline_columns,
    layer_graph_weights,
    lead_of,
    per_prompt_vs_null,
    why_no_depth,
)
from blockcoupling.report.summaries.runs import (
    across_runs_data,
    run_overview,
)
from blockcoupling.report.summaries.tokens import (
    GridPick,
    TokenPick,
    coupling_grid_data,
    grid_mosaic,
    token_axes,
    token_heatmap_data,
)
from blockcoupling.report.summaries.trajectory import (
    InverseDepthFit,
    inverse_depth_fit,
    pca_data,
    top_singular_values,
    trajectory_summary,
    window_covers_model,
)

__all__ = [
    "CHANCE_BAND",
    "EXPODISTANCE_NAN_REASON",
    "GridPick",
    "HIGHER_IS_COUPLED",
    "InverseDepthFit",
    "NoData",
    "P_VARIANTS",
    "RobustStats",
    "Runs",
    "TOKEN_KINDS",
    "TokenPick",
    "across_runs_data",
    "as_runs",
    "chance_coupling_rows",
    "check_variant",
    "config_differences",
    "coupling_by_distance",
    "coupling_grid_data",
    "depth_matrices",
    "depth_matrix",
    "depth_rows",
    "edge_strength",
    "fmt_number",
    "grid_mosaic",
    "has_variant",
    "headline_columns",
    "inverse_depth_fit",
    "is_empty",
    "layer_graph_weights",
    "lead_of",
    "n_layers",
    "n_prompts",
    "pca_data",
    "per_prompt_vs_null",
    "resolve_k",
    "REPORT_RULE",
    "at_run_k",
    "robust_stats",
    "run_label",
    "short_name",
    "run_labels",
    "run_overview",
    "token_axes",
    "token_heatmap_data",
    "token_metric_stats",
    "top_singular_values",
    "trajectory_summary",
    "why_no_depth",
    "window_covers_model",
]
