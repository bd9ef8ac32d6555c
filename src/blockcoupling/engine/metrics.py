"""Coupling of two Jacobians: coupling matrices, every coupling variant, and the chance level.

Notation (see ``DEFINITIONS.md``, "Coupling of two Jacobians"): J1 is the *measured* Jacobian
(side ``a``) and J2 the *basis* Jacobian (side ``b``) with top-K singular vectors U2, V2.

- Orientation ``ujv``: ``A = U2^T J1 V2`` (K x K). Orientation ``vju``: ``A = V2^T J1 U2``.
- ``miscoupling``: ``m_K = ||A_K - diag(s1K)||_F / ||s1K||_p`` (p in {1, 2, inf}, default 1),
  where ``A_K`` is the leading K x K block of A and ``s1K`` the top-K singular values of J1.
- ``coupling``: ``c_K = 1 - m_K``.
- ``released_norm``: ``|| |A_K| - diag(s1K) ||_F / ||s1K||_2`` (element-wise |A|, as in the
  released code; forgives sign flips). Reported with ``p = 2``.
- ``released_trace``: the same numerator divided by ``sum(s1K)``. Reported with ``p`` empty.
- ``offdiag_ratio``: ``||A_K - Diag(A_K)||_F / ||A_K||_F`` (lower = more coupled). Reported
  with ``p`` empty.
- ``coupling_vs_null``: ``(c - c_null) / (1 - c_null) = 1 - m_K / m_null`` where ``c_null`` is
  the chance level below: 0 = chance, 1 = perfectly coupled, negative = worse than chance.
  m_K and m_null share the denominator ``||s1K||_p``, so the value does not depend on p: it is
  reported once, with ``p`` empty (computed with p = 1; a p passed in is accepted and has no
  effect).

Chance level (not in the paper). Let U, V be *independent* Haar-random d x K matrices with
orthonormal columns, independent of J1 (d x d). Because U and -U have the same law, E[A] = 0;
because E[U U^T] = (K/d) I (and likewise for V),
``E||U^T J1 V||_F^2 = (K/d) E tr(V^T J1^T J1 V) = (K/d)^2 ||J1||_F^2``.
Hence ``E||A - diag(s1K)||_F^2 = (K/d)^2 ||J1||_F^2 + ||s1K||_2^2`` and we define

    m_null = sqrt((K/d)^2 fro2 + ||s1K||_2^2) / ||s1K||_p,   c_null = 1 - m_null,

with ``fro2 = ||J1||_F^2``. This is the root-mean-square miscoupling of a random basis (the
square root is taken of the expectation; the mean of the square root is below it by Jensen's
inequality, but ||A - S||_F concentrates for d in the tens and above, so the gap is small).
For a flat spectrum and K << d, ``c_null ~ 1 - ||s1K||_2 / ||s1K||_1 = 1 - 1/sqrt(K)``.

Degenerate inputs are not hidden: where J1's top-k singular values are all zero (or A_K = 0
for ``offdiag_ratio``) the ratio is 0/0 and the value is NaN.

Every function broadcasts over leading dimensions and works in float32 / float64 on any
device; values are computed in the dtype of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from blockcoupling.engine.names import FIXED_P, ORIENTATIONS, P_VARIANTS, VALID_P, VARIANTS
from blockcoupling.errors import BlockCouplingError

__all__ = ["FIXED_P", "ORIENTATIONS", "P_VARIANTS", "VALID_P", "VARIANTS"]  # and the functions below


# --------------------------------------------------------------------------- validation
def _check_orientation(orientation: str) -> None:
    if orientation not in ORIENTATIONS:
        raise BlockCouplingError(
            f"unknown orientation {orientation!r}; use one of {', '.join(ORIENTATIONS)}"
        )


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise BlockCouplingError(
            f"unknown coupling variant {variant!r}; use one of {', '.join(VARIANTS)}"
        )


def _norm_p(p: float | int | str | None) -> float:
    """Normalise a user-supplied p (1, 2, inf, "inf", None -> 1) to a float in VALID_P."""
    if p is None:
        return 1.0
    if isinstance(p, str):
        if p.strip().lower() in ("inf", "infinity", "max"):
            return math.inf
        try:
            p = float(p)
        except ValueError:
            raise BlockCouplingError(f"p must be 1, 2 or inf, got {p!r}") from None
    pf = float(p)
    if pf not in VALID_P:
        raise BlockCouplingError(f"p must be 1, 2 or inf, got {p!r}")
    return pf


def reported_p(variant: str, p: float | int | str | None = None) -> float | None:
    """The ``p`` that goes into the ``p`` column of the coupling table for ``variant``.

    ``coupling`` and ``miscoupling`` use the chosen p (default 1); the others have the fixed
    p of :data:`FIXED_P`: ``released_norm`` always 2; ``released_trace``, ``offdiag_ratio``
    and ``coupling_vs_null`` (which does not depend on p) none (an empty cell).
    """
    _check_variant(variant)
    if variant in P_VARIANTS:
        return _norm_p(p)
    return FIXED_P[variant]


def _check_fixed_p(variant: str, p: float | int | str | None) -> None:
    """Refuse a p that a variant with a fixed normaliser would silently ignore."""
    if p is None:
        return
    fixed = reported_p(variant)
    if fixed is None:
        raise BlockCouplingError(f"variant {variant!r} has no p; pass p=None")
    if _norm_p(p) != fixed:
        raise BlockCouplingError(
            f"variant {variant!r} always uses p={fixed:g}; pass p=None or p={fixed:g}"
        )


def _check_k(A: Tensor, s1: Tensor, k: int) -> None:
    if A.shape[-1] != A.shape[-2]:
        raise BlockCouplingError(
            f"coupling matrix must be square (..., K, K), got shape {tuple(A.shape)}"
        )
    kmax = min(A.shape[-1], s1.shape[-1])
    if not (1 <= int(k) <= kmax):
        raise BlockCouplingError(
            f"k={k} is out of range: the coupling matrix was computed with K_max={kmax}; "
            f"use 1 <= k <= {kmax} or recompute with a larger K_max"
        )


# --------------------------------------------------------------------------- coupling matrix
def coupling_matrix(J1: Tensor | Callable[[Tensor], Tensor], U2: Tensor, V2: Tensor,
                    orientation: str = "ujv") -> Tensor:
    """Coupling matrix of a measured Jacobian J1 in the top-K singular basis of J2.

    J1 (..., d, d), U2 / V2 (..., d, K) -> A (..., K, K); leading dimensions broadcast.
    ``ujv``: ``A = U2^T J1 V2``; ``vju``: ``A = V2^T J1 U2``.

    J1 may also be an operator ``X (d, m) -> J1 X (d, m)`` (a matrix-free Jacobian, or a dense
    one applied as one GEMM): then every basis in the leading dimensions of U2 / V2 (P, d, K)
    goes through it in one product, ``J1 [B_1 ... B_P]`` (d, P K).
    """
    _check_orientation(orientation)
    left, right = (U2, V2) if orientation == "ujv" else (V2, U2)
    if isinstance(J1, Tensor):
        return left.mT @ (J1 @ right)  # (..., K, K)
    d, K = right.shape[-2], right.shape[-1]
    R = right.reshape(-1, d, K)  # (P, d, K)
    P = R.shape[0]
    JX = J1(R.permute(1, 0, 2).reshape(d, P * K))  # (d, P*K)
    JX = JX.reshape(d, P, K).permute(1, 0, 2)  # (P, d, K)
    A = left.reshape(-1, d, K).transpose(-1, -2) @ JX  # (P, K, K)
    return A.reshape(*right.shape[:-2], K, K)


def coupling_matrix_from_products(JV: Tensor, U2: Tensor) -> Tensor:
    """Coupling matrix from an operator product (matrix-free path): ``U2^T (J1 V2)``.

    ``ujv``: pass ``JV = J1 V2`` (..., d, K) and ``U2`` (..., d, K).
    ``vju``: pass ``J1 U2`` as ``JV`` and ``V2`` as ``U2`` -> ``V2^T (J1 U2)``.
    Returns (..., K, K).
    """
    return U2.mT @ JV  # (..., K, K)


# --------------------------------------------------------------------------- chance level
def _pnorm(s: Tensor, p: float) -> Tensor:
    """||s||_p over the last dimension for p in {1, 2, inf}; s (..., k) -> (...,)."""
    return torch.linalg.vector_norm(s, ord=p, dim=-1)


def chance_miscoupling(
    s1: Tensor, fro2: Tensor | float, d: int, k: int, p: float | int | str = 1
) -> Tensor:
    """Root-mean-square miscoupling of Haar-random independent bases (see module docstring).

    ``m_null = sqrt((k/d)^2 fro2 + ||s1[:k]||_2^2) / ||s1[:k]||_p``; s1 (..., >= k) the measured
    Jacobian's singular values (descending), fro2 (...,) = ||J1||_F^2, d its dimension.
    Returns (...,).
    """
    pf = _norm_p(p)
    if not (1 <= int(k) <= s1.shape[-1]):
        raise BlockCouplingError(
            f"k={k} must be between 1 and the number of singular values {s1.shape[-1]}"
        )
    if int(d) < int(k):
        raise BlockCouplingError(f"d={d} must be at least k={k}")
    sk = s1[..., :k]  # (..., k)
    fro2_t = torch.as_tensor(fro2, dtype=s1.dtype, device=s1.device)
    num = torch.sqrt((k / d) ** 2 * fro2_t + (sk * sk).sum(-1))  # (...,)
    return num / _pnorm(sk, pf)


def chance_coupling(
    s1: Tensor, fro2: Tensor | float, d: int, k: int, p: float | int | str = 1
) -> Tensor:
    """``c_null = 1 - chance_miscoupling(s1, fro2, d, k, p)``; (...,)."""
    return 1.0 - chance_miscoupling(s1, fro2, d, k, p)


# --------------------------------------------------------------------------- values
def coupling_values(
    A: Tensor,
    s1: Tensor,
    k: int,
    variant: str,
    p: float | int | str | None = None,
    fro2: Tensor | float | None = None,
    d: int | None = None,
) -> Tensor:
    """One coupling variant from a coupling matrix, for one k.

    A (..., K_max, K_max) coupling matrix, s1 (..., >= k) the *measured* Jacobian's singular
    values (descending). Only the leading k x k block of A and ``s1[..., :k]`` are used (top-K
    subspaces are nested, so one K_max computation serves every k <= K_max). ``p`` applies to
    ``coupling``, ``miscoupling`` and ``coupling_vs_null`` (1, 2 or inf; default 1);
    ``released_norm`` accepts only None or 2, ``released_trace`` and ``offdiag_ratio`` only
    None. ``coupling_vs_null`` needs ``fro2`` (..., ||J1||_F^2) and ``d``. Returns (...,).
    """
    _check_variant(variant)
    _check_k(A, s1, k)
    if variant not in P_VARIANTS and variant != "coupling_vs_null":
        _check_fixed_p(variant, p)
    Ak = A[..., :k, :k]  # (..., k, k)
    sk = s1[..., :k]  # (..., k)
    if variant == "offdiag_ratio":
        off = Ak - torch.diag_embed(torch.diagonal(Ak, dim1=-2, dim2=-1))
        return torch.linalg.matrix_norm(off) / torch.linalg.matrix_norm(Ak)
    if variant in ("released_norm", "released_trace"):
        num = torch.linalg.matrix_norm(Ak.abs() - torch.diag_embed(sk))
        den = _pnorm(sk, 2.0) if variant == "released_norm" else sk.sum(-1)
        return num / den
    pf = _norm_p(p)
    m = torch.linalg.matrix_norm(Ak - torch.diag_embed(sk)) / _pnorm(sk, pf)  # (...,)
    if variant == "miscoupling":
        return m
    if variant == "coupling":
        return 1.0 - m
    # coupling_vs_null: (c - c_null) / (1 - c_null) = 1 - m / m_null
    if fro2 is None or d is None:
        raise BlockCouplingError(
            "variant 'coupling_vs_null' needs fro2 (||J1||_F^2) and d (the hidden size)"
        )
    return 1.0 - m / chance_miscoupling(s1, fro2, d, k, pf)  # the same for every p


def _leading_block_sums(E: Tensor, ks: Sequence[int]) -> Tensor:
    """Sums of E (..., K, K) over its leading k x k blocks for each k of ``ks`` -> (..., len(ks)).

    A few k (the usual 10, 30, 50): each block summed on its own (sum k^2 elements; strided
    reductions, 6x faster than the cumulative sums at P = 2048 pairs of K = 50); many k: one
    2-D cumulative sum serves them all (K^2 elements, whatever their number)."""
    if sum(k * k for k in ks) <= 2 * E.shape[-1] ** 2:
        return torch.stack([E[..., :k, :k].sum((-2, -1)) for k in ks], dim=-1)
    C = torch.diagonal(E.cumsum(-1).cumsum(-2), dim1=-2, dim2=-1)  # (..., K): entry k-1
    return C.index_select(-1, torch.tensor([k - 1 for k in ks], device=E.device))


def all_coupling_values(
    A: Tensor,
    s1: Tensor,
    ks: Iterable[int],
    variants: Iterable[str] = VARIANTS,
    ps: Iterable[float | int | str] = (1,),
    fro2: Tensor | float | None = None,
    d: int | None = None,
) -> dict[tuple[str, float | None, int], Tensor]:
    """Every requested (variant, p, k) at once, vectorised over all leading dimensions.

    A (..., K_max, K_max), s1 (..., >= K_max). Returns ``{(variant, p, k): values (...,)}``
    where ``p`` is the *reported* p (:func:`reported_p`): each p in ``ps`` for ``coupling`` and
    ``miscoupling``; 2 for ``released_norm``; None for ``released_trace``, ``offdiag_ratio``
    and ``coupling_vs_null`` (those get one entry whatever ``ps`` holds).
    The squared Frobenius norms of the leading k x k blocks are block sums
    (:func:`_leading_block_sums`: direct for a few k, one 2-D cumulative sum for many). Requesting
    ``coupling_vs_null`` without ``fro2`` and ``d`` raises (a request is never dropped).
    """
    variants = tuple(variants)
    for v in variants:
        _check_variant(v)
    ks = sorted({int(k) for k in ks})
    if not ks:
        raise BlockCouplingError("ks is empty; pass at least one k")
    for k in ks:
        _check_k(A, s1, k)
    pset = tuple(dict.fromkeys(_norm_p(p) for p in ps)) or (1.0,)
    if "coupling_vs_null" in variants and (fro2 is None or d is None):
        raise BlockCouplingError(
            "variant 'coupling_vs_null' needs fro2 (||J1||_F^2) and d (the hidden size)"
        )

    kmax = ks[-1]
    Ak = A[..., :kmax, :kmax]  # (..., Kx, Kx)
    sk = s1[..., :kmax]  # (..., Kx)
    diag_s = torch.diag_embed(sk)  # (..., Kx, Kx)
    idx = torch.tensor([k - 1 for k in ks], device=A.device)

    out: dict[tuple[str, float | None, int], Tensor] = {}

    def pick(x: Tensor) -> Tensor:  # (..., Kx) -> (..., len(ks))
        return x.index_select(-1, idx)

    need_signed = any(v in (*P_VARIANTS, "coupling_vs_null") for v in variants)
    if need_signed:
        num = _leading_block_sums((Ak - diag_s) ** 2, ks).sqrt()  # (..., nk)
        s2 = pick((sk * sk).cumsum(-1))  # (..., nk) ||s_k||_2^2
        dens = {
            1.0: pick(sk.abs().cumsum(-1)),
            2.0: s2.sqrt(),
            math.inf: pick(sk.abs().cummax(-1).values),
        }
        if "coupling_vs_null" in variants:
            assert d is not None and fro2 is not None
            kk = torch.tensor(ks, dtype=A.dtype, device=A.device)  # (nk,)
            fro2_t = torch.as_tensor(fro2, dtype=A.dtype, device=A.device).unsqueeze(-1)  # (..., 1)
            null_num = torch.sqrt((kk / d) ** 2 * fro2_t + s2)  # (..., nk)
            m1 = num / dens[1.0]  # p cancels in m / m_null: computed once, with p = 1
            for j, k in enumerate(ks):
                m_null = null_num[..., j] / dens[1.0][..., j]
                out[("coupling_vs_null", None, k)] = 1.0 - m1[..., j] / m_null
        for pf in pset:
            m = num / dens[pf]  # (..., nk)
            for j, k in enumerate(ks):
                if "miscoupling" in variants:
                    out[("miscoupling", pf, k)] = m[..., j]
                if "coupling" in variants:
                    out[("coupling", pf, k)] = 1.0 - m[..., j]
    if "released_norm" in variants or "released_trace" in variants:
        num_abs = _leading_block_sums((Ak.abs() - diag_s) ** 2, ks).sqrt()  # (..., nk)
        l2 = pick((sk * sk).cumsum(-1)).sqrt()  # (..., nk)
        tr = pick(sk.cumsum(-1))  # (..., nk)
        for j, k in enumerate(ks):
            if "released_norm" in variants:
                out[("released_norm", 2.0, k)] = num_abs[..., j] / l2[..., j]
            if "released_trace" in variants:
                out[("released_trace", None, k)] = num_abs[..., j] / tr[..., j]
    if "offdiag_ratio" in variants:
        total = _leading_block_sums(Ak * Ak, ks)  # (..., nk)
        off = Ak - torch.diag_embed(torch.diagonal(Ak, dim1=-2, dim2=-1))  # (..., Kx, Kx)
        off_sq = _leading_block_sums(off * off, ks)  # (..., nk), no cancellation
        ratio = off_sq.sqrt() / total.sqrt()
        for j, k in enumerate(ks):
            out[("offdiag_ratio", None, k)] = ratio[..., j]
    return out


def variant_p_pairs(
    variants: Sequence[str], ps: Iterable[float | int | str] = (1,)
) -> list[tuple[str, float | None]]:
    """The (variant, reported p) combinations :func:`all_coupling_values` produces, in order."""
    pset = tuple(dict.fromkeys(_norm_p(p) for p in ps)) or (1.0,)
    pairs: list[tuple[str, float | None]] = []
    for v in variants:
        _check_variant(v)
        if v in P_VARIANTS:
            pairs.extend((v, pf) for pf in pset)
        else:
            pairs.append((v, reported_p(v)))
    return pairs
