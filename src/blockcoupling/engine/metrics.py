"""Coupling of two Jacobians: coupling matrices, every coupling variant, and the chance level.

J1 is the *measured* Jacobian (side ``a``) and J2 the *basis* Jacobian (side ``b``) with top-K
singular vectors U2, V2; ``A = U2^T J1 V2`` (``ujv``) or ``V2^T J1 U2`` (``vju``). Each variant
is one record of ``engine/variants.py`` (its formula, direction and p rule; the definitions and
both nulls are stated there and in docs/conventions.md, "Coupling"); the functions here check
the inputs and run those formulas.

The chance level of independent Haar-random bases (not in the paper) is the root-mean-square
miscoupling ``m_null = sqrt((K/d)^2 ||J1||_F^2 + ||s1K||_2^2) / ||s1K||_p``, ``c_null = 1 -
m_null`` (about ``1 - 1/sqrt(K)`` for a flat spectrum and K << d).

Degenerate inputs are not hidden: where J1's top-k singular values are all zero (or A_K = 0
for ``offdiag_ratio``) the value is NaN. Every function broadcasts over leading dimensions
and computes in the dtype of its inputs, on any device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from blockcoupling.engine import variants as registry
from blockcoupling.engine.names import FIXED_P, ORIENTATIONS, P_VARIANTS, VALID_P, VARIANTS
from blockcoupling.engine.variants import P_FREE, P_USER, Parts
from blockcoupling.errors import BlockCouplingError

__all__ = ["FIXED_P", "ORIENTATIONS", "P_VARIANTS", "VALID_P", "VARIANTS"]  # and the functions below


# --------------------------------------------------------------------------- validation
def _check_orientation(orientation: str) -> None:
    if orientation not in ORIENTATIONS:
        raise BlockCouplingError(
            f"unknown orientation {orientation!r}; use one of {', '.join(ORIENTATIONS)}"
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
    p of `FIXED_P`: ``released_norm`` always 2; ``released_trace``, ``offdiag_ratio``,
    ``coupling_vs_null`` and ``coupling_vs_rotated`` (which do not depend on p) none (an empty
    cell).
    """
    if registry.get(variant).p == P_USER:
        return _norm_p(p)
    return FIXED_P[variant]


def _check_fixed_p(variant: str, p: float | int | str | None) -> None:
    """Refuse a p that a variant with a fixed normaliser would silently ignore (a p-free
    variant accepts any p: it does not depend on it)."""
    if p is None or registry.get(variant).p in (P_USER, P_FREE):
        if p is not None:
            _norm_p(p)
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


def rotated_chance_miscoupling(
    s1: Tensor, fro2: Tensor | float, trace: Tensor | float, trace2: Tensor | float,
    overlap: Tensor, d: int, k: int, p: float | int | str = 1
) -> Tensor:
    """Root-mean-square miscoupling of the basis rotated at random (``engine/variants.py``).

    ``m_rot = sqrt(E_R ||(R U2)^T J1 (R V2) - S||_F^2) / ||s1[:k]||_p`` for a Haar-random
    orthogonal R: s1 (..., >= k) the measured Jacobian's singular values, fro2 / trace /
    trace2 (...,) its ``||J1||_F^2``, ``tr(J1)``, ``tr(J1^2)``, overlap (..., >= k, >= k) the
    basis's ``M = U2^T V2``, d its dimension. Returns (...,) (the same in both orientations).
    """
    pf = _norm_p(p)
    if not (1 <= int(k) <= s1.shape[-1]):
        raise BlockCouplingError(
            f"k={k} must be between 1 and the number of singular values {s1.shape[-1]}"
        )
    P = Parts(overlap, s1, (int(k),), fro2=fro2, d=d, trace=trace, trace2=trace2,
              overlap=overlap)
    return (P.rotated_num / P.den(pf))[..., 0]


def isotropy_diagnostics(trace: Tensor | float, fro2: Tensor | float, U: Tensor, V: Tensor,
                         d: int, k: int) -> dict[str, float]:
    """What tells an isotropic Jacobian from coupling (the ``diagnostics`` table's columns):
    ``trace_over_d`` = tr(J)/d; ``isotropic_share`` = d (tr(J)/d)^2 / ||J||_F^2, the share of
    ||J||_F^2 in its isotropic part (tr(J)/d) I (0..1); ``uv_overlap`` = ||U_k^T V_k||_F^2 / k
    of its own top-k singular vectors (0..1: about k/d for unrelated U and V, 1 for a
    symmetric J up to signs; with a large isotropic share this is what lets
    ``coupling_vs_null`` credit isotropy). U, V (d, >= k); scalars in, floats out."""
    tr = float(trace)
    f2 = float(fro2)
    Uk, Vk = U[..., :k], V[..., :k]
    overlap = float(((Uk.mT @ Vk) ** 2).sum()) / k
    share = tr * tr / (d * f2) if f2 > 0 else math.nan
    return {"trace_over_d": tr / d, "isotropic_share": share, "uv_overlap": overlap}


# --------------------------------------------------------------------------- values
def _needs_error(variant: str, missing: Sequence[str]) -> BlockCouplingError:
    what = {"fro2": "fro2 (||J1||_F^2)", "d": "d (the hidden size)", "trace": "trace (tr(J1))",
            "trace2": "trace2 (tr(J1^2))", "overlap": "overlap (the basis's U2^T V2)"}
    return BlockCouplingError(f"variant {variant!r} needs "
                              + " and ".join(what.get(n, n) for n in missing))


def coupling_values(
    A: Tensor,
    s1: Tensor,
    k: int,
    variant: str,
    p: float | int | str | None = None,
    fro2: Tensor | float | None = None,
    d: int | None = None,
    *,
    trace: Tensor | float | None = None,
    trace2: Tensor | float | None = None,
    overlap: Tensor | None = None,
) -> Tensor:
    """One coupling variant from a coupling matrix, for one k.

    A (..., K_max, K_max) coupling matrix, s1 (..., >= k) the *measured* Jacobian's singular
    values (descending). Only the leading k x k block of A and ``s1[..., :k]`` are used (top-K
    subspaces are nested, so one K_max computation serves every k <= K_max). ``p`` applies to
    ``coupling`` and ``miscoupling`` (1, 2 or inf; default 1); the p-free variants
    (``coupling_vs_null``, ``coupling_vs_rotated``) accept any p and ignore it;
    ``released_norm`` accepts only None or 2, ``released_trace`` and ``offdiag_ratio`` only
    None. ``coupling_vs_null`` needs ``fro2`` (..., ||J1||_F^2) and ``d``;
    ``coupling_vs_rotated`` also ``trace`` (..., tr(J1)), ``trace2`` (..., tr(J1^2)) and
    ``overlap`` (..., >= k, >= k: the basis's U2^T V2). Returns (...,).
    """
    spec = registry.get(variant)
    _check_k(A, s1, k)
    _check_fixed_p(variant, p)
    P = Parts(A, s1, (int(k),), fro2=fro2, d=d, trace=trace, trace2=trace2, overlap=overlap)
    missing = P.missing(spec.needs)
    if missing:
        raise _needs_error(variant, missing)
    pf = _norm_p(p) if spec.p == P_USER else (spec.p if isinstance(spec.p, float) else 1.0)
    return spec.formula(P, pf)[..., 0]


def all_coupling_values(
    A: Tensor,
    s1: Tensor,
    ks: Iterable[int],
    variants: Iterable[str] = VARIANTS,
    ps: Iterable[float | int | str] = (1,),
    fro2: Tensor | float | None = None,
    d: int | None = None,
    *,
    trace: Tensor | float | None = None,
    trace2: Tensor | float | None = None,
    overlap: Tensor | None = None,
) -> dict[tuple[str, float | None, int], Tensor]:
    """Every requested (variant, p, k) at once, vectorised over all leading dimensions.

    A (..., K_max, K_max), s1 (..., >= K_max). Returns ``{(variant, p, k): values (...,)}``
    where ``p`` is the *reported* p (`reported_p`): each p in ``ps`` for ``coupling`` and
    ``miscoupling``; 2 for ``released_norm``; None for the others (those get one entry
    whatever ``ps`` holds). Entries come variant by variant in the order of ``variants``,
    then p, then k. Each variant is its record's formula (``engine/variants.py``); the pieces
    several share (the squared Frobenius norms of every leading k x k block, from one 2-D
    cumulative sum) are computed once, so the cost does not grow with the number of k
    values. A variant whose inputs are not given (``fro2``, ``d``, ``trace``, ``trace2``,
    ``overlap``: `blockcoupling.engine.variants.Parts`) raises, naming them (a
    request is never dropped).
    """
    variants = tuple(variants)
    specs = [registry.get(v) for v in variants]
    ks = sorted({int(k) for k in ks})
    if not ks:
        raise BlockCouplingError("ks is empty; pass at least one k")
    for k in ks:
        _check_k(A, s1, k)
    pset = tuple(dict.fromkeys(_norm_p(p) for p in ps)) or (1.0,)
    P = Parts(A, s1, ks, fro2=fro2, d=d, trace=trace, trace2=trace2, overlap=overlap)
    for spec in specs:
        missing = P.missing(spec.needs)
        if missing:
            raise _needs_error(spec.name, missing)
    out: dict[tuple[str, float | None, int], Tensor] = {}
    for spec in specs:
        rows: Sequence[tuple[float | None, float]] = (
            [(pf, pf) for pf in pset] if spec.p == P_USER else
            [(spec.p, spec.p)] if isinstance(spec.p, float) else [(None, 1.0)])
        for reported, pf in rows:
            vals = spec.formula(P, pf)  # (..., n_k)
            for j, k in enumerate(ks):
                out[(spec.name, reported, k)] = vals[..., j]
    return out


def variant_p_pairs(
    variants: Sequence[str], ps: Iterable[float | int | str] = (1,)
) -> list[tuple[str, float | None]]:
    """The (variant, reported p) combinations `all_coupling_values` produces, in order."""
    pset = tuple(dict.fromkeys(_norm_p(p) for p in ps)) or (1.0,)
    pairs: list[tuple[str, float | None]] = []
    for v in variants:
        if registry.get(v).p == P_USER:
            pairs.extend((v, pf) for pf in pset)
        else:
            pairs.append((v, reported_p(v)))
    return pairs
