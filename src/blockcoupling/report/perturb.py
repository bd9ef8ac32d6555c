"""The perturbation experiment's summary, figure and page [paper fig. 34]: the cosine
similarity of the perturbed last-token state with the true one, against the noise level, at
the first and the last layer (and the input as the reference), from the table of
``engine.perturb`` (one row per prompt, level, draw and layer)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.report.figures.base import new_figure

__all__ = ["perturbation_summary", "plot_perturbation", "write_perturbation_html"]


def perturbation_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (level, layer): each prompt's mean over its draws first (the prompt is the unit of
    replication), then ``n_prompts``, the mean, its standard error (sample std / sqrt(n)) and
    the median over prompts, for ``cosine`` and ``rel_distance``. The prompts are reduced in
    the order of ``rows`` (the stored table's canonical order: by content), never by their
    ids, which name a position in a prompt file."""
    per_prompt = rows.groupby(["level", "layer", "prompt_id"], sort=False)[
        ["cosine", "rel_distance"]].mean()
    g = per_prompt.groupby(["level", "layer"])
    out = pd.DataFrame({"n_prompts": g.size()})
    for col in ("cosine", "rel_distance"):
        out[f"{col}_mean"] = g[col].mean()
        out[f"{col}_se"] = g[col].std(ddof=1) / np.sqrt(out["n_prompts"])
        out[f"{col}_median"] = g[col].median()
    return out.reset_index()


def plot_perturbation(rows: pd.DataFrame) -> Figure:
    """Left: mean cosine similarity (error bars one standard error over prompts) against the
    noise level at layer 0 (the perturbed input: the reference), layer 1 (after the first
    block) and layer L (the last); right: the cosine against the layer, one line per level."""
    s = perturbation_summary(rows)
    L = int(s["layer"].max())
    fig = new_figure(11.0, 4.0)
    left, right = fig.subplots(1, 2)
    for layer, style, name in ((0, ":", "input x^0 (reference)"), (1, "-", "first layer (l = 1)"),
                               (L, "--", f"last layer (l = {L})")):
        g = s[s["layer"] == layer].sort_values("level")
        left.errorbar(g["level"], g["cosine_mean"], yerr=g["cosine_se"].fillna(0.0), fmt="o",
                      ls=style, capsize=3, label=name)
    left.set_xscale("log")
    left.set_xlabel("noise level ||delta|| / ||x^0_t||")
    left.set_ylabel("cosine(perturbed x^l_t, true x^l_t)")
    left.grid(alpha=0.3)
    left.legend(fontsize="small")
    levels = sorted(s["level"].unique())
    for i, lv in enumerate(levels):
        g = s[s["level"] == lv].sort_values("layer")
        right.plot(g["layer"], g["cosine_mean"], "o-", ms=3,
                   color=f"C{i % 10}", label=f"level {lv:g}")
    right.set_xlabel("layer l (0 = input of block 1)")
    right.set_ylabel("mean cosine")
    right.grid(alpha=0.3)
    right.legend(fontsize="x-small")
    return fig


def write_perturbation_html(rows: pd.DataFrame, settings: Mapping[str, Any],
                            out: str | Path) -> Path:
    """The page: what was perturbed and how, the figure, the summary table."""
    from blockcoupling.report.html import Section, esc, figure_html, table_html, write_page
    from blockcoupling.report.summaries import short_name

    s = perturbation_summary(rows)
    L = int(s["layer"].max())
    key = s[s["layer"].isin([0, 1, L])].copy()
    lead = (f"<p>Model {esc(short_name(str(settings.get('model', '?'))))}; "
            f"{esc(rows['prompt_id'].nunique())} "
            f"prompts; token {esc(settings.get('token', -1))} (negative: from the end); "
            f"{esc(settings.get('draws'))} random directions per level (seed "
            f"{esc(settings.get('seed'))}). {esc(settings.get('rule', ''))}</p>")
    caption = ("Cosine similarity of the perturbed state of the token with its true state, "
               "mean over prompts of each prompt's mean over directions (error bars one "
               "standard error over prompts): against the noise level at the input, the first "
               f"and the last layer (left), and against the layer (right); L = {L}. The paper's "
               "fig. 34 (Llama-3 8B).")
    sections = [Section("figure", "Cosine similarity with the true trajectory",
                        figure_html(plot_perturbation(rows), caption, number=1)),
                Section("table", "Input, first and last layer", table_html(key, index=False))]
    return write_page(Path(out), "Perturbation of the last token's embedding", sections,
                      lead=lead)
