"""What every figure family shares: figure creation, panels, saving, caption phrases.

Figures are built with :class:`matplotlib.figure.Figure` and the Agg canvas directly (no
``pyplot``): no global state, no GUI backend, nothing is ever shown. Captions name runs by
their labels only; the report defines each label once in its runs table.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure

from blockcoupling.engine.names import NULL_VARIANTS
from blockcoupling.engine.results import Measurement
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

__all__ = ["DPI", "FORMATS", "FigureUnavailable", "Runs", "colormap", "fmt_p", "label_list",
           "missing_text", "new_figure", "no_data", "panels", "png_bytes", "present",
           "save_figure", "selection_text", "tokens_text"]


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


def selection_text(ms: Sequence[Measurement], k: int | None, variant: str, p: float | None,
                   orientation: str, token: int | None,
                   labels: Sequence[str] | None = None) -> str:
    """'K=2, variant=coupling (higher = more coupled), p=1, orientation=ujv, token 'last'.'"""
    labs = run_labels(ms, labels)
    k_text = "K=" + label_list([resolve_k(m, k) for m in ms], labs)
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


def no_data(ax: Any, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4",
            wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def colormap(name: str) -> Colormap:
    return colormaps[name]  # a copy: safe to modify


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


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (no metadata), as embedded in the HTML pages."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()
