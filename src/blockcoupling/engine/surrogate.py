"""A differentiable estimate of depth-wise coupling, cheap enough to train with.

The engine's coupling ``c_K`` needs each block's top-K singular vectors (an SVD per block and
input): exact, but not a term a loss can carry at every step. This module estimates a
related quantity from a few Jacobian-vector products (``torch.func.jvp``), differentiable
with respect to the model's parameters.

**What it estimates.** For blocks l and l' at one token t of one input, with
``J^l = J^l_{tt}`` (DEFINITIONS.md, "Block Jacobians") and its traceless part
``T^l = J^l - (tr(J^l)/d) I``, the *traceless alignment*

    rho_{l l'} = <T^l, T^{l'}>_F / (||T^l||_F ||T^{l'}||_F)     (in [-1, 1])

is the cosine between the two Jacobians once their isotropic parts are removed. It is 1
when ``T^{l'}`` is a positive multiple of ``T^l`` (same singular vectors and the same
spectrum shape: the engine's coupling is then 1 too, up to the isotropic part), near 0 for
unrelated Jacobians, and by von Neumann's trace inequality it reaches its bound only when the
two share their singular vectors in order, which is what coupling measures. Removing
``tr(J)/d I`` is what ``coupling_vs_rotated`` does to the null (for ``J = c I + G`` the
alignment of the isotropic parts is not counted: ``T = G``). It is not ``c_K``: it weights
every direction by its squared singular values instead of taking the top K, and it compares
spectra as well as vectors; `blockcoupling.studies.vit` checks it against the engine's
coupling on trained models, and the intervention study measures with the engine.

**The estimator.** With an orthonormal frame ``Q`` (d x m, ``Q^T Q = I``) drawn at random
(Haar), ``(d/m) tr(Q^T A Q)`` is unbiased for ``tr(A)``: so ``t^l = tr(Q^T J^l Q)/m`` estimates
``tr(J^l)/d``, the columns ``P^l = J^l Q - t^l Q`` give ``(d/m) tr(P^{lT} P^{l'})``
for ``<T^l, T^{l'}>_F`` (up to the trace estimate's own error), and the ratio estimates
``rho`` (consistent; exact when m = d, whatever the frame). One JVP per block and direction,
at the block's recorded input, with the tangent at token t only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import jvp, vmap

from blockcoupling.engine.capture import replay_context
from blockcoupling.errors import BlockCouplingError

__all__ = ["alignment_from_products", "block_products", "depth_alignment", "mean_offdiagonal",
           "random_frame"]


def random_frame(d: int, m: int, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """A Haar-random orthonormal frame (d, m) (QR of a Gaussian matrix, signs fixed by R's
    diagonal so the distribution is Haar)."""
    if not 1 <= m <= d:
        raise BlockCouplingError(f"directions m = {m}: give 1 <= m <= d = {d}")
    G = torch.randn(d, m, generator=generator, dtype=torch.float64)
    Q, R = torch.linalg.qr(G)
    return (Q * torch.sign(torch.diagonal(R))).to(dtype)


def block_products(branches: Sequence[Callable[[Tensor], Tensor]], inputs: Sequence[Tensor],
                   token: int, frame: Tensor) -> Tensor:
    """``J^l_{tt} Q`` for every block: ``branches[l]`` maps a hidden input (B, n, d) to its
    residual branch (B, n, d), ``inputs[l]`` is its input (B, n, d) (differentiable: the
    products carry the graph to the parameters), ``frame`` Q (d, m). Returns (B, L, d, m)."""
    if len(branches) != len(inputs) or not branches:
        raise BlockCouplingError("give one input per block branch (at least one block)")
    n = inputs[0].shape[-2]
    if not -n <= token < n:
        raise BlockCouplingError(f"token {token} is outside the {n} positions of the input")
    out = []
    with replay_context():  # the SDPA math backend: forward-mode AD through attention
        for f, x in zip(branches, inputs, strict=True):
            tangents = x.new_zeros((frame.shape[1], *x.shape))
            tangents[:, :, token, :] = frame.T.to(x.dtype)[:, None, :]
            jq = vmap(lambda t, f=f, x=x: jvp(f, (x,), (t,))[1])(tangents)  # (m, B, n, d)
            out.append(jq[:, :, token, :].permute(1, 2, 0))  # (B, d, m)
    return torch.stack(out, 1)


def alignment_from_products(products: Tensor, frame: Tensor, eps: float = 1e-12) -> Tensor:
    """The traceless alignment ``rho`` (B, L, L) from ``J^l Q`` (B, L, d, m) and Q (d, m):
    the module's estimator (exact for m = d)."""
    Q = frame.to(products.dtype)
    m = Q.shape[1]
    trace = torch.einsum("bldm,dm->bl", products, Q) / m  # tr(J)/d
    P = products - trace[..., None, None] * Q
    G = torch.einsum("bldm,bkdm->blk", P, P)
    norm = torch.sqrt(torch.diagonal(G, dim1=-2, dim2=-1).clamp_min(eps))
    return G / (norm[..., :, None] * norm[..., None, :])


def mean_offdiagonal(rho: Tensor) -> Tensor:
    """The mean of ``rho`` (..., L, L) over pairs l != l' (the depth-wise aggregate, as
    ``mean_depth_coupling``); a scalar per leading index, averaged over all of them."""
    L = rho.shape[-1]
    if L < 2:
        raise BlockCouplingError("depth-wise alignment needs at least 2 blocks")
    off = ~torch.eye(L, dtype=torch.bool, device=rho.device)
    return rho[..., off].mean()


def depth_alignment(model: nn.Module, blocks: Sequence[nn.Module], forward: Callable[[], object],
                    token: int, frame: Tensor) -> Tensor:
    """The traceless alignment (B, L, L) of ``model``'s ``blocks`` at ``token``, in eval mode
    (no drop-path), differentiable: ``forward()`` runs the model on the inputs (their block
    inputs are recorded by pre-hooks), then `block_products` at those inputs. The model's
    train/eval mode is restored."""
    inputs: list[Tensor] = []

    def keep(_module: nn.Module, args: tuple[Tensor, ...]) -> None:
        inputs.append(args[0])

    was = model.training
    handles = [b.register_forward_pre_hook(keep) for b in blocks]
    model.eval()
    try:
        try:
            forward()
        finally:
            for h in handles:
                h.remove()
        if len(inputs) != len(blocks):
            raise BlockCouplingError(f"the forward pass reached {len(inputs)} of "
                                     f"{len(blocks)} blocks once each")

        def branch(b: nn.Module) -> Callable[[Tensor], Tensor]:
            def f(x: Tensor) -> Tensor:
                out = b(x)
                return (out[0] if isinstance(out, tuple) else out) - x
            return f

        return alignment_from_products(
            block_products([branch(b) for b in blocks], inputs, token, frame), frame)
    finally:
        model.train(was)
