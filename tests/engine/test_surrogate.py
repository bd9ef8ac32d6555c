"""``engine.surrogate``: the differentiable estimate of depth-wise coupling that the coupling
term trains with. Exact for m = d against a float64 oracle (autograd Jacobians through hooks
of our own); consistent for m < d (its numerator unbiased over Haar frames); against the
engine's ``coupling_vs_rotated`` on small constructed cases (they move together, and the
isotropic part that ``coupling_vs_null`` credits is not counted); differentiable (a step
against the term's gradient raises it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blockcoupling.engine.blocks import find_blocks, get_blocks
from blockcoupling.engine.surrogate import (
    alignment_from_products,
    depth_alignment,
    mean_offdiagonal,
    random_frame,
)
from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.vit.model import build_vit, resolve_shape
from tests.helpers.oracles import oracle_jacobians, oracle_value
from tests.helpers.threads import one_torch_thread  # noqa: F401 - autouse: one torch thread


def _traceless_cosine(A: np.ndarray, B: np.ndarray) -> float:
    d = A.shape[0]
    TA, TB = A - np.trace(A) / d * np.eye(d), B - np.trace(B) / d * np.eye(d)
    return float((TA * TB).sum() / np.sqrt((TA * TA).sum() * (TB * TB).sum()))


def _products(Js: list[np.ndarray], Q: np.ndarray) -> torch.Tensor:
    """(1, L, d, m): J^l Q for matrices given directly."""
    return torch.from_numpy(np.stack([J @ Q for J in Js])[None])


@pytest.fixture(scope="module")
def vit() -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_vit(resolve_shape("tiny", hidden_size=16, depth=3, heads=2), image_size=8,
                      num_channels=1, num_labels=4, drop_path=0.2, seed=3).double()
    with torch.no_grad():  # a trained-looking model: weights away from their initialisation
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("token", [0, 4])
def test_exact_with_every_direction_against_the_float64_oracle(vit: torch.nn.Module,
                                                               token: int) -> None:
    """m = d (any orthonormal frame): the estimate equals the traceless cosine of the
    oracle's J^l_{tt} (autograd through hooks of our own), for every pair, in eval mode
    (drop-path off), and the model's train mode is restored."""
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    vit.train()
    blocks = get_blocks(vit, find_blocks(vit))
    Q = random_frame(16, 16, torch.Generator().manual_seed(2), dtype=torch.float64)
    rho = depth_alignment(vit, blocks, lambda: vit(pixel_values=x), token, Q).detach()
    assert vit.training
    vit.eval()
    for b in range(2):
        Js, _ = oracle_jacobians(vit, {"pixel_values": x[b:b + 1]})
        Jt = [J[token, token] for J in Js]
        for i in range(3):
            for j in range(3):
                want = _traceless_cosine(Jt[i], Jt[j])
                assert float(rho[b, i, j]) == pytest.approx(want, abs=1e-9)


def test_consistent_over_haar_frames_and_exact_at_m_equal_d() -> None:
    """For m < d the estimate scatters around the exact traceless cosine, its RMS error
    falls as m grows (300 Haar frames each) and vanishes at m = d."""
    rng = np.random.default_rng(0)
    d = 12
    A = rng.standard_normal((d, d)) + 2 * np.eye(d)
    B = 0.6 * A + 0.8 * rng.standard_normal((d, d)) - np.eye(d)
    exact = _traceless_cosine(A, B)
    g = torch.Generator().manual_seed(5)
    rms = []
    for m in (2, 6, 12):
        vals = []
        for _ in range(300):
            Q = random_frame(d, m, g, dtype=torch.float64)
            vals.append(float(alignment_from_products(_products([A, B], Q.numpy()), Q)[0, 0, 1]))
        rms.append(float(np.sqrt(np.mean((np.array(vals) - exact) ** 2))))
    assert rms[0] > rms[1] > rms[2] and rms[2] < 1e-12


def test_follows_the_engines_coupling_vs_rotated_not_the_isotropic_part() -> None:
    """On constructed pairs J2 = (1 - a) J1 + a R (R unrelated to J1), both the surrogate and
    the engine's coupling_vs_rotated (the oracle formula the engine is tested against) fall
    as a grows (means over 30 draws, monotone, rank correlation 1); with a large common
    isotropic part (J = 3 I + G, G unrelated) coupling_vs_null reads far above 0 while the
    surrogate and coupling_vs_rotated read near 0."""
    rng = np.random.default_rng(1)
    d, k = 24, 4
    means_s, means_c = [], []
    for a in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        s_vals, c_vals = [], []
        for _ in range(30):
            J1 = rng.standard_normal((d, d)) / np.sqrt(d)
            J2 = (1 - a) * J1 + a * rng.standard_normal((d, d)) / np.sqrt(d)
            s_vals.append(_traceless_cosine(J1, J2))
            c_vals.append(oracle_value(J1, J2, k, "coupling_vs_rotated", 1.0, "ujv"))
        means_s.append(np.mean(s_vals))
        means_c.append(np.mean(c_vals))
    assert all(np.diff(means_s) < 0) and all(np.diff(means_c) < 0)
    assert means_s[0] == pytest.approx(1.0) and means_c[0] == pytest.approx(1.0)
    iso_s, iso_null, iso_rot = [], [], []
    for _ in range(30):
        G1, G2 = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(2))
        S = rng.standard_normal((d, d))
        J1, J2 = 3 * np.eye(d) + G1, 3 * np.eye(d) + (G2 + S @ S.T / d)  # J2 near-symmetric
        iso_s.append(_traceless_cosine(J1, J2))
        iso_null.append(oracle_value(J1, J2, k, "coupling_vs_null", 1.0, "ujv"))
        iso_rot.append(oracle_value(J1, J2, k, "coupling_vs_rotated", 1.0, "ujv"))
    assert np.mean(iso_null) > 0.3
    assert abs(np.mean(iso_s)) < 0.05 and abs(np.mean(iso_rot)) < 0.1


def test_differentiable_a_step_against_the_loss_raises_the_alignment(vit: torch.nn.Module
                                                                      ) -> None:
    """The estimate carries the graph to the parameters: one small gradient step on
    -alignment raises the alignment (same frame, same images)."""
    model = build_vit(resolve_shape("tiny", hidden_size=16, depth=3, heads=2), image_size=8,
                      num_channels=1, num_labels=4, drop_path=0.0, seed=4)
    blocks = get_blocks(model, find_blocks(model))
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    Q = random_frame(16, 4, torch.Generator().manual_seed(1))

    def value() -> torch.Tensor:
        return mean_offdiagonal(depth_alignment(model, blocks, lambda: model(pixel_values=x),
                                                0, Q))

    before = value()
    (-before).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(1e-2 * p.grad)
    assert float(value().detach()) > float(before.detach())


def test_bad_inputs_are_one_line() -> None:
    with pytest.raises(BlockCouplingError, match="1 <= m <= d"):
        random_frame(4, 5)
    with pytest.raises(BlockCouplingError, match="at least 2 blocks"):
        mean_offdiagonal(torch.ones(1, 1, 1))
