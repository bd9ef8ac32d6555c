"""Block Jacobians of a residual branch: dense blocks (batched VJP / JVP) and matrix-free operators.

For ``f: (n, d) -> (n, d)`` (`blockcoupling.engine.capture.residual_branch`) the Jacobian block
``J_{t1 t2} = d f(x)_{t2} / d x_{t1}`` is a (d, d) matrix with rows = output coordinates
(token t2) and columns = input coordinates (token t1) (DEFINITIONS.md "Block Jacobians").

* `jacobian_blocks` -- reverse mode: one forward pass (``torch.func.vjp``), then the
  vjp function is applied under ``vmap`` to one-hot cotangents: the cotangent ``e_{t2, a}``
  gives row ``a`` of ``J_{t1 t2}`` for *every* input token t1 at once. ``forward=True``:
  ``torch.func.jvp`` under ``vmap`` with one-hot tangents: the tangent ``e_{t1, b}`` gives
  column ``b`` of ``J_{t1 t2}`` for every output token t2 at once (``fixed_input``).
* `JacobianOperator` -- matrix-free ``J_{t_in t_out}``: ``matmat`` by batched JVP,
  ``rmatmat`` by batched VJP (forward pass done once, vjp function reused).

Cotangent / tangent batches are chunked to a memory budget (``chunk_size`` or a default from
`DEFAULT_MEMORY_BYTES`). Every call runs in `blockcoupling.engine.capture.replay_context`
(SDPA math backend) so that forward-mode AD and vmap work for every attention layer, and
under ``torch.no_grad`` so that no graph towards the model's parameters is recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor
from torch.func import jvp, vjp, vmap

from blockcoupling.engine.capture import replay_context
from blockcoupling.errors import BlockCouplingError, NumericalError

__all__ = [
    "check_finite",
    "check_positions",
    "DEFAULT_MEMORY_BYTES",
    "JacobianOperator",
    "default_chunk_size",
    "vectors_in_budget",
    "jacobian_blocks",
    "jacobian_operator",
]

#: Default memory budget for one batch of cotangents / tangents (bytes).
DEFAULT_MEMORY_BYTES: int = 1 << 30
# Rough number of (n, d)-sized activations a transformer block keeps per batch element
# (attention, a 4x MLP, norms) plus the per-head (n, n) attention matrices.
_ACTIVATION_FACTOR: int = 32

Fn = Callable[[Tensor], Tensor]


@contextlib.contextmanager
def _autodiff_context() -> Iterator[None]:
    """SDPA math backend, and no outer autograd graph towards the model's parameters.

    ``torch.func`` transforms differentiate with respect to their inputs whatever the outer
    grad mode; ``no_grad`` only stops autograd from also recording the (unused) dependence on
    parameters that have ``requires_grad=True``, which would keep every activation alive.
    """
    with replay_context(), torch.no_grad():
        yield


def as_columns(M: Tensor, d: int, device: torch.device, dtype: torch.dtype, name: str) -> Tensor:
    """``M`` as a block of column vectors (d, m) on ``device`` in ``dtype`` (a vector is one
    column); a clear error for any other shape. Shared by the matrix-free operators."""
    if M.ndim == 1:
        M = M[:, None]
    if M.ndim != 2 or M.shape[0] != d:
        raise BlockCouplingError(f"{name} must have shape (d, m) with d={d}; got {tuple(M.shape)}.")
    return M.to(device, dtype)


def default_chunk_size(
    n: int, d: int, dtype: torch.dtype, memory_bytes: int = DEFAULT_MEMORY_BYTES
) -> int:
    """Batch size of one-hot (co)tangents that fits ``memory_bytes`` (at least 1)."""
    itemsize = torch.finfo(dtype).bits // 8
    per_vector = itemsize * (_ACTIVATION_FACTOR * n * d + 4 * n * n)
    return vectors_in_budget(per_vector, memory_bytes)


def vectors_in_budget(per_vector_bytes: int, memory_bytes: int, most: int | None = None) -> int:
    """How many (co)tangent vectors of ``per_vector_bytes`` each fit ``memory_bytes`` (at least
    1, at most ``most``): the one chunking rule; callers differ only in what a vector costs."""
    fit = int(memory_bytes // max(per_vector_bytes, 1))
    return max(1, fit if most is None else min(most, fit))


def check_positions(tokens: Sequence[int] | None, n: int, what: str) -> list[int]:
    """Real 0-based positions (``None`` = all n) in range and not empty: the one token check
    of the Jacobian code (``fastpath`` uses it too)."""
    toks = list(range(n)) if tokens is None else [int(t) for t in tokens]
    bad = [t for t in toks if not 0 <= t < n]
    if bad:
        raise BlockCouplingError(f"{what} {bad} out of range: the prompt has positions 0..{n - 1}.")
    if not toks:
        raise BlockCouplingError(f"{what} is empty; give at least one token position.")
    return toks


def all_finite(J: Tensor) -> bool:
    """Whether every entry of J is finite: its 2-norm is finite exactly when they are, unless
    the sum of squares overflows, and only then is every entry tested (no (..., d, d) mask)."""
    return bool(torch.isfinite(torch.linalg.vector_norm(J))) or bool(torch.isfinite(J).all())


def check_finite(J: Tensor, what: str) -> Tensor:
    """``J`` unchanged, or a NumericalError that says what to do (the one finite check of the
    Jacobian code)."""
    if not all_finite(J):
        raise NumericalError(
            f"the {what} contains NaN or inf. Use a wider analysis dtype (dtype=torch.float64) "
            "or check the model's hidden states."
        )
    return J


def _one_hot(idx: Tensor, tokens: Tensor, n: int, d: int, like: Tensor) -> Tensor:
    """(m, n, d) one-hot vectors e_{tokens[i], coord[i]} for flat indices ``idx`` into (tokens x d)."""
    m = idx.numel()
    out = torch.zeros(m, n, d, dtype=like.dtype, device=like.device)
    tok = tokens[idx // d]
    coord = idx % d
    out[torch.arange(m, device=like.device), tok, coord] = 1
    return out


def _check_x(x: Tensor) -> tuple[int, int]:
    if x.ndim != 2:
        raise BlockCouplingError(
            f"x must be one prompt's hidden states (n, d); got shape {tuple(x.shape)}."
        )
    if not x.is_floating_point():
        raise BlockCouplingError(f"x must be a floating tensor; got {x.dtype}.")
    return int(x.shape[0]), int(x.shape[1])


def _block_setup(x: Tensor, out_tokens: Sequence[int] | None, in_tokens: Sequence[int] | None,
                 chunk_size: int | None, memory_bytes: int
                 ) -> tuple[int, int, list[int], list[int], Tensor, Tensor, int]:
    """Checked shapes and token lists, their index tensors, and the batch size of (co)tangents."""
    n, d = _check_x(x)
    outs = check_positions(out_tokens, n, "out_tokens")
    ins = check_positions(in_tokens, n, "in_tokens")
    chunk = chunk_size or default_chunk_size(n, d, x.dtype, memory_bytes)
    return (n, d, outs, ins, torch.tensor(outs, device=x.device),
            torch.tensor(ins, device=x.device), chunk)


def jacobian_blocks(
    f: Fn,
    x: Tensor,
    out_tokens: Sequence[int] | None = None,
    *,
    in_tokens: Sequence[int] | None = None,
    forward: bool = False,
    chunk_size: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> Tensor:
    """Dense Jacobian blocks by batched VJPs, or JVPs (``forward``).

    Returns J of shape (len(out_tokens), len(in_tokens), d, d) with
    ``J[i, j] = d f(x)[out_tokens[i]] / d x[in_tokens[j]]`` (rows = output coordinates).
    ``None`` means every position 0..n-1. By VJPs: one forward pass in total, the
    len(out_tokens) * d one-hot cotangents through ``vmap(vjp_fn)``; by JVPs: the
    len(in_tokens) * d one-hot tangents through ``vmap(jvp)``, each a column for every output
    token at once (fewer batches where there are fewer input tokens). In chunks of
    ``chunk_size`` (default from ``memory_bytes``).
    """
    return _dense_blocks(f, x, out_tokens, in_tokens, chunk_size, memory_bytes, forward=forward)


def _dense_blocks(f: Fn, x: Tensor, out_tokens: Sequence[int] | None,
                  in_tokens: Sequence[int] | None, chunk_size: int | None, memory_bytes: int,
                  *, forward: bool) -> Tensor:
    """`jacobian_blocks`: ``forward=False`` one-hot cotangents at the output tokens, each
    pulled back to a row e_i^T J at every input token; ``forward=True`` one-hot tangents at
    the input tokens, each pushed forward to a column J e_i at every output token."""
    n, d, outs, ins, out_t, in_t, chunk = _block_setup(x, out_tokens, in_tokens, chunk_size,
                                                        memory_bytes)
    seeds, kept = (in_t, out_t) if forward else (out_t, in_t)
    with _autodiff_context():
        if forward:
            apply = vmap(lambda v: jvp(f, (x,), (v,))[1])
        else:
            pullback = vjp(f, x)[1]  # one forward pass: (f(x), pullback)
            apply = vmap(lambda v: pullback(v)[0])
        total = len(seeds) * d
        parts = [apply(_one_hot(torch.arange(start, min(start + chunk, total), device=x.device),
                                seeds, n, d, x)).index_select(1, kept)  # (m, len(kept), d)
                 for start in range(0, total, chunk)]
    G = torch.cat(parts).reshape(len(seeds), d, len(kept), d)  # (seed, ., kept, .)
    J = G.permute(2, 0, 3, 1) if forward else G.permute(0, 2, 1, 3)  # (out, in, a, b)
    return check_finite(J.contiguous(), "Jacobian")


class JacobianOperator:
    """Matrix-free ``J = J_{t_in t_out}`` (d, d) of ``f`` at ``x``.

    ``matmat(V)`` = J V by batched JVP (one ``vmap(jvp)`` per chunk of columns);
    ``rmatmat(U)`` = J^T U by batched VJP (the forward pass is done once, on first use, and
    the vjp function is reused).
    """

    def __init__(
        self,
        f: Fn,
        x: Tensor,
        token_in: int,
        token_out: int,
        *,
        chunk_size: int | None = None,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        n, d = _check_x(x)
        self.token_in: int = check_positions([token_in], n, "token_in")[0]
        self.token_out: int = check_positions([token_out], n, "token_out")[0]
        self.f = f
        self.x = x
        self.n = n
        self.d: int = d
        self.dtype: torch.dtype = x.dtype
        self.device: torch.device = x.device
        self.chunk_size: int = chunk_size or default_chunk_size(n, d, x.dtype, memory_bytes)
        self._vjp_fn: Callable[[Tensor], tuple[Tensor, ...]] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.d, self.d)

    def _check_block(self, M: Tensor, name: str) -> Tensor:
        return as_columns(M, self.d, self.device, self.dtype, name)

    def matmat(self, V: Tensor) -> Tensor:
        """(d, m) -> (d, m) = J V."""
        with _autodiff_context():
            push = vmap(lambda v: jvp(self.f, (self.x,), (v,))[1])
            return self._products(push, self._check_block(V, "V"), self.token_in,
                                  self.token_out, "Jacobian-vector product")

    def rmatmat(self, U: Tensor) -> Tensor:
        """(d, m) -> (d, m) = J^T U."""
        with _autodiff_context():
            if self._vjp_fn is None:
                self._vjp_fn = vjp(self.f, self.x)[1]  # (f(x), pullback)
            vjp_fn = self._vjp_fn
            return self._products(vmap(lambda u: vjp_fn(u)[0]), self._check_block(U, "U"),
                                  self.token_out, self.token_in, "vector-Jacobian product")

    def _products(self, apply: Callable[[Tensor], Tensor], M: Tensor, at: int, read: int,
                  what: str) -> Tensor:
        """``apply`` (a batched JVP or VJP) on the columns of M (d, m) placed at token ``at``,
        read at token ``read``, in chunks: (d, m)."""
        outs: list[Tensor] = []
        for start in range(0, M.shape[1], self.chunk_size):
            Mc = M[:, start : start + self.chunk_size].T  # (c, d)
            vec = torch.zeros(Mc.shape[0], self.n, self.d, dtype=self.dtype, device=self.device)
            vec[:, at, :] = Mc
            outs.append(apply(vec)[:, read, :])  # (c, d)
        return check_finite(torch.cat(outs).T, what)  # (d, m)

    def matvec(self, v: Tensor) -> Tensor:
        """(d,) -> (d,) = J v."""
        return self.matmat(v[:, None])[:, 0]

    def rmatvec(self, u: Tensor) -> Tensor:
        """(d,) -> (d,) = J^T u."""
        return self.rmatmat(u[:, None])[:, 0]


#: the matrix-free operator for ``J_{token_in token_out}`` of ``f`` at ``x``
jacobian_operator = JacobianOperator
