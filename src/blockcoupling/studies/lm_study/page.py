"""The lm-family study's page (``study.html``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from blockcoupling.studies.lm_study.design import HYPOTHESES, stopping_rule
from blockcoupling.studies.lm_study.result import StudyResult


def write_study_page(result: StudyResult, path: Path) -> Path:
    """``study.html``: the statement, the emergence curves, final accuracy against final
    coupling (error bars one se), the models and the tests."""

    from blockcoupling.report.page import Section, esc, figure_html, table_html, write_page

    em, mt = result.emergence, result.models
    fig, fig2 = _emergence_figure(em), _correlation_figure(mt, result.spec.k)
    cols = ["run_id", "n_layer", "d_model", "batch_size", "data_chars", "stop_step", "step",
            "params",
            "coupling_vs_null_mean", "coupling_vs_null_se", "coupling_mean", "coupling_se",
            "coupling_chance", "accuracy", "loss", "plateau_reached"]
    sections = [
        Section("result", "What the study found", "".join(
            f"<p>{esc(line)}</p>" for line in result.statement)),
        Section("design", "Hypotheses (fixed before the data)", "".join(
            f"<p><b>{esc(k)}</b>: {esc(v)}</p>" for k, v in HYPOTHESES.items())
            + f"<p><b>Training length</b>: {esc(stopping_rule(result.spec))}</p>"),
        Section("emergence", "Emergence over training", figure_html(
            fig, "Left: depth-wise coupling above chance (coupling_vs_null, K = "
            f"{result.spec.k}, last token, pairs l != l') per run against the training step "
            "(symmetric-log axis), error bars one standard error over prompts; right: "
            "held-out next-character accuracy.")),
        Section("correlation", "Final coupling against held-out accuracy", figure_html(
            fig2, "One point per independent run (its final checkpoint); error bars one "
            "standard error over prompts.")),
        Section("models", "Runs", table_html(mt[cols].set_index("run_id"))),
    ]
    return write_page(path, "Tiny-LM family: coupling and generalisation", sections,
                      lead="blockcoupling study lm-family")


def _emergence_figure(em: pd.DataFrame) -> Figure:
    """Per run against the training step (symmetric-log axis): coupling above chance with
    one standard error (left) and held-out accuracy (right)."""
    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for i, (rid, g) in enumerate(em.groupby("run_id", sort=False)):
        x = g["step"].astype(float).to_numpy()
        axes[0].errorbar(x, g["coupling_vs_null_mean"], yerr=g["coupling_vs_null_se"],
                         fmt="o-", ms=3, capsize=2, color=f"C{i % 10}", label=rid)
        axes[1].plot(x, g["accuracy"], "o-", ms=3, color=f"C{i % 10}")
    for ax, lab in ((axes[0], "coupling above chance (coupling_vs_null)"),
                    (axes[1], "held-out accuracy (%)")):
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("training step")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.0, color="0.5", lw=0.8, ls=":")
    axes[0].legend(fontsize=6)
    return fig


def _correlation_figure(mt: pd.DataFrame, k: int) -> Figure:
    """Held-out accuracy against the final coupling above chance (left) and raw c_K (right),
    one point per run with one standard error."""
    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for ax, col, lab in ((axes[0], "coupling_vs_null", "final coupling above chance"),
                         (axes[1], "coupling", f"final raw c_K (K = {k})")):
        ax.errorbar(mt[f"{col}_mean"], mt["accuracy"], xerr=mt[f"{col}_se"], fmt="o",
                    capsize=2)
        for r in mt.itertuples():
            ax.annotate(r.run_id, (getattr(r, f"{col}_mean"), r.accuracy), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(lab)
        ax.set_ylabel("held-out accuracy (%)")
        ax.grid(alpha=0.3)
    return fig
