"""Coupling variants, each declared once: one `Variant` record per variant.

A record holds everything the package knows about a variant: its ``name`` (the ``variant``
column), its ``formula`` (a function of `Parts`), its direction (``higher_is_coupled``), its
``p`` rule, its schema entry (``meaning``, ``unit``), the null it is 0 at (``null``) and
whether it enters a config's identity hash (``hashed``). The name lists (``engine/names.py``),
``engine/metrics.py``, the report's directions and every table's schema are built from
`REGISTRY`; ``tests/engine/test_variants.py`` fails when a variant is declared in part. To add
one: docs/DESIGN.md, "Recipe: add a coupling variant" (``hashed=False``; a new input is one
more field of `Parts`, filled in ``engine/tables.py``).

Notation (``DEFINITIONS.md``): J1 (d x d) the measured Jacobian with top-K singular values
``s``, J2 the basis Jacobian with top-K singular vectors U2, V2; ``A = U2^T J1 V2`` (``ujv``)
or ``V2^T J1 U2`` (``vju``); ``S = diag(s_1..s_K)``; ``m = ||A_K - S||_F / ||s_K||_p``.

The two nulls (not in the paper; derived in docs/conventions.md, "The chance level" and "The
rotated-basis null"), both root-mean-square values and p-free (stored with ``p`` empty):

- independent Haar-random bases: ``m_null = sqrt((K/d)^2 ||J1||_F^2 + ||s_K||_2^2) /
  ||s_K||_p``, ``coupling_vs_null = 1 - m / m_null``;
- the same basis rotated at random (U2 -> R U2, V2 -> R V2, which keeps ``M = U2_K^T V2_K``;
  ``vju``: M^T): with ``tau = tr(J1)/d``, ``F = ||J1||_F^2 - d tau^2``,
  ``T = tr(J1^2) - d tau^2``, ``a = ((d + 1) F - T) / ((d - 1) d (d + 2))``,
  ``b = ((d + 1) T - F) / ((d - 1) d (d + 2))``, ``c = -(a + b) / d``:

      E||A' - S||_F^2 = ||s_K||_2^2 - 2 tau sum_i s_i M_ii + tau^2 ||M_K||_F^2
                        + a K^2 + (b + c) ||M_K||_F^2,

  ``m_rot = sqrt(E||A' - S||_F^2) / ||s_K||_p``, ``coupling_vs_rotated = 1 - m / m_rot``
  (the same in both orientations; an isotropic part of J1 scores 0 here).

Where m and its null are both 0 the value is 0/0 = NaN: nothing is hidden. Inputs per
measured J1: ``s``, ``||J1||_F^2``, ``tr(J1)``, ``tr(J1^2)``; per basis ``M``; exact on the
dense path, Hutchinson estimates from the randomized SVD's sketch on the matrix-free path.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from blockcoupling.errors import BlockCouplingError

#: p rules: ``"user"`` = one row per p the user chose (1, 2, inf); ``"free"`` = the value does
#: not depend on p (stored once, p empty; any p is accepted and has no effect); a float = the
#: variant always uses that p (a different one is refused); None = no p (a p is refused)
PRule = str | float | None
P_USER = "user"
P_FREE = "free"


def _leading_block_sums(E: Tensor, ks: Sequence[int]) -> Tensor:
    """Sums of E (..., K, K) over its leading k x k blocks for each k of ``ks`` -> (..., len(ks)).

    A few k (the usual 10, 30, 50): each block summed on its own (sum k^2 elements; strided
    reductions, 6x faster than the cumulative sums at P = 2048 pairs of K = 50); many k: one
    2-D cumulative sum serves them all (K^2 elements, whatever their number)."""
    if sum(k * k for k in ks) <= 2 * E.shape[-1] ** 2:
        return torch.stack([E[..., :k, :k].sum((-2, -1)) for k in ks], dim=-1)
    C = torch.diagonal(E.cumsum(-1).cumsum(-2), dim1=-2, dim2=-1)  # (..., K): entry k-1
    return C.index_select(-1, torch.tensor([k - 1 for k in ks], device=E.device))


class Parts:
    """What the formulas read, for coupling matrices A (..., K_max, K_max) and the requested
    K values ``ks`` (sorted): the inputs and the pieces several variants share, each computed
    once, on first use, for every K at once (``(..., n_k)``, entry j for ``ks[j]``).

    Inputs beyond A and s (None where not given): ``fro2`` (...,) ``||J1||_F^2``; ``d`` the
    hidden size; ``trace`` (...,) ``tr(J1)``; ``trace2`` (...,) ``tr(J1^2)``; ``overlap``
    (..., K_max, K_max) the basis's ``M = U2^T V2``."""

    #: the inputs a variant may name in ``Variant.needs``
    INPUTS: tuple[str, ...] = ("fro2", "d", "trace", "trace2", "overlap")

    def __init__(self, A: Tensor, s1: Tensor, ks: Sequence[int], *,
                 fro2: Tensor | float | None = None, d: int | None = None,
                 trace: Tensor | float | None = None, trace2: Tensor | float | None = None,
                 overlap: Tensor | None = None) -> None:
        self.ks = tuple(int(k) for k in ks)
        kmax = self.ks[-1]
        self.Ak = A[..., :kmax, :kmax]  # (..., Kx, Kx)
        self.sk = s1[..., :kmax]  # (..., Kx)
        self.diag_s = torch.diag_embed(self.sk)  # (..., Kx, Kx)
        self.idx = torch.tensor([k - 1 for k in self.ks], device=A.device)
        self.fro2 = self._scalar(fro2)
        self.d = d
        self.trace = self._scalar(trace)
        self.trace2 = self._scalar(trace2)
        self.overlap = None if overlap is None else overlap[..., :kmax, :kmax].to(A.dtype)
        self._dens: dict[float, Tensor] = {}

    def _scalar(self, x: Tensor | float | None) -> Tensor | None:
        if x is None:
            return None
        return torch.as_tensor(x, dtype=self.Ak.dtype, device=self.Ak.device)

    def pick(self, x: Tensor) -> Tensor:
        """(..., Kx) -> (..., n_k): the entries of the requested K."""
        return x.index_select(-1, self.idx)

    def missing(self, needs: Sequence[str]) -> list[str]:
        return [n for n in needs if getattr(self, n) is None]

    @functools.cached_property
    def kk(self) -> Tensor:
        """(n_k,) the K values as numbers."""
        return torch.tensor(self.ks, dtype=self.Ak.dtype, device=self.Ak.device)

    # -- shared pieces ---------------------------------------------------------------------
    @functools.cached_property
    def signed_num(self) -> Tensor:
        """``||A_K - S_K||_F`` (..., n_k)."""
        return _leading_block_sums((self.Ak - self.diag_s) ** 2, self.ks).sqrt()

    @functools.cached_property
    def abs_num(self) -> Tensor:
        """``|| |A_K| - S_K ||_F`` (..., n_k) (the released code's element-wise |A|)."""
        return _leading_block_sums((self.Ak.abs() - self.diag_s) ** 2, self.ks).sqrt()

    @functools.cached_property
    def s2(self) -> Tensor:
        """``||s_K||_2^2`` (..., n_k)."""
        return self.pick((self.sk * self.sk).cumsum(-1))

    def den(self, p: float) -> Tensor:
        """``||s_K||_p`` (..., n_k) for p in {1, 2, inf}."""
        if p not in self._dens:
            self._dens[p] = (self.pick(self.sk.abs().cumsum(-1)) if p == 1.0 else
                             self.s2.sqrt() if p == 2.0 else
                             self.pick(self.sk.abs().cummax(-1).values))
        return self._dens[p]

    @functools.cached_property
    def null_num(self) -> Tensor:
        """``sqrt((K/d)^2 ||J1||_F^2 + ||s_K||_2^2)`` (..., n_k): the independent null."""
        assert self.fro2 is not None and self.d is not None
        return torch.sqrt((self.kk / self.d) ** 2 * self.fro2.unsqueeze(-1) + self.s2)

    @functools.cached_property
    def rotated_num(self) -> Tensor:
        """``sqrt(E_R ||A' - S_K||_F^2)`` (..., n_k): the rotated-basis null (module
        docstring). Combined in float64 whatever the inputs' dtype (near isotropy its terms
        nearly cancel; they are K-sized, so this costs nothing), clamped at 0 against
        rounding, returned in the inputs' dtype."""
        assert (self.fro2 is not None and self.d is not None and self.trace is not None
                and self.trace2 is not None and self.overlap is not None)
        f64 = torch.float64
        d = float(self.d)
        tau = (self.trace.to(f64) / d).unsqueeze(-1)  # (..., 1)
        F = (self.fro2.to(f64) - d * tau[..., 0] ** 2).unsqueeze(-1)  # ||J0||_F^2
        T = (self.trace2.to(f64) - d * tau[..., 0] ** 2).unsqueeze(-1)  # tr(J0^2)
        den = (d - 1.0) * d * (d + 2.0) if d > 1 else math.inf
        a = ((d + 1.0) * F - T) / den
        b = ((d + 1.0) * T - F) / den
        c = -(a + b) / d
        M, sk = self.overlap.to(f64), self.sk.to(f64)
        cross = self.pick((sk * torch.diagonal(M, dim1=-2, dim2=-1)).cumsum(-1))
        m2 = _leading_block_sums(M * M, self.ks)  # ||M_K||_F^2
        s2 = self.pick((sk * sk).cumsum(-1))
        kk = self.kk.to(f64)
        e2 = s2 - 2.0 * tau * cross + tau ** 2 * m2 + a * kk ** 2 + (b + c) * m2
        return e2.clamp_min(0.0).sqrt().to(self.Ak.dtype)


# ---------------------------------------------------------------------------- formulas
def _miscoupling(P: Parts, p: float) -> Tensor:
    return P.signed_num / P.den(p)


def _coupling(P: Parts, p: float) -> Tensor:
    return 1.0 - P.signed_num / P.den(p)


def _released_norm(P: Parts, p: float) -> Tensor:
    return P.abs_num / P.den(2.0)


def _released_trace(P: Parts, p: float) -> Tensor:
    return P.abs_num / P.pick(P.sk.cumsum(-1))


def _offdiag_ratio(P: Parts, p: float) -> Tensor:
    total = _leading_block_sums(P.Ak * P.Ak, P.ks)
    off = P.Ak - torch.diag_embed(torch.diagonal(P.Ak, dim1=-2, dim2=-1))
    off_sq = _leading_block_sums(off * off, P.ks)  # no cancellation
    return off_sq.sqrt() / total.sqrt()


def _coupling_vs_null(P: Parts, p: float) -> Tensor:
    den = P.den(1.0)  # p cancels in m / m_null: computed with p = 1
    return 1.0 - (P.signed_num / den) / (P.null_num / den)


def _coupling_vs_rotated(P: Parts, p: float) -> Tensor:
    return 1.0 - P.signed_num / P.rotated_num  # p cancels: no denominator at all


# ---------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class Variant:
    """One coupling variant (module docstring)."""

    name: str
    formula: Callable[[Parts, float], Tensor]  # (parts, p) -> (..., n_k)
    higher_is_coupled: bool  # the direction: True = higher is more coupled
    p: PRule  # P_USER, P_FREE, a fixed float, or None (see PRule)
    meaning: str  # the schema entry: what the value is, its range (the direction is added)
    unit: str = "dimensionless"
    needs: tuple[str, ...] = ()  # Parts inputs beyond A and s
    null: str | None = None  # the null it is 0 at (None: a raw value, no null)
    hashed: bool = False  # enters MeasureConfig.config_hash (only the variants of v1 do)

    def __post_init__(self) -> None:
        problems = []
        if not self.name or not self.name.isidentifier():
            problems.append("a name that is a Python identifier")
        if not callable(self.formula):
            problems.append("a formula")
        if not isinstance(self.higher_is_coupled, bool):
            problems.append("a direction (higher_is_coupled True or False)")
        if not (self.p in (P_USER, P_FREE, None) or isinstance(self.p, float)):
            problems.append(f"a p rule ({P_USER!r}, {P_FREE!r}, a float or None)")
        if not self.meaning.strip():
            problems.append("a schema meaning")
        bad = [n for n in self.needs if n not in Parts.INPUTS]
        if bad:
            problems.append(f"inputs among {', '.join(Parts.INPUTS)} (not {bad})")
        if problems:
            raise BlockCouplingError(f"coupling variant {self.name!r} needs "
                                     + "; ".join(problems))

    @property
    def direction(self) -> str:
        return "higher = more coupled" if self.higher_is_coupled else "lower = more coupled"

    @property
    def schema_entry(self) -> str:
        """The variant's line in every table's schema (``store/schema.py``)."""
        return f"{self.direction}; {self.meaning}"


_NULL_NEEDS = ("fro2", "d")
_ROTATED_NEEDS = ("fro2", "d", "trace", "trace2", "overlap")

#: every coupling variant, in table order (docs/conventions.md, "Coupling")
REGISTRY: dict[str, Variant] = {v.name: v for v in (
    Variant("coupling", _coupling, True, P_USER,
            "1 - miscoupling, 1 for J1 = J2", hashed=True),
    Variant("miscoupling", _miscoupling, False, P_USER,
            "||A - S1K||_F / ||s1K||_p, 0 for J1 = J2", hashed=True),
    Variant("released_norm", _released_norm, False, 2.0,
            "|| |A| - S1K ||_F / ||s1K||_2 (released code)", hashed=True),
    Variant("released_trace", _released_trace, False, None,
            "|| |A| - S1K ||_F / trace(S1K) (released code)", hashed=True),
    Variant("offdiag_ratio", _offdiag_ratio, False, None,
            "||A - Diag(A)||_F / ||A||_F", hashed=True),
    Variant("coupling_vs_null", _coupling_vs_null, True, P_FREE,
            "(c - c_null) / (1 - c_null) = 1 - m / m_null: 0 = chance for independent "
            "Haar-random bases U, V, 1 = J1 = J2; p is null (independent of p)",
            needs=_NULL_NEEDS, null="independent Haar-random bases", hashed=True),
    Variant("coupling_vs_rotated", _coupling_vs_rotated, True, P_FREE,
            "1 - m / m_rot: 0 = chance for the same basis under a Haar-random rotation "
            "(U2 -> R U2, V2 -> R V2; keeps U2^T V2, so an isotropic part of J1 scores 0), "
            "1 = J1 = J2; p is null (independent of p)",
            needs=_ROTATED_NEEDS, null="the same basis, rotated at random"),
)}


def get(name: str) -> Variant:
    """The record of ``name``; a clear error for an unknown one."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise BlockCouplingError(
            f"unknown coupling variant {name!r}; use one of {', '.join(REGISTRY)}") from None


__all__ = ["P_FREE", "P_USER", "PRule", "Parts", "REGISTRY", "Variant", "get"]
