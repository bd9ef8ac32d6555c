"""Spectra and influence (``DEFINITIONS.md``, "Spectra and influence").

- `influence_metrics`: scalar summaries of a Jacobian's singular values (cross-token
  influence of the released code).
- `fit_inverse_depth`: least-squares fit of top singular values against 1/depth.
- `linearisation_cosine`: how well the product of linearised blocks predicts x^L.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from blockcoupling.errors import BlockCouplingError

INFLUENCE_METRICS: tuple[str, ...] = (
    "frobenius",
    "spectral",
    "participation_ratio",
    "effective_rank",
)


def influence_metrics(s: Tensor) -> dict[str, Tensor]:
    """Influence metrics from singular values s (..., r) (any order, non-negative) -> (...,) each.

    ``frobenius = ||s||_2`` (= ||J||_F when s holds all singular values), ``spectral = max s``,
    ``participation_ratio = (sum s)^2 / sum s^2`` (between 1 and r),
    ``effective_rank = exp(-sum_i p_i log p_i)`` with ``p = s / sum s`` and ``0 log 0 = 0``
    (between 1 and r). For s = 0 the two ratios are 0/0 and NaN.
    """
    if s.ndim < 1 or s.shape[-1] < 1:
        raise BlockCouplingError(
            f"influence_metrics needs singular values of shape (..., r) with r >= 1, got {tuple(s.shape)}"
        )
    if bool((s < 0).any()):
        raise BlockCouplingError("singular values must be non-negative")
    total = s.sum(-1)  # (...,)
    sq = (s * s).sum(-1)  # (...,)
    p = s / total.unsqueeze(-1)  # (..., r); NaN where total = 0
    plogp = torch.where(
        p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p)
    )
    ent = -plogp.sum(-1)
    eff = torch.exp(ent)
    eff = torch.where(total > 0, eff, torch.full_like(eff, float("nan")))
    return {
        "frobenius": sq.sqrt(),
        "spectral": s.amax(-1),
        "participation_ratio": total**2 / sq,
        "effective_rank": eff,
    }


def fit_inverse_depth(
    layers: Sequence[float] | np.ndarray | Tensor, sigma: Sequence[float] | np.ndarray | Tensor
) -> dict[str, float]:
    """Fit ``sigma ~ a / depth + b`` by ordinary least squares.

    layers: 1-based depths (> 0), one per observation (repeat a layer for several tokens or
    prompts); sigma: the observed values (e.g. top singular values), same length. Minimises
    ``sum_i (sigma_i - a / layer_i - b)^2`` over (a, b) (``numpy.linalg.lstsq`` on the design
    matrix [1/layer, 1]); non-finite pairs are dropped. Returns ``a``, ``b``, ``r2`` =
    ``1 - SS_res / SS_tot`` (NaN when all sigma are equal) and ``n`` (points used).
    Needs at least two distinct layers.
    """
    x = np.asarray(
        layers.detach().cpu() if isinstance(layers, Tensor) else layers, dtype=np.float64
    ).ravel()
    y = np.asarray(
        sigma.detach().cpu() if isinstance(sigma, Tensor) else sigma, dtype=np.float64
    ).ravel()
    if x.shape != y.shape:
        raise BlockCouplingError(
            f"layers and sigma must have the same length, got {x.size} and {y.size}"
        )
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if (x <= 0).any():
        raise BlockCouplingError("layers must be 1-based depths (> 0) for a 1/depth fit")
    if np.unique(x).size < 2:
        raise BlockCouplingError("fit_inverse_depth needs values at two or more distinct layers")
    design = np.stack([1.0 / x, np.ones_like(x)], axis=1)  # (N, 2)
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ np.array([a, b])
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return {"a": float(a), "b": float(b), "r2": r2, "n": int(x.size)}


def linearisation_cosine(J_list: Iterable[Tensor | Callable[[Tensor], Tensor]] | Tensor,
                         x0: Tensor, xL: Tensor) -> Tensor:
    """Cosine between the linearised propagation ``prod_l (I + J^l) x^0`` and x^L.

    J_list: the L Jacobians ``J^l_{tt}`` (..., d, d) in block order l = 1..L (a sequence, a
    tensor (L, ..., d, d), or any iterable, consumed once and in order), or operators
    ``v (..., d) -> J^l v (..., d)`` (matrix-free Jacobians); x0, xL (..., d). Computes
    ``v = x0`` then ``v <- v + J^l v`` for l = 1..L (so J^1 acts first) and returns the cosine
    ``<v, xL> / (||v|| ||xL||)`` (...,) (``torch.nn.functional.cosine_similarity``); NaN if
    either vector is zero.
    """
    v = x0
    n = 0
    for J in J_list:
        n += 1
        if callable(J) and not isinstance(J, Tensor):
            v = v + J(v)  # (..., d)
            continue
        if J.shape[-1] != v.shape[-1] or J.shape[-2] != v.shape[-1]:
            raise BlockCouplingError(
                f"Jacobian shape {tuple(J.shape)} does not match vector size {v.shape[-1]}"
            )
        v = v + (J @ v.unsqueeze(-1)).squeeze(-1)  # (..., d)
    if n == 0:
        raise BlockCouplingError("linearisation_cosine needs at least one Jacobian")
    cos = torch.nn.functional.cosine_similarity(v, xL, dim=-1)
    zero = (torch.linalg.vector_norm(v, dim=-1) == 0) | (torch.linalg.vector_norm(xL, dim=-1) == 0)
    return torch.where(zero, torch.full_like(cos, float("nan")), cos)
