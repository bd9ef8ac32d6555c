"""``study.html`` of ``study intervention``: the statement, the design, the figure (coupling
reached and accuracy per arm, accuracy against the coupling reached), the arms and the runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from blockcoupling.report.figures.base import new_figure

if TYPE_CHECKING:
    from blockcoupling.studies.intervention.result import InterventionResult

__all__ = ["plot_arms", "write_study_page"]


def plot_arms(result: InterventionResult) -> Figure:
    """Left and middle: the coupling reached and test accuracy per strength (arm means with
    seed-level se bars; faint: the runs); right: test accuracy against the coupling reached,
    one line per seed through its arms."""
    spec, runs, arms = result.spec, result.runs, result.analysis["arms"]
    v = spec.variant
    fig = new_figure(13.0, 3.9)
    ax0, ax1, ax2 = fig.subplots(1, 3)
    pos = {s: i for i, s in enumerate(result.analysis["strengths"])}
    for ax, c in ((ax0, v), (ax1, "test_accuracy")):
        ax.scatter([pos[s] for s in runs["strength"]], runs[c], s=8, color="0.6", alpha=0.5)
        ax.errorbar([pos[s] for s in arms["strength"]], arms[f"{c}_mean"],
                    yerr=arms[f"{c}_se"], fmt="o-", ms=5, capsize=3, color="C0")
        ax.set_xticks(range(len(pos)), [f"{s:+g}" for s in pos])
        ax.set_xlabel("strength of the coupling term")
        ax.set_ylabel(c)
        ax.grid(alpha=0.3)
    ax0.axhline(0.0, color="0.5", lw=0.8, ls=":")
    cmap = colormaps["viridis"]
    for _, g in runs.sort_values("strength").groupby("seed"):
        ax2.plot(g[v], g["test_accuracy"], "-", color="0.8", lw=0.8, zorder=1)
    ax2.scatter(runs[v], runs["test_accuracy"], c=[pos[s] for s in runs["strength"]],
                cmap=cmap, s=14, zorder=2)
    ax2.set_xlabel(f"{v} reached")
    ax2.set_ylabel("test accuracy")
    ax2.axvline(0.0, color="0.5", lw=0.8, ls=":")
    ax2.grid(alpha=0.3)
    return fig


def write_study_page(result: InterventionResult, path: Path) -> Path:
    """The study's page: what it found, the design and its hypotheses and power, the figure,
    the arms (seed level) and the runs."""
    from blockcoupling.report.html import (
        Section,
        esc,
        figure_html,
        paragraphs_html,
        table_html,
        write_page,
    )
    from blockcoupling.studies.intervention.design import HYPOTHESES, describe_design

    spec = result.spec
    power = pd.DataFrame([{"test": k, "power": r.get("power"), "effect": r.get("effect"),
                           "model": r.get("model")} for k, r in result.powers.items()])
    sections = [
        Section("result", "What the study found", paragraphs_html(result.statement)),
        Section("design", "Design and hypotheses (fixed before the data)",
                paragraphs_html(describe_design(spec)) + "".join(
                    f"<p><b>{esc(k)}</b>: {esc(t)}</p>" for k, t in HYPOTHESES.items())
                + table_html(power, index=False)),
        Section("figure", "Coupling reached and accuracy per arm", figure_html(
            plot_arms(result), f"Left: {spec.variant} (measured by the engine) per strength; "
            "middle: test accuracy; arm means with seed-level standard errors, one faint "
            "point per run. Right: test accuracy against the coupling reached, one grey line "
            "per seed through its arms (colour: strength).")),
        Section("arms", "Arms (seed level)", table_html(result.analysis["arms"], index=False)),
        Section("runs", "Runs", table_html(result.runs.drop(columns=["path"]), index=False)),
    ]
    return write_page(path, "Changing coupling: does accuracy follow?", sections,
                      lead="blockcoupling study intervention")
