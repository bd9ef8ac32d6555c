"""Tests for blockcoupling.engine.trajectory: norms, LSS (whole and windowed), expodistance, cv, PCA."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockcoupling.engine.trajectory import (
    equidistance_cv,
    expodistance,
    line_shape_score,
    line_shape_scores,
    norms,
    pca_projection,
    pca_projections,
    step_norms,
    windowed_lss,
)
from blockcoupling.errors import BlockCouplingError
from tests.helpers.oracles import assert_pca_matches

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
F64 = torch.float64


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _ref_lss(x: np.ndarray) -> float:
    """Gai & Zhang's recursion, literally: x (T, d) one token's trajectory, no zero steps."""
    y = x[0].copy()
    y0 = y.copy()
    for layer in range(1, x.shape[0]):
        step = x[layer] - x[layer - 1]
        y = y + step / np.linalg.norm(step)
    span = np.linalg.norm(y - y0)
    return math.inf if span == 0 else (x.shape[0] - 1) / span  # d = 1 back-and-forth: inf


@SETTINGS
@given(seed=st.integers(0, 10_000), L=st.integers(1, 14), n=st.integers(1, 4), d=st.integers(1, 6))
def test_lss_against_reference_and_at_least_one(seed: int, L: int, n: int, d: int) -> None:
    X = _rand(seed, L + 1, n, d)
    got = line_shape_score(X)
    assert got.shape == (n,)
    for i in range(n):
        assert float(got[i]) == pytest.approx(_ref_lss(X[:, i].numpy()), rel=1e-10)
    assert bool((got >= 1 - 1e-12).all())


@SETTINGS
@given(seed=st.integers(0, 10_000), L=st.integers(1, 14), width=st.sampled_from([1, 3, 5, 11, 31]))
def test_windowed_lss_against_reference(seed: int, L: int, width: int) -> None:
    n, d = 2, 4
    X = _rand(seed, L + 1, n, d)
    got = windowed_lss(X, width)
    assert got.shape == (L + 1, n)
    h = (width - 1) // 2
    for layer in range(L + 1):
        lo, hi = max(0, layer - h), min(L, layer + h)
        for i in range(n):
            if hi - lo < 1:
                assert math.isnan(float(got[layer, i]))
            else:
                assert float(got[layer, i]) == pytest.approx(
                    _ref_lss(X[lo : hi + 1, i].numpy()), rel=1e-10
                )
    if L % 2 == 0 and width >= L + 1:  # the middle layer's window is the whole trajectory
        assert float(got[L // 2, 0]) == pytest.approx(float(line_shape_score(X)[0]), rel=1e-12)


def test_straight_line_has_lss_one() -> None:
    direction = _rand(1, 5)
    x0 = _rand(2, 5)
    c = torch.tensor([0.0, 0.1, 0.5, 0.6, 2.0, 7.0, 7.5], dtype=F64)  # uneven, increasing
    X = (x0 + c[:, None] * direction)[:, None, :]  # (7, 1, 5)
    assert float(line_shape_score(X)[0]) == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(windowed_lss(X, 3), torch.ones(7, 1, dtype=F64))


@pytest.mark.parametrize("L", [5, 6])
@pytest.mark.parametrize("theta", [0.3, 1.0])
def test_zigzag_closed_form(L: int, theta: float) -> None:
    # steps alternate (cos t, sin t), (cos t, -sin t): the unit steps sum to
    # (L cos t, sin t if L odd else 0), so LSS = L / sqrt(L^2 cos^2 t + [L odd] sin^2 t).
    steps = torch.tensor(
        [[math.cos(theta), (-1) ** j * math.sin(theta)] for j in range(L)], dtype=F64
    )
    steps = steps * torch.arange(1, L + 1, dtype=F64)[:, None]  # step lengths do not matter
    X = torch.cat([torch.zeros(1, 2, dtype=F64), steps.cumsum(0)])[:, None, :]
    expected = L / math.sqrt(L**2 * math.cos(theta) ** 2 + (L % 2) * math.sin(theta) ** 2)
    assert float(line_shape_score(X)[0]) == pytest.approx(expected, rel=1e-12)


def test_lss_degenerate_steps() -> None:
    a, b, c = (torch.tensor(v, dtype=F64) for v in ([0.0, 0.0], [1.0, 0.0], [1.0, 2.0]))
    with_repeat = torch.stack([a, b, b, c])[:, None, :]
    deduplicated = torch.stack([a, b, c])[:, None, :]
    assert float(line_shape_score(with_repeat)[0]) == pytest.approx(
        float(line_shape_score(deduplicated)[0])
    )
    assert float(line_shape_score(deduplicated)[0]) == pytest.approx(2 / math.sqrt(2))
    assert math.isnan(float(line_shape_score(torch.stack([a, a, a])[:, None, :])[0]))
    assert float(line_shape_score(torch.stack([a, b, a])[:, None, :])[0]) == math.inf
    # the zero-step token does not disturb the other token
    X = torch.stack([torch.stack([a, a]), torch.stack([a, b]), torch.stack([a, c])])  # (3, 2, 2)
    out = line_shape_score(X)
    assert math.isnan(float(out[0])) and math.isfinite(float(out[1]))


def test_windowed_lss_errors_and_single_layer() -> None:
    X = _rand(0, 5, 2, 3)
    with pytest.raises(BlockCouplingError, match="odd"):
        windowed_lss(X, 4)
    with pytest.raises(BlockCouplingError, match="odd"):
        windowed_lss(X, 0)
    assert bool(torch.isnan(windowed_lss(X, 1)).all())
    assert bool(torch.isnan(windowed_lss(X[:1], 11)).all())
    with pytest.raises(BlockCouplingError, match="shape"):
        line_shape_score(X[0])
    with pytest.raises(BlockCouplingError, match="at least 2"):
        line_shape_score(X[:1])


def test_norms_and_steps_against_numpy() -> None:
    X = _rand(3, 6, 4, 5)
    np.testing.assert_allclose(norms(X).numpy(), np.linalg.norm(X.numpy(), axis=-1), rtol=1e-12)
    np.testing.assert_allclose(
        step_norms(X).numpy(), np.linalg.norm(np.diff(X.numpy(), axis=0), axis=-1), rtol=1e-12
    )


def test_expodistance() -> None:
    # exact exponential growth (directions rotate freely): ED = 0
    L, d = 8, 4
    dirs = _rand(5, L + 1, 1, d)
    dirs = dirs / torch.linalg.vector_norm(dirs, dim=-1, keepdim=True)
    X = dirs * torch.exp(0.3 * torch.arange(L + 1, dtype=F64))[:, None, None] * 2.5
    assert float(expodistance(X)[0]) == pytest.approx(0.0, abs=1e-12)
    # norms 1, e, e^3: alpha = (1, 2), mean 1.5, population var 0.25 -> ED = 1/9
    X = torch.tensor([1.0, math.e, math.e**3], dtype=F64)[:, None, None]
    assert float(expodistance(X)[0]) == pytest.approx(1 / 9, rel=1e-12)
    # against a direct numpy computation
    X = _rand(6, 7, 3, 4)
    nr = np.linalg.norm(X.numpy(), axis=-1)
    alpha = np.log(nr[1:] / nr[:-1])
    np.testing.assert_allclose(
        expodistance(X).numpy(), alpha.var(0) / alpha.mean(0) ** 2, rtol=1e-10
    )
    # a zero norm makes alpha undefined
    X[2, 1] = 0.0
    out = expodistance(X)
    assert math.isnan(float(out[1])) and math.isfinite(float(out[0]))


def test_equidistance_cv() -> None:
    # equidistant steps in varying directions: cv = 0
    steps = _rand(7, 6, 1, 3)
    steps = 0.7 * steps / torch.linalg.vector_norm(steps, dim=-1, keepdim=True)
    X = torch.cat([torch.zeros(1, 1, 3, dtype=F64), steps.cumsum(0)])
    assert float(equidistance_cv(X)[0]) == pytest.approx(0.0, abs=1e-12)
    # step lengths 1 and 3: mean 2, population std 1
    X = torch.tensor([0.0, 1.0, 4.0], dtype=F64)[:, None, None]
    assert float(equidistance_cv(X)[0]) == pytest.approx(0.5)
    X = _rand(8, 9, 2, 3)
    st_ = np.linalg.norm(np.diff(X.numpy(), axis=0), axis=-1)
    np.testing.assert_allclose(equidistance_cv(X).numpy(), st_.std(0) / st_.mean(0), rtol=1e-10)
    assert math.isnan(float(equidistance_cv(torch.zeros(3, 1, 2, dtype=F64))[0]))


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(3, 8), d=st.integers(2, 6))
def test_pca_against_numpy_svd(seed: int, n: int, d: int) -> None:
    L = 4
    X = _rand(seed, L + 1, n, d)
    P = pca_projection(X)
    assert P.shape == (L + 1, n, 2)
    XL = X[L].numpy()
    mu = XL.mean(0)
    _, _, Vt = np.linalg.svd(XL - mu)
    ref = (X.numpy() - mu) @ Vt[:2].T  # (L+1, n, 2), sign arbitrary
    for c in range(2):
        assert_pca_matches(P[..., c].numpy(), ref[..., c], atol=1e-10)
    # the last layer's scores are centred and their variance is ordered
    last = P[L].numpy()
    np.testing.assert_allclose(last.mean(0), 0.0, atol=1e-10)
    assert last[:, 0].var() >= last[:, 1].var() - 1e-12


@pytest.mark.parametrize("n", [1, 2, 5])
def test_batched_pca_is_the_pca_of_each(n: int) -> None:
    """`pca_projections` on a stack: each trajectory's own `pca_projection` (NaN included)."""
    X = _rand(5, 3, 4, n, 6)
    got = pca_projections(X)
    assert got.shape == (3, 4, n, 2)
    for i in range(3):
        one = pca_projection(X[i])
        assert torch.equal(torch.isnan(got[i]), torch.isnan(one))
        for c in range(2):  # n = 2: the scores tie, the batched SVD may round to the other sign
            if not bool(torch.isnan(one[..., c]).any()):
                assert_pca_matches(got[i][..., c].numpy(), one[..., c].numpy(), atol=1e-12)
    with pytest.raises(BlockCouplingError, match="P, L"):
        pca_projections(X[0])


def test_pca_degenerate_token_counts() -> None:
    X = _rand(1, 4, 1, 5)
    assert bool(torch.isnan(pca_projection(X)).all())
    X = _rand(2, 4, 2, 5)
    P = pca_projection(X)
    assert bool(torch.isfinite(P[..., 0]).all()) and bool(torch.isnan(P[..., 1]).all())
    # with two tokens the first component is the line through them: scores +-half the distance
    half = float(torch.linalg.vector_norm(X[-1, 0] - X[-1, 1])) / 2
    np.testing.assert_allclose(np.sort(P[-1, :, 0].numpy()), [-half, half], rtol=1e-12)
    # d = 1: only one component exists
    X = _rand(3, 4, 5, 1)
    P = pca_projection(X)
    assert bool(torch.isfinite(P[..., 0]).all()) and bool(torch.isnan(P[..., 1]).all())


def test_float32_works() -> None:
    X = _rand(4, 6, 3, 8)
    for fn in (
        line_shape_score,
        expodistance,
        equidistance_cv,
        norms,
        step_norms,
        pca_projection,
        lambda x: windowed_lss(x, 3),
    ):
        a, b = fn(X.float()), fn(X)
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@given(st.integers(2, 14), st.integers(1, 4), st.sampled_from([1, 3, 5, 11]), st.integers(0, 10**6))
@SETTINGS
def test_line_shape_scores_equal_the_single_functions(L: int, n: int, width: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(L + 1, n, 5, generator=g, dtype=torch.float64).cumsum(0)
    whole, windowed = line_shape_scores(X, width)
    torch.testing.assert_close(whole, line_shape_score(X), equal_nan=True)
    torch.testing.assert_close(windowed, windowed_lss(X, width), equal_nan=True)


def test_expodistance_is_nan_where_norms_only_change_by_rounding() -> None:
    # every layer rescaled to the same norm up to float32 rounding (a post-LN block at init)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(7, 3, 64, generator=g)
    X = X / torch.linalg.vector_norm(X, dim=-1, keepdim=True) * 8.0
    ed = expodistance(X, resolution=8 * torch.finfo(torch.float32).eps)
    assert torch.isnan(ed).all()
    # real growth is untouched by the resolution
    Y = X * (1.1 ** torch.arange(7.0))[:, None, None]
    torch.testing.assert_close(expodistance(Y, resolution=1e-6), expodistance(Y))
    assert torch.isfinite(expodistance(Y)).all()
