"""Tests of the post-LN normalisation directions (engine/normdirs.py) against float64 oracles:
the LayerNorm's left null space, the skip connection's rows of a real BERT block's Jacobian,
the projection of dense matrices and of matrix-free operators."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import tiny_inputs, tiny_model

from blockcoupling.engine import normdirs
from blockcoupling.engine.svd import DenseOperator
from blockcoupling.errors import BlockCouplingError


def _block_out(block: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    out = block(h.unsqueeze(0))
    return (out[0] if isinstance(out, tuple) else out)[0]  # (n, d)


def _block_jacobian(block: torch.nn.Module, x: torch.Tensor, t_in: int, t_out: int) -> torch.Tensor:
    """float64 oracle: d f(X)_{t_out} / d x_{t_in} with f = F - X (rows = outputs)."""

    def g(v: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        h[t_in] = v
        return (_block_out(block, h) - h)[t_out]

    return torch.autograd.functional.jacobian(g, x[t_in].clone())  # (d, d)


def _bert_block_and_input(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    model = tiny_model("bert", seed=seed, dtype=torch.float64)
    with torch.no_grad():
        out = model(**tiny_inputs("bert", n=5, seed=seed), output_hidden_states=True)
    return model.encoder.layer[1], out.hidden_states[1][0]  # block 2, its input (n, d)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(3, 24))
def test_basis_spans_the_left_null_space_of_layernorm(seed: int, d: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ln = torch.nn.LayerNorm(d, eps=1e-12, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(torch.rand(d, generator=g, dtype=torch.float64) + 0.2)
        ln.bias.copy_(torch.randn(d, generator=g, dtype=torch.float64))
    z = 3 * torch.randn(d, generator=g, dtype=torch.float64) + 1.5
    J = torch.autograd.functional.jacobian(ln, z).detach()  # (d, d)
    y = ln(z).detach()
    N = normdirs.layernorm_null_basis(y, ln.weight.detach(), ln.bias.detach())  # (d, 2)
    assert N.shape == (d, 2)
    torch.testing.assert_close(N.T @ N, torch.eye(2, dtype=torch.float64), atol=1e-12, rtol=0)
    # every row direction of the LayerNorm's Jacobian in N is zero ...
    assert float((N.T @ J).abs().max()) < 1e-9 * float(J.abs().max())
    # ... and N is all of the left null space: J has rank d - 2
    assert int(torch.linalg.matrix_rank(J, rtol=1e-9)) == d - 2
    assert normdirs.is_layernorm_output(y, ln.weight, ln.bias)


def test_post_ln_block_rows_in_n_are_minus_the_identity() -> None:
    block, x = _bert_block_and_input()
    ln = normdirs.output_layernorm(block)
    assert ln is block.output.LayerNorm
    y = _block_out(block, x).detach()  # (n, d)
    assert normdirs.is_layernorm_output(y, ln.weight, ln.bias)
    t = 3
    J = _block_jacobian(block, x, t, t)
    N = normdirs.layernorm_null_basis(y[t], ln.weight, ln.bias)
    # the rows of J_tt in N are exactly -Pi_N: the skip connection, whatever the weights
    torch.testing.assert_close(N.T @ J, -N.T, atol=1e-9, rtol=0)
    Jp = normdirs.project_rows(J, N)
    torch.testing.assert_close(Jp, J + N @ N.T, atol=1e-9, rtol=0)
    torch.testing.assert_close(N.T @ Jp, torch.zeros_like(N.T), atol=1e-9, rtol=0)
    # off-diagonal Jacobians have no identity: their rows in N_{t_out} vanish, projection = no-op
    J21 = _block_jacobian(block, x, 1, t)
    torch.testing.assert_close(normdirs.project_rows(J21, N), J21, atol=1e-9, rtol=0)


def test_pre_ln_block_output_is_not_a_layernorm_output() -> None:
    model = tiny_model("gpt2", dtype=torch.float64)
    with torch.no_grad():
        out = model(**tiny_inputs("gpt2", n=5), output_hidden_states=True)
    block = model.h[0]
    ln = normdirs.output_layernorm(block)
    assert ln is block.ln_2  # the last LayerNorm of a pre-LN block is inside the branch
    y = out.hidden_states[1][0]  # block 1's output (n, d)
    assert not normdirs.is_layernorm_output(y, ln.weight, ln.bias)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(2, 20), m=st.integers(1, 5))
def test_projected_operator_equals_the_projected_matrix(seed: int, d: int, m: int) -> None:
    g = torch.Generator().manual_seed(seed)
    J = torch.randn(d, d, generator=g, dtype=torch.float64)
    r = min(2, d)
    N, _ = torch.linalg.qr(torch.randn(d, r, generator=g, dtype=torch.float64))
    op = normdirs.ProjectedOperator(DenseOperator(J), N)
    V = torch.randn(d, m, generator=g, dtype=torch.float64)
    Q = torch.eye(d, dtype=torch.float64) - N @ N.T
    torch.testing.assert_close(op.matmat(V), Q @ J @ V)
    torch.testing.assert_close(op.rmatmat(V), (Q @ J).T @ V)


def test_zero_layernorm_weight_is_a_clear_error() -> None:
    w = torch.ones(4, dtype=torch.float64)
    w[2] = 0
    with pytest.raises(BlockCouplingError, match="zero weight"):
        normdirs.layernorm_null_basis(torch.randn(4, dtype=torch.float64), w, None)
