"""Token-wise coupling heatmaps: kinds ``self`` [paper fig. 4], ``fixed_input`` and
``fixed_output`` (context coupling). Data from
`blockcoupling.report.summaries.token_heatmap_data`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.report.figures.base import (
    HEATMAP_CMAP,
    TITLE_CHARS,
    Runs,
    clip,
    colormap,
    fixed_text,
    fmt_p,
    label_list,
    matrix_ticks,
    missing_text,
    panels,
    present,
    prompt_named,
    run_parts,
)
from blockcoupling.report.summaries import (
    P_VARIANTS,
    REPORT_RULE,
    as_runs,
    resolve_k,
    run_labels,
    token_heatmap_data,
)

__all__ = ["caption_token_heatmap", "plot_token_heatmap"]


def plot_token_heatmap(runs: Runs, kind: str = "self", rule: StatisticRule = REPORT_RULE, *,
                       prompt_id: str | None = None, layers: tuple[int, int] | None = None,
                       fixed_token: int | None = None,
                       labels: Sequence[str] | None = None) -> Figure:
    """Token-wise coupling heatmaps (paper fig. 4), one panel per run.

    ``self``: J^l_tt against J^l'_t't' (rows t, columns t'). ``fixed_input``: J^l_{s t}
    against J^l'_{s t'} for a fixed input token s. ``fixed_output``: J^l_{s t} against
    J^l'_{s' t} for a fixed output token t (rows s, columns s'). Missing cells (e.g. a causal
    model's t < s) are blank."""
    ms = as_runs(runs)
    found = token_heatmap_data(ms, kind, rule, prompt_id=prompt_id, layers=layers,
                               fixed_token=fixed_token)
    picks, labs = present(found, run_labels(ms, labels))
    values = np.concatenate([pk.matrix.to_numpy(dtype=float).ravel() for pk in picks])
    norm = Normalize(float(np.nanmin(values)), float(np.nanmax(values)))
    row_name, col_name = {"self": ("measured token t", "basis token t'"),
                          "fixed_input": ("measured output token t", "basis output token t'"),
                          "fixed_output": ("measured input token s", "basis input token s'")}[kind]
    fig, axes = panels(len(picks), 3.6, 4.4, extra_width=1.0)  # room for two-line titles
    image = None
    for ax, pick, lab in zip(axes, picks, labs, strict=True):
        ax.set_title(f"{clip(lab, TITLE_CHARS)}\nlayers {pick.layer_a}, {pick.layer_b}"
                     f"{fixed_text(kind, pick.fixed)}", fontsize="medium")
        image = ax.imshow(pick.matrix.to_numpy(dtype=float),
                          cmap=colormap(HEATMAP_CMAP).with_extremes(bad="0.92"), norm=norm,
                          interpolation="nearest")
        matrix_ticks(ax, list(pick.matrix.index), list(pick.matrix.columns))
        ax.set_xlabel(col_name)
        ax.set_ylabel(row_name)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=rule.variant, shrink=0.9)
    return fig


def caption_token_heatmap(runs: Runs, kind: str = "self", rule: StatisticRule = REPORT_RULE,
                          *, prompt_id: str | None = None, layers: tuple[int, int] | None = None,
                          fixed_token: int | None = None,
                          labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    picks = token_heatmap_data(ms, kind, rule, prompt_id=prompt_id, layers=layers,
                               fixed_token=fixed_token)
    variant, p, orientation = rule.variant, rule.p, rule.orientation
    what = {
        "self": "Token-wise coupling, same input and output token (kind self): J^l_tt "
                "(measured, rows t) against J^l'_t't' (basis, columns t').",
        "fixed_input": "Context coupling with a fixed input token s (kind fixed_input): "
                       "J^l_st (measured, rows t) against J^l'_st' (basis, columns t').",
        "fixed_output": "Context coupling with a fixed output token t (kind fixed_output): "
                        "J^l_st (measured, rows s) against J^l'_s't (basis, columns s').",
    }[kind]
    parts = run_parts(ms, picks, labs, lambda m, pick: f"{prompt_named(m, pick.prompt_id)}, "
                      f"layers l={pick.layer_a}, l'={pick.layer_b}"
                      + fixed_text(kind, pick.fixed, ", fixed "))
    p_text = f", p={fmt_p(p)}" if variant in P_VARIANTS else ""
    k_text = "K=" + label_list([resolve_k(m, rule.k) for m in ms], labs)
    has_rows = [bool((m.coupling["kind"] == kind).any()) for m in ms]
    not_measured = [None if pick is None and not rows else 0
                    for pick, rows in zip(picks, has_rows, strict=True)]
    one_token = [None if pick is None and rows else 0
                 for pick, rows in zip(picks, has_rows, strict=True)]
    return (f"{what} {k_text}, variant={variant}{p_text}, orientation={orientation}. "
            + parts + "." + missing_text(not_measured, labs)
            + missing_text(one_token, labs, "Measured at one token only"))
