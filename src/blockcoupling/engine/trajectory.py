"""Geometry of token trajectories through the blocks (``DEFINITIONS.md``, "Trajectories").

Every function takes the trajectory tensor of ONE prompt, ``X`` of shape (L+1, n, d): layer
0..L (x^0 = first block input, x^l = output of block l), the n real (non-padded) tokens, the
hidden size d. Results keep the token axis; layers stay 0-based along the first axis here
(the public tables use the same numbers: layer 0 = x^0).

Degenerate cases return NaN (or inf where the mathematics says so) rather than a made-up
number; each function's docstring says exactly when.
"""

from __future__ import annotations

import torch
from torch import Tensor

from blockcoupling.errors import BlockCouplingError


def _check_width(width: int) -> None:
    if int(width) < 1 or int(width) % 2 == 0:
        raise BlockCouplingError(f"the LSS window width must be an odd positive integer, got {width}")


def _check_X(X: Tensor, min_layers: int = 1) -> None:
    if X.ndim != 3:
        raise BlockCouplingError(f"a trajectory must have shape (L+1, n, d), got {tuple(X.shape)}")
    if X.shape[0] < min_layers:
        raise BlockCouplingError(
            f"this metric needs at least {min_layers} layers (x^0..x^L) in the trajectory, got {X.shape[0]}"
        )


def norms(X: Tensor) -> Tensor:
    """``||x^l_i||_2``: X (L+1, n, d) -> (L+1, n)."""
    _check_X(X)
    return torch.linalg.vector_norm(X, dim=-1)


def step_norms(X: Tensor) -> Tensor:
    """``||x^l_i - x^{l-1}_i||_2`` for l = 1..L: X (L+1, n, d) -> (L, n)."""
    _check_X(X, 2)
    return torch.linalg.vector_norm(X[1:] - X[:-1], dim=-1)


def _unit_steps(X: Tensor) -> tuple[Tensor, Tensor]:
    """Unit step directions (L, n, d) (zero where a step is exactly zero) and the mask of
    non-zero steps (L, n)."""
    D = X[1:] - X[:-1]  # (L, n, d)
    nrm = torch.linalg.vector_norm(D, dim=-1, keepdim=True)  # (L, n, 1)
    nonzero = nrm > 0
    unit = torch.where(
        nonzero, D / torch.where(nonzero, nrm, torch.ones_like(nrm)), torch.zeros_like(D)
    )
    return unit, nonzero.squeeze(-1)


def _lss_between(unit: Tensor, nonzero: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """LSS of the sub-trajectories x^lo..x^hi from cumulative unit steps.

    unit (L, n, d), nonzero (L, n), lo / hi (W,) layer indices with lo <= hi -> (W, n).
    """
    L, n, d = unit.shape
    zero = torch.zeros(1, n, d, dtype=unit.dtype, device=unit.device)
    C = torch.cat([zero, unit.cumsum(0)], dim=0)  # (L+1, n, d): y^l - y^0
    cnt = torch.cat(
        [torch.zeros(1, n, dtype=unit.dtype, device=unit.device), nonzero.to(unit.dtype).cumsum(0)],
        dim=0,
    )  # (L+1, n): number of non-zero steps up to layer l
    span = torch.linalg.vector_norm(C[hi] - C[lo], dim=-1)  # (W, n)
    count = cnt[hi] - cnt[lo]  # (W, n)
    out = count / span  # count > 0 and span = 0 -> inf (unit steps cancel exactly)
    return torch.where(count > 0, out, torch.full_like(out, float("nan")))


def line_shape_score(X: Tensor) -> Tensor:
    """Line-shape score (Gai & Zhang 2021) of each token's whole trajectory: (L+1, n, d) -> (n,).

    ``y^0 = x^0``, ``y^l = y^{l-1} + (x^l - x^{l-1}) / ||x^l - x^{l-1}||``,
    ``LSS = L / ||y^L - y^0||``; LSS >= 1 with equality iff the trajectory is a straight line
    traversed in one direction.

    Degenerate cases: a step of exactly zero length has no direction; it is skipped (it adds
    no unit vector and is not counted in L), i.e. LSS is that of the trajectory with repeated
    points removed. If every step is zero the LSS is NaN. If the unit steps cancel exactly
    (e.g. a pure back-and-forth) the LSS is +inf.
    """
    _check_X(X, 2)
    unit, nonzero = _unit_steps(X)
    L = X.shape[0] - 1
    lo = torch.tensor([0], device=X.device)
    hi = torch.tensor([L], device=X.device)
    return _lss_between(unit, nonzero, lo, hi)[0]


def windowed_lss(X: Tensor, width: int = 11) -> Tensor:
    """LSS on a window of layers centred on each layer: (L+1, n, d) -> (L+1, n).

    For layer l (0..L) the window is layers ``max(0, l - h) .. min(L, l + h)`` with
    ``h = (width - 1) // 2`` (``width`` must be odd and >= 1), i.e. clipped at the ends
    (so end windows are shorter, not shifted). The value is `line_shape_score` of that
    sub-trajectory, whose number of steps is the window length minus one. NaN where the window
    has fewer than 2 layers (only when width = 1 or L = 0) or all its steps are zero; the
    same zero-step rule as `line_shape_score` applies.
    """
    _check_X(X)
    _check_width(width)
    L = X.shape[0] - 1
    n = X.shape[1]
    if L == 0:
        return torch.full((1, n), float("nan"), dtype=X.dtype, device=X.device)
    h = (int(width) - 1) // 2
    layers = torch.arange(L + 1, device=X.device)
    lo = (layers - h).clamp(min=0)
    hi = (layers + h).clamp(max=L)
    unit, nonzero = _unit_steps(X)
    return _lss_between(unit, nonzero, lo, hi)  # (L+1, n)


def line_shape_scores(X: Tensor, width: int = 11) -> tuple[Tensor, Tensor]:
    """`line_shape_score` and `windowed_lss` together, sharing one computation of
    the unit steps: (L+1, n, d) -> ((n,), (L+1, n))."""
    _check_X(X, 2)
    _check_width(width)
    L = X.shape[0] - 1
    h = (int(width) - 1) // 2
    layers = torch.arange(L + 1, device=X.device)
    lo = torch.cat([torch.tensor([0], device=X.device), (layers - h).clamp(min=0)])
    hi = torch.cat([torch.tensor([L], device=X.device), (layers + h).clamp(max=L)])
    unit, nonzero = _unit_steps(X)
    both = _lss_between(unit, nonzero, lo, hi)  # (1 + L+1, n)
    return both[0], both[1:]


def expodistance(X: Tensor, *, resolution: float = 0.0) -> Tensor:
    """Expodistance ``ED = Var_l(alpha^l) / Mean_l(alpha^l)^2``: (L+1, n, d) -> (n,).

    ``alpha^l = ln(||x^l|| / ||x^{l-1}||)`` for l = 1..L; Var is the population variance
    (mean of squared deviations, ddof = 0). ED = 0 for exact exponential growth (or decay) of
    the norms. NaN if any norm along the trajectory is zero (alpha undefined), if the mean
    and the variance of alpha are both zero, or if every |alpha^l| is at most ``resolution``:
    norms that do not change beyond rounding (e.g. post-LN blocks whose LayerNorm fixes the
    norm) have no growth rate, and their ratio of rounding noise is not a measurement.
    +inf if only the mean is zero.
    """
    _check_X(X, 2)
    nr = torch.linalg.vector_norm(X, dim=-1, dtype=torch.float64)  # (L+1, n)
    safe = torch.where(nr > 0, nr, torch.ones_like(nr))
    alpha = torch.log(safe[1:]) - torch.log(safe[:-1])  # (L, n)
    ok = (nr > 0).all(dim=0) & (alpha.abs().amax(0) > resolution)  # (n,)
    mean = alpha.mean(0)
    var = ((alpha - mean) ** 2).mean(0)
    ed = var / mean**2
    return torch.where(ok, ed, torch.full_like(ed, float("nan"))).to(X.dtype)


def equidistance_cv(X: Tensor) -> Tensor:
    """Coefficient of variation over l of the step lengths ``||x^l - x^{l-1}||``: -> (n,).

    ``std_l / mean_l`` with the population standard deviation (ddof = 0); 0 for equidistant
    steps; NaN when every step is zero.
    """
    st = step_norms(X)  # (L, n)
    mean = st.mean(0)
    std = ((st - mean) ** 2).mean(0).sqrt()
    return torch.where(
        mean > 0,
        std / torch.where(mean > 0, mean, torch.ones_like(mean)),
        torch.full_like(mean, float("nan")),
    )


def pca_projection(X: Tensor, n_components: int = 2) -> Tensor:
    """Project every x^l_i on the top principal directions of the last layer: -> (L+1, n, c).

    Fits PCA on X[L] (n, d): centre ``mu = mean_i x^L_i``, SVD of ``X[L] - mu``; the
    components are the top right singular vectors. Every x^l_i is projected with the same
    centre: ``(x^l_i - mu) . w_c``. Signs are fixed so that the last-layer score with the
    largest absolute value is positive on every component (as scikit-learn's ``svd_flip``).
    A component whose singular value is zero (relative tolerance ``max(n, d) * eps * s_max``)
    is undefined and its column is NaN: with n = 1 every column is NaN, with n = 2 the second.
    """
    _check_X(X)
    return pca_projections(X[None], n_components)[0]


def pca_projections(X: Tensor, n_components: int = 2) -> Tensor:
    """`pca_projection` of P trajectories of the same length at once (one batched SVD, e.g.
    the prompts of a batch on a GPU): X (P, L+1, n, d) -> (P, L+1, n, c), each its own PCA."""
    if X.ndim != 4:
        raise BlockCouplingError(f"a stack of trajectories must have shape (P, L+1, n, d), "
                                 f"got {tuple(X.shape)}")
    c = int(n_components)
    if c < 1:
        raise BlockCouplingError(f"n_components must be at least 1, got {n_components}")
    XL = X[:, -1]  # (P, n, d)
    P_, n, d = XL.shape
    mu = XL.mean(-2, keepdim=True)  # (P, 1, d)
    U, S, Vh = torch.linalg.svd(XL - mu, full_matrices=False)  # (P, n, r), (P, r), (P, r, d)
    r = S.shape[-1]
    W = torch.zeros(P_, d, c, dtype=X.dtype, device=X.device)  # (P, d, c)
    valid = torch.zeros(P_, c, dtype=torch.bool, device=X.device)
    m = min(c, r)
    if m > 0:
        W[..., :m] = Vh[:, :m].mT
        eps = torch.finfo(X.dtype).eps
        valid[:, :m] = S[:, :m] > max(n, d) * eps * S[:, :1]
        # sign: the largest |score| of the last layer is positive
        scores = U[..., :m] * S[:, None, :m]  # (P, n, m)
        idx = scores.abs().argmax(-2, keepdim=True)  # (P, 1, m)
        sign = torch.sign(scores.gather(-2, idx))  # (P, 1, m)
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)
        W[..., :m] = W[..., :m] * sign
    proj = (X - mu[:, None]) @ W[:, None]  # (P, L+1, n, c)
    return torch.where(valid[:, None, None, :], proj, torch.full_like(proj, float("nan")))
