"""The one template of every report page: `Section` objects rendered by `render_page` (or
`write_page`) into ONE self-contained HTML file: the stylesheet (`CSS`) once, a table of
contents, images embedded, no external URL and no script a page needs to display.
"""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from blockcoupling.errors import BlockCouplingError
from blockcoupling.report import figures as F
from blockcoupling.report.summaries import fmt_number
from blockcoupling.store.fileio import atomic_write_text

__all__ = ["CSS", "Section", "cell_html", "esc", "figure_html", "html_path", "notes_html",
           "paragraphs_html", "render_page", "table_html", "write_page"]


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


def notes_html(lines: Sequence[str]) -> str:
    """Short notes under a figure or table (muted, one paragraph each, escaped)."""
    return "".join(f'<p class="muted">{esc(x)}</p>' for x in lines)


def paragraphs_html(lines: Sequence[str], *, as_list: bool = False) -> str:
    """Plain-text lines as ``<p>`` paragraphs or one ``<ul>`` list (escaped)."""
    if as_list:
        return "<ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>"
    return "".join(f"<p>{esc(x)}</p>" for x in lines)


def cell_html(value: Any) -> tuple[str, str]:
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
    page). Numbers get 3 significant digits (`fmt_number`),
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
            text, cls = cell_html(value)
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="data">{head}<tbody>{"".join(body)}</tbody>'
            "</table></div>")


def figure_html(fig: Figure, caption: str, *, title: str = "", number: int | None = None,
                stem: Path | None = None, formats: Sequence[str] = ("png",)) -> str:
    """A ``<figure>`` with ``fig`` embedded as a PNG and its caption (plain text).

    With ``stem`` the figure is also written as ``stem.<fmt>`` for each of ``formats`` and the
    files are listed under it (relative to the page: the stem's folder and name). A figure
    whose titles or labels overlap (`layout_problems`) warns, and its image carries a
    ``data-layout-problems`` attribute for automated checks of the page."""
    png, problems = F.rendered_png(fig)
    flagged = (f' data-layout-problems="{esc("; ".join(problems))}"' if problems else "")
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
            f'<img alt="{esc(title or caption[:80])}"{flagged} '
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


def html_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path, refused unless it ends in .html (or .htm)."""
    out = Path(path)
    if out.suffix.lower() not in (".html", ".htm"):
        raise BlockCouplingError(f"report path {out}: give a file name ending in .html")
    return out


def write_page(path: Path | str, title: str, sections: Sequence[Section], *,
               lead: str = "") -> Path:
    """`render_page` written atomically to ``path`` (must end in .html)."""
    out = html_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render_page(title, sections, lead=lead))
    return out
