"""Tests for blockcoupling.engine.metrics: coupling matrices, variants, the chance level."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockcoupling.engine.metrics import (
    VARIANTS,
    all_coupling_values,
    chance_coupling,
    chance_miscoupling,
    coupling_matrix,
    coupling_matrix_from_products,
    coupling_values,
    reported_p,
    variant_p_pairs,
)
from blockcoupling.errors import BlockCouplingError

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
F64 = torch.float64


def _rand(seed: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64)


def _svd(J: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    U, S, Vh = torch.linalg.svd(J)
    return U, S, Vh.mT


def _inputs(J1: torch.Tensor, U2: torch.Tensor, V2: torch.Tensor) -> dict:
    """What the chance-corrected variants need besides A and s1."""
    return {"fro2": (J1**2).sum(), "d": J1.shape[-1], "trace": torch.trace(J1),
            "trace2": torch.trace(J1 @ J1), "overlap": U2.mT @ V2}


def _haar(g: torch.Generator, d: int, k: int) -> torch.Tensor:
    """Haar-distributed d x k orthonormal frame: QR of a Gaussian with the sign of R fixed."""
    Z = torch.randn(d, k, generator=g, dtype=F64)
    Q, R = torch.linalg.qr(Z)
    return Q * torch.sign(torch.diagonal(R))


# ---------------------------------------------------------------- straightforward reference
def _ref_value(
    J1: np.ndarray,
    U2: np.ndarray,
    V2: np.ndarray,
    s1: np.ndarray,
    k: int,
    variant: str,
    p: float | None,
    orientation: str,
) -> float:
    """Loop-based float64 reference, written from DEFINITIONS.md independently of the package."""
    left, right = (U2, V2) if orientation == "ujv" else (V2, U2)
    d = J1.shape[0]
    A = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            A[i, j] = sum(left[a, i] * J1[a, b] * right[b, j] for a in range(d) for b in range(d))
    sk = [float(s1[i]) for i in range(k)]
    signed = math.sqrt(
        sum((A[i, j] - (sk[i] if i == j else 0.0)) ** 2 for i in range(k) for j in range(k))
    )
    absd = math.sqrt(
        sum((abs(A[i, j]) - (sk[i] if i == j else 0.0)) ** 2 for i in range(k) for j in range(k))
    )
    if p == 1:
        den = sum(abs(x) for x in sk)
    elif p == 2:
        den = math.sqrt(sum(x * x for x in sk))
    else:
        den = max(abs(x) for x in sk)
    if variant == "miscoupling":
        return signed / den
    if variant == "coupling":
        return 1 - signed / den
    if variant == "released_norm":
        return absd / math.sqrt(sum(x * x for x in sk))
    if variant == "released_trace":
        return absd / sum(sk)
    if variant == "offdiag_ratio":
        off = math.sqrt(sum(A[i, j] ** 2 for i in range(k) for j in range(k) if i != j))
        return off / math.sqrt(sum(A[i, j] ** 2 for i in range(k) for j in range(k)))
    if variant == "coupling_vs_null":
        fro2 = float((J1**2).sum())
        m_null = math.sqrt((k / d) ** 2 * fro2 + sum(x * x for x in sk)) / den
        c, c_null = 1 - signed / den, 1 - m_null
        return (c - c_null) / (1 - c_null)
    if variant == "coupling_vs_rotated":
        # E_R ||(R U)^T J1 (R V) - S||^2 from the moments of R^T J0 R (docs/conventions.md),
        # a and b solved numerically from their two equations
        tau = float(np.trace(J1)) / d
        J0 = J1 - tau * np.eye(d)
        F, T = float((J0 ** 2).sum()), float(np.trace(J0 @ J0))
        a, b = np.linalg.solve([[d * d - 1, d - 1], [d - 1, d * d - 1]], [F, T])
        c = -(a + b) / d
        M = U2[:, :k].T @ V2[:, :k]
        e2 = (sum(x * x for x in sk) - 2 * tau * sum(sk[i] * M[i, i] for i in range(k))
              + tau ** 2 * (M ** 2).sum() + a * k * k + (b + c) * (M ** 2).sum())
        return 1 - signed / math.sqrt(e2)
    raise AssertionError(variant)


@SETTINGS
@given(
    seed=st.integers(0, 10_000), d=st.integers(4, 9), orientation=st.sampled_from(["ujv", "vju"]),
    few=st.booleans(),
)
def test_agrees_with_loop_reference(seed: int, d: int, orientation: str, few: bool) -> None:
    """Every k (the leading blocks' sums from one cumulative sum) or a few (each block summed
    on its own: variants._leading_block_sums takes the other branch)."""
    J1 = _rand(seed, d, d)
    J2 = _rand(seed + 1, d, d)
    _, s1, _ = _svd(J1)
    U2, _, V2 = _svd(J2)
    kmax = d - 1
    ks = sorted({1, kmax // 2 or 1, kmax}) if few else list(range(1, kmax + 1))
    A = coupling_matrix(J1, U2[:, :kmax], V2[:, :kmax], orientation)
    inputs = _inputs(J1, U2[:, :kmax], V2[:, :kmax])
    got = all_coupling_values(
        A, s1, ks=ks, variants=VARIANTS, ps=(1, 2, "inf"), **inputs
    )
    for (variant, p, k), value in got.items():
        ref = _ref_value(J1.numpy(), U2.numpy(), V2.numpy(), s1.numpy(), k, variant, p, orientation)
        assert float(value) == pytest.approx(ref, rel=1e-10, abs=1e-12), (variant, p, k)
        single = coupling_values(A, s1, k, variant, p, **inputs)
        assert float(single) == pytest.approx(ref, rel=1e-10, abs=1e-12), (variant, p, k)
    # every (variant, reported p, k) was produced exactly once
    expected = {
        (v, p, k)
        for v, p in variant_p_pairs(VARIANTS, (1, 2, math.inf))
        for k in ks
    }
    assert set(got) == expected


@SETTINGS
@given(seed=st.integers(0, 10_000), d=st.integers(3, 10))
def test_self_coupling_is_exact(seed: int, d: int) -> None:
    J = _rand(seed, d, d)
    U, S, V = _svd(J)
    A = coupling_matrix(J, U, V, "ujv")
    inputs = _inputs(J, U, V)
    for k in range(1, d + 1):
        for p in (1, 2, math.inf):
            assert float(coupling_values(A, S, k, "miscoupling", p)) == pytest.approx(0, abs=1e-12)
            assert float(coupling_values(A, S, k, "coupling", p)) == pytest.approx(1, abs=1e-12)
            for v in ("coupling_vs_null", "coupling_vs_rotated"):
                assert float(coupling_values(A, S, k, v, p, **inputs)) == pytest.approx(
                    1, abs=1e-12)
        assert float(coupling_values(A, S, k, "released_norm")) == pytest.approx(0, abs=1e-12)
        assert float(coupling_values(A, S, k, "released_trace")) == pytest.approx(0, abs=1e-12)
        assert float(coupling_values(A, S, k, "offdiag_ratio")) == pytest.approx(0, abs=1e-12)


def test_vju_self_coupling_for_symmetric_psd_and_not_in_general() -> None:
    # For symmetric PSD J, U = V so vju coincides with ujv and c = 1; in general vju differs.
    B = _rand(3, 8, 8)
    J = B @ B.mT
    U, S, V = _svd(J)
    assert float(
        coupling_values(coupling_matrix(J, U, V, "vju"), S, 5, "miscoupling")
    ) == pytest.approx(0, abs=1e-10)
    J = _rand(4, 8, 8)
    U, S, V = _svd(J)
    A_vju = coupling_matrix(J, U, V, "vju")
    torch.testing.assert_close(A_vju, V.mT @ J @ U)
    assert float(coupling_values(A_vju, S, 5, "miscoupling")) > 0.1


@SETTINGS
@given(
    seed=st.integers(0, 10_000), d=st.integers(3, 9), orientation=st.sampled_from(["ujv", "vju"])
)
def test_invariant_under_common_orthogonal_change_of_basis(
    seed: int, d: int, orientation: str
) -> None:
    J1, J2 = _rand(seed, d, d), _rand(seed + 7, d, d)
    Q, _ = torch.linalg.qr(_rand(seed + 13, d, d))
    _, s1, _ = _svd(J1)
    U2, _, V2 = _svd(J2)
    k = max(1, d - 2)
    A = coupling_matrix(J1, U2[:, :k], V2[:, :k], orientation)
    A_rot = coupling_matrix(Q @ J1 @ Q.mT, Q @ U2[:, :k], Q @ V2[:, :k], orientation)
    torch.testing.assert_close(A_rot, A, rtol=1e-10, atol=1e-10)
    inputs = _inputs(J1, U2[:, :k], V2[:, :k])
    rotated = _inputs(Q @ J1 @ Q.mT, Q @ U2[:, :k], Q @ V2[:, :k])
    for v in VARIANTS:
        a = coupling_values(A, s1, k, v, **inputs)
        b = coupling_values(A_rot, s1, k, v, **rotated)
        assert float(a) == pytest.approx(float(b), rel=1e-9, abs=1e-12)


def _e(d: int, *idx: int, signs: tuple[float, ...] | None = None) -> torch.Tensor:
    M = torch.zeros(d, len(idx), dtype=F64)
    for c, i in enumerate(idx):
        M[i, c] = 1.0 if signs is None else signs[c]
    return M


def test_closed_form_diagonal_with_permuted_and_flipped_bases() -> None:
    s = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=F64)
    J1 = torch.diag(s)
    s1 = s
    # swapped basis: A = diag(3, 4); ||A - S||_F = sqrt(2), ||s_2||_1 = 7
    A = coupling_matrix(J1, _e(4, 1, 0), _e(4, 1, 0))
    torch.testing.assert_close(A, torch.diag(torch.tensor([3.0, 4.0], dtype=F64)))
    assert float(coupling_values(A, s1, 2, "miscoupling")) == pytest.approx(math.sqrt(2) / 7)
    assert float(coupling_values(A, s1, 2, "miscoupling", 2)) == pytest.approx(math.sqrt(2) / 5)
    assert float(coupling_values(A, s1, 2, "miscoupling", math.inf)) == pytest.approx(
        math.sqrt(2) / 4
    )
    assert float(coupling_values(A, s1, 2, "offdiag_ratio")) == 0.0
    # k = 1 uses only the leading entry: |3 - 4| / 4
    assert float(coupling_values(A, s1, 1, "miscoupling")) == pytest.approx(0.25)
    # sign flip on v_1: A = diag(-4, 3): miscoupling 8/7, released variants forgive it
    A = coupling_matrix(J1, _e(4, 0, 1), _e(4, 0, 1, signs=(-1.0, 1.0)))
    assert float(coupling_values(A, s1, 2, "miscoupling")) == pytest.approx(8 / 7)
    assert float(coupling_values(A, s1, 2, "coupling")) == pytest.approx(-1 / 7)
    assert float(coupling_values(A, s1, 2, "released_norm")) == pytest.approx(0.0, abs=1e-15)
    assert float(coupling_values(A, s1, 2, "released_trace")) == pytest.approx(0.0, abs=1e-15)
    # U permuted, V not: A = [[0, 3], [4, 0]]
    A = coupling_matrix(J1, _e(4, 1, 0), _e(4, 0, 1))
    torch.testing.assert_close(A, torch.tensor([[0.0, 3.0], [4.0, 0.0]], dtype=F64))
    assert float(coupling_values(A, s1, 2, "offdiag_ratio")) == pytest.approx(1.0)
    assert float(coupling_values(A, s1, 2, "miscoupling")) == pytest.approx(math.sqrt(50) / 7)
    assert float(coupling_values(A, s1, 2, "released_trace")) == pytest.approx(math.sqrt(50) / 7)
    assert float(coupling_values(A, s1, 2, "released_norm")) == pytest.approx(math.sqrt(50) / 5)
    # vju on this pair swaps the roles: V^T J U = [[0, 4], [3, 0]]
    torch.testing.assert_close(
        coupling_matrix(J1, _e(4, 1, 0), _e(4, 0, 1), "vju"),
        torch.tensor([[0.0, 4.0], [3.0, 0.0]], dtype=F64),
    )


@SETTINGS
@given(seed=st.integers(0, 10_000), orientation=st.sampled_from(["ujv", "vju"]))
def test_nested_k_matches_direct_computation(seed: int, orientation: str) -> None:
    d, kmax = 10, 7
    J1, J2 = _rand(seed, d, d), _rand(seed + 1, d, d)
    _, s1, _ = _svd(J1)
    U2, _, V2 = _svd(J2)
    A_max = coupling_matrix(J1, U2[:, :kmax], V2[:, :kmax], orientation)
    inputs = _inputs(J1, U2[:, :kmax], V2[:, :kmax])
    for k in range(1, kmax + 1):
        A_k = coupling_matrix(J1, U2[:, :k], V2[:, :k], orientation)
        for v in VARIANTS:
            a = coupling_values(A_max, s1, k, v, **inputs)
            b = coupling_values(A_k, s1[:k], k, v, **_inputs(J1, U2[:, :k], V2[:, :k]))
            assert float(a) == pytest.approx(float(b), rel=1e-12, abs=1e-14)


def test_batched_broadcasting_and_matrix_free_products() -> None:
    d, k = 6, 3
    J1 = _rand(0, 4, 5, d, d)  # (L, L', d, d): measured
    J2 = _rand(1, 5, d, d)  # broadcast basis
    U2, _, V2 = _svd(J2)
    U2, V2 = U2[..., :k], V2[..., :k]
    s1 = torch.linalg.svdvals(J1)
    A = coupling_matrix(J1, U2, V2)
    assert A.shape == (4, 5, k, k)
    torch.testing.assert_close(A[2, 3], U2[3].mT @ J1[2, 3] @ V2[3])
    torch.testing.assert_close(coupling_matrix_from_products(J1 @ V2, U2), A)
    torch.testing.assert_close(
        coupling_matrix_from_products(J1 @ U2, V2), coupling_matrix(J1, U2, V2, "vju")
    )
    vals = coupling_values(A, s1, 2, "miscoupling")
    assert vals.shape == (4, 5)
    assert float(vals[1, 4]) == pytest.approx(
        float(coupling_values(A[1, 4], s1[1, 4], 2, "miscoupling"))
    )
    allv = all_coupling_values(A, s1, [1, 3], ["coupling", "offdiag_ratio"], ps=[1, 2])
    assert set(allv) == {
        ("coupling", 1.0, 1),
        ("coupling", 1.0, 3),
        ("coupling", 2.0, 1),
        ("coupling", 2.0, 3),
        ("offdiag_ratio", None, 1),
        ("offdiag_ratio", None, 3),
    }
    assert allv[("coupling", 2.0, 3)].shape == (4, 5)


def test_float32_matches_float64() -> None:
    d, k = 16, 5
    J1, J2 = _rand(5, d, d), _rand(6, d, d)
    _, s1, _ = _svd(J1)
    U2, _, V2 = _svd(J2)
    A64 = coupling_matrix(J1, U2[:, :k], V2[:, :k])
    A32 = coupling_matrix(J1.float(), U2[:, :k].float(), V2[:, :k].float())
    assert A32.dtype == torch.float32
    v64 = all_coupling_values(A64, s1, [2, 5], VARIANTS, **_inputs(J1, U2[:, :k], V2[:, :k]))
    v32 = all_coupling_values(A32, s1.float(), [2, 5], VARIANTS, **_inputs(
        J1.float(), U2[:, :k].float(), V2[:, :k].float()))
    for key in v64:
        assert v32[key].dtype == torch.float32
        assert float(v32[key]) == pytest.approx(float(v64[key]), rel=1e-4, abs=1e-5)


# ---------------------------------------------------------------- chance level
@pytest.mark.parametrize("k", [8, 24])
def test_chance_level_matches_monte_carlo_haar_bases(k: int) -> None:
    """Haar-random independent bases: the mean miscoupling is within a few % of m_null.

    m_null is the root-mean-square value sqrt(E||A - S||^2) / ||s||_p; the identities behind
    it (E[A] = 0, E||A||_F^2 = (K/d)^2 ||J1||_F^2) are checked directly. The mean of
    ||A - S||_F is slightly below the RMS (Jensen), but for d = 64 ||A - S||_F concentrates,
    so the gap is a few percent at most. K = 24 makes the random term (K/d)^2 ||J1||_F^2 a
    large part of m_null, so a wrong factor there would fail the test.
    """
    d, n = 64, 400
    Q1, _ = torch.linalg.qr(_rand(10, d, d))
    Q2, _ = torch.linalg.qr(_rand(11, d, d))
    s = 1.0 / (1.0 + 0.02 * torch.arange(d, dtype=F64))  # slowly decaying
    J1 = Q1 @ torch.diag(s) @ Q2.mT
    fro2 = (J1**2).sum()
    g = torch.Generator().manual_seed(123)
    U = torch.stack([_haar(g, d, k) for _ in range(n)])  # (n, d, k)
    V = torch.stack([_haar(g, d, k) for _ in range(n)])
    A = coupling_matrix(J1, U, V)  # (n, k, k)
    rand_sq = (k / d) ** 2 * fro2
    assert float((torch.linalg.matrix_norm(A) ** 2).mean()) == pytest.approx(
        float(rand_sq), rel=0.03
    )
    assert float(A.mean(0).abs().max()) < 4 * math.sqrt(float(rand_sq) / k**2 / n)  # E[A] = 0
    sq = torch.linalg.matrix_norm(A - torch.diag(s[:k])) ** 2  # (n,)
    assert float(sq.mean()) == pytest.approx(float(rand_sq + (s[:k] ** 2).sum()), rel=0.02)
    for p in (1, 2, math.inf):
        m = coupling_values(A, s, k, "miscoupling", p)  # (n,)
        m_null = chance_miscoupling(s, fro2, d, k, p)
        assert float(m.mean()) == pytest.approx(float(m_null), rel=0.03)
        assert float(chance_coupling(s, fro2, d, k, p)) == pytest.approx(1 - float(m_null))
        # coupling_vs_null of random bases is about 0
        cvn = coupling_values(A, s, k, "coupling_vs_null", p, fro2=fro2, d=d)
        assert abs(float(cvn.mean())) < 0.03


def test_chance_level_flat_spectrum_limit() -> None:
    # flat spectrum, K << d: c_null -> 1 - 1/sqrt(K)
    for k in (1, 4, 10, 30):
        d = 100_000
        s = torch.ones(k, dtype=F64)
        c = chance_coupling(s, fro2=float(d), d=d, k=k)
        assert float(c) == pytest.approx(1 - 1 / math.sqrt(k), abs=1e-3)


def test_chance_miscoupling_closed_form() -> None:
    s = torch.tensor([3.0, 2.0, 1.0], dtype=F64)
    got = chance_miscoupling(s, fro2=50.0, d=10, k=2, p=1)
    assert float(got) == pytest.approx(math.sqrt(0.04 * 50 + 13) / 5)


# ---------------------------------------------------------------- errors and edge cases
def test_errors() -> None:
    A = torch.eye(3, dtype=F64)
    s = torch.ones(3, dtype=F64)
    with pytest.raises(BlockCouplingError, match="K_max=3"):
        coupling_values(A, s, 4, "coupling")
    with pytest.raises(BlockCouplingError, match="variant"):
        coupling_values(A, s, 2, "bogus")
    with pytest.raises(BlockCouplingError, match="orientation"):
        coupling_matrix(A, A, A, "uvj")
    with pytest.raises(BlockCouplingError, match="p must be"):
        coupling_values(A, s, 2, "coupling", p=3)
    with pytest.raises(BlockCouplingError, match="no p"):
        coupling_values(A, s, 2, "offdiag_ratio", p=1)
    with pytest.raises(BlockCouplingError, match="p=2"):
        coupling_values(A, s, 2, "released_norm", p=1)
    with pytest.raises(BlockCouplingError, match="fro2"):
        coupling_values(A, s, 2, "coupling_vs_null")
    with pytest.raises(BlockCouplingError, match="fro2"):
        all_coupling_values(A, s, [1], ["coupling_vs_null"])
    assert float(coupling_values(A, s, 2, "released_norm", p=2)) == 0.0


def test_reported_p() -> None:
    assert reported_p("coupling") == 1.0
    assert reported_p("miscoupling", "inf") == math.inf
    assert reported_p("released_norm", 1) == 2.0
    assert reported_p("released_trace") is None
    assert reported_p("offdiag_ratio") is None


def test_zero_measured_jacobian_gives_nan_not_a_number_made_up() -> None:
    A = torch.zeros(3, 3, dtype=F64)
    s = torch.zeros(3, dtype=F64)
    for v in ("coupling", "miscoupling", "released_norm", "released_trace", "offdiag_ratio"):
        assert math.isnan(float(coupling_values(A, s, 2, v)))
        assert math.isnan(float(all_coupling_values(A, s, [2], [v])[(v, reported_p(v), 2)]))
