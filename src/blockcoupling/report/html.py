"""Self-contained static HTML pages, and the report of one or more runs.

The page skeleton is shared by every report page (this one, and the sweep/emergence,
correlation and ViT pages): build :class:`Section` objects, then :func:`render_page` (or
:func:`write_page`) makes ONE HTML file with the CSS once, a table of contents and no external
URL. Helpers for the body of a section: :func:`figure_html` (a matplotlib figure embedded as a
base64 PNG with its caption, optionally also written as files), :func:`table_html` (a
DataFrame with formatted numbers in a box that scrolls sideways instead of overflowing the
page), :func:`paragraphs_html` and :func:`esc`.

:func:`write_report` draws the figures of :mod:`blockcoupling.report.figures` and writes

- ``<out>``: a summary generated from the data (:mod:`blockcoupling.report.narrative`), the
  runs defined once (their labels, and what differs between them), then each figure that has
  data with its caption (figures without data are left out and listed in one line);
- ``<out stem>_figures/NN_<name>.{png,svg,pdf}``: each figure as a file, for papers.

No JavaScript is needed to display a page (a four-line inline script only records, in
``<body data-images-ok>``, how many images the browser decoded, for automated checks).
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import Measurement
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report import figures as F
from blockcoupling.report.narrative import ReportSummary, report_summary
from blockcoupling.report.summaries import fmt_number, is_empty, n_layers
from blockcoupling.store.fileio import atomic_write_text

__all__ = ["CSS", "ReportFigure", "Section", "esc", "figure_html", "paragraphs_html",
           "render_page", "report_figures", "table_html", "write_page", "write_report",
           "write_report_from_dirs"]


# ====================================================================== the page skeleton
CSS = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 1.5em auto; max-width: 1300px; padding: 0 1em; color: #222; line-height: 1.45;
       overflow-wrap: break-word; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
h3 { font-size: 1.05em; margin: 1.2em 0 .3em; }
.scroll { overflow-x: auto; max-width: 100%; margin: 1em 0; border: 1px solid #e4e4e4; }
table.data { border-collapse: collapse; font-size: .88em; }
table.data th, table.data td { border: 1px solid #d6d6d6; padding: .3em .6em;
       vertical-align: top; text-align: left; }
table.data td.long { overflow-wrap: anywhere; min-width: 10em; }
table.data td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data thead th { background: #f3f3f3; }
table.data tbody th { background: #fafafa; position: sticky; left: 0; white-space: nowrap; }
figure { margin: 1.5em 0; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #eee; }
.figbox { border: 0; margin: 0; }
figcaption { font-size: .9em; color: #333; max-width: 70em; margin-top: .4em; }
.summary { background: #f5f8fc; border: 1px solid #d5e1f0; padding: .6em 1em; }
.summary ul { margin: .3em 0 .6em; padding-left: 1.3em; }
.muted, .files { font-size: .85em; color: #666; }
.nothing { font-size: 1.1em; color: #8a5a00; background: #fff7e6; border: 1px solid #f0d9a8;
       padding: .8em 1em; }
dl.common { display: grid; grid-template-columns: max-content 1fr; gap: .1em 1em;
       font-size: .88em; margin: .5em 0; }
dl.common dt { font-weight: 600; }
dl.common dd { margin: 0; overflow-wrap: anywhere; }
details pre { font-size: .8em; background: #f7f7f7; padding: .6em; overflow-x: auto;
       white-space: pre-wrap; overflow-wrap: anywhere; }
code { overflow-wrap: anywhere; }
nav ul { columns: 2; font-size: .9em; list-style: none; padding-left: 0; }
@media (max-width: 700px) {
  body { margin: .8em auto; padding: 0 .6em; }
  nav ul { columns: 1; }
  .summary { padding: .4em .6em; }
  /* many-panel figures stay legible on a phone: at least 55 % of their natural size,
     scrolling sideways inside their own box rather than shrinking to a thumbnail */
  .figbox img { max-width: none; width: max(100%, calc(var(--w) * 0.55)); }
}
"""

# Counts the images the browser decoded (for automated checks); the page needs no script.
_SCRIPT = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images-ok", ok + "/" + imgs.length);
});
</script>"""


@dataclass(frozen=True)
class Section:
    """One part of a page: ``id`` (the HTML anchor), ``title`` (its heading, plain text) and
    ``body`` (HTML). ``in_toc=False`` keeps it out of the table of contents."""

    id: str
    title: str
    body: str
    in_toc: bool = True


def esc(value: Any) -> str:
    """HTML-escape ``str(value)``."""
    return html.escape(str(value), quote=True)


def paragraphs_html(lines: Sequence[str], *, as_list: bool = False) -> str:
    """Plain-text lines as ``<p>`` paragraphs or one ``<ul>`` list (escaped)."""
    if as_list:
        return "<ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>"
    return "".join(f"<p>{esc(x)}</p>" for x in lines)


def _cell(value: Any) -> tuple[str, str]:
    """(escaped text, CSS class) of a table cell: 'num' for numbers, 'long' for text with a
    word longer than 24 characters (a path: may break anywhere), '' otherwise."""
    if isinstance(value, float) and math.isnan(value):
        return "-", ""
    if isinstance(value, float | int | np.integer | np.floating) and not isinstance(value, bool):
        return esc(fmt_number(value)), "num"
    if value is None:
        return "-", ""
    try:
        if pd.isna(value):
            return "-", ""
    except (TypeError, ValueError):
        pass
    text = str(value)
    return esc(text), "long" if any(len(w) > 24 for w in text.split()) else ""


def table_html(df: pd.DataFrame, *, index: bool = True, header: bool = True) -> str:
    """A DataFrame as an HTML table in a box that scrolls sideways (never wider than the
    page). Numbers get 3 significant digits (:func:`~blockcoupling.report.summaries.fmt_number`),
    missing values '-'. With ``index`` the index is a sticky first column."""
    head = ""
    if header:
        first = f"<th>{esc(df.index.name or '')}</th>" if index else ""
        head = "<thead><tr>" + first + "".join(f"<th>{esc(c)}</th>" for c in df.columns) \
            + "</tr></thead>"
    body = []
    for key, row in zip(df.index, df.itertuples(index=False), strict=True):
        cells = [f"<th>{esc(key)}</th>"] if index else []
        for value in row:
            text, cls = _cell(value)
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="data">{head}<tbody>{"".join(body)}</tbody>'
            "</table></div>")


def figure_html(fig: Figure, caption: str, *, title: str = "", number: int | None = None,
                stem: Path | None = None, formats: Sequence[str] = ("png",)) -> str:
    """A ``<figure>`` with ``fig`` embedded as a PNG and its caption (plain text).

    With ``stem`` the figure is also written as ``stem.<fmt>`` for each of ``formats`` and the
    files are listed under it (relative to the page: the stem's folder and name)."""
    png = F.png_bytes(fig)
    links = ""
    if stem is not None and formats:
        # The layout is solved by the first draw; freeze it so the SVG / PDF files reuse it.
        fig.set_layout_engine("none")
        files = []
        for fmt in formats:
            if fmt == "png":  # the embedded image, written once
                stem.parent.mkdir(parents=True, exist_ok=True)
                stem.with_suffix(".png").write_bytes(png)
                files.append(stem.with_suffix(".png"))
            else:
                files += F.save_figure(fig, stem, (fmt,))
        links = ('<p class="files">Files: ' + " ".join(
            f"{esc(stem.parent.name)}/{esc(path.name)}" for path in files) + "</p>")
    label = f"<b>Figure {number}.</b> " if number is not None else ""
    width = round(fig.get_figwidth() * fig.dpi)  # the PNG's natural width in pixels
    return (f'<figure><div class="scroll figbox" style="--w: {width}px">'
            f'<img alt="{esc(title or caption[:80])}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"></div>'
            f"<figcaption>{label}{esc(caption)}</figcaption></figure>{links}")


def render_page(title: str, sections: Sequence[Section], *, lead: str = "",
                toc: bool = True) -> str:
    """A complete self-contained HTML document: ``title`` as <title> and <h1>, ``lead`` (HTML)
    under it, a table of contents of the sections with ``in_toc`` and the sections."""
    nav = ""
    listed = [s for s in sections if s.in_toc]
    if toc and len(listed) > 1:
        nav = ("<nav><h2>Contents</h2><ul>" + "".join(
            f'<li><a href="#{esc(s.id)}">{esc(s.title)}</a></li>' for s in listed)
            + "</ul></nav>")
    body = "".join(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{s.body}</section>'
                   for s in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{esc(title)}</h1>{lead}{nav}{body}{_SCRIPT}</body></html>\n")


def write_page(path: Path | str, title: str, sections: Sequence[Section], *,
               lead: str = "") -> Path:
    """:func:`render_page` written atomically to ``path`` (must end in .html)."""
    out = Path(path)
    if out.suffix.lower() not in (".html", ".htm"):
        raise BlockCouplingError(f"report path {out}: give a file name ending in .html")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render_page(title, sections, lead=lead))
    return out


# ====================================================================== the report's figures
@dataclass(frozen=True)
class ReportFigure:
    """One entry of the report: how to draw it and caption it from the runs."""

    name: str  # file stem and HTML id
    title: str
    plot: Callable[[list[Measurement]], Figure]
    caption: Callable[[list[Measurement]], str]
    min_runs: int = 1


def report_figures(*, labels: Sequence[str] | None = None, k: int | None = None,
                   variant: str = "coupling", p: float | None = 1.0,
                   orientation: str = "ujv",
                   order_name: str = "in the order given") -> list[ReportFigure]:
    """The figures of the report, in order, bound to one coupling selection. The layer graph
    and the distance plot show ``coupling_vs_null`` where every run measured it."""
    sel: dict[str, Any] = {"k": k, "variant": variant, "p": p, "orientation": orientation,
                           "labels": labels}
    grid: dict[str, Any] = {"k": k, "orientation": orientation, "labels": labels}
    lab: dict[str, Any] = {"labels": labels}

    def bind(fn: Callable[..., Any], *args: Any, **kw: Any) -> Callable[[list[Measurement]], Any]:
        return lambda ms: fn(ms, *args, **kw)

    def chance(fn: Callable[..., Any]) -> Callable[[list[Measurement]], Any]:
        return lambda ms: fn(ms, **{**sel, "variant": F.layer_graph_variant(ms, variant)})

    out = [
        ReportFigure("depth_heatmap", "Depth-wise coupling (L x L)",
                     bind(F.plot_depth_heatmap, **sel), bind(F.caption_depth_heatmap, **sel)),
        ReportFigure("coupling_grid", "Coupling matrices |A| across a window of layers",
                     bind(F.plot_coupling_grid, **grid), bind(F.caption_coupling_grid, **grid)),
    ]
    for kind, title in (("self", "Token-wise coupling (same input and output token)"),
                        ("fixed_input", "Context coupling, fixed input token"),
                        ("fixed_output", "Context coupling, fixed output token")):
        out.append(ReportFigure(f"token_{kind}", title,
                                bind(F.plot_token_heatmap, kind, **sel),
                                bind(F.caption_token_heatmap, kind, **sel)))
    for kind, title in (("self", "Coupling matrices |A| across tokens (same input and output)"),
                        ("fixed_input", "Coupling matrices |A|, fixed input token"),
                        ("fixed_output", "Coupling matrices |A|, fixed output token")):
        out.append(ReportFigure(f"token_grid_{kind}", title,
                                bind(F.plot_token_grid, kind, **grid),
                                bind(F.caption_token_grid, kind, **grid)))
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
            f"<dt>{esc(n)}</dt><dd>{_cell(fields[0].get(n))[0]}</dd>" for n in common
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
        parts.append("<h3>Headline numbers</h3><p class=\"muted\">Depth-wise coupling above "
                     "chance = coupling_vs_null = 1 - m/m_null, mean over layer pairs l != l' "
                     "per prompt and token: 0 = the chance level of unrelated random bases, "
                     "1 = perfect coupling; raw c_K and the chance level c_K of the same "
                     "pairs beside it.</p>" + table_html(summary.table))
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
                 k: int | None = None, variant: str = "coupling", p: float | None = 1.0,
                 orientation: str = "ujv", title: str | None = None,
                 order_name: str = "in the order given") -> Path:
    """Write the HTML report of ``measurements`` to ``out`` and the figure files to
    ``<out stem>_figures/``; returns the HTML path. ``order_name`` says how the runs were
    ordered (``"by parameter count"``; the caller orders them).

    ``labels`` name the runs (default: meta label, revision or model). ``k``, ``variant``,
    ``p``, ``orientation`` select the coupling values shown (default: each run's smallest K,
    ``coupling``, p = 1, ``ujv``). Figures whose data was not measured are left out (listed
    in one line); a report of runs with no data says that nothing was measured."""
    ms = F.as_runs(measurements)
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise BlockCouplingError(f"report path {out}: give a file name ending in .html")
    for fmt in formats:
        if fmt not in F.FORMATS:
            raise BlockCouplingError(f"figure format {fmt!r}: choose from {', '.join(F.FORMATS)}")
    labs = F.run_labels(ms, labels)
    doc_title = title or "blockcoupling report: " + ", ".join(labs)
    if len(doc_title) > 120:
        doc_title = f"blockcoupling report: {len(ms)} runs"
    summary = report_summary(ms, labs, k=k, p=p, orientation=orientation)
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
    for spec in report_figures(labels=labs, k=k, variant=variant, p=p,
                               orientation=orientation, order_name=order_name):
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
    """Open each run directory with :func:`blockcoupling.store.rundir.open_run` and write the
    report (options as for :func:`write_report`)."""
    from blockcoupling.store.rundir import open_run

    return write_report([open_run(Path(d)) for d in run_dirs], out, **options)
