"""The paper's figures, drawn from stored measurements only.

Every ``plot_*`` function takes one :class:`~blockcoupling.engine.results.Measurement` or a sequence of
them (several runs side by side: a trained model next to its random initialisation, training
checkpoints, different models) and returns a :class:`matplotlib.figure.Figure`. Every figure
has a ``caption_*`` function with the same arguments that says what was measured: the model,
K, the variant, p, the orientation, the token, the prompt set and the number of prompts.

Nothing here recomputes a Jacobian: figures read the tidy tables (``coupling``,
``trajectory``, ``token_metrics``, ``spectra``, ``prompts``) and the coupling-matrix arrays
``A/<prompt_id>/<orientation>`` of a Measurement. Where the data a figure needs is absent the
plot and caption functions raise :class:`FigureUnavailable`, which the HTML report turns into
a note.

Figures are built with :class:`matplotlib.figure.Figure` and the Agg canvas directly (no
``pyplot``): no global state, no GUI backend, nothing is ever shown.

Figures (paper numbers in brackets):

1. :func:`plot_depth_heatmap` - L x L depth-wise coupling (mean over prompts).
2. :func:`plot_coupling_grid` - |A| K x K coupling matrices for a window of layers [fig. 3].
3. :func:`plot_token_heatmap` - token-wise coupling, kinds ``self`` [fig. 4], ``fixed_input``,
   ``fixed_output``.
4. :func:`plot_layer_graph` - layers on a circle, edges = mean depth-wise coupling [fig. 1c-e].
5. :func:`plot_coupling_by_distance` - coupling against layer distance |l - l'|.
6. :func:`plot_pca_trajectories` - 2-D PCA trajectories per token [fig. 17].
7. :func:`plot_trajectory_metrics` - norms, windowed LSS per layer, per-token LSS and
   expodistance [fig. 24].
8. :func:`plot_singular_values` - sigma_1 against depth with the fit sigma ~ a / depth + b.
9. :func:`plot_across_runs` - mean depth-wise coupling, LSS and expodistance per run
   [fig. 1b].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.spectra import fit_inverse_depth
from blockcoupling.errors import BlockCouplingError

Runs = Measurement | Sequence[Measurement]

#: variants whose normaliser takes a user-chosen p (the others store p empty or fixed)
P_VARIANTS: tuple[str, ...] = ("coupling", "miscoupling", "coupling_vs_null")
#: variants where a larger value means more coupled (for the others, smaller is more coupled)
HIGHER_IS_COUPLED: dict[str, bool] = {
    "coupling": True,
    "coupling_vs_null": True,
    "miscoupling": False,
    "released_norm": False,
    "released_trace": False,
    "offdiag_ratio": False,
}
TOKEN_KINDS: tuple[str, ...] = ("self", "fixed_input", "fixed_output")
FORMATS: tuple[str, ...] = ("png", "svg", "pdf")

_DPI = 110
_HEATMAP_CMAP = "viridis"
_GRID_CMAP = "magma"


class FigureUnavailable(BlockCouplingError):
    """The data a figure needs was not measured (e.g. no ``self`` coupling rows)."""


# ====================================================================== small helpers
def as_runs(runs: Runs) -> list[Measurement]:
    """One Measurement or a sequence of them -> a non-empty list."""
    out = [runs] if isinstance(runs, Measurement) else list(runs)
    if not out:
        raise BlockCouplingError("no measurement given: pass one Measurement or a list of them")
    return out


def run_label(m: Measurement, index: int = 0) -> str:
    """A short name for a run: meta ``label``, else ``revision``, else the model id."""
    for key in ("label", "revision", "model"):
        value = m.meta.get(key)
        if value not in (None, ""):
            return str(value)
    return f"run {index + 1}"


def run_labels(ms: Sequence[Measurement], labels: Sequence[str] | None = None) -> list[str]:
    """Labels for several runs; explicit ``labels`` win. Duplicates get a suffix #i."""
    if labels is not None:
        if len(labels) != len(ms):
            raise BlockCouplingError(
                f"{len(labels)} labels for {len(ms)} runs: give one label per run"
            )
        out = [str(x) for x in labels]
    else:
        out = [run_label(m, i) for i, m in enumerate(ms)]
    seen: dict[str, int] = {}
    for i, lab in enumerate(out):
        if out.count(lab) > 1:
            seen[lab] = seen.get(lab, 0) + 1
            out[i] = f"{lab} #{seen[lab]}"
    return out


def n_prompts(m: Measurement) -> int:
    """Number of prompts of a run (prompts table, else distinct prompt ids in any table)."""
    if len(m.prompts):
        return int(m.prompts["prompt_id"].nunique())
    ids: set[str] = set()
    for name in ("coupling", "trajectory", "token_metrics", "spectra"):
        ids.update(str(v) for v in m.table(name)["prompt_id"].dropna().unique())
    return len(ids)


def resolve_k(m: Measurement, k: int | None) -> int:
    """The K a figure uses for run ``m``: ``k`` or the run's smallest measured K."""
    return int(k) if k is not None else int(min(m.config.k))


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "any"
    return "inf" if math.isinf(p) else f"{p:g}"


def _check_variant(variant: str, orientation: str) -> None:
    if variant not in HIGHER_IS_COUPLED:
        raise BlockCouplingError(
            f"variant {variant!r} is unknown; choose from {', '.join(HIGHER_IS_COUPLED)}"
        )
    if orientation not in ("ujv", "vju"):
        raise BlockCouplingError(f"orientation {orientation!r} is unknown; choose ujv or vju")


def _tokens_text(m: Measurement, token: int | None) -> str:
    if token is not None:
        return f"token {token}"
    spec = m.config.tokens
    if isinstance(spec, str):
        return f"token(s) '{spec}' (mean over tokens)" if spec == "all" else f"token '{spec}'"
    return f"tokens {', '.join(map(str, spec))} (mean over tokens)"


def _runs_text(ms: Sequence[Measurement], labels: Sequence[str] | None) -> str:
    """'Runs: (1) trained: model m (revision r), 12 prompts from builtin:capital; ...'."""
    labs = run_labels(ms, labels)
    parts = []
    for i, (m, lab) in enumerate(zip(ms, labs, strict=True)):
        model = m.meta.get("model", "unknown model")
        rev = m.meta.get("revision")
        spec = m.meta.get("prompts_spec")
        s = f"({i + 1}) {lab}: model {model}"
        if rev not in (None, ""):
            s += f" (revision {rev})"
        s += f", {n_prompts(m)} prompts"
        if spec not in (None, ""):
            s += f" from {spec}"
        parts.append(s)
    return ("Run: " if len(ms) == 1 else "Runs: ") + "; ".join(parts) + "."


def _selection_text(ms: Sequence[Measurement], k: int | None, variant: str, p: float | None,
                    orientation: str, token: int | None) -> str:
    ks = [resolve_k(m, k) for m in ms]
    k_text = f"K={ks[0]}" if len(set(ks)) == 1 else "K=" + ", ".join(
        f"{kk} (run {i + 1})" for i, kk in enumerate(ks))
    p_text = f", p={_fmt_p(p)}" if variant in P_VARIANTS else ""
    toks = {_tokens_text(m, token) for m in ms}
    direction = "higher = more coupled" if HIGHER_IS_COUPLED[variant] else "lower = more coupled"
    return (f"{k_text}, variant={variant} ({direction}){p_text}, orientation={orientation}, "
            f"{'; '.join(sorted(toks))}.")


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _panels(n: int, width: float, height: float, *, extra_width: float = 0.0,
            max_columns: int = 4) -> tuple[Figure, list[Any]]:
    """A figure with one panel per run, at most ``max_columns`` per row (many checkpoints
    wrap onto several rows). Returns the figure and the n panels in run order."""
    ncols = min(n, max_columns)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(width * ncols + extra_width, height * nrows)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.remove()
    return fig, axes[:n]


def _no_data(ax: Any, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _depth_rows(m: Measurement, k: int | None, variant: str, p: float | None,
                orientation: str) -> pd.DataFrame | None:
    """The run's depth-wise rows for one selection, or None where none were measured."""
    try:
        return m.select("depth", resolve_k(m, k), variant, p, orientation)
    except KeyError:
        return None


def _why_no_depth(m: Measurement, k: int | None, variant: str, p: float | None,
                  orientation: str) -> str:
    """The message of the failed selection (says what was measured)."""
    try:
        m.select("depth", resolve_k(m, k), variant, p, orientation)
    except KeyError as err:
        return str(err.args[0]) if err.args else "no depth-wise coupling rows"
    return "no depth-wise coupling rows for this selection"


def _depth_matrix(m: Measurement, k: int | None, variant: str, p: float | None,
                  orientation: str, token: int | None) -> pd.DataFrame | None:
    if _depth_rows(m, k, variant, p, orientation) is None:
        return None
    mat = m.depth_matrix(token=token, k=resolve_k(m, k), variant=variant, p=p,
                         orientation=orientation)
    return None if mat.empty else mat


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
        fig.savefig(path, format=fmt, dpi=_DPI, metadata=meta)
        paths.append(path)
    return paths


# ====================================================================== 1. depth heatmap
def depth_heatmap_data(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                       p: float | None = 1.0, orientation: str = "ujv",
                       token: int | None = None) -> list[pd.DataFrame | None]:
    """Per run: the L x L matrix drawn by :func:`plot_depth_heatmap` (None where absent)."""
    _check_variant(variant, orientation)
    ms = as_runs(runs)
    mats = [_depth_matrix(m, k, variant, p, orientation, token) for m in ms]
    if all(x is None for x in mats):
        raise FigureUnavailable(_why_no_depth(ms[0], k, variant, p, orientation))
    return mats


def plot_depth_heatmap(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                       p: float | None = 1.0, orientation: str = "ujv",
                       token: int | None = None,
                       labels: Sequence[str] | None = None) -> Figure:
    """L x L depth-wise coupling heatmaps, one panel per run, one shared colour scale.

    Rows are the measured layer l (side a), columns the basis layer l' (side b); each cell is
    the mean over prompts (and tokens) of ``Measurement.depth_matrix``."""
    ms = as_runs(runs)
    mats = depth_heatmap_data(ms, k=k, variant=variant, p=p, orientation=orientation,
                              token=token)
    labs = run_labels(ms, labels)
    values = np.concatenate([m.to_numpy().ravel() for m in mats if m is not None])
    norm = Normalize(float(np.nanmin(values)), float(np.nanmax(values)))
    fig, axes = _panels(len(ms), 3.6, 4.0, extra_width=1.0)
    image = None
    for ax, mat, lab in zip(axes, mats, labs, strict=True):
        ax.set_title(lab)
        if mat is None:
            _no_data(ax)
            continue
        image = ax.imshow(mat.to_numpy(dtype=float), cmap=_HEATMAP_CMAP, norm=norm,
                          origin="upper", interpolation="nearest")
        rows, cols = list(mat.index), list(mat.columns)
        step = max(1, len(cols) // 12)
        ax.set_xticks(range(0, len(cols), step), [str(c) for c in cols[::step]])
        ax.set_yticks(range(0, len(rows), step), [str(r) for r in rows[::step]])
        ax.set_xlabel("basis layer l'")
        ax.set_ylabel("measured layer l")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=variant, shrink=0.9)
    return fig


def caption_depth_heatmap(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                          p: float | None = 1.0, orientation: str = "ujv",
                          token: int | None = None,
                          labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    depth_heatmap_data(ms, k=k, variant=variant, p=p, orientation=orientation, token=token)
    return ("Depth-wise coupling between the block Jacobians J^l_tt of every pair of layers: "
            "rows = measured layer l, columns = basis layer l', mean over prompts. "
            + _selection_text(ms, k, variant, p, orientation, token) + " "
            + _runs_text(ms, labels))


# ====================================================================== 2. |A| grid
@dataclass(frozen=True)
class GridPick:
    """What :func:`plot_coupling_grid` draws for one run."""

    prompt_id: str
    key: str
    layers: tuple[int, ...]  # the window's layer numbers (1-based)
    k: int
    mosaic: np.ndarray  # (W*k + (W-1)*gap, same); NaN in the gaps; each cell |A| / max|A|
    gap: int


def _figure_window(m: Measurement, width: int) -> tuple[int, ...] | None:
    win = m.meta.get("figure_window") or m.config.figure_window
    if win is None:
        return None
    first, last = int(win[0]), int(win[1])
    # measure() keeps the selected layers inside the window (``layers`` may skip some)
    chosen = m.config.layers
    layers = (tuple(range(first, last + 1)) if chosen is None
              else tuple(x for x in chosen if first <= x <= last))
    if len(layers) != width:
        raise BlockCouplingError(
            f"figure_window {first}..{last} holds {len(layers)} measured layers but the stored "
            f"coupling arrays have {width}; the run directory is inconsistent, re-run it"
        )
    return layers


def grid_mosaic(A: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """Tile |A[i, j, :k, :k]| (each normalised by its own max) into one image.

    ``A``: (W, W, Kmax, Kmax), first index = measured layer, second = basis layer. Returns the
    mosaic (W*k + (W-1)*gap, W*k + (W-1)*gap) with NaN between cells, and the gap."""
    W = A.shape[0]
    gap = max(1, k // 4)
    size = W * k + (W - 1) * gap
    out = np.full((size, size), np.nan)
    for i in range(W):
        for j in range(W):
            cell = np.abs(np.asarray(A[i, j, :k, :k], dtype=float))  # (k, k)
            top = cell.max()
            if top > 0:
                cell = cell / top
            r, c = i * (k + gap), j * (k + gap)
            out[r:r + k, c:c + k] = cell
    return out, gap


def coupling_grid_data(runs: Runs, *, prompt_id: str | None = None, k: int | None = None,
                       orientation: str = "ujv") -> list[GridPick | None]:
    """Per run: the prompt, window and mosaic drawn by :func:`plot_coupling_grid`."""
    _check_variant("coupling", orientation)
    picks: list[GridPick | None] = []
    for m in as_runs(runs):
        keys = [key for key in m.arrays
                if key.startswith("A/") and key.endswith(f"/{orientation}")]
        if not keys:
            picks.append(None)
            continue
        if prompt_id is not None:
            key = f"A/{prompt_id}/{orientation}"
            if key not in m.arrays:
                picks.append(None)
                continue
        else:
            order = [f"A/{pid}/{orientation}" for pid in m.prompts["prompt_id"]]
            key = next((x for x in order if x in m.arrays), sorted(keys)[0])
        A = np.asarray(m.arrays[key])  # (W, W, Kmax, Kmax)
        if A.ndim != 4 or A.shape[0] != A.shape[1] or A.shape[2] != A.shape[3]:
            raise BlockCouplingError(
                f"array {key!r} has shape {A.shape}; expected (W, W, K, K)"
            )
        kk = A.shape[2] if k is None else min(int(k), A.shape[2])
        layers = _figure_window(m, A.shape[0]) or tuple(range(1, A.shape[0] + 1))
        mosaic, gap = grid_mosaic(A, kk)
        picks.append(GridPick(key.split("/", 1)[1].rsplit("/", 1)[0], key, layers, kk,
                              mosaic, gap))
    if all(x is None for x in picks):
        raise FigureUnavailable(
            f"no coupling matrices stored (arrays 'A/<prompt>/{orientation}'); measure with "
            "figure_window set to keep them"
        )
    return picks


def plot_coupling_grid(runs: Runs, *, prompt_id: str | None = None, k: int | None = None,
                       orientation: str = "ujv",
                       labels: Sequence[str] | None = None) -> Figure:
    """Grid of |A| coupling matrices for a window of layers (paper fig. 3), one panel per run.

    Cell (row l, column l') of a panel is |A_{l l'}| = |U_{l'}^T J^l V_{l'}| (orientation
    ujv), the leading k x k block, divided by its own maximum so that the diagonal pattern is
    visible in every cell whatever the scale of the Jacobians."""
    ms = as_runs(runs)
    picks = coupling_grid_data(ms, prompt_id=prompt_id, k=k, orientation=orientation)
    labs = run_labels(ms, labels)
    fig, axes = _panels(len(ms), 4.6, 4.8, extra_width=1.0)
    image = None
    for ax, pick, lab in zip(axes, picks, labs, strict=True):
        ax.set_title(lab)
        if pick is None:
            _no_data(ax, "no coupling matrices")
            continue
        image = ax.imshow(pick.mosaic, cmap=_colormap(_GRID_CMAP).with_extremes(bad="white"),
                          vmin=0.0, vmax=1.0, interpolation="nearest")
        centres = [i * (pick.k + pick.gap) + (pick.k - 1) / 2 for i in range(len(pick.layers))]
        names = [str(x) for x in pick.layers]
        ax.set_xticks(centres, names)
        ax.set_yticks(centres, names)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_xlabel("basis layer l'")
        ax.set_ylabel("measured layer l")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="|A| / max |A| (per cell)", shrink=0.8)
    return fig


def caption_coupling_grid(runs: Runs, *, prompt_id: str | None = None, k: int | None = None,
                          orientation: str = "ujv",
                          labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    picks = coupling_grid_data(ms, prompt_id=prompt_id, k=k, orientation=orientation)
    formula = "U_l'^T J^l V_l'" if orientation == "ujv" else "V_l'^T J^l U_l'"
    parts = []
    for i, (m, pick) in enumerate(zip(ms, picks, strict=True)):
        if pick is None:
            parts.append(f"run {i + 1}: not stored")
            continue
        text = _prompt_text(m, pick.prompt_id)
        parts.append(f"run {i + 1}: K={pick.k}, layers {_layers_text(pick.layers)}, "
                     f"prompt {pick.prompt_id}{text}, the last measured token")
    return (f"Coupling matrices |A_ll'| = |{formula}| (orientation={orientation}) for every "
            "pair of layers in the figure window, leading K x K block, each cell divided by "
            "its own maximum; a bright diagonal with a dark off-diagonal means the basis "
            "layer's singular vectors diagonalise the measured layer's Jacobian. "
            + "; ".join(parts) + ". " + _runs_text(ms, labels))


def _layers_text(layers: Sequence[int]) -> str:
    """'2..5' for a contiguous run of layers, else '3, 5, 7'."""
    if list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))


def _prompt_text(m: Measurement, prompt_id: str) -> str:
    rows = m.prompts[m.prompts["prompt_id"] == prompt_id]
    if rows.empty or pd.isna(rows["text"].iloc[0]):
        return ""
    text = str(rows["text"].iloc[0])
    return f' ("{text[:77] + "..." if len(text) > 80 else text}")'


# ====================================================================== 3. token-wise
@dataclass(frozen=True)
class TokenPick:
    """What :func:`plot_token_heatmap` draws for one run."""

    kind: str
    prompt_id: str
    layer_a: int
    layer_b: int
    fixed: int | None  # the fixed input (fixed_input) or output (fixed_output) token
    matrix: pd.DataFrame  # rows = side-a token, columns = side-b token


def _token_axes(kind: str) -> tuple[str, str, str | None]:
    """(row column, column column, fixed-token column) of the pivot for a kind."""
    if kind == "self":
        return "token_out_a", "token_out_b", None
    if kind == "fixed_input":
        return "token_out_a", "token_out_b", "token_in_a"
    if kind == "fixed_output":
        return "token_in_a", "token_in_b", "token_out_a"
    raise BlockCouplingError(f"token-wise kind {kind!r}: choose from {', '.join(TOKEN_KINDS)}")


def _token_pick(m: Measurement, kind: str, *, prompt_id: str | None,
                layers: tuple[int, int] | None, fixed_token: int | None, k: int | None,
                variant: str, p: float | None, orientation: str) -> TokenPick | None:
    row, col, fixed_col = _token_axes(kind)
    try:
        df = m.select(kind, resolve_k(m, k), variant, p, orientation)
    except KeyError:
        return None
    if prompt_id is None:
        order = [pid for pid in m.prompts["prompt_id"] if (df["prompt_id"] == pid).any()]
        prompt_id = order[0] if order else str(df["prompt_id"].iloc[0])
    df = df[df["prompt_id"] == prompt_id]
    if df.empty:
        return None
    if layers is None:
        pairs = sorted({(int(a), int(b)) for a, b in zip(df["layer_a"], df["layer_b"],
                                                          strict=True)})
        same = [pr for pr in pairs if pr[0] == pr[1]]
        layers = same[len(same) // 2] if same else pairs[0]
    df = df[(df["layer_a"] == layers[0]) & (df["layer_b"] == layers[1])]
    fixed = None
    if fixed_col is not None:
        other = fixed_col.replace("_a", "_b")
        df = df[df[fixed_col] == df[other]]
        if df.empty:
            return None
        if fixed_token is None:
            # fixed_input: the first input token (sees every output); fixed_output: the last.
            fixed = int(df[fixed_col].min() if kind == "fixed_input" else df[fixed_col].max())
        else:
            fixed = int(fixed_token)
        df = df[df[fixed_col] == fixed]
    if df.empty:
        return None
    matrix = df.pivot_table(index=row, columns=col, values="value", aggfunc="mean")
    return TokenPick(kind, str(prompt_id), int(layers[0]), int(layers[1]), fixed, matrix)


def token_heatmap_data(runs: Runs, kind: str = "self", *, prompt_id: str | None = None,
                       layers: tuple[int, int] | None = None, fixed_token: int | None = None,
                       k: int | None = None, variant: str = "coupling",
                       p: float | None = 1.0, orientation: str = "ujv") -> list[TokenPick | None]:
    """Per run: the prompt, layer pair, fixed token and n x n matrix drawn."""
    _check_variant(variant, orientation)
    _token_axes(kind)
    picks = [_token_pick(m, kind, prompt_id=prompt_id, layers=layers, fixed_token=fixed_token,
                         k=k, variant=variant, p=p, orientation=orientation)
             for m in as_runs(runs)]
    if all(x is None for x in picks):
        raise FigureUnavailable(f"no '{kind}' coupling rows for this selection; measure with "
                                f"coupling including {kind!r}")
    return picks


def plot_token_heatmap(runs: Runs, kind: str = "self", *, prompt_id: str | None = None,
                       layers: tuple[int, int] | None = None, fixed_token: int | None = None,
                       k: int | None = None, variant: str = "coupling", p: float | None = 1.0,
                       orientation: str = "ujv",
                       labels: Sequence[str] | None = None) -> Figure:
    """Token-wise coupling heatmaps (paper fig. 4), one panel per run.

    ``self``: J^l_tt against J^l'_t't' (rows t, columns t'). ``fixed_input``: J^l_{s t}
    against J^l'_{s t'} for a fixed input token s. ``fixed_output``: J^l_{s t} against
    J^l'_{s' t} for a fixed output token t (rows s, columns s'). Missing cells (e.g. a causal
    model's t < s) are blank."""
    ms = as_runs(runs)
    picks = token_heatmap_data(ms, kind, prompt_id=prompt_id, layers=layers,
                               fixed_token=fixed_token, k=k, variant=variant, p=p,
                               orientation=orientation)
    labs = run_labels(ms, labels)
    values = np.concatenate([pk.matrix.to_numpy(dtype=float).ravel()
                             for pk in picks if pk is not None])
    norm = Normalize(float(np.nanmin(values)), float(np.nanmax(values)))
    row_name, col_name = {"self": ("measured token t", "basis token t'"),
                          "fixed_input": ("measured output token t", "basis output token t'"),
                          "fixed_output": ("measured input token s", "basis input token s'")}[kind]
    fig, axes = _panels(len(ms), 3.6, 4.4, extra_width=1.0)  # room for two-line titles
    image = None
    for ax, pick, lab in zip(axes, picks, labs, strict=True):
        if pick is None:
            ax.set_title(lab)
            _no_data(ax)
            continue
        title = f"{lab}\nlayers {pick.layer_a}, {pick.layer_b}"
        if pick.fixed is not None:
            title += f"; {'input' if kind == 'fixed_input' else 'output'} token {pick.fixed}"
        ax.set_title(title, fontsize="medium")
        image = ax.imshow(pick.matrix.to_numpy(dtype=float),
                          cmap=_colormap(_HEATMAP_CMAP).with_extremes(bad="0.92"), norm=norm,
                          interpolation="nearest")
        rows, cols = list(pick.matrix.index), list(pick.matrix.columns)
        step = max(1, len(cols) // 12)
        ax.set_xticks(range(0, len(cols), step), [str(c) for c in cols[::step]])
        ax.set_yticks(range(0, len(rows), step), [str(r) for r in rows[::step]])
        ax.set_xlabel(col_name)
        ax.set_ylabel(row_name)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=variant, shrink=0.9)
    return fig


def caption_token_heatmap(runs: Runs, kind: str = "self", *, prompt_id: str | None = None,
                          layers: tuple[int, int] | None = None,
                          fixed_token: int | None = None, k: int | None = None,
                          variant: str = "coupling", p: float | None = 1.0,
                          orientation: str = "ujv",
                          labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    picks = token_heatmap_data(ms, kind, prompt_id=prompt_id, layers=layers,
                               fixed_token=fixed_token, k=k, variant=variant, p=p,
                               orientation=orientation)
    what = {
        "self": "Token-wise coupling, same input and output token (kind self): J^l_tt "
                "(measured, rows t) against J^l'_t't' (basis, columns t').",
        "fixed_input": "Context coupling with a fixed input token s (kind fixed_input): "
                       "J^l_st (measured, rows t) against J^l'_st' (basis, columns t').",
        "fixed_output": "Context coupling with a fixed output token t (kind fixed_output): "
                        "J^l_st (measured, rows s) against J^l'_s't (basis, columns s').",
    }[kind]
    parts = []
    for i, (m, pick) in enumerate(zip(ms, picks, strict=True)):
        if pick is None:
            parts.append(f"run {i + 1}: not measured")
            continue
        s = (f"run {i + 1}: prompt {pick.prompt_id}{_prompt_text(m, pick.prompt_id)}, "
             f"layers l={pick.layer_a}, l'={pick.layer_b}")
        if pick.fixed is not None:
            s += f", fixed {'input' if kind == 'fixed_input' else 'output'} token {pick.fixed}"
        parts.append(s)
    ks = [resolve_k(m, k) for m in ms]
    p_text = f", p={_fmt_p(p)}" if variant in P_VARIANTS else ""
    k_text = f"K={ks[0]}" if len(set(ks)) == 1 else "K=" + ", ".join(map(str, ks))
    return (f"{what} {k_text}, variant={variant}{p_text}, orientation={orientation}. "
            + "; ".join(parts) + ". " + _runs_text(ms, labels))


# ====================================================================== 4. layer graph
def layer_graph_weights(matrix: pd.DataFrame) -> dict[tuple[int, int], float]:
    """Edge value for each pair of layers l < l': the mean of M[l, l'] and M[l', l]
    (coupling is not symmetric; the graph is), over the entries that were measured."""
    layers = sorted(set(matrix.index) | set(matrix.columns))
    out: dict[tuple[int, int], float] = {}
    for i, a in enumerate(layers):
        for b in layers[i + 1:]:
            vals = [float(matrix.loc[x, y]) for x, y in ((a, b), (b, a))
                    if x in matrix.index and y in matrix.columns
                    and not pd.isna(matrix.loc[x, y])]
            if vals:
                out[(int(a), int(b))] = float(np.mean(vals))
    return out


def plot_layer_graph(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                     p: float | None = 1.0, orientation: str = "ujv", token: int | None = None,
                     labels: Sequence[str] | None = None) -> Figure:
    """Layer adjacency graph (paper fig. 1c-e), one panel per run.

    Layers are nodes on a circle (layer 1 at the top, clockwise). The edge between l and l'
    has width and opacity proportional to its mean depth-wise coupling, rescaled to [0, 1]
    over every edge of every run shown (so panels are comparable; for variants where lower
    means more coupled the scale is flipped). Edges are drawn in the order of
    ``layer_graph_weights`` (l < l', lexicographic) as one LineCollection per panel."""
    ms = as_runs(runs)
    mats = depth_heatmap_data(ms, k=k, variant=variant, p=p, orientation=orientation,
                              token=token)
    labs = run_labels(ms, labels)
    weights = [layer_graph_weights(m) if m is not None else {} for m in mats]
    allv = np.array([v for w in weights for v in w.values()], dtype=float)
    if allv.size == 0:
        raise FigureUnavailable("the depth-wise matrices have no off-diagonal pairs")
    lo, hi = float(allv.min()), float(allv.max())
    flip = not HIGHER_IS_COUPLED[variant]
    fig, axes = _panels(len(ms), 3.8, 4.2, extra_width=0.4)
    for ax, mat, w, lab in zip(axes, mats, weights, labs, strict=True):
        ax.set_title(lab)
        ax.set_aspect("equal")
        ax.axis("off")
        if mat is None:
            _no_data(ax)
            continue
        layers = sorted(set(mat.index) | set(mat.columns))
        n = len(layers)
        angle = {lay: math.pi / 2 - 2 * math.pi * i / n for i, lay in enumerate(layers)}
        pos = {lay: (math.cos(a), math.sin(a)) for lay, a in angle.items()}
        segs, widths, colors = [], [], []
        for (a, b), v in w.items():
            s = (v - lo) / (hi - lo) if hi > lo else 1.0
            s = 1.0 - s if flip else s
            segs.append([pos[a], pos[b]])
            widths.append(0.3 + 5.0 * s)
            colors.append((0.12, 0.35, 0.70, 0.05 + 0.9 * s))
        ax.add_collection(LineCollection(segs, linewidths=widths, colors=colors, zorder=1))
        xy = np.array([pos[lay] for lay in layers])  # (n, 2)
        ax.scatter(xy[:, 0], xy[:, 1], s=140 if n <= 24 else 40, c="white",
                   edgecolors="0.2", zorder=2)
        if n <= 40:
            for lay in layers:
                ax.text(*pos[lay], str(lay), ha="center", va="center", fontsize=7, zorder=3)
        ax.set_xlim(-1.2, 1.2)
        ax.set_ylim(-1.2, 1.2)
    handles = []
    for s in (0.0, 0.5, 1.0):
        v = lo + (1.0 - s if flip else s) * (hi - lo)
        handles.append(Line2D([], [], lw=0.3 + 5.0 * s, color=(0.12, 0.35, 0.70, 0.05 + 0.9 * s),
                              label=f"{variant} {v:.3g}"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False,
               fontsize="small")
    return fig


def caption_layer_graph(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                        p: float | None = 1.0, orientation: str = "ujv", token: int | None = None,
                        labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    depth_heatmap_data(ms, k=k, variant=variant, p=p, orientation=orientation, token=token)
    return ("Layer adjacency graph: each node is a layer (layer 1 at the top, clockwise); "
            "edge width and opacity grow with the mean depth-wise coupling of the two layers "
            "(mean of both directions, mean over prompts), on one scale across the panels. "
            + _selection_text(ms, k, variant, p, orientation, token) + " "
            + _runs_text(ms, labels))


# ====================================================================== 5. by distance
def plot_coupling_by_distance(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                              p: float | None = 1.0, orientation: str = "ujv",
                              labels: Sequence[str] | None = None) -> Figure:
    """Locality: mean depth-wise coupling against |l - l'|, one line per run, +- one std."""
    ms = as_runs(runs)
    _check_variant(variant, orientation)
    labs = run_labels(ms, labels)
    tables = [m.coupling_by_distance(resolve_k(m, k), variant=variant, p=p,
                                     orientation=orientation)
              if _depth_rows(m, k, variant, p, orientation) is not None else None for m in ms]
    if all(t is None for t in tables):
        raise FigureUnavailable(_why_no_depth(ms[0], k, variant, p, orientation))
    fig = _new_figure(6.0, 3.8)
    ax = fig.subplots()
    for i, (t, lab) in enumerate(zip(tables, labs, strict=True)):
        if t is None:
            continue
        x = t["distance"].to_numpy(dtype=float)
        y = t["mean"].to_numpy(dtype=float)
        sd = t["std"].fillna(0.0).to_numpy(dtype=float)
        ax.plot(x, y, marker="o", color=f"C{i}", label=lab)
        ax.fill_between(x, y - sd, y + sd, color=f"C{i}", alpha=0.15, linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer distance |l - l'|")
    ax.set_ylabel(f"mean {variant}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def caption_coupling_by_distance(runs: Runs, *, k: int | None = None,
                                 variant: str = "coupling", p: float | None = 1.0,
                                 orientation: str = "ujv",
                                 labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    if all(_depth_rows(m, k, variant, p, orientation) is None for m in ms):
        raise FigureUnavailable(_why_no_depth(ms[0], k, variant, p, orientation))
    return ("Locality of coupling: mean depth-wise value over all layer pairs at distance "
            "|l - l'| (0 = the diagonal), over prompts and tokens; the band is +- one standard "
            "deviation. " + _selection_text(ms, k, variant, p, orientation, None) + " "
            + _runs_text(ms, labels))


# ====================================================================== 6. PCA
def _first_prompt(m: Measurement, table: pd.DataFrame) -> str | None:
    if table.empty:
        return None
    present = set(table["prompt_id"])
    for pid in m.prompts["prompt_id"]:
        if pid in present:
            return str(pid)
    return str(table["prompt_id"].iloc[0])


def pca_data(m: Measurement, prompt_id: str | None = None) -> tuple[str, pd.DataFrame] | None:
    """(prompt id, trajectory rows of that prompt sorted by token and layer) or None."""
    tr = m.trajectory.dropna(subset=["pca_x", "pca_y"])
    pid = prompt_id if prompt_id is not None else _first_prompt(m, tr)
    if pid is None:
        return None
    rows = tr[tr["prompt_id"] == pid].sort_values(["token", "layer"])
    return (pid, rows) if not rows.empty else None


def plot_pca_trajectories(runs: Runs, *, prompt_id: str | None = None,
                          labels: Sequence[str] | None = None) -> Figure:
    """Token trajectories in the 2-D PCA plane (paper fig. 17), one panel per run.

    One line per token through layers 0..L (circle = layer 0, square = last layer); the last
    token is black and thicker, the others coloured by position. Lines are added token by
    token in increasing order, so ``ax.lines[i]`` is token i's trajectory."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    data = [pca_data(m, prompt_id) for m in ms]
    if all(x is None for x in data):
        raise FigureUnavailable("no PCA coordinates in the trajectory table; measure with "
                                "trajectory=True")
    fig, axes = _panels(len(ms), 4.0, 4.2, extra_width=0.6)
    for ax, item, lab in zip(axes, data, labs, strict=True):
        ax.set_title(lab if item is None else f"{lab}\nprompt {item[0]}", fontsize="medium")
        if item is None:
            _no_data(ax)
            continue
        rows = item[1]
        tokens = sorted(int(t) for t in rows["token"].unique())
        last = tokens[-1]
        cmap = _colormap("viridis")
        for t in tokens:
            r = rows[rows["token"] == t]
            x, y = r["pca_x"].to_numpy(dtype=float), r["pca_y"].to_numpy(dtype=float)
            if t == last:
                color, lw, z, name = "black", 2.2, 3, f"last token ({t})"
            else:
                color = cmap(0.85 * t / max(1, last))
                lw, z, name = 1.0, 2, (f"token {t}" if len(tokens) <= 8 else None)
            ax.plot(x, y, color=color, lw=lw, zorder=z, label=name)
            ax.scatter(x[:1], y[:1], s=14, color=color, marker="o", zorder=z)
            ax.scatter(x[-1:], y[-1:], s=18, color=color, marker="s", zorder=z)
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", loc="best")
    return fig


def _colormap(name: str) -> Colormap:
    return colormaps[name]  # a copy: safe to modify


def caption_pca_trajectories(runs: Runs, *, prompt_id: str | None = None,
                             labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    data = [pca_data(m, prompt_id) for m in ms]
    if all(x is None for x in data):
        raise FigureUnavailable("no PCA coordinates in the trajectory table")
    parts = []
    for i, (m, item) in enumerate(zip(ms, data, strict=True)):
        if item is None:
            parts.append(f"run {i + 1}: none")
            continue
        parts.append(f"run {i + 1}: prompt {item[0]}{_prompt_text(m, item[0])}, "
                     f"{item[1]['token'].nunique()} tokens, layers "
                     f"{int(item[1]['layer'].min())}..{int(item[1]['layer'].max())}")
    return ("Hidden trajectories x^0_i .. x^L_i of every token of one prompt, projected on "
            "the 2-component PCA fitted to the last layer's token embeddings (circle = layer "
            "0, square = last layer; the last token in black). " + "; ".join(parts) + ". "
            + _runs_text(ms, labels))


# ====================================================================== 7. trajectory metrics
def trajectory_summary(m: Measurement, token: int | None = None) -> pd.DataFrame:
    """Per layer: mean norm and mean windowed LSS over prompts and tokens (NaN skipped)."""
    tr = m.trajectory if token is None else m.trajectory[m.trajectory["token"] == token]
    if tr.empty:
        return pd.DataFrame({"layer": [], "norm": [], "lss_window": []})
    g = tr.groupby("layer")[["norm", "lss_window"]].mean()
    return g.reset_index()


def plot_trajectory_metrics(runs: Runs, *, token: int | None = None,
                            labels: Sequence[str] | None = None) -> Figure:
    """Four panels: (a) mean norm ||x^l|| per layer, (b) mean windowed LSS per layer, one line
    per run; (c) per-token LSS and (d) per-token expodistance, one box per run with the
    individual (prompt, token) values as dots."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    summaries = [trajectory_summary(m, token) for m in ms]
    tms = [m.token_metrics if token is None else
           m.token_metrics[m.token_metrics["token"] == token] for m in ms]
    if all(s.empty for s in summaries) and all(t.empty for t in tms):
        raise FigureUnavailable("no trajectory metrics; measure with trajectory=True")
    fig = _new_figure(9.5, 6.4)
    (ax_n, ax_w), (ax_l, ax_e) = fig.subplots(2, 2)
    for ax, col, ylabel in ((ax_n, "norm", "mean norm ||x^l||"),
                            (ax_w, "lss_window", "mean windowed LSS")):
        ax.ticklabel_format(axis="y", useOffset=False)  # plain values, no "+1.8e0" offset
        drawn = False
        for i, (s, lab) in enumerate(zip(summaries, labs, strict=True)):
            if s.empty or s[col].isna().all():
                continue
            s = s.dropna(subset=[col])  # windowed LSS is undefined near the ends
            ax.plot(s["layer"].to_numpy(dtype=float), s[col].to_numpy(dtype=float),
                    marker=".", color=f"C{i}", label=lab)
            drawn = True
        if not drawn:
            _no_data(ax)
            continue
        if col == "norm":
            norms = np.concatenate([s["norm"].to_numpy(dtype=float) for s in summaries])
            if np.nanmin(norms) > 0 and np.nanmax(norms) / np.nanmin(norms) > 30:
                ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer l (0 = input of block 1)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax, col in ((ax_l, "lss"), (ax_e, "expodistance")):
        vals = [t[col].dropna().to_numpy(dtype=float) for t in tms]
        if all(v.size == 0 for v in vals):
            _no_data(ax)
            continue
        pos = [i + 1 for i, v in enumerate(vals) if v.size]
        ax.boxplot([v for v in vals if v.size], positions=pos, widths=0.5, showfliers=False)
        for i, v in enumerate(vals):
            if v.size:
                jitter = np.linspace(-0.15, 0.15, v.size) if v.size > 1 else np.zeros(1)
                ax.scatter(i + 1 + jitter, v, s=8, color=f"C{i}", alpha=0.7, zorder=3)
        ax.set_xticks(range(1, len(ms) + 1), labs, rotation=20 if len(ms) > 3 else 0,
                      fontsize="small")
        ax.set_ylabel(f"per-token {col}")
        ax.grid(alpha=0.3, axis="y")
    ax_n.set_title("(a) norms", fontsize="medium", loc="left")
    ax_w.set_title("(b) windowed line-shape score", fontsize="medium", loc="left")
    ax_l.set_title("(c) LSS of whole trajectories", fontsize="medium", loc="left")
    ax_e.set_title("(d) expodistance", fontsize="medium", loc="left")
    return fig


def caption_trajectory_metrics(runs: Runs, *, token: int | None = None,
                               labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    if all(m.trajectory.empty and m.token_metrics.empty for m in ms):
        raise FigureUnavailable("no trajectory metrics")
    win = {m.config.lss_window for m in ms}
    return ("Trajectory metrics of the hidden states: (a) mean norm ||x^l_i|| per layer and "
            f"(b) mean line-shape score on a centred window of {', '.join(map(str, win))} "
            "layers, both over prompts and tokens; (c) line-shape score LSS of each whole "
            "trajectory (1 = straight line) and (d) expodistance Var(alpha)/Mean(alpha)^2 of "
            "alpha^l = ln(||x^l|| / ||x^(l-1)||) (0 = exact exponential growth), one dot per "
            f"(prompt, token). {'; '.join(sorted({_tokens_text(m, token) for m in ms}))}. "
            + _runs_text(ms, labels))


# ====================================================================== 8. spectra
def top_singular_values(m: Measurement, rank: int = 1, token: int | None = None) -> pd.DataFrame:
    """Per layer: mean over prompts (and tokens) of the rank-th singular value of J^l_tt."""
    sp = m.spectra
    sel = (sp["rank"] == rank) & (sp["token_in"] == sp["token_out"])
    if token is not None:
        sel &= sp["token_out"] == token
    g = sp[sel].groupby("layer")["singular_value"].mean()
    return g.reset_index().rename(columns={"singular_value": "sigma"})


def plot_singular_values(runs: Runs, *, rank: int = 1, token: int | None = None,
                         labels: Sequence[str] | None = None) -> Figure:
    """sigma_rank of J^l_tt against depth l, one line per run, with the dashed least-squares
    fit sigma ~ a / l + b and its R^2 in the legend (the paper's 1/depth observation)."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    tables = [top_singular_values(m, rank, token) for m in ms]
    if all(t.empty for t in tables):
        raise FigureUnavailable("no singular values stored; measure with spectra=True")
    fig = _new_figure(6.0, 3.8)
    ax = fig.subplots()
    for i, (t, lab) in enumerate(zip(tables, labs, strict=True)):
        if t.empty:
            continue
        x = t["layer"].to_numpy(dtype=float)
        y = t["sigma"].to_numpy(dtype=float)
        ax.plot(x, y, marker="o", color=f"C{i}", label=lab)
        if len(x) >= 3:
            fit = fit_inverse_depth(x, y)
            xs = np.linspace(x.min(), x.max(), 200)
            ax.plot(xs, fit["a"] / xs + fit["b"], ls="--", color=f"C{i}", alpha=0.8,
                    label=f"{lab}: {fit['a']:.3g}/l + {fit['b']:.3g}, R²={fit['r2']:.2f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer l")
    ax.set_ylabel(f"σ_{rank}(J^l_tt), mean over prompts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    return fig


def caption_singular_values(runs: Runs, *, rank: int = 1, token: int | None = None,
                            labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    tables = [top_singular_values(m, rank, token) for m in ms]
    if all(t.empty for t in tables):
        raise FigureUnavailable("no singular values stored")
    return (f"Singular value sigma_{rank} of the block Jacobians J^l_tt against depth l, mean "
            "over prompts (and tokens), with the least-squares fit sigma ~ a/l + b (dashed; "
            "R^2 in the legend). "
            f"{'; '.join(sorted({_tokens_text(m, token) for m in ms}))}. "
            + _runs_text(ms, labels))


# ====================================================================== 9. across runs
def across_runs_data(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                     p: float | None = 1.0, orientation: str = "ujv") -> pd.DataFrame:
    """One row per run (in order): mean and std over prompts/tokens of the off-diagonal
    depth-wise value (and of ``coupling_vs_null``, the same against its chance level, when it
    was measured), and mean, std, median and quartiles of the per-token LSS and expodistance
    (NaN where absent). Expodistance is heavy-tailed where norms barely grow (post-LN models),
    so the figure shows medians and quartiles for the trajectory metrics."""
    _check_variant(variant, orientation)
    rows = []
    for m in as_runs(runs):
        row: dict[str, float] = {}
        for name, var in (("coupling", variant), ("null", "coupling_vs_null")):
            if (name == "coupling" or var != variant) and _depth_rows(m, k, var, p, orientation) is not None:
                md = m.mean_depth_coupling(resolve_k(m, k), variant=var, p=p,
                                           orientation=orientation)["mean_offdiag"]
                row[f"{name}_mean"], row[f"{name}_std"] = float(md.mean()), float(md.std(ddof=0))
            else:
                row[f"{name}_mean"] = row[f"{name}_std"] = float("nan")
        for col in ("lss", "expodistance"):
            v = m.token_metrics[col].dropna()
            row[f"{col}_mean"] = float(v.mean()) if len(v) else float("nan")
            row[f"{col}_std"] = float(v.std(ddof=0)) if len(v) else float("nan")
            q = v.quantile([0.25, 0.5, 0.75]).to_numpy() if len(v) else [float("nan")] * 3
            row[f"{col}_q25"], row[f"{col}_median"], row[f"{col}_q75"] = map(float, q)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out[["coupling_mean", "lss_mean", "expodistance_mean"]].isna().all().all():
        raise FigureUnavailable("no depth-wise coupling and no trajectory metrics to compare")
    return out


def plot_across_runs(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                     p: float | None = 1.0, orientation: str = "ujv",
                     labels: Sequence[str] | None = None) -> Figure:
    """Runs in the order given (checkpoints, models) on the x axis (paper fig. 1b): mean
    off-diagonal depth-wise coupling, mean LSS and mean expodistance, +- one std."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    data = across_runs_data(ms, k=k, variant=variant, p=p, orientation=orientation)
    panels = [("coupling", f"mean off-diagonal {variant}")]
    if not data["null_mean"].isna().all():
        panels.append(("null", "mean off-diagonal coupling_vs_null"))
    panels += [("lss", "median LSS"), ("expodistance", "median expodistance")]
    fig = _new_figure(min(22.0, max(9.0, 2.0 + 1.6 * len(panels) + 1.2 * len(ms))), 3.8)
    axes = fig.subplots(1, len(panels))
    x = np.arange(len(ms), dtype=float)
    for ax, (col, name) in zip(axes, panels, strict=True):
        ax.set_title(name, fontsize="medium")
        if col in ("lss", "expodistance"):  # median with the inter-quartile range
            y = data[f"{col}_median"].to_numpy(dtype=float)
            e = np.vstack([y - data[f"{col}_q25"].to_numpy(float),
                           data[f"{col}_q75"].to_numpy(float) - y])
        else:  # mean +- one std
            y = data[f"{col}_mean"].to_numpy(dtype=float)
            e = data[f"{col}_std"].to_numpy(dtype=float)
        if np.isnan(y).all():
            _no_data(ax)
            continue
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.errorbar(x, y, yerr=np.nan_to_num(e), marker="o", capsize=3, color="C0")
        ax.set_xticks(x, labs, rotation=30 if len(ms) > 3 else 0, ha="right" if len(ms) > 3
                      else "center", fontsize="small")
        ax.set_xlim(-0.5, len(ms) - 0.5)
        ax.grid(alpha=0.3)
    return fig


def caption_across_runs(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                        p: float | None = 1.0, orientation: str = "ujv",
                        labels: Sequence[str] | None = None) -> str:
    ms = as_runs(runs)
    across_runs_data(ms, k=k, variant=variant, p=p, orientation=orientation)
    return ("Across runs, in the order given: mean depth-wise value over layer pairs l != l' "
            "(mean over prompts and tokens, error bars one standard deviation), the same for "
            "coupling_vs_null (0 = the chance level of a random basis, 1 = perfect coupling) when "
            "it was measured, and the median per-token LSS and expodistance (error bars the "
            "inter-quartile range; expodistance is heavy-tailed where norms barely grow). "
            + _selection_text(ms, k, variant, p, orientation, None) + " "
            + _runs_text(ms, labels))
