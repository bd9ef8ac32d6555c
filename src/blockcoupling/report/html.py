"""The report of one or more runs (``blockcoupling report RUN_DIR ...``): `write_report` writes
``<out>`` (a summary generated from the data, `blockcoupling.report.narrative`; the runs
defined once; each figure of `blockcoupling.report.figures` that has data, with its caption)
and ``<out stem>_figures/NN_<name>.{png,svg,pdf}``. Re-exports the page template
(`blockcoupling.report.page`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report import figures as F
from blockcoupling.report.narrative import ReportSummary, report_summary
from blockcoupling.report.page import (
    CSS,
    Section,
    cell_html,
    esc,
    figure_html,
    html_path,
    paragraphs_html,
    render_page,
    table_html,
    write_page,
)
from blockcoupling.report.summaries import REPORT_RULE, fmt_number, is_empty, n_layers

__all__ = ["CSS", "ReportFigure", "Section", "esc", "figure_html", "paragraphs_html",
           "render_page", "report_figures", "table_html", "write_page", "write_report",
           "write_report_from_dirs"]


# ====================================================================== the report's figures
@dataclass(frozen=True)
class ReportFigure:
    """One entry of the report: how to draw it and caption it from the runs."""

    name: str  # file stem and HTML id
    title: str
    plot: Callable[[list[Measurement]], Figure]
    caption: Callable[[list[Measurement]], str]
    min_runs: int = 1


def report_figures(rule: StatisticRule = REPORT_RULE, *, labels: Sequence[str] | None = None,
                   order_name: str = "in the order given") -> list[ReportFigure]:
    """The figures of the report, in order, bound to one rule (its variant, K, p and
    orientation select the rows). The layer graph and the distance plot show the leading
    chance-corrected variant where every run measured it (``coupling_vs_rotated``, else
    ``coupling_vs_null``); the |A| grids show the rule's K x K block (all of each stored
    matrix where its K is None) in its orientation."""
    sel: dict[str, Any] = {"rule": rule, "labels": labels}
    grid: dict[str, Any] = {"k": rule.k if isinstance(rule.k, int) else None,
                            "orientation": rule.orientation, "labels": labels}
    lab: dict[str, Any] = {"labels": labels}

    def bind(fn: Callable[..., Any], *args: Any, **kw: Any) -> Callable[[list[Measurement]], Any]:
        return lambda ms: fn(ms, *args, **kw)

    def chance(fn: Callable[..., Any]) -> Callable[[list[Measurement]], Any]:
        return lambda ms: fn(ms, rule.with_variant(F.layer_graph_variant(ms, rule.variant)),
                             labels=labels)

    out = [
        ReportFigure("depth_heatmap", "Depth-wise coupling (L x L)",
                     bind(F.plot_depth_heatmap, **sel), bind(F.caption_depth_heatmap, **sel)),
        ReportFigure("coupling_grid", "Coupling matrices |A| across a window of layers",
                     bind(F.plot_coupling_grid, **grid), bind(F.caption_coupling_grid, **grid)),
    ]
    token_kinds = {  # kind -> (the heatmap's title, the matrices' title)
        "self": ("Token-wise coupling (same input and output token)",
                 "Coupling matrices |A| across tokens (same input and output)"),
        "fixed_input": ("Context coupling, fixed input token",
                        "Coupling matrices |A|, fixed input token"),
        "fixed_output": ("Context coupling, fixed output token",
                         "Coupling matrices |A|, fixed output token")}
    for name, (plot, caption, opts), which in (
            ("token", (F.plot_token_heatmap, F.caption_token_heatmap, sel), 0),
            ("token_grid", (F.plot_token_grid, F.caption_token_grid, grid), 1)):
        out += [ReportFigure(f"{name}_{kind}", titles[which], bind(plot, kind, **opts),
                             bind(caption, kind, **opts)) for kind, titles in token_kinds.items()]
    out += [
        ReportFigure("layer_graph", "Layer adjacency graph",
                     bind(F.plot_layer_graph, **sel), bind(F.caption_layer_graph, **sel)),
        ReportFigure("coupling_by_distance", "Coupling against layer distance",
                     chance(F.plot_coupling_by_distance),
                     chance(F.caption_coupling_by_distance)),
        ReportFigure("pca_trajectories", "Token trajectories (PCA)",
                     bind(F.plot_pca_trajectories, **lab),
                     bind(F.caption_pca_trajectories, **lab)),
        ReportFigure("trajectory_metrics", "Norms, line-shape score and expodistance",
                     bind(F.plot_trajectory_metrics, **lab),
                     bind(F.caption_trajectory_metrics, **lab)),
        ReportFigure("depth_profiles", "Norm, windowed LSS, step length and logit entropy "
                     "against depth", bind(F.plot_depth_profiles, **lab),
                     bind(F.caption_depth_profiles, **lab)),
        ReportFigure("metrics_by_run", "Trajectory metrics per model",
                     bind(F.plot_metrics_by_run, order_name=order_name, **lab),
                     bind(F.caption_metrics_by_run, order_name=order_name, **lab), min_runs=2),
        ReportFigure("singular_values", "Top singular value against depth",
                     bind(F.plot_singular_values, **lab),
                     bind(F.caption_singular_values, **lab)),
        ReportFigure("across_runs", "Across runs", bind(F.plot_across_runs, **sel),
                     bind(F.caption_across_runs, **sel), min_runs=2),
    ]
    return out


# ====================================================================== the runs, defined once
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return fmt_number(value)
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if value is None:
        return "-"
    return str(value)


def _run_fields(m: Measurement) -> dict[str, Any]:
    """What defines a run, in display order: model, revision, prompts, layers, the options
    that change a number, scalar metadata."""
    c = m.config
    prompts = f"{F.n_prompts(m)}" + (f" from {m.meta['prompts_spec']}"
                                      if m.meta.get("prompts_spec") else "")
    out: dict[str, Any] = {
        "model": m.meta.get("model"),
        "revision": m.meta.get("revision"),
        "prompts": prompts,
        "blocks L": n_layers(m),
        "kinds": _fmt(c.coupling),
        "K": _fmt(c.k),
        "tokens": _fmt(c.tokens),
        "p": _fmt(c.p),
        "variants": _fmt(c.variants),
        "orientations": _fmt(c.orientations),
        "layers": "all" if c.layers is None else f"{c.layers[0]}..{c.layers[-1]}",
        "analysis dtype": str(c.dtype).removeprefix("torch."),
        "method": c.method,
        "final_norm": c.final_norm,
        "lss_window": c.lss_window,
    }
    shown = {"coupling", "k", "tokens", "p", "variants", "orientations", "layers", "dtype",
             "method", "final_norm", "lss_window", "extra"}
    defaults = MeasureConfig().to_dict()
    for key, value in c.to_dict().items():  # any other option set away from its default
        if key not in shown and value != defaults.get(key):
            out[key] = _fmt(value)
    for key, value in sorted(m.meta.items()):
        if key in ("model", "revision", "prompts_spec", "label", "figure_window"):
            continue
        if isinstance(value, str | int | float | bool) or value is None:
            out[key] = value
    versions = m.meta.get("versions")
    if isinstance(versions, dict):
        out["versions"] = _fmt(versions)
    return out


def runs_html(ms: Sequence[Measurement], labels: Sequence[str]) -> str:
    """The runs, defined once: what all runs share as a list, a table with one column per
    run of what differs (scrolls inside its box), then per-run details."""
    fields = [_run_fields(m) for m in ms]
    names = list(dict.fromkeys(k for f in fields for k in f))
    common: list[str] = []
    differ: list[str] = []
    for name in names:
        vals = [f.get(name) for f in fields]
        (common if len(ms) > 1 and len({repr(v) for v in vals}) == 1 else differ).append(name)
    if len(ms) == 1:
        common, differ = differ, []
    parts = []
    if common:
        parts.append('<dl class="common">' + "".join(
            f"<dt>{esc(n)}</dt><dd>{cell_html(fields[0].get(n))[0]}</dd>" for n in common
            if fields[0].get(n) not in (None, "")) + "</dl>")
    if differ:
        table = pd.DataFrame({lab: [f.get(n) for n in differ]
                              for lab, f in zip(labels, fields, strict=True)},
                             index=pd.Index(differ, name="run"))
        parts.insert(0, "<p>Each run is named by its label everywhere below.</p>")
        parts.append(table_html(table))
    details = []
    for m, lab in zip(ms, labels, strict=True):
        prompts = m.prompts.head(20)
        plist = "".join(f"<li><code>{esc(r.prompt_id)}</code> ({esc(r.n_tokens)} tokens): "
                        f"{esc(r.text)}</li>" for r in prompts.itertuples())
        more = f"<p>... and {len(m.prompts) - 20} more</p>" if len(m.prompts) > 20 else ""
        details.append(
            f"<details><summary>{esc(lab)}: full configuration, metadata and prompts</summary>"
            f"<pre>{esc(json.dumps(m.config.to_dict(), indent=2, sort_keys=True, default=str))}"
            f"</pre><pre>{esc(json.dumps(m.meta, indent=2, sort_keys=True, default=str))}</pre>"
            f"<ol>{plist}</ol>{more}</details>")
    return "".join(parts) + "".join(details)


def summary_html(summary: ReportSummary) -> str:
    """The generated summary as HTML (a box at the top of the report)."""
    if summary.nothing_measured:
        return f'<p class="nothing">{esc(" ".join(summary.measured))}</p>'
    parts = [paragraphs_html(summary.measured)]
    if summary.table is not None and len(summary.table.columns):
        coupled = any(str(c).startswith(("above chance", "raw c_K"))
                      for c in summary.table.columns)
        what = ("Depth-wise coupling above chance = coupling_vs_rotated = 1 - m/m_rot "
                "(against the same basis rotated at random; coupling_vs_null = 1 - m/m_null, "
                "against independent random bases, for runs measured before it existed), "
                "mean over layer pairs l != l' per prompt and token: 0 = the chance level, "
                "1 = perfect coupling; ± = one standard error over prompts, within one model; "
                "coupling_vs_null, raw c_K and the chance level c_K of the same pairs beside "
                "it." if coupled else
                "No depth-wise coupling was measured in these runs (no coupling kind, or "
                "token-wise kinds only): the table holds what was measured, the hidden-state "
                "trajectory metrics over prompts and tokens.")
        parts.append(f'<h3>Headline numbers</h3><p class="muted">{esc(what)}</p>'
                     + table_html(summary.table))
    for title, lines in ((("In words" if summary.table is not None else "Headline numbers"),
                          summary.headline),
                         ("Comparisons", summary.comparisons),
                         ("What these numbers do not show", summary.caveats)):
        if lines:
            parts.append(f"<h3>{esc(title)}</h3>" + paragraphs_html(lines, as_list=True))
    return '<div class="summary">' + "".join(parts) + "</div>"


# ====================================================================== entry points
def write_report(measurements: Sequence[Measurement], out: Path | str, *,
                 labels: Sequence[str] | None = None,
                 formats: Sequence[str] = ("png", "svg", "pdf"),
                 rule: StatisticRule = REPORT_RULE, title: str | None = None,
                 order_name: str = "in the order given") -> Path:
    """Write the HTML report of ``measurements`` to ``out`` and the figure files to
    ``<out stem>_figures/``; returns the HTML path. ``order_name`` says how the runs were
    ordered (``"by parameter count"``; the caller orders them).

    ``labels`` name the runs (default: meta label, revision or model). ``rule`` (an
    ``engine.statistic.StatisticRule``, passed whole) selects the coupling values shown: its
    variant, K, p and orientation (default `REPORT_RULE`: each run's smallest K,
    ``coupling``, p = 1, ``ujv``). Figures whose data was not measured are left out (listed
    in one line); a report of runs with no data says that nothing was measured."""
    ms = F.as_runs(measurements)
    out = html_path(out)
    for fmt in formats:
        if fmt not in F.FORMATS:
            raise BlockCouplingError(f"figure format {fmt!r}: choose from {', '.join(F.FORMATS)}")
    labs = F.run_labels(ms, labels)
    doc_title = title or "blockcoupling report: " + ", ".join(labs)
    if len(doc_title) > 120:
        doc_title = f"blockcoupling report: {len(ms)} runs"
    summary = report_summary(ms, labs, rule)
    lead = ("<p>Transformer block coupling (Aubry, Meng, Sugolov, Papyan, ICLR 2025) and "
            "trajectory metrics, drawn from the stored measurements. Layers are numbered from 1 "
            "(layer l = block l), tokens from 0.</p>")
    sections = [Section("summary", "Summary", summary_html(summary)),
                Section("runs", "Runs", runs_html(ms, labs))]
    if summary.nothing_measured:
        write_page(out, doc_title, sections, lead=lead)
        return out

    fig_dir = out.parent / f"{out.stem}_figures"
    hidden: list[str] = []
    number = 0
    for spec in report_figures(rule, labels=labs, order_name=order_name):
        if len(ms) < spec.min_runs or all(is_empty(m) for m in ms):
            continue
        try:
            caption = spec.caption(ms)
            fig = spec.plot(ms)
        except F.FigureUnavailable:
            hidden.append(spec.title)
            continue
        number += 1
        body = figure_html(fig, caption, title=spec.title, number=number,
                           stem=fig_dir / f"{number:02d}_{spec.name}", formats=formats)
        sections.append(Section(f"fig-{spec.name}", f"{number}. {spec.title}", body))
    if hidden:
        sections.append(Section("not-shown", "Not shown", '<p class="muted">Not measured in '
                                "these runs, so not drawn: " + esc(", ".join(hidden)) + ".</p>",
                                in_toc=False))
    write_page(out, doc_title, sections, lead=lead)
    return out


def write_report_from_dirs(run_dirs: Sequence[Path | str], out: Path | str,
                           **options: Any) -> Path:
    """Open each run directory with [`open_run`][blockcoupling.store.reader.open_run] and write the
    report (options as for [`write_report`][blockcoupling.report.html.write_report])."""
    from blockcoupling.store.reader import open_run

    return write_report([open_run(Path(d)) for d in run_dirs], out, **options)
