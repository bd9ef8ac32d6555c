"""Tests for blockcoupling.engine.svd: exact and randomized top-K SVD."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockcoupling.engine.svd import (
    DenseOperator,
    LinearOperator,
    TopK,
    randomized_topk_svd,
    topk_svd,
)
from blockcoupling.errors import BlockCouplingError, NumericalError

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)
F64 = torch.float64


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _with_spectrum(s: torch.Tensor, seed: int = 0) -> torch.Tensor:
    d = s.shape[0]
    Q1, _ = torch.linalg.qr(_rand(seed, d, d))
    Q2, _ = torch.linalg.qr(_rand(seed + 1, d, d))
    return Q1 @ torch.diag(s) @ Q2.mT


def _rank_k(t: TopK) -> torch.Tensor:
    return t.U @ torch.diag_embed(t.S) @ t.V.mT


@SETTINGS
@given(seed=st.integers(0, 10_000), m=st.integers(2, 9), n=st.integers(2, 9), data=st.data())
def test_exact_matches_numpy_svd(seed: int, m: int, n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, min(m, n)))
    J = _rand(seed, 3, m, n)  # batched, non-square
    t = topk_svd(J, k)
    assert t.U.shape == (3, m, k) and t.S.shape == (3, k) and t.V.shape == (3, n, k)
    assert t.residual is None and t.n_iter is None
    for b in range(3):
        Un, Sn, Vhn = np.linalg.svd(J[b].numpy())
        np.testing.assert_allclose(t.S[b].numpy(), Sn[:k], rtol=1e-12, atol=1e-12)
        ref = Un[:, :k] @ np.diag(Sn[:k]) @ Vhn[:k]
        np.testing.assert_allclose(_rank_k(t)[b].numpy(), ref, atol=1e-10)
        # vectors agree up to sign (random matrices have distinct singular values)
        np.testing.assert_allclose(
            np.abs(np.sum(t.U[b].numpy() * Un[:, :k], axis=0)), 1.0, atol=1e-8
        )
        np.testing.assert_allclose(
            np.abs(np.sum(t.V[b].numpy() * Vhn[:k].T, axis=0)), 1.0, atol=1e-8
        )
        assert float(t.fro2[b]) == pytest.approx(float(np.sum(J[b].numpy() ** 2)), rel=1e-12)


def test_exact_errors() -> None:
    J = _rand(0, 5, 5)
    with pytest.raises(BlockCouplingError, match="maximum is k=5"):
        topk_svd(J, 6)
    with pytest.raises(BlockCouplingError, match="at least 1"):
        topk_svd(J, 0)
    J[1, 2] = float("nan")
    with pytest.raises(NumericalError):
        topk_svd(J, 2)


def _ref_residual(J: torch.Tensor, t: TopK) -> float:
    worst = max(
        float(torch.linalg.vector_norm(J @ t.V[:, i] - t.S[i] * t.U[:, i])) for i in range(t.k)
    )
    return worst / float(t.S[0])


def test_randomized_decaying_spectrum_is_tight() -> None:
    d, k = 64, 8
    J = _with_spectrum(0.7 ** torch.arange(d, dtype=F64))
    op = DenseOperator(J)
    assert isinstance(op, LinearOperator)
    t = randomized_topk_svd(op, k)
    ex = topk_svd(J, k)
    torch.testing.assert_close(t.S, ex.S, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(_rank_k(t), _rank_k(ex), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        (t.U * ex.U).sum(0).abs(), torch.ones(k, dtype=F64), rtol=0, atol=1e-10
    )
    assert float(t.residual) < 1e-12
    assert float(t.residual) == pytest.approx(_ref_residual(J, t), rel=1e-6, abs=1e-15)
    assert t.n_iter == 4
    # J^T u_i = s_i v_i by construction (documented in the module)
    assert float(torch.linalg.matrix_norm(J.mT @ t.U - t.V * t.S)) < 1e-12
    # cost: (n_iter + 1) m columns each way, + k for the residual
    m = k + 10
    assert op.n_matmat == 5 * m + k and op.n_rmatmat == 5 * m


def test_randomized_flat_spectrum_is_looser() -> None:
    """Nearly flat spectrum (1% spread): the singular values are still accurate to ~1%, and the
    residual is small because every direction is nearly singular, but the top-K *subspace* is
    ill-determined (no spectral gap), so only values and the residual are checked."""
    d, k = 64, 8
    s = 1.0 + 0.01 * torch.linspace(1, 0, d, dtype=F64)
    J = _with_spectrum(s, seed=3)
    t = randomized_topk_svd(DenseOperator(J), k)
    ex = topk_svd(J, k)
    assert float(((t.S - ex.S) / ex.S).abs().max()) < 0.01
    assert float(t.residual) < 0.02
    assert float(t.residual) == pytest.approx(_ref_residual(J, t), rel=1e-6)
    assert bool((t.S[:-1] >= t.S[1:]).all())


def test_residual_decreases_with_n_iter_and_tol_iterates() -> None:
    d, k = 64, 8
    J = _with_spectrum(1.0 / (1.0 + 0.05 * torch.arange(d, dtype=F64)), seed=5)
    ex = topk_svd(J, k)
    res, err = [], []
    for n_iter in (0, 1, 2, 4, 8):
        t = randomized_topk_svd(DenseOperator(J), k, n_iter=n_iter)
        assert float(t.residual) == pytest.approx(_ref_residual(J, t), rel=1e-6)
        res.append(float(t.residual))
        err.append(float(((t.S - ex.S) / ex.S).abs().max()))
    assert all(a > b for a, b in zip(res, res[1:], strict=False)), res
    assert all(a > b for a, b in zip(err, err[1:], strict=False)), err
    assert res[-1] < 0.1 * res[0]
    # with tol, the iteration continues until the residual is below it
    t = randomized_topk_svd(DenseOperator(J), k, n_iter=0, tol=1e-6, max_iter=60)
    assert float(t.residual) <= 1e-6 and t.n_iter > 8
    torch.testing.assert_close(t.S, ex.S, rtol=1e-6, atol=0)
    # ... and stops at max_iter, reporting the residual it reached
    t = randomized_topk_svd(DenseOperator(J), k, n_iter=0, tol=1e-14, max_iter=3)
    assert t.n_iter == 3 and float(t.residual) > 1e-14


def test_randomized_is_deterministic_under_the_seed() -> None:
    J = _with_spectrum(1.0 / (1.0 + 0.1 * torch.arange(32, dtype=F64)), seed=9)
    a = randomized_topk_svd(DenseOperator(J), 5, n_iter=1, seed=7)
    b = randomized_topk_svd(DenseOperator(J), 5, n_iter=1, seed=7)
    c = randomized_topk_svd(DenseOperator(J), 5, n_iter=1, seed=8)
    assert torch.equal(a.U, b.U) and torch.equal(a.S, b.S) and torch.equal(a.V, b.V)
    assert torch.equal(a.fro2, b.fro2) and torch.equal(a.residual, b.residual)
    assert not torch.equal(a.S, c.S)


def test_fro2_estimate_is_unbiased() -> None:
    d = 48
    J = _with_spectrum(1.0 / (1.0 + 0.2 * torch.arange(d, dtype=F64)), seed=2)
    exact = float((J**2).sum())
    est = [
        float(randomized_topk_svd(DenseOperator(J), 4, n_iter=0, seed=s).fro2) for s in range(200)
    ]
    assert np.mean(est) == pytest.approx(exact, rel=0.03)
    assert np.std(est) > 0  # a real estimate, not the exact value by accident


def test_traces_exact_on_the_dense_path_and_unbiased_on_the_sketch() -> None:
    """tr(J) and tr(J^2) for the rotated-basis null: exact from topk_svd (also batched and on
    the float32 Gram route), Hutchinson estimates on the randomized sketch's own vectors
    (tr(J) free, tr(J^2) only when asked, for m more rmatmat columns)."""
    g = torch.Generator().manual_seed(3)
    d = 40
    J = -0.8 * torch.eye(d, dtype=F64) + torch.randn(d, d, generator=g, dtype=F64) / d ** 0.5
    exact_tr, exact_tr2 = float(torch.trace(J)), float(torch.trace(J @ J))
    top = topk_svd(J, 4)
    assert float(top.trace) == pytest.approx(exact_tr, rel=1e-12)
    assert float(top.trace2) == pytest.approx(exact_tr2, rel=1e-12)
    batch = topk_svd(torch.stack([J, 2 * J]), 3)
    torch.testing.assert_close(batch.trace2, torch.tensor([exact_tr2, 4 * exact_tr2], dtype=F64))
    gram = topk_svd(J.float(), 4)  # the float32 Gram route
    assert float(gram.trace2) == pytest.approx(exact_tr2, rel=1e-5)
    assert topk_svd(torch.randn(5, 7, dtype=F64), 2).trace is None  # not square
    est_tr, est_tr2 = [], []
    for seed in range(200):
        op = DenseOperator(J)
        r = randomized_topk_svd(op, 4, n_iter=1, seed=seed, trace2=True)
        est_tr.append(float(r.trace))
        est_tr2.append(float(r.trace2))
    for est, exact in ((est_tr, exact_tr), (est_tr2, exact_tr2)):
        se = np.std(est, ddof=1) / np.sqrt(len(est))
        assert abs(np.mean(est) - exact) < 4 * se + 1e-12 * abs(exact), (np.mean(est), exact)
        assert np.std(est) > 0
    plain, asked = DenseOperator(J), DenseOperator(J)
    assert randomized_topk_svd(plain, 4, n_iter=1, seed=0).trace2 is None
    randomized_topk_svd(asked, 4, n_iter=1, seed=0, trace2=True)
    assert asked.n_rmatmat - plain.n_rmatmat == min(4 + 10, d)  # one extra block of m columns
    assert asked.n_matmat == plain.n_matmat


def test_randomized_float32_and_small_d() -> None:
    d, k = 12, 12  # k = d: oversampling clipped to d, exact up to rounding
    J = _rand(4, d, d)
    t = randomized_topk_svd(DenseOperator(J.float()), k, n_iter=1)
    assert t.S.dtype == torch.float32 and t.U.shape == (d, k)
    torch.testing.assert_close(t.S.double(), torch.linalg.svdvals(J), rtol=1e-4, atol=1e-4)
    assert float(t.residual) < 1e-4


def test_randomized_errors_and_zero_operator() -> None:
    with pytest.raises(BlockCouplingError, match="maximum is k=6"):
        randomized_topk_svd(DenseOperator(_rand(0, 6, 6)), 7)
    with pytest.raises(BlockCouplingError, match="square"):
        DenseOperator(_rand(0, 6, 5))
    with pytest.raises(BlockCouplingError, match="tol"):
        randomized_topk_svd(DenseOperator(_rand(0, 6, 6)), 2, tol=0)
    t = randomized_topk_svd(DenseOperator(torch.zeros(6, 6, dtype=F64)), 2)
    assert float(t.residual) == 0.0 and float(t.S.abs().max()) == 0.0 and float(t.fro2) == 0.0


def test_gram_route_for_float32_is_as_exact_as_the_float32_svd() -> None:
    """A float32 CPU matrix with 4k <= d goes through the float64 Gram matrix: its top-k
    triplets must be at least as close to the float64 SVD of the same float32 matrix as
    torch's float32 SVD is (singular values, projectors of the top-k subspaces)."""
    d, k = 96, 20
    s = torch.cat([torch.linspace(10, 1, 40, dtype=F64), torch.linspace(0.9, 0.01, d - 40, dtype=F64)])
    J32 = _with_spectrum(s, seed=3).float()
    t = topk_svd(J32, k)
    assert t.U.dtype == torch.float32 and t.U.shape == (d, k) and t.V.shape == (d, k)
    U64, S64, Vh64 = torch.linalg.svd(J32.double())
    U32, S32, Vh32 = torch.linalg.svd(J32)

    def errs(U: torch.Tensor, S: torch.Tensor, V: torch.Tensor) -> tuple[float, float, float]:
        es = float((S.double() - S64[:k]).abs().max())
        eu = float((U.double() @ U.double().mT - U64[:, :k] @ U64[:, :k].mT).abs().max())
        ev = float((V.double() @ V.double().mT - Vh64[:k].mT @ Vh64[:k]).abs().max())
        return es, eu, ev

    got, ref = errs(t.U, t.S, t.V), errs(U32[:, :k], S32[:k], Vh32[:k].mT)
    for g, r in zip(got, ref, strict=True):
        assert g <= max(2 * r, 1e-6), (got, ref)
    assert float(t.fro2) == pytest.approx(float((J32.double() ** 2).sum()), rel=1e-5)


def _subspace_errors(t: TopK, J32: torch.Tensor, k: int) -> tuple[float, float, float]:
    """Max errors of S and of the top-k projectors against the float64 SVD of J32."""
    U64, S64, Vh64 = torch.linalg.svd(J32.double())
    es = float((t.S.double() - S64[:k]).abs().max())
    eu = float((t.U.double() @ t.U.double().mT - U64[:, :k] @ U64[:, :k].mT).abs().max())
    ev = float((t.V.double() @ t.V.double().mT - Vh64[:k].mT @ Vh64[:k]).abs().max())
    return es, eu, ev


def _count_f64_route(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from blockcoupling.engine import svd as svd_mod

    calls: list[int] = []
    f64 = svd_mod._topk_gram_f64

    def counted(J: torch.Tensor, k: int) -> object:
        calls.append(k)
        return f64(J, k)

    monkeypatch.setattr(svd_mod, "_topk_gram_f64", counted)
    return calls


#: the Gram routes' solvers: the CPU's (subset MRRR), and the GPU's (the full
#: ``torch.linalg.eigh``, sliced; and subspace iteration first, its fallback that eigh)
SOLVERS = pytest.mark.parametrize("solver", ["cpu", "gpu-eigh", "gpu-iter"],
                                  ids=["cpu-subset", "gpu-full-eigh", "gpu-iterated"])


def _solver(monkeypatch: pytest.MonkeyPatch, solver: str) -> None:
    """The Gram routes' eigensolvers as on a GPU (`SOLVERS`), here on the CPU, so the GPU's
    algorithm is checked where CI runs."""
    from blockcoupling.engine import svd as svd_mod

    if solver != "cpu":
        top = svd_mod._top_eigh
        monkeypatch.setattr(svd_mod, "_top_eigh", lambda G, w: top(G, w, subset=False))
    monkeypatch.setattr(svd_mod, "_iterate_first", lambda n, k, device: solver == "gpu-iter")


@SOLVERS
def test_mixed_gram_route_resolves_near_degenerate_values_in_float64(
        monkeypatch: pytest.MonkeyPatch, solver: str) -> None:
    """Six singular values 1e-4 apart inside the top k, and s_k 1e-4 above s_{k+1}: the
    float32 subspace plus the float64 Rayleigh-Ritz step (no float64 eigensolver call) gives
    each singular vector of the float32 matrix to its float32 rounding (angles <= 1e-3; the
    float32 subspace alone: 4e-3, torch's float32 SVD: 9e-3), and J v = s u. The spectrum is
    the same whichever subspace the route found (on the GPU's iterated route: 24 products
    of the Gram, s_{p+1} / s_k = 0.74 for its block of p = 72)."""
    _solver(monkeypatch, solver)
    d, k = 128, 24
    s = torch.linspace(10, 4, d, dtype=F64)
    s[5:11] = s[5] - torch.arange(6, dtype=F64) * 1e-4  # a cluster inside the top k
    s[k] = s[k - 1] - 1e-4
    s, _ = s.sort(descending=True)
    J32 = _with_spectrum(s, seed=11).float()
    calls = _count_f64_route(monkeypatch)
    t = topk_svd(J32, k)
    assert calls == []  # the certificate held
    assert t.route == ("gram-iter" if solver == "gpu-iter" else "gram-eigh")
    U64, S64, Vh64 = torch.linalg.svd(J32.double())
    for got, ref in ((t.V, Vh64[:k].mT), (t.U, U64[:, :k])):
        cos = (got.double() * ref).sum(0).abs().clamp(max=1)
        assert float((1 - cos**2).clamp_min(0).sqrt().max()) <= 1e-3
    assert float((t.S.double() - S64[:k]).abs().max()) <= 1e-5
    Jd = J32.double()
    pair_res = (Jd @ t.V.double() - t.U.double() * t.S.double()).norm(dim=0).max()
    assert float(pair_res) <= 1e-5 * float(s[0])


@SOLVERS
def test_mixed_gram_route_falls_back_to_float64_where_its_certificate_fails(
        monkeypatch: pytest.MonkeyPatch, solver: str) -> None:
    """s_k / s_1 = 3e-3 (above the Gram routes' 1e-3 floor): a float32 Gram cannot hold the
    small eigenvalues to a few roundings of s_1 s_k, the certificate fails, and the float64
    Gram route answers, as exact as the float32 SVD."""
    _solver(monkeypatch, solver)
    d, k = 64, 8
    s = torch.cat([torch.linspace(1, 0.5, 4, dtype=F64), torch.linspace(4e-3, 1e-4, d - 4, dtype=F64)])
    J32 = _with_spectrum(s, seed=13).float()
    calls = _count_f64_route(monkeypatch)
    t = topk_svd(J32, k)
    assert calls == [k] and t.route == "gram-f64"
    U32, S32, Vh32 = torch.linalg.svd(J32)
    ref = _subspace_errors(TopK(U=U32[:, :k], S=S32[:k], V=Vh32[:k].mT), J32, k)
    got = _subspace_errors(t, J32, k)
    for g, r in zip(got, ref, strict=True):
        assert g <= max(2 * r, 1e-6), (got, ref)


def test_gram_route_falls_back_where_the_tail_is_tiny() -> None:
    """s_k / s_1 below 1e-3: the Gram route would lose digits; the full SVD is used."""
    d, k = 40, 10
    s = torch.cat([torch.tensor([1.0], dtype=F64), torch.full((d - 1,), 1e-5, dtype=F64)])
    s[1:] -= torch.arange(d - 1, dtype=F64) * 1e-8  # distinct
    J32 = _with_spectrum(s, seed=5).float()
    t = topk_svd(J32, k)
    S32 = torch.linalg.svd(J32).S[:k]
    assert torch.equal(t.S, S32)  # the very same computation as torch.linalg.svd
    assert t.route == "svd"


def _iterated(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The GPU's iterated route on the CPU; returns the certificate's ratio at each check."""
    from blockcoupling.engine import svd as svd_mod

    _solver(monkeypatch, "gpu-iter")
    ratios: list[float] = []
    ritz = svd_mod._ritz64

    def counted(J: torch.Tensor, W: torch.Tensor, k: int) -> object:
        got = ritz(J, W, k)
        ratios.append(got[1])
        return got

    monkeypatch.setattr(svd_mod, "_ritz64", counted)
    return ratios


@pytest.mark.parametrize("k", [10, 24])
def test_iterated_route_certifies_a_decaying_spectrum(monkeypatch: pytest.MonkeyPatch,
                                                      k: int) -> None:
    """A decaying spectrum (s_i = 10 / sqrt(i)): subspace iteration on the Gram is certified
    within its budget of products, no eigensolver of the whole Gram runs, and the triplets
    are as exact as the float32 SVD's against the float64 SVD of the same float32 matrix."""
    from blockcoupling.engine import svd as svd_mod

    ratios = _iterated(monkeypatch)
    eighs: list[int] = []
    monkeypatch.setattr(svd_mod, "_top_eigh", lambda G, w: eighs.append(w))
    d = 512
    s = 10 / torch.arange(1, d + 1, dtype=F64).sqrt()
    J32 = _with_spectrum(s, seed=17).float()
    t = topk_svd(J32, k)
    assert t.route == "gram-iter" and eighs == [] and ratios[-1] <= 1
    assert 1 <= len(ratios) <= svd_mod._ITER_MAX // svd_mod._ITER_CHECK
    U32, S32, Vh32 = torch.linalg.svd(J32)
    ref = _subspace_errors(TopK(U=U32[:, :k], S=S32[:k], V=Vh32[:k].mT), J32, k)
    got = _subspace_errors(t, J32, k)
    for g, r in zip(got, ref, strict=True):
        assert g <= max(2 * r, 1e-6), (got, ref)


def test_iterated_route_falls_back_to_the_full_eigh_on_a_plateau(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The hard case: four separated values, then a plateau of near-degenerate ones (8e-4
    apart, s_5 = 2 down to s_256 = 1.8) far beyond the iteration's block (p = 60), so that
    s_{p+1} / s_k = 0.98 and no affordable number of products separates the top k. The
    certificate fails (its ratio is in the thousands), the iteration gives up at its first
    check (at the rate its Ritz values predict, the ratio would not reach 1 within its
    budget), and the eigh of the whole Gram answers, certified, with the float64 SVD's
    values."""
    from blockcoupling.engine import svd as svd_mod

    ratios = _iterated(monkeypatch)
    d, k = 256, 12
    s = torch.cat([torch.tensor([8.0, 6.0, 5.0, 4.0], dtype=F64),
                   torch.linspace(2.0, 1.8, d - 4, dtype=F64)])
    J32 = _with_spectrum(s, seed=19).float()
    calls = _count_f64_route(monkeypatch)
    t = topk_svd(J32, k)
    assert t.route == "gram-eigh" and calls == []
    assert len(ratios) == 2 and ratios[0] > 100 and ratios[1] <= 1
    assert svd_mod._ITER_CHECK < svd_mod._ITER_MAX  # gave up early
    S64 = torch.linalg.svdvals(J32.double())[:k]
    assert float((t.S.double() - S64).abs().max()) <= 1e-5
    Jd = J32.double()
    pair_res = (Jd @ t.V.double() - t.U.double() * t.S.double()).norm(dim=0).max()
    assert float(pair_res) <= 1e-5 * float(s[0])


def test_iterated_route_stops_at_once_without_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """s_k = 0 exactly (the zero matrix): the certificate has no bound to reach, so the
    iteration stops at its first check, and the full SVD answers with zeros."""
    ratios = _iterated(monkeypatch)
    t = topk_svd(torch.zeros(64, 64), 6)
    assert t.route == "svd" and float(t.S.abs().max()) == 0.0
    assert ratios == [float("inf")] * 2  # the iteration's one check, then the eigh window's


def test_the_iteration_rule_is_for_wide_matrices_and_small_k() -> None:
    """`_iterate_first`: while the block is <= 1/8 of d; on the CPU only from d = 4096 (below
    it LAPACK's subset MRRR was faster at the default K = 50)."""
    from blockcoupling.engine.svd import _iterate_first

    assert _iterate_first(4096, 50, torch.device("cpu"))
    assert not _iterate_first(2048, 50, torch.device("cpu"))
    assert _iterate_first(2048, 50, torch.device("cuda"))
    assert _iterate_first(1024, 10, torch.device("cuda"))
    assert _iterate_first(4096, 50, torch.device("cuda"))
    assert not _iterate_first(768, 77, torch.device("cuda"))
    assert not _iterate_first(4096, 500, torch.device("cpu"))
    assert topk_svd(_rand(3, 64, 64).float(), 4).route in ("gram-eigh", "gram-f64")


def test_exact_accepts_huge_finite_entries_and_refuses_inf() -> None:
    """The finite check rides on ||J||_F: an overflowing norm with finite entries is not an
    error (every entry is then checked), an infinite entry is."""
    J = _rand(1, 8, 8).float()
    J[0, 0] = 3e38
    top = topk_svd(J, 2)
    assert torch.isfinite(top.S).all()
    J[0, 0] = float("inf")
    with pytest.raises(NumericalError):
        topk_svd(J, 2)
