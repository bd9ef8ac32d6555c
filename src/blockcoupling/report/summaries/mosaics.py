"""Token-wise |A| mosaics [paper fig. 4 and its context-coupling figures]: the stored K x K
coupling matrices of one layer over pairs of tokens (``engine.tables.token_figure_arrays``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries.common import NoData, Runs, as_runs, check_variant
from blockcoupling.report.summaries.tokens import grid_mosaic, token_axes


@dataclass(frozen=True)
class TokenGridPick:
    """What a token-wise |A| mosaic draws for one run."""

    kind: str
    prompt_id: str
    layer: int            # the layer pair (l, l) of the matrices
    fixed: int | None     # the fixed input (fixed_input) or output (fixed_output) token
    tokens: tuple[int, ...]  # the axis: measured token (rows) and basis token (columns)
    k: int
    mosaic: np.ndarray    # (T*k + (T-1)*gap, same); NaN in the gaps; each cell |A| / max|A|
    gap: int


def token_grid_data(runs: Runs, kind: str = "self", *, prompt_id: str | None = None,
                    k: int | None = None, orientation: str = "ujv") -> list[TokenGridPick | None]:
    """Per run: the stored token-wise matrices of ``kind`` (first prompt kept for figures
    unless ``prompt_id``) tiled as a mosaic of |A| cells, leading ``k`` x ``k`` block."""
    check_variant("coupling", orientation)
    token_axes(kind)
    prefix = f"A_{kind}/"
    picks: list[TokenGridPick | None] = []
    for m in as_runs(runs):
        stored = [key.split("/")[1] for key in m.arrays
                  if key.startswith(prefix) and key.endswith(f"/{orientation}")]
        if prompt_id is not None:
            pid = prompt_id if prompt_id in stored else None
        else:
            order = [str(p) for p in m.prompts["prompt_id"] if str(p) in stored]
            pid = order[0] if order else (sorted(stored)[0] if stored else None)
        if pid is None:
            picks.append(None)
            continue
        A = np.asarray(m.arrays[f"{prefix}{pid}/{orientation}"])  # (T, T, Kmax, Kmax)
        toks = tuple(int(t) for t in m.arrays[f"{prefix}{pid}/tokens"])
        layer, fixed = (int(v) for v in m.arrays[f"{prefix}{pid}/where"])
        if A.ndim != 4 or A.shape[:2] != (len(toks), len(toks)) or A.shape[2] != A.shape[3]:
            raise BlockCouplingError(f"array {prefix}{pid}/{orientation} has shape {A.shape}; "
                                     f"expected ({len(toks)}, {len(toks)}, K, K)")
        kk = A.shape[2] if k is None else min(int(k), A.shape[2])
        mosaic, gap = grid_mosaic(A, kk)
        picks.append(TokenGridPick(kind, pid, layer, None if fixed < 0 else fixed, toks, kk,
                                   mosaic, gap))
    if all(x is None for x in picks):
        raise NoData(f"no token-wise coupling matrices of kind {kind!r} stored; measure with "
                     f"coupling including {kind!r} (figure_prompts >= 1)")
    return picks


__all__ = ["TokenGridPick", "token_grid_data"]
