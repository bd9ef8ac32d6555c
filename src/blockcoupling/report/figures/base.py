"""What every figure family shares: figure creation, panels, saving, caption phrases.

Figures are built with `matplotlib.figure.Figure` and the Agg canvas directly (no
``pyplot``): no global state, no GUI backend, nothing is ever shown. Captions name runs by
their labels only; the report defines each label once in its runs table.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure

from blockcoupling.engine.names import NULL_VARIANTS
from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries import (
    HIGHER_IS_COUPLED,
    P_VARIANTS,
    NoData,
    Runs,
    resolve_k,
    run_labels,
)

T = TypeVar("T")

#: raised by plot and caption functions where the data a figure needs was not measured
FigureUnavailable = NoData
FORMATS: tuple[str, ...] = ("png", "svg", "pdf")
DPI = 110
HEATMAP_CMAP = "viridis"
GRID_CMAP = "magma"

__all__ = ["DPI", "FORMATS", "FigureLayoutWarning", "FigureUnavailable", "Runs", "colormap",
           "clip", "fit_run_ticks", "fmt_p", "label_list", "layout_problems", "missing_text", "new_figure",
           "prompt_named", "run_parts",
           "panels", "png_bytes", "present", "rendered_png", "run_ticks", "save_figure", "selection_text",
           "tokens_text"]


class FigureLayoutWarning(UserWarning):
    """A drawn figure has a title or label that overlaps another or leaves the figure
    (`layout_problems`); the report tests turn it into an error."""


#: the most characters of a run label in a panel title, a legend and a tick label: figures
#: name runs short (the page defines each label once in full)
TITLE_CHARS, LEGEND_CHARS, TICK_CHARS = 30, 40, 22


def clip(text: str, width: int) -> str:
    """``text`` shortened in the middle to at most ``width`` characters (``ab…yz``), so
    that a long run label cannot run over its neighbour in a figure."""
    text = str(text)
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def fmt_p(p: float | None) -> str:
    if p is None:
        return "any"
    return "inf" if math.isinf(p) else f"{p:g}"


def tokens_text(m: Measurement, token: int | None) -> str:
    """'token 3', "token 'last'" or 'tokens 0, 2 (mean over tokens)'."""
    if token is not None:
        return f"token {token}"
    spec = m.config.tokens
    if isinstance(spec, str):
        return f"token(s) '{spec}' (mean over tokens)" if spec == "all" else f"token '{spec}'"
    return f"tokens {', '.join(map(str, spec))} (mean over tokens)"


def label_list(values: Sequence[Any], labels: Sequence[str]) -> str:
    """'x' when every run has the same value, else 'x (label a), y (label b)'."""
    if len({str(v) for v in values}) == 1:
        return str(values[0])
    return ", ".join(f"{v} ({lab})" for v, lab in zip(values, labels, strict=True))


def selection_text(ms: Sequence[Measurement], rule: StatisticRule, token: int | None,
                   labels: Sequence[str] | None = None) -> str:
    """'K=2, variant=coupling (higher = more coupled), p=1, orientation=ujv, token 'last'.'"""
    labs = run_labels(ms, labels)
    variant, p, orientation = rule.variant, rule.p, rule.orientation
    k_text = "K=" + label_list([resolve_k(m, rule.k) for m in ms], labs)
    p_text = f", p={fmt_p(p)}" if variant in P_VARIANTS else ""
    toks = {tokens_text(m, token) for m in ms}
    direction = "higher = more coupled" if HIGHER_IS_COUPLED[variant] else "lower = more coupled"
    if variant in NULL_VARIANTS:
        direction += f"; 0 = chance level ({NULL_VARIANTS[variant]}), 1 = perfect"
    return (f"{k_text}, variant={variant} ({direction}){p_text}, orientation={orientation}, "
            f"{'; '.join(sorted(toks))}.")


def present(items: Sequence[T | None], labels: Sequence[str]) -> tuple[list[T], list[str]]:
    """The items that are not None and their labels (runs without the data get no panel)."""
    keep = [(x, lab) for x, lab in zip(items, labels, strict=True) if x is not None]
    return [x for x, _ in keep], [lab for _, lab in keep]


def prompt_named(m: Measurement, prompt_id: str) -> str:
    """'prompt ID ("the prompt text")', the text shortened to 80 characters (left out when
    unknown)."""
    rows = m.prompts[m.prompts["prompt_id"] == prompt_id]
    if rows.empty or rows["text"].isna().iloc[0]:
        return f"prompt {prompt_id}"
    text = str(rows["text"].iloc[0])
    return f'prompt {prompt_id} ("{text[:77] + "..." if len(text) > 80 else text}")'


def run_parts(ms: Sequence[Measurement], items: Sequence[T | None], labels: Sequence[str],
              describe: Callable[[Measurement, T], str]) -> str:
    """A caption's per-run parts, '; '-joined: 'label: describe(run, item)' for each run whose
    item is not None (`missing_text` names the others)."""
    return "; ".join(f"{lab}: {describe(m, x)}"
                     for m, x, lab in zip(ms, items, labels, strict=True) if x is not None)


def missing_text(items: Sequence[Any], labels: Sequence[str], what: str = "Not measured") -> str:
    """' Not measured for a, b.' for the runs whose item is None, else ''."""
    gone = [lab for x, lab in zip(items, labels, strict=True) if x is None]
    if len(gone) > 3:
        return f" {what} for the {len(gone)} other runs (no panel)."
    return f" {what} for {', '.join(gone)} (no panel)." if gone else ""


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def panels(n: int, width: float, height: float, *, extra_width: float = 0.0,
           max_columns: int = 4) -> tuple[Figure, list[Any]]:
    """A figure with one panel per run, at most ``max_columns`` per row (many checkpoints
    wrap onto several rows). Returns the figure and the n panels in run order."""
    ncols = min(n, max_columns)
    nrows = math.ceil(n / ncols)
    fig = new_figure(width * ncols + extra_width, height * nrows)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.remove()
    return fig, axes[:n]


def colormap(name: str) -> Colormap:
    return colormaps[name]  # a copy: safe to modify


def matrix_ticks(ax: Any, rows: list[Any], cols: list[Any]) -> None:
    """Row and column names of a heatmap as ticks, at most about 12 a side."""
    step = max(1, math.ceil(len(cols) / 12))
    ax.set_xticks(range(0, len(cols), step), [str(c) for c in cols[::step]])
    ax.set_yticks(range(0, len(rows), step), [str(r) for r in rows[::step]])


def fixed_text(kind: str, fixed: int | None, lead: str = "; ") -> str:
    """'; input token 3' (fixed_input) or '; output token 5' (fixed_output); '' when None."""
    if fixed is None:
        return ""
    return f"{lead}{'input' if kind == 'fixed_input' else 'output'} token {fixed}"


def mosaic_panel(ax: Any, pick: Any, names: Sequence[Any], **font: Any) -> Any:
    """Draw ``pick.mosaic`` (cells of ``pick.k`` with ``pick.gap`` between them, each in 0..1,
    NaN in the gaps) with one tick per cell named by ``names``; returns the image."""
    image = ax.imshow(pick.mosaic, cmap=colormap(GRID_CMAP).with_extremes(bad="white"),
                      vmin=0.0, vmax=1.0, interpolation="nearest")
    centres = [i * (pick.k + pick.gap) + (pick.k - 1) / 2 for i in range(len(names))]
    ax.set_xticks(centres, [str(x) for x in names], **font)
    ax.set_yticks(centres, [str(x) for x in names], **font)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    return image


def save_figure(fig: Figure, stem: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``fig`` as ``stem.<fmt>`` for each format; returns the paths written."""
    paths = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise BlockCouplingError(f"figure format {fmt!r}: choose from {', '.join(FORMATS)}")
        path = stem.with_suffix(f".{fmt}")
        path.parent.mkdir(parents=True, exist_ok=True)
        # No "Software" metadata: keeps URLs out of the files and makes them reproducible.
        meta: dict[str, Any] = {"png": {"Software": None},
                                "svg": {"Date": None, "Creator": None},
                                "pdf": {"CreationDate": None, "Creator": None,
                                        "Producer": None}}[fmt]
        fig.savefig(path, format=fmt, dpi=DPI, metadata=meta)
        paths.append(path)
    return paths


def _texts(fig: Figure) -> list[tuple[str, Any]]:
    """(name, text artist) of every visible, non-empty title, axis label and tick label."""
    out: list[tuple[str, Any]] = []
    sup = getattr(fig, "_suptitle", None)
    if sup is not None:
        out.append(("figure title", sup))
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        where = f"panel {i + 1}"
        for t in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)):
            if t is not None:
                out.append((f"{where} title", t))
        out += [(f"{where} x label", ax.xaxis.label), (f"{where} y label", ax.yaxis.label)]
        out += [(f"{where} x tick", t) for t in ax.get_xticklabels()]
    return [(n, t) for n, t in out if t.get_visible() and t.get_text().strip()]


def _overlap(a: Any, b: Any) -> bool:
    """Whether two boxes (display units) share more than a pixel each way."""
    from matplotlib.transforms import Bbox

    inter = Bbox.intersection(a, b)
    return inter is not None and inter.width > 1 and inter.height > 1


def layout_problems(fig: Figure) -> list[str]:
    """What is wrong with ``fig``'s drawn layout: a title or label partly outside the figure,
    two titles that overlap, a title over another panel, or x tick labels of one panel that
    overlap each other. Draws the figure once (its canvas's renderer)."""
    if not isinstance(fig.canvas, FigureCanvasAgg):  # a Figure made without a canvas
        FigureCanvasAgg(fig)
    # twice: constrained layout with fixed-aspect images and a shared colour bar settles on
    # its second pass (the first can leave titles outside a figure that the saved file,
    # drawn again, has inside)
    fig.canvas.draw()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    page = fig.bbox
    boxes = [(name, t, t.get_window_extent(renderer)) for name, t in _texts(fig)]
    problems = []
    for name, t, b in boxes:
        if "tick" in name:
            continue
        if b.x0 < page.x0 - 1 or b.x1 > page.x1 + 1 or b.y0 < page.y0 - 1 or b.y1 > page.y1 + 1:
            problems.append(f"{name} {t.get_text()[:40]!r} leaves the figure")
    titles = [(n, t, b) for n, t, b in boxes if n.endswith("title")]
    for i, (n1, t1, b1) in enumerate(titles):
        for n2, _, b2 in titles[i + 1:]:
            if _overlap(b1, b2):
                problems.append(f"{n1} {t1.get_text()[:40]!r} overlaps {n2}")
        for j, ax in enumerate(fig.axes):
            if ax.get_visible() and not n1.startswith(f"panel {j + 1} ") and n1 != "figure title":
                if _overlap(b1, ax.get_window_extent(renderer)):
                    problems.append(f"{n1} {t1.get_text()[:40]!r} overlaps panel {j + 1}")
    ticks: dict[str, list[tuple[Any, Any]]] = {}
    for n, t, b in boxes:
        if "tick" in n:
            ticks.setdefault(n, []).append((t, b))
    for n, tb in ticks.items():
        if _ticks_collide(tb, fig.dpi):
            problems.append(f"{n} labels overlap each other")
    return problems


#: the angles a row of run labels may be turned by, tried in order until neighbours clear
TICK_ANGLES: tuple[int, ...] = (0, 30, 45, 60, 90)
_RUN_TICKS = "run-ticks"  # the gid that marks an x axis whose labels name runs


def median_band(ax: Any, frame: Any, col: str, i: int, label: str) -> None:
    """The per-layer median of ``col`` (``{col}_median``) as a line, its quartiles
    (``{col}_q25``, ``{col}_q75``) as a band, in colour ``C{i}``."""
    x = frame["layer"].to_numpy(dtype=float)
    ax.plot(x, frame[f"{col}_median"].to_numpy(dtype=float), marker=".", color=f"C{i % 10}",
            label=clip(label, LEGEND_CHARS))
    ax.fill_between(x, frame[f"{col}_q25"].to_numpy(dtype=float),
                    frame[f"{col}_q75"].to_numpy(dtype=float), color=f"C{i % 10}",
                    alpha=0.12, linewidth=0)


def run_ticks(ax: Any, positions: Iterable[float], labels: Sequence[str]) -> None:
    """X tick labels that name runs, small; their angle is chosen from the drawn figure by
    `fit_run_ticks` (call it once the figure is complete)."""
    ax.set_xticks(list(positions), list(labels), fontsize="small")
    ax.xaxis.set_gid(_RUN_TICKS)


def fit_run_ticks(fig: Figure) -> None:
    """Turn each row of run labels (`run_ticks`) by the smallest of `TICK_ANGLES` at which
    neighbouring labels do not collide by the layout check's own rule (`layout_problems`),
    drawing the figure once per angle tried; 90 degrees where none clears."""
    pending = [ax for ax in fig.axes if ax.xaxis.get_gid() == _RUN_TICKS]
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    for angle in TICK_ANGLES:
        if not pending:
            return
        for ax in pending:
            for t in ax.get_xticklabels():
                t.set(rotation=angle, ha="right" if angle % 90 else "center",
                      rotation_mode="anchor" if angle % 90 else "default")
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        pending = [ax for ax in pending if _ticks_collide(
            [(t, t.get_window_extent(renderer)) for t in ax.get_xticklabels()
             if t.get_visible() and t.get_text().strip()], fig.dpi)]


def _ticks_collide(ticks: list[tuple[Any, Any]], dpi: float) -> bool:
    """Whether neighbouring x tick labels overlap: their boxes when upright; when turned by
    an angle a, their anchors closer than their lines of text (font size x lines / sin a)
    apart."""
    upright = [b for t, b in ticks if t.get_rotation() % 180 == 0]
    upright.sort(key=lambda b: b.x0)
    if any(_overlap(a, c) for a, c in zip(upright, upright[1:], strict=False)):
        return True
    turned = sorted((t.get_transform().transform(t.get_position())[0], t) for t, _ in ticks
                    if t.get_rotation() % 180 != 0)
    for (x1, t), (x2, _) in zip(turned, turned[1:], strict=False):
        lines = t.get_text().count("\n") + 1
        line = lines * t.get_fontsize() * dpi / 72 / abs(math.sin(math.radians(t.get_rotation())))
        if x2 - x1 < 0.9 * line:
            return True
    return False


def rendered_png(fig: Figure) -> tuple[bytes, list[str]]:
    """The figure as PNG bytes (no metadata) and its `layout_problems`; a
    `FigureLayoutWarning` says what overlaps."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    problems = layout_problems(fig)
    if problems:
        warnings.warn(FigureLayoutWarning("figure layout: " + "; ".join(problems[:3])),
                      stacklevel=3)
    return buf.getvalue(), problems


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (no metadata), as embedded in the HTML pages
    (`rendered_png`: warns where the layout overlaps)."""
    return rendered_png(fig)[0]
