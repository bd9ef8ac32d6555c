"""A self-contained static HTML report of one or more runs.

:func:`write_report` draws every figure of :mod:`blockcoupling.report.figures` from the stored tables
of the given measurements (several runs side by side: a trained model next to its random
initialisation, training checkpoints, different models) and writes

- ``<out>``: ONE HTML file with a header table per run (model, revision, prompts, config,
  versions), each figure embedded as a base64 PNG with its caption, and a note for each
  figure whose data was not measured. No external URL, no JavaScript needed to display it
  (a four-line inline script only records, in ``<body data-images-ok>``, how many images the
  browser decoded, for automated checks).
- ``<out stem>_figures/NN_<name>.{png,svg,pdf}``: each figure as a file, for papers.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from blockcoupling.engine.results import Measurement
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report import figures as F


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
                   orientation: str = "ujv") -> list[ReportFigure]:
    """The figures of the report, in order, bound to one coupling selection."""
    sel: dict[str, Any] = {"k": k, "variant": variant, "p": p, "orientation": orientation,
                           "labels": labels}
    grid: dict[str, Any] = {"k": k, "orientation": orientation, "labels": labels}
    lab: dict[str, Any] = {"labels": labels}

    def bind(fn: Callable[..., Any], *args: Any, **kw: Any) -> Callable[[list[Measurement]], Any]:
        return lambda ms: fn(ms, *args, **kw)

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
    out += [
        ReportFigure("layer_graph", "Layer adjacency graph",
                     bind(F.plot_layer_graph, **sel), bind(F.caption_layer_graph, **sel)),
        ReportFigure("coupling_by_distance", "Coupling against layer distance",
                     bind(F.plot_coupling_by_distance, **sel),
                     bind(F.caption_coupling_by_distance, **sel)),
        ReportFigure("pca_trajectories", "Token trajectories (PCA)",
                     bind(F.plot_pca_trajectories, **lab),
                     bind(F.caption_pca_trajectories, **lab)),
        ReportFigure("trajectory_metrics", "Norms, line-shape score and expodistance",
                     bind(F.plot_trajectory_metrics, **lab),
                     bind(F.caption_trajectory_metrics, **lab)),
        ReportFigure("singular_values", "Top singular value against depth",
                     bind(F.plot_singular_values, **lab),
                     bind(F.caption_singular_values, **lab)),
        ReportFigure("across_runs", "Across runs", bind(F.plot_across_runs, **sel),
                     bind(F.caption_across_runs, **sel), min_runs=2),
    ]
    return out


# ====================================================================== HTML pieces
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 2em auto; max-width: 1300px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table.runs { border-collapse: collapse; font-size: .9em; margin: 1em 0; }
table.runs th, table.runs td { border: 1px solid #ccc; padding: .3em .6em; vertical-align: top;
       text-align: left; }
table.runs th { background: #f3f3f3; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #333; max-width: 1100px; }
.note { color: #8a5a00; background: #fff7e6; border: 1px solid #f0d9a8; padding: .5em .8em; }
.files { font-size: .8em; color: #666; }
details pre { font-size: .8em; background: #f7f7f7; padding: .6em; overflow-x: auto; }
nav ol { columns: 2; font-size: .9em; }
"""

# Counts the images the browser decoded (for automated checks); the page needs no script.
_SCRIPT = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images-ok", ok + "/" + imgs.length);
});
</script>"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    return str(value)


def _config_text(m: Measurement) -> str:
    c = m.config
    layers = "all" if c.layers is None else f"{c.layers[0]}..{c.layers[-1]}"
    return (f"kinds {_fmt(c.coupling)}; K {_fmt(c.k)}; tokens {_fmt(c.tokens)}; "
            f"p {_fmt(c.p)}; variants {_fmt(c.variants)}; orientations "
            f"{_fmt(c.orientations)}; layers {layers}; dtype "
            f"{str(c.dtype).removeprefix('torch.')}; method {c.method}; "
            f"final_norm {c.final_norm}")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _header(ms: Sequence[Measurement], labels: list[str]) -> str:
    """One column per run: model, revision, prompts, config, versions; then details."""
    rows: list[tuple[str, list[str]]] = [
        ("model", [_e(m.meta.get("model", "?")) for m in ms]),
        ("revision", [_e(m.meta.get("revision", "-")) for m in ms]),
        ("prompts", [_e(f"{F.n_prompts(m)}" + (f" from {m.meta['prompts_spec']}"
                                                 if m.meta.get("prompts_spec") else ""))
                     for m in ms]),
        ("config", [_e(_config_text(m)) for m in ms]),
        ("versions", [_e(_fmt(m.meta.get("versions", "-"))) for m in ms]),
    ]
    other = sorted({k for m in ms for k, v in m.meta.items()
                    if k not in ("model", "revision", "prompts_spec", "versions", "label")
                    and isinstance(v, str | int | float | bool)})
    rows += [(k, [_e(_fmt(m.meta.get(k, "-"))) for m in ms]) for k in other]
    head = "<tr><th></th>" + "".join(f"<th>{_e(x)}</th>" for x in labels) + "</tr>"
    body = "".join(f"<tr><th>{_e(name)}</th>" + "".join(f"<td>{c}</td>" for c in cells)
                   + "</tr>" for name, cells in rows)
    details = []
    for m, lab in zip(ms, labels, strict=True):
        prompts = m.prompts.head(20)
        plist = "".join(f"<li><code>{_e(r.prompt_id)}</code> ({_e(r.n_tokens)} tokens): "
                        f"{_e(r.text)}</li>" for r in prompts.itertuples())
        more = f"<p>... and {len(m.prompts) - 20} more</p>" if len(m.prompts) > 20 else ""
        details.append(
            f"<details><summary>{_e(lab)}: full configuration, metadata and prompts</summary>"
            f"<pre>{_e(_json(m.config.to_dict()))}</pre><pre>{_e(_json(m.meta))}</pre>"
            f"<ol>{plist}</ol>{more}</details>")
    return f'<table class="runs">{head}{body}</table>' + "".join(details)


def _png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    return buf.getvalue()


# ====================================================================== entry points
def write_report(measurements: Sequence[Measurement], out: Path | str, *,
                 labels: Sequence[str] | None = None,
                 formats: Sequence[str] = ("png", "svg", "pdf"),
                 k: int | None = None, variant: str = "coupling", p: float | None = 1.0,
                 orientation: str = "ujv", title: str | None = None) -> Path:
    """Write the HTML report of ``measurements`` to ``out`` and the figure files to
    ``<out stem>_figures/``; returns the HTML path.

    ``labels`` name the runs (default: meta label, revision or model). ``k``, ``variant``,
    ``p``, ``orientation`` select the coupling values shown (default: each run's smallest K,
    ``coupling``, p = 1, ``ujv``). Figures whose data was not measured become a note."""
    ms = F.as_runs(measurements)
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise BlockCouplingError(f"report path {out}: give a file name ending in .html")
    for fmt in formats:
        if fmt not in F.FORMATS:
            raise BlockCouplingError(f"figure format {fmt!r}: choose from {', '.join(F.FORMATS)}")
    labs = F.run_labels(ms, labels)
    fig_dir = out.parent / f"{out.stem}_figures"
    fig_dir.mkdir(parents=True, exist_ok=True)

    sections, toc = [], []
    specs = report_figures(labels=labs, k=k, variant=variant, p=p, orientation=orientation)
    for i, spec in enumerate(specs, start=1):
        anchor = f"fig-{spec.name}"
        toc.append(f'<li><a href="#{anchor}">{_e(spec.title)}</a></li>')
        head = f'<section id="{anchor}"><h2>{i}. {_e(spec.title)}</h2>'
        if len(ms) < spec.min_runs:
            sections.append(f'{head}<p class="note">Skipped: needs {spec.min_runs} or more '
                            f"runs.</p></section>")
            continue
        try:
            caption = spec.caption(ms)
            fig = spec.plot(ms)
        except F.FigureUnavailable as err:
            sections.append(f'{head}<p class="note">Skipped: {_e(err)}.</p></section>')
            continue
        stem = fig_dir / f"{i:02d}_{spec.name}"
        png = _png_bytes(fig)
        # The layout is solved by that first draw; freeze it so the SVG / PDF files reuse it
        # (same picture, no second constrained-layout pass per format).
        fig.set_layout_engine("none")
        files = []
        for fmt in formats:
            if fmt == "png":  # the embedded image, written once
                stem.with_suffix(".png").write_bytes(png)
                files.append(stem.with_suffix(".png"))
            else:
                files += F.save_figure(fig, stem, (fmt,))
        links = " ".join(f"{_e(fig_dir.name)}/{_e(path.name)}" for path in files)
        sections.append(
            f'{head}<figure><img alt="{_e(spec.title)}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
            f"<figcaption><b>Figure {i}.</b> {_e(caption)}</figcaption></figure>"
            + (f'<p class="files">Files: {links}</p>' if files else "") + "</section>")

    doc_title = title or "blockcoupling report: " + ", ".join(labs)
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(doc_title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(doc_title)}</h1>"
        "<p>Transformer block coupling (Aubry, Meng, Sugolov, Papyan, ICLR 2025) and trajectory "
        "metrics, drawn from the stored measurements. Layers are numbered from 1 (layer l = "
        "block l), tokens from 0.</p>"
        f"<h2>Runs</h2>{_header(ms, labs)}"
        f"<nav><h2>Figures</h2><ol>{''.join(toc)}</ol></nav>"
        + "".join(sections) + _SCRIPT + "</body></html>\n")
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out


def write_report_from_dirs(run_dirs: Sequence[Path | str], out: Path | str,
                           **options: Any) -> Path:
    """Open each run directory with :func:`blockcoupling.store.rundir.open_run` and write the report
    (options as for :func:`write_report`)."""
    from blockcoupling.store.rundir import open_run

    return write_report([open_run(Path(d)) for d in run_dirs], out, **options)
