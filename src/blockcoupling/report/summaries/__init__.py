"""Pure pandas summaries of stored measurements: what the figures draw and the report states.

Nothing here imports matplotlib (the correlation, sweep and monitor studies read these
summaries without plotting) and nothing recomputes a Jacobian: every function reads the tidy
tables of a [`Measurement`][blockcoupling.engine.results.Measurement] (``coupling``, ``trajectory``,
``token_metrics``, ``spectra``, ``prompts``) and its ``A/<prompt_id>/<orientation>`` arrays.

Conventions shared by every function:

- ``runs``: one Measurement or a sequence of them (a trained model next to its random
  initialisation, training checkpoints, different models); results come back in run order.
- The coupling rows a function selects are given by one ``engine.statistic.StatisticRule``
  passed whole (``rule``; default `REPORT_RULE`: raw ``coupling``): its variant, its K
  (``k=None``: each run's smallest measured K, as everywhere), its ``p`` (for the variants
  that take one, ``P_VARIANTS``) and its orientation (``ujv`` or ``vju``). The |A| grids take
  a display ``k`` (the leading k x k block of the stored matrices) and an ``orientation``.
- Where a run lacks the data, per-run lists hold ``None``; where no run has it, the function
  raises `NoData` (a [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] whose message
  says what to measure).
- Robust statistics (median and quartiles) sit next to means wherever a quantity is
  heavy-tailed (expodistance of post-LN models reaches 1e5 on single tokens).
- ``coupling_vs_rotated`` = 1 - m / m_rot leads (0 at the chance level of the same basis
  rotated at random), ``coupling_vs_null`` = 1 - m / m_null stands beside it (0 at the chance
  level of independent random bases, whose left and right vectors are unrelated too;
  ``docs/conventions.md``); 1 = perfect coupling. A run measured before the rotated null
  existed is led by ``coupling_vs_null`` (``lead_of``). The chance coupling ``c_null`` itself
  is recovered row by row from the ``coupling`` and ``coupling_vs_null`` rows of the same
  Jacobian pair.
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
