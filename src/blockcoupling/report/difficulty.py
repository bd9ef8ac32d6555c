"""Per-prompt coupling against difficulty and prompt length (the paper's fig. 10): the figure
and the page, from a table of one row per prompt (``rating``, ``n_tokens`` and the coupling
columns) and its regressions (``studies.difficulty``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.report.figures.base import new_figure

__all__ = ["plot_difficulty", "write_difficulty_html"]

_X = {"rating": "difficulty rating (Easy2Hard-Bench)", "n_tokens": "prompt length (tokens)"}


def plot_difficulty(table: pd.DataFrame, fits: Mapping[str, Mapping[str, Any]],
                    variant: str | None = None) -> Figure:
    """Two panels: each prompt's ``variant`` (default: the first of ``fits``, the leading
    variant) against its difficulty rating and against its length, with the least-squares
    line, R^2, p and Spearman's rho in the title; a chance-corrected variant (``coupling_vs_*``)
    with its chance line at 0."""
    variant = variant or next(iter(fits))
    fig = new_figure(10.0, 3.9)
    axes = fig.subplots(1, 2)
    for ax, name in zip(axes, ("rating", "n_tokens"), strict=True):
        x = table[name].to_numpy(dtype=float)
        y = table[variant].to_numpy(dtype=float)
        ax.scatter(x, y, s=14, alpha=0.7)
        r = fits.get(variant, {}).get(name, {})
        if "slope" in r:
            xs = np.linspace(np.nanmin(x), np.nanmax(x), 20)
            ax.plot(xs, r["slope"] * xs + r["intercept"], "--", color="C1")
            ax.set_title(f"R^2={r['r2']:.2f}, p={r['p']:.2g}, rho={r['spearman_rho']:+.2f} "
                         f"(n={r['n']})", fontsize="small")
        elif "skipped" in r:
            ax.set_title(f"no fit: {r['skipped']}", fontsize="x-small")
        if variant.startswith("coupling_vs_"):
            ax.axhline(0.0, color="0.5", lw=0.8, ls=":", label="chance (0)")
        ax.set_xlabel(_X[name])
        ax.set_ylabel(f"per-prompt {variant}")
        ax.grid(alpha=0.3)
    return fig


def write_difficulty_html(result: Any, out: str | Path) -> Path:
    """The page of a ``studies.difficulty.DifficultyResult``: one figure per variant and the
    table of prompts."""
    from blockcoupling.report.html import Section, esc, figure_html, table_html, write_page

    sections = []
    for i, variant in enumerate(result.fits, start=1):
        caption = (f"Each prompt's depth-wise {variant} (K={result.k}; mean over layer pairs "
                   "l != l' at its last measured token) against its Easy2Hard difficulty rating "
                   "(left) and its length in tokens (right), the least-squares line dashed; "
                   "the paper's fig. 10. The prompt is the unit of the regression."
                   + (" Dotted: the chance level (0) of this chance-corrected variant."
                      if variant.startswith("coupling_vs_") else ""))
        sections.append(Section(f"fig-{variant}", f"{variant} against difficulty and length",
                                figure_html(plot_difficulty(result.table, result.fits, variant),
                                            caption, number=i)))
    sections.append(Section("prompts", "Prompts", table_html(result.table, index=False)))
    lead = (f"<p>{esc(len(result.table))} prompts; ratings: {esc(result.ratings)}.</p>")
    return write_page(Path(out), "Coupling against prompt difficulty and length", sections,
                      lead=lead)
