"""A coupling variant is one record (engine/variants.py): every list the package keeps is built
from it, and a half-declared variant fails here. The rotated-basis null of
``coupling_vs_rotated`` against a seeded Monte Carlo over Haar rotations
(``scipy.stats.ortho_group``), and the synthetic cases it must get right: J = c I + G scores
about 0 for every c, a planted shared subspace scores the planted coupling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import ortho_group

from blockcoupling.engine import names, variants
from blockcoupling.engine.metrics import (
    all_coupling_values,
    coupling_matrix,
    coupling_values,
    reported_p,
    rotated_chance_miscoupling,
    variant_p_pairs,
)
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.engine.variants import REGISTRY, Variant
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries.common import HIGHER_IS_COUPLED
from blockcoupling.store import schema

F64 = torch.float64
DOCS = Path(__file__).resolve().parents[2] / "docs"


# ---------------------------------------------------------------- one record, every list
def test_every_list_is_built_from_the_records() -> None:
    assert names.VARIANTS == tuple(REGISTRY)
    assert set(HIGHER_IS_COUPLED) == set(REGISTRY)
    assert set(schema.VARIANTS) == set(REGISTRY)
    assert set(names.P_VARIANTS) | set(names.FIXED_P) == set(REGISTRY)
    assert not set(names.P_VARIANTS) & set(names.FIXED_P)
    for name, v in REGISTRY.items():
        assert v.name == name
        assert HIGHER_IS_COUPLED[name] is v.higher_is_coupled
        assert schema.VARIANTS[name].startswith(v.direction)
        assert (name in names.NULL_VARIANTS) == (v.null is not None)
        StatisticRule(variant=name)  # the headline rule knows it


def test_every_variant_is_documented_in_the_conventions() -> None:
    text = (DOCS / "conventions.md").read_text(encoding="utf-8")
    for name in REGISTRY:
        assert f"`{name}`" in text, f"docs/conventions.md does not define {name}"


def _inputs(J1: torch.Tensor, U2: torch.Tensor, V2: torch.Tensor) -> dict:
    return {"fro2": (J1 ** 2).sum(), "d": J1.shape[-1], "trace": torch.trace(J1),
            "trace2": torch.trace(J1 @ J1), "overlap": U2.mT @ V2}


def test_no_requested_variant_is_dropped() -> None:
    """all_coupling_values answers every (variant, p, k) it is asked for, or raises."""
    g = torch.Generator().manual_seed(0)
    J1, J2 = torch.randn(2, 9, 9, generator=g, dtype=F64)
    U, _, Vh = torch.linalg.svd(J2)
    U2, V2 = U[:, :5], Vh[:5].mT
    s1 = torch.linalg.svdvals(J1)
    A = coupling_matrix(J1, U2, V2)
    got = all_coupling_values(A, s1, (1, 3, 5), names.VARIANTS, ps=(1, 2, "inf"),
                              **_inputs(J1, U2, V2))
    want = {(v, p, k) for v, p in variant_p_pairs(names.VARIANTS, (1, 2, math.inf))
            for k in (1, 3, 5)}
    assert set(got) == want
    for v in names.VARIANTS:  # the single-K function gives the same numbers
        single = coupling_values(A, s1, 3, v, reported_p(v), **_inputs(J1, U2, V2))
        assert float(single) == pytest.approx(float(got[(v, reported_p(v), 3)]), rel=1e-12)
    with pytest.raises(BlockCouplingError, match="coupling_vs_rotated.*needs.*trace"):
        all_coupling_values(A, s1, (2,), ("coupling_vs_rotated",), fro2=1.0, d=9)


def test_a_half_declared_variant_is_refused() -> None:
    def f(parts: variants.Parts, p: float) -> torch.Tensor:
        return parts.signed_num

    Variant("ok_variant", f, True, None, "a test variant")
    for kwargs, what in (({"formula": None}, "a formula"),
                         ({"higher_is_coupled": None}, "a direction"),
                         ({"p": "sometimes"}, "a p rule"),
                         ({"meaning": " "}, "a schema meaning"),
                         ({"needs": ("trace3",)}, "inputs among")):
        args = {"name": "half", "formula": f, "higher_is_coupled": True, "p": None,
                "meaning": "m", **kwargs}
        with pytest.raises(BlockCouplingError, match=what):
            Variant(**args)


def test_a_later_variant_leaves_config_identities_alone() -> None:
    """Only the variants of the first hash version enter config_hash (Variant.hashed)."""
    from blockcoupling.engine.config import MeasureConfig

    assert "coupling_vs_rotated" in MeasureConfig().variants  # measured by default
    assert not REGISTRY["coupling_vs_rotated"].hashed
    old = [v for v in names.VARIANTS if REGISTRY[v].hashed]
    assert MeasureConfig(variants=tuple(old)).config_hash() == MeasureConfig().config_hash()


# ---------------------------------------------------------------- the rotated-basis null
def _numpy_case(seed: int, d: int, k: int, iso: float, sym: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """J1 with an isotropic part ``iso`` I, a basis from a J2 whose U and V are related
    (``sym`` mixes in its transpose)."""
    rng = np.random.default_rng(seed)
    J1 = iso * np.eye(d) + rng.normal(size=(d, d)) / np.sqrt(d) \
        + 0.5 * np.outer(rng.normal(size=d), rng.normal(size=d)) / d
    G = rng.normal(size=(d, d))
    J2 = iso * np.eye(d) + (G + sym * G.T) / np.sqrt(d)
    U, _, Vt = np.linalg.svd(J2)
    s1 = np.linalg.svd(J1, compute_uv=False)
    return J1, U[:, :k], Vt[:k].T, s1[:k]


@pytest.mark.parametrize("orientation", ["ujv", "vju"])
@pytest.mark.parametrize("case", [(0, 12, 4, -1.0, 0.7), (1, 10, 3, 0.5, 0.0),
                                  (2, 8, 8, 2.0, 1.0)])
def test_rotated_null_equals_a_monte_carlo_over_haar_rotations(case: tuple, orientation: str
                                                               ) -> None:
    seed, d, k, iso, sym = case
    J1, U2, V2, s = _numpy_case(seed, d, k, iso, sym)
    S = np.diag(s)
    n = 40_000
    R = ortho_group.rvs(d, size=n, random_state=seed)  # (n, d, d), Haar on O(d)
    RU, RV = R @ U2, R @ V2  # (n, d, k)
    left, right = (RU, RV) if orientation == "ujv" else (RV, RU)
    A = left.transpose(0, 2, 1) @ J1 @ right  # (n, k, k)
    sq = ((A - S) ** 2).sum(axis=(1, 2))  # (n,)
    mc, mc_se = sq.mean(), sq.std(ddof=1) / math.sqrt(n)
    t = torch.from_numpy
    m_rot = rotated_chance_miscoupling(t(s), float((J1 ** 2).sum()), float(np.trace(J1)),
                                       float(np.trace(J1 @ J1)), t(U2.T @ V2), d, k, p=1)
    expect_sq = (float(m_rot) * s.sum()) ** 2
    assert abs(expect_sq - mc) < 4 * mc_se, (expect_sq, mc, mc_se)
    # the root-mean-square against the mean of the root (Jensen): a small gap
    assert np.sqrt(sq).mean() <= math.sqrt(mc) * 1.0001


def _torch_value(J1: torch.Tensor, J2: torch.Tensor, k: int, variant: str) -> float:
    U, _, Vh = torch.linalg.svd(J2)
    U2, V2 = U[:, :k], Vh[:k].mT
    s1 = torch.linalg.svdvals(J1)
    A = coupling_matrix(J1, U2, V2)
    return float(coupling_values(A, s1, k, variant, **_inputs(J1, U2, V2)))


@pytest.mark.parametrize("c", [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
def test_isotropy_plus_noise_scores_zero_against_the_rotated_null(c: float) -> None:
    """J = c I + G against the basis of an independent J' = c I + G': 0 for every c on
    coupling_vs_rotated, while coupling_vs_null credits the shared c I."""
    d, k = 256, 10
    g = torch.Generator().manual_seed(int(10 * c) + 100)
    vals, nulls = [], []
    for _ in range(4):
        G1, G2 = torch.randn(2, d, d, generator=g, dtype=F64) / math.sqrt(d)
        J1, J2 = c * torch.eye(d, dtype=F64) + G1, c * torch.eye(d, dtype=F64) + G2
        vals.append(_torch_value(J1, J2, k, "coupling_vs_rotated"))
        nulls.append(_torch_value(J1, J2, k, "coupling_vs_null"))
    assert abs(np.mean(vals)) < 0.02, vals
    if abs(c) >= 1:
        assert np.mean(nulls) > 0.25, nulls  # the isotropic part passes for coupling there


def test_a_planted_shared_subspace_gives_the_planted_coupling() -> None:
    """J1 = Q D P^T (+ an orthogonal remainder) with the basis's top-K vectors Q, P: the
    coupling matrix is D, so m = ||D - diag(svd(D))|| / sum(svd(D)) is planted; the value is
    1 - m / m_rot with m_rot from a Monte Carlo over Haar rotations (not from the package)."""
    d, k = 24, 4
    rng = np.random.default_rng(7)
    W = np.linalg.qr(rng.normal(size=(d, d)))[0]
    Z = np.linalg.qr(rng.normal(size=(d, d)))[0]
    Q, P = W[:, :k], Z[:, :k]
    s2 = np.array([5.0, 4.0, 3.0, 2.0] + [0.1] * (d - k))
    J2 = W @ np.diag(s2) @ Z.T  # the basis: top-K vectors Q, P
    for theta in (0.0, 0.3, 0.8):  # how far J1's top vectors are turned inside the subspace
        rot = np.eye(k)
        rot[:2, :2] = [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]]
        D = rot @ np.diag([3.0, 2.5, 2.0, 1.5])  # the planted K x K block
        E = W[:, k:] @ np.diag(rng.uniform(0.05, 0.2, d - k)) @ Z[:, k:].T
        J1 = Q @ D @ P.T + E
        s = np.linalg.svd(D, compute_uv=False)
        m = np.linalg.norm(D - np.diag(s)) / s.sum()
        R = ortho_group.rvs(d, size=8_000, random_state=3)
        A = (R @ Q).transpose(0, 2, 1) @ J1 @ (R @ P)
        m_rot = math.sqrt(((A - np.diag(s)) ** 2).sum(axis=(1, 2)).mean()) / s.sum()
        got = _torch_value(torch.from_numpy(J1), torch.from_numpy(J2), k,
                           "coupling_vs_rotated")
        assert got == pytest.approx(1 - m / m_rot, abs=0.01), theta
        if theta == 0.0:
            assert got == pytest.approx(1.0, abs=1e-12)  # perfectly coupled


def test_exact_isotropy_is_zero_over_zero() -> None:
    """J1 = tau I with a basis whose M = sign(tau) I: nothing but isotropy, m = m_rot = 0."""
    d, k = 6, 3
    J = -torch.eye(d, dtype=F64)
    U = torch.eye(d, dtype=F64)[:, :k]
    A = coupling_matrix(J, U, -U)
    v = coupling_values(A, torch.ones(d, dtype=F64), k, "coupling_vs_rotated",
                        **_inputs(J, U, -U))
    assert math.isnan(float(v))


def test_the_docs_state_the_formula() -> None:
    text = " ".join((DOCS / "conventions.md").read_text(encoding="utf-8").split())
    for piece in ("a (d^2 - 1) + b (d - 1)", "a (d - 1) + b (d^2 - 1)", "tau M",
                  "tau = tr(J1)/d", "coupling_vs_rotated = 1 - m / m_rot",
                  "`isotropic_share` = `d (tr(J)/d)^2 / ||J||_F^2`"):
        assert piece in text, piece
