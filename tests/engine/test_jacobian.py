"""Jacobian blocks of every tiny architecture against autograd oracles, operators, padding,
final norm, the real MiniLM, float32 analysis, chunking and errors."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd.functional import jacobian as autograd_jacobian
from torch.nn.attention import SDPBackend, sdpa_kernel

from blockcoupling.engine.blocks import find_blocks, get_blocks, get_module
from blockcoupling.engine.capture import capture, residual_branch
from blockcoupling.engine.jacobian import (
    JacobianOperator,
    jacobian_blocks,
    jacobian_operator,
)
from blockcoupling.errors import BlockCouplingError, NumericalError
from tests.helpers.oracles import call_block_oracle
from tests.helpers.tiny_models import ALL, CAUSAL, ENCODERS, minilm_path, tiny_inputs, tiny_model


def _oracle_blocks(model, cap, layer: int, *, forward: bool = False, norm=None) -> torch.Tensor:
    """(n, n, d, d) oracle J[t2, t1] from autograd on the block called on (1, n, d) directly."""
    call = cap.calls[layer - 1]
    g = call_block_oracle(
        get_blocks(model, cap.spec)[layer - 1], call.args, call.kwargs, call.hidden
    )
    if norm is not None:
        g0 = g
        g = lambda h: norm(g0(h) + h) - h  # noqa: E731
    x = call.input.detach().clone()  # (1, n, d)
    if forward:
        with sdpa_kernel(SDPBackend.MATH):
            Jfull = autograd_jacobian(g, x, vectorize=True, strategy="forward-mode")
    else:
        Jfull = autograd_jacobian(g, x, vectorize=True)  # (1, n, d, 1, n, d)
    return Jfull[0, :, :, 0].permute(0, 2, 1, 3)  # (t2, t1, a, b)


def _close(A: torch.Tensor, B: torch.Tensor, tol: float) -> None:
    scale = max(1.0, B.abs().max().item())
    err = (A - B).abs().max().item()
    assert err <= tol * scale, f"max error {err:.3g} > {tol:.1g} * {scale:.3g}"


@pytest.mark.parametrize("arch", sorted(ALL))
def test_jacobian_blocks_match_oracle(arch: str, tiny64) -> None:
    model, spec, cap = tiny64(arch)
    n = cap.boundaries.shape[2]
    gen = torch.Generator().manual_seed(0)
    for layer in range(1, spec.num_layers + 1):
        f, x = residual_branch(model, cap, layer, 0, dtype=torch.float64)
        J = jacobian_blocks(f, x, range(n))  # (n, n, d, d)
        oracle = _oracle_blocks(model, cap, layer)
        assert J.shape == oracle.shape == (n, n, x.shape[1], x.shape[1])
        _close(J, oracle, 1e-8)
        # forward mode: exact against a forward-mode oracle; HF upcasts some ops to float32
        # (RMSNorm, eager softmax), which limits forward vs reverse agreement to float32 level.
        Jf = jacobian_blocks(f, x, in_tokens=range(n), forward=True)
        _close(Jf, _oracle_blocks(model, cap, layer, forward=True), 1e-8)
        _close(Jf, oracle, 1e-6)
        norms = J.flatten(2).norm(dim=2)  # (t2, t1)
        for t2 in range(n):
            for t1 in range(n):
                if arch in CAUSAL and t1 > t2:
                    assert norms[t2, t1] == 0  # exact zero: no information flows backwards
                elif arch == "gpt_neo" and t2 - t1 >= model.config.window_size:
                    pass  # GPT-Neo's local-attention layer does not see that far back
                else:
                    assert norms[t2, t1] > 1e-6
        # matrix-free operator against the dense blocks
        for t_in, t_out in [(0, n - 1), (n - 1, n - 1), (1, 2)]:
            op = jacobian_operator(f, x, t_in, t_out)
            V = torch.randn(x.shape[1], 3, generator=gen, dtype=torch.float64)
            # random (not one-hot) directions go through HF's float32 upcasts: float32 level
            # here; exactness of the operator is tested on the analytic oracle below
            _close(op.matmat(V), J[t_out, t_in] @ V, 1e-6)
            _close(op.rmatmat(V), J[t_out, t_in].T @ V, 1e-6)


@pytest.mark.parametrize("arch", sorted(set(ALL) - {"bert"}))
def test_final_norm_changes_only_last_layer(arch: str, tiny64) -> None:
    model, spec, cap = tiny64(arch)
    capn = capture(model, tiny_inputs(arch, n=5), spec, final_norm=True)
    L, n = spec.num_layers, cap.boundaries.shape[2]
    for layer in range(1, L + 1):
        f, x = residual_branch(model, cap, layer, 0, dtype=torch.float64)
        fn, xn = residual_branch(model, capn, layer, 0, dtype=torch.float64)
        J, Jn = jacobian_blocks(f, x, range(n)), jacobian_blocks(fn, xn, range(n))
        if layer < L:
            torch.testing.assert_close(Jn, J, rtol=0, atol=0)
        else:
            norm = get_module(model, spec.final_norm_path)
            _close(Jn, _oracle_blocks(model, capn, layer, norm=norm), 1e-8)
            assert (Jn - J).abs().max() > 1e-3


@pytest.mark.parametrize("arch", sorted(set(CAUSAL) | set(ENCODERS)))
def test_padding_gives_same_jacobians_as_alone(arch: str) -> None:
    model = tiny_model(arch, dtype=torch.float64)
    spec = find_blocks(model)
    ids = tiny_inputs(arch, n=6, batch=2, seed=1)["input_ids"]
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    cap = capture(model, {"input_ids": ids, "attention_mask": mask}, spec)
    for prompt, length in enumerate(cap.lengths):
        alone = capture(model, {"input_ids": ids[prompt : prompt + 1, :length]}, spec)
        for layer in (1, spec.num_layers):
            f, x = residual_branch(model, cap, layer, prompt, dtype=torch.float64)
            fa, xa = residual_branch(model, alone, layer, 0, dtype=torch.float64)
            J = jacobian_blocks(f, x, range(length), in_tokens=range(length))
            Ja = jacobian_blocks(fa, xa, range(length))
            _close(J, Ja, 1e-10)
            if prompt == 1:  # the two prompts really differ
                f0, x0 = residual_branch(model, cap, layer, 0, dtype=torch.float64)
                J0 = jacobian_blocks(f0, x0, range(length), in_tokens=range(length))
                assert (J0 - J).abs().max() > 1e-4


def test_real_minilm_float32_weights_float64_analysis() -> None:
    model = tf.AutoModel.from_pretrained(minilm_path()).eval()
    tok = tf.AutoTokenizer.from_pretrained(minilm_path())
    spec = find_blocks(model)
    batch = tok(["the cat sat", "paris"], return_tensors="pt", padding=True)
    cap = capture(model, dict(batch), spec)
    n = cap.lengths[1]
    for layer in (1, spec.num_layers):
        f, x = residual_branch(model, cap, layer, 1, dtype=torch.float64)
        J = jacobian_blocks(f, x, range(n), in_tokens=range(n))  # (n, n, 384, 384)
        # oracle: a float64 copy of the block, the prompt's row of the recorded call in float64
        call = cap.calls[layer - 1]
        block64 = copy.deepcopy(get_blocks(model, spec)[layer - 1]).double()
        args = (call.input[1:2, :n].double(), call.args[1][1:2, :, :n, :n].double()) + call.args[2:]
        g = call_block_oracle(block64, args, call.kwargs, 0)
        Jo = autograd_jacobian(g, args[0], vectorize=True)[0, :, :, 0].permute(0, 2, 1, 3)
        _close(J, Jo, 1e-8)
        assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert"])
def test_float32_analysis_of_float64_model(arch: str, tiny64) -> None:
    model, spec, cap = tiny64(arch)
    n = cap.boundaries.shape[2]
    for layer in range(1, spec.num_layers + 1):
        f64, x64 = residual_branch(model, cap, layer, 0, dtype=torch.float64)
        f32, x32 = residual_branch(model, cap, layer, 0, dtype=torch.float32)
        J64 = jacobian_blocks(f64, x64, range(n))
        J32 = jacobian_blocks(f32, x32, range(n))
        assert J32.dtype == torch.float32
        _close(J32.double(), J64, 1e-5)
        assert (J32.double() - J64).abs().max() > 0  # really computed in float32


# ----------------------------------------------------------------------------- analytic oracle


def _analytic(n: int, d: int, seed: int):
    """f(X) = tanh(A X W): J[t2, t1][a, b] = (1 - tanh^2(Z))[t2, a] * A[t2, t1] * W[b, a]."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    W = torch.randn(d, d, generator=g, dtype=torch.float64)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)

    def f(h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(A @ h @ W)

    s = 1 - torch.tanh(A @ x @ W) ** 2  # (n, d)
    J = s[:, None, :, None] * A[:, :, None, None] * W.T[None, None, :, :]  # (t2, t1, a, b)
    return f, x, J


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5),
    d=st.integers(1, 6),
    seed=st.integers(0, 1000),
    chunk=st.integers(1, 40),
    data=st.data(),
)
def test_chunked_subsets_match_analytic(n: int, d: int, seed: int, chunk: int, data) -> None:
    f, x, J = _analytic(n, d, seed)
    outs = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))
    ins = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))
    expected = J[outs][:, ins]
    torch.testing.assert_close(
        jacobian_blocks(f, x, outs, in_tokens=ins, chunk_size=chunk), expected
    )
    torch.testing.assert_close(
        jacobian_blocks(f, x, outs, in_tokens=ins, forward=True, chunk_size=chunk), expected
    )
    op = JacobianOperator(f, x, ins[0], outs[0], chunk_size=chunk)
    assert (op.d, op.dtype, op.device.type, op.shape) == (d, torch.float64, "cpu", (d, d))
    V = torch.randn(d, 3, dtype=torch.float64)
    torch.testing.assert_close(op.matmat(V), J[outs[0], ins[0]] @ V)
    torch.testing.assert_close(op.rmatmat(V), J[outs[0], ins[0]].T @ V)
    torch.testing.assert_close(op.matvec(V[:, 0]), J[outs[0], ins[0]] @ V[:, 0])
    torch.testing.assert_close(op.rmatvec(V[:, 0]), J[outs[0], ins[0]].T @ V[:, 0])


def test_default_in_tokens_is_all() -> None:
    f, x, J = _analytic(4, 3, 0)
    torch.testing.assert_close(jacobian_blocks(f, x, [2]), J[[2]])
    torch.testing.assert_close(jacobian_blocks(f, x, in_tokens=[1], forward=True), J[:, [1]])


def test_nan_jacobian_and_bad_arguments() -> None:
    x = torch.randn(3, 2, dtype=torch.float64)
    f_nan = lambda h: h * torch.tensor(float("nan"), dtype=h.dtype)  # noqa: E731
    with pytest.raises(NumericalError):
        jacobian_blocks(f_nan, x, [0])
    with pytest.raises(NumericalError):
        jacobian_blocks(f_nan, x, in_tokens=[0], forward=True)
    with pytest.raises(NumericalError):
        jacobian_operator(f_nan, x, 0, 0).matmat(torch.ones(2, 1, dtype=torch.float64))
    with pytest.raises(NumericalError):
        jacobian_operator(f_nan, x, 0, 0).rmatmat(torch.ones(2, 1, dtype=torch.float64))
    f = torch.tanh
    with pytest.raises(BlockCouplingError, match="out of range"):
        jacobian_blocks(f, x, [3])
    with pytest.raises(BlockCouplingError, match="empty"):
        jacobian_blocks(f, x, [])
    with pytest.raises(BlockCouplingError, match=r"\(n, d\)"):
        jacobian_blocks(f, x[None], [0])
    with pytest.raises(BlockCouplingError, match="shape"):
        jacobian_operator(f, x, 0, 0).matmat(torch.ones(5, 1, dtype=torch.float64))


@given(per=st.integers(0, 10**10), mem=st.integers(0, 2**34), most=st.none() | st.integers(1, 4096))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_vectors_in_budget_is_the_largest_batch_that_fits(per: int, mem: int, most: int | None) -> None:
    """The one chunking rule: at least 1, at most ``most``, and the largest count that fits."""
    from blockcoupling.engine.jacobian import vectors_in_budget

    n = vectors_in_budget(per, mem, most)
    assert n >= 1 and (most is None or n <= most)
    if n > 1:
        assert n * max(per, 1) <= mem
    if most is None or n < most:
        assert (n + 1) * max(per, 1) > mem


def test_all_finite_is_exact_where_the_norm_overflows() -> None:
    """The cheap test (the 2-norm) decides only where it is finite; a huge finite entry whose
    square overflows float32 is still finite, and NaN / inf anywhere are caught."""
    from blockcoupling.engine.jacobian import all_finite

    J = torch.randn(6, 6)
    assert all_finite(J)
    J[2, 3] = 3e38  # finite, but its square overflows: the norm is inf
    assert not bool(torch.isfinite(torch.linalg.vector_norm(J)))
    assert all_finite(J)
    for bad in (float("nan"), float("inf"), -float("inf")):
        K = torch.randn(6, 6)
        K[5, 0] = bad
        assert not all_finite(K)
