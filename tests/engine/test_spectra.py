"""Tests for blockcoupling.engine.spectra: influence metrics, 1/depth fit, linearisation cosine."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from blockcoupling.engine.spectra import (
    INFLUENCE_METRICS,
    fit_inverse_depth,
    influence_metrics,
    linearisation_cosine,
)
from blockcoupling.errors import BlockCouplingError

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
F64 = torch.float64


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


@SETTINGS
@given(seed=st.integers(0, 10_000), r=st.integers(1, 10))
def test_influence_metrics_against_direct_loops(seed: int, r: int) -> None:
    s_batch = _rand(seed, 3, r).abs()
    if r >= 2:
        s_batch[1, 0] = 0.0  # a zero singular value: 0 log 0 = 0
    out = influence_metrics(s_batch)
    assert set(out) == set(INFLUENCE_METRICS)
    for b in range(3):
        s = [float(x) for x in s_batch[b]]
        tot = sum(s)
        fro = math.sqrt(sum(x * x for x in s))
        pr = tot**2 / sum(x * x for x in s)
        ent = -sum((x / tot) * math.log(x / tot) for x in s if x > 0)
        assert float(out["frobenius"][b]) == pytest.approx(fro, rel=1e-12)
        assert float(out["spectral"][b]) == pytest.approx(max(s), rel=1e-12)
        assert float(out["participation_ratio"][b]) == pytest.approx(pr, rel=1e-12)
        assert float(out["effective_rank"][b]) == pytest.approx(math.exp(ent), rel=1e-12)
        assert 1 - 1e-12 <= float(out["participation_ratio"][b]) <= r + 1e-12
        assert 1 - 1e-12 <= float(out["effective_rank"][b]) <= r + 1e-12


def test_influence_metrics_known_values_and_edge_cases() -> None:
    out = influence_metrics(torch.ones(5, dtype=F64))
    assert float(out["participation_ratio"]) == pytest.approx(5.0)
    assert float(out["effective_rank"]) == pytest.approx(5.0)
    out = influence_metrics(torch.tensor([2.0, 0.0, 0.0], dtype=F64))
    assert float(out["participation_ratio"]) == pytest.approx(1.0)
    assert float(out["effective_rank"]) == pytest.approx(1.0)
    assert float(out["spectral"]) == 2.0 and float(out["frobenius"]) == 2.0
    # frobenius of all singular values = ||J||_F
    J = _rand(0, 6, 6)
    assert float(influence_metrics(torch.linalg.svdvals(J))["frobenius"]) == pytest.approx(
        float(torch.linalg.matrix_norm(J)), rel=1e-12
    )
    out = influence_metrics(torch.zeros(4, dtype=F64))
    assert float(out["frobenius"]) == 0.0 and float(out["spectral"]) == 0.0
    assert math.isnan(float(out["participation_ratio"])) and math.isnan(
        float(out["effective_rank"])
    )
    with pytest.raises(BlockCouplingError, match="non-negative"):
        influence_metrics(torch.tensor([1.0, -0.5], dtype=F64))
    out32 = influence_metrics(torch.tensor([3.0, 1.0], dtype=torch.float32))
    assert out32["effective_rank"].dtype == torch.float32


def test_fit_inverse_depth_exact_and_against_scipy() -> None:
    layers = np.arange(1, 13, dtype=float)
    fit = fit_inverse_depth(layers, 2.0 / layers + 0.5)
    assert (
        fit["a"] == pytest.approx(2.0)
        and fit["b"] == pytest.approx(0.5)
        and fit["r2"] == pytest.approx(1.0)
    )
    assert fit["n"] == 12
    # noisy, repeated layers (several tokens per layer), as a torch tensor: simple regression on 1/l
    rng = np.random.default_rng(0)
    lay = np.repeat(layers, 3)
    sig = 1.3 / lay + 0.2 + 0.05 * rng.standard_normal(lay.size)
    fit = fit_inverse_depth(torch.tensor(lay), torch.tensor(sig))
    ref = stats.linregress(1.0 / lay, sig)
    assert fit["a"] == pytest.approx(ref.slope, rel=1e-10)
    assert fit["b"] == pytest.approx(ref.intercept, rel=1e-10)
    assert fit["r2"] == pytest.approx(ref.rvalue**2, rel=1e-10)
    # non-finite pairs are dropped
    sig2 = sig.copy()
    sig2[4] = np.nan
    fit2 = fit_inverse_depth(lay, sig2)
    ref2 = stats.linregress(1.0 / np.delete(lay, 4), np.delete(sig, 4))
    assert fit2["a"] == pytest.approx(ref2.slope, rel=1e-10) and fit2["n"] == lay.size - 1


def test_fit_inverse_depth_errors() -> None:
    with pytest.raises(BlockCouplingError, match="two or more distinct layers"):
        fit_inverse_depth([3, 3, 3], [1.0, 2.0, 3.0])
    with pytest.raises(BlockCouplingError, match="1-based"):
        fit_inverse_depth([0, 1, 2], [1.0, 2.0, 3.0])
    with pytest.raises(BlockCouplingError, match="same length"):
        fit_inverse_depth([1, 2], [1.0])
    assert math.isnan(fit_inverse_depth([1, 2, 3], [1.0, 1.0, 1.0])["r2"])


def test_linearisation_cosine_against_explicit_product() -> None:
    L, d = 4, 5
    Js = [0.3 * _rand(10 + j, d, d) for j in range(L)]
    x0 = _rand(1, d)
    xL = _rand(2, d)
    M = np.eye(d)
    for J in Js:  # J^1 acts first: M = (I + J^L) ... (I + J^1)
        M = (np.eye(d) + J.numpy()) @ M
    v = M @ x0.numpy()
    ref = v @ xL.numpy() / (np.linalg.norm(v) * np.linalg.norm(xL.numpy()))
    assert float(linearisation_cosine(Js, x0, xL)) == pytest.approx(ref, rel=1e-12)
    assert float(linearisation_cosine(torch.stack(Js), x0, xL)) == pytest.approx(ref, rel=1e-12)
    # the order matters (the Jacobians do not commute) and is the block order
    assert float(linearisation_cosine(Js[::-1], x0, xL)) != pytest.approx(ref, rel=1e-6)
    # exactly linear blocks: the cosine with the true output is 1
    assert float(linearisation_cosine(Js, x0, torch.tensor(v))) == pytest.approx(1.0, abs=1e-12)


def test_linearisation_cosine_batched_tokens_and_edges() -> None:
    L, n, d = 3, 4, 5
    J = 0.2 * _rand(0, L, n, d, d)  # (L, n, d, d): J^l_tt for every token t
    x0, xL = _rand(1, n, d), _rand(2, n, d)
    out = linearisation_cosine(J, x0, xL)
    assert out.shape == (n,)
    for t in range(n):
        assert float(out[t]) == pytest.approx(
            float(linearisation_cosine(J[:, t], x0[t], xL[t])), rel=1e-12
        )
    assert math.isnan(float(linearisation_cosine(J[:, 0], x0[0], torch.zeros(d, dtype=F64))))
    with pytest.raises(BlockCouplingError, match="at least one"):
        linearisation_cosine([], x0[0], xL[0])
    with pytest.raises(BlockCouplingError, match="does not match"):
        linearisation_cosine([torch.eye(3, dtype=F64)], x0[0], xL[0])
    out32 = linearisation_cosine(J.float(), x0.float(), xL.float())
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), out, rtol=1e-4, atol=1e-5)
