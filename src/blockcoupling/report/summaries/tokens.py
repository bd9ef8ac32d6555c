"""Token-wise coupling: the grid of one layer pair over token pairs and the token heatmaps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries.common import (
    REPORT_RULE,
    TOKEN_KINDS,
    NoData,
    Runs,
    as_runs,
    check_variant,
    resolve_k,
)


# ====================================================================== |A| grids
@dataclass(frozen=True)
class GridPick:
    """What the coupling-matrix grid draws for one run."""

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
    """Per run: the prompt, window and mosaic of the stored coupling matrices A (``k``: the
    leading k x k block of each stored K x K matrix, None = all of it; a display size, not
    the statistic's K, so not a `StatisticRule`)."""
    check_variant("coupling", orientation)
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
        raise NoData(
            f"no coupling matrices stored (arrays 'A/<prompt>/{orientation}'); measure with "
            "figure_window set to keep them"
        )
    return picks


# ====================================================================== token-wise coupling
@dataclass(frozen=True)
class TokenPick:
    """What the token-wise heatmap draws for one run."""

    kind: str
    prompt_id: str
    layer_a: int
    layer_b: int
    fixed: int | None  # the fixed input (fixed_input) or output (fixed_output) token
    matrix: pd.DataFrame  # rows = side-a token, columns = side-b token


def token_axes(kind: str) -> tuple[str, str, str | None]:
    """(row column, column column, fixed-token column) of the pivot for a token-wise kind."""
    if kind == "self":
        return "token_out_a", "token_out_b", None
    if kind == "fixed_input":
        return "token_out_a", "token_out_b", "token_in_a"
    if kind == "fixed_output":
        return "token_in_a", "token_in_b", "token_out_a"
    raise BlockCouplingError(f"token-wise kind {kind!r}: choose from {', '.join(TOKEN_KINDS)}")


def _token_pick(m: Measurement, kind: str, rule: StatisticRule, *, prompt_id: str | None,
                layers: tuple[int, int] | None, fixed_token: int | None) -> TokenPick | None:
    row, col, fixed_col = token_axes(kind)
    try:
        df = m.select(kind, resolve_k(m, rule.k), rule.variant, rule.p, rule.orientation)
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


def token_heatmap_data(runs: Runs, kind: str = "self", rule: StatisticRule = REPORT_RULE, *,
                       prompt_id: str | None = None, layers: tuple[int, int] | None = None,
                       fixed_token: int | None = None) -> list[TokenPick | None]:
    """Per run: the prompt, layer pair, fixed token and n x n token-wise matrix of the
    rule's variant, K, p and orientation.

    Defaults: the run's first prompt, the middle same-layer pair, for ``fixed_input`` the
    first input token and for ``fixed_output`` the last output token. A run measured at one
    token (an encoder's [CLS] under ``tokens="auto"``) has no token-wise matrix to show
    (None: a 1 x 1 "heatmap" says nothing)."""
    token_axes(kind)
    picks = [_token_pick(m, kind, rule, prompt_id=prompt_id, layers=layers,
                         fixed_token=fixed_token) for m in as_runs(runs)]
    measured = any(x is not None for x in picks)
    picks = [x if x is not None and min(x.matrix.shape) > 1 else None for x in picks]
    if all(x is None for x in picks):
        raise NoData(f"no '{kind}' coupling rows for this selection; measure with "
                     f"coupling including {kind!r}" if not measured else
                     f"'{kind}' coupling was measured at one token only; a token-wise "
                     "heatmap needs two or more (measure with tokens=all)")
    return picks
