"""Token-wise |A| mosaics [paper fig. 4; the context-coupling figures]: one panel per run,
cell (t, t') the coupling matrix |A| of the measured Jacobian at token t against the basis at
token t', at one layer. Data from `blockcoupling.report.summaries.mosaics.token_grid_data`."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from blockcoupling.report.figures.base import (
    TITLE_CHARS,
    Runs,
    clip,
    fixed_text,
    missing_text,
    mosaic_panel,
    panels,
    present,
    prompt_named,
    run_parts,
)
from blockcoupling.report.summaries import as_runs, run_labels
from blockcoupling.report.summaries.mosaics import token_grid_data

__all__ = ["caption_token_grid", "plot_token_grid"]

_AXES = {"self": ("measured token t (J^l_tt)", "basis token t' (J^l_t't')"),
         "fixed_input": ("measured output token t (J^l_st)", "basis output token t' (J^l_st')"),
         "fixed_output": ("measured input token s (J^l_st)", "basis input token s' (J^l_s't)")}


def plot_token_grid(runs: Runs, kind: str = "self", *, prompt_id: str | None = None,
                    k: int | None = None, orientation: str = "ujv",
                    labels: Sequence[str] | None = None) -> Figure:
    """Mosaic of |A| over token pairs at one layer, one panel per run; each cell divided by
    its own maximum (a bright diagonal inside a cell = the basis diagonalises the measured
    Jacobian)."""
    ms = as_runs(runs)
    picks, labs = present(token_grid_data(ms, kind, prompt_id=prompt_id, k=k,
                                          orientation=orientation), run_labels(ms, labels))
    fig, axes = panels(len(picks), 4.6, 4.8, extra_width=1.0)
    image = None
    rows, cols = _AXES[kind]
    for ax, pick, lab in zip(axes, picks, labs, strict=True):
        ax.set_title(f"{clip(lab, TITLE_CHARS)}\nlayer {pick.layer}"
                     f"{fixed_text(kind, pick.fixed)}", fontsize="medium")
        image = mosaic_panel(ax, pick, pick.tokens, fontsize="small")
        ax.set_xlabel(cols, fontsize="small")
        ax.set_ylabel(rows, fontsize="small")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="|A| / max |A| (per cell)", shrink=0.8)
    return fig


def caption_token_grid(runs: Runs, kind: str = "self", *, prompt_id: str | None = None,
                       k: int | None = None, orientation: str = "ujv",
                       labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    picks = token_grid_data(ms, kind, prompt_id=prompt_id, k=k, orientation=orientation)
    what = {"self": "same input and output token (kind self, the paper's fig. 4)",
            "fixed_input": "a fixed input token (kind fixed_input, context coupling)",
            "fixed_output": "a fixed output token (kind fixed_output, context coupling)"}[kind]
    formula = "U_b^T J_a V_b" if orientation == "ujv" else "V_b^T J_a U_b"
    parts = run_parts(ms, picks, labs,
                      lambda m, p: f"K={p.k}, layer {p.layer}, {prompt_named(m, p.prompt_id)}")
    return (f"Coupling matrices |A| = |{formula}| across tokens, {what}: cell (row a, column b) "
            "compares the measured Jacobian of token a with the top-K singular vectors of the "
            "Jacobian of token b at the same layer (l = l'), leading K x K block, each cell "
            "divided by its own maximum; at most the last 12 tokens per axis. "
            + parts + "." + missing_text(picks, labs, "Not stored"))
