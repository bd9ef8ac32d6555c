"""Removing the output LayerNorm's directions from a post-LN block's Jacobian.

Option ``remove_norm_directions`` of
[`MeasureConfig`][blockcoupling.engine.config.MeasureConfig]; derivation and measurements in
docs/conventions.md ("Post-LN blocks"). A block whose output is a LayerNorm has every row of
``dF_t`` in ``N_t = span{1 / g, zhat_t / g}`` equal to zero, so its diagonal Jacobian
``J_tt = dF_t/dx_t - I`` is ``-Pi_N`` there: the skip connection's identity, whatever the
weights. ``Q_N J`` with ``Q_N = I - Pi_N`` (N of the output token) removes exactly that term;
off-diagonal Jacobians are unchanged by it. Pure tensor code; `blockcoupling.engine.measure`
applies it to the dense Jacobians and the matrix-free operators before their SVD.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from blockcoupling.engine.svd import LinearOperator
from blockcoupling.errors import BlockCouplingError

__all__ = [
    "ProjectedOperator",
    "block_null_bases",
    "is_layernorm_output",
    "layernorm_null_basis",
    "output_layernorm",
    "project_rows",
]

#: How far a block output may be from an exact LayerNorm output and still count as one:
#: |mean(zhat)| and |mean(zhat^2) - 1| per token (float32 rounding and a LayerNorm eps of up to
#: ~1 % of the variance stay well inside).
LAYERNORM_TOL = 2e-2


def _affine(weight: Tensor | None, bias: Tensor | None, y: Tensor) -> tuple[Tensor, Tensor]:
    d = y.shape[-1]
    g = weight.to(y) if weight is not None else torch.ones(d, dtype=y.dtype, device=y.device)
    b = bias.to(y) if bias is not None else torch.zeros(d, dtype=y.dtype, device=y.device)
    if g.shape != (d,) or b.shape != (d,):
        raise BlockCouplingError(
            f"remove_norm_directions: the LayerNorm's weight/bias have shapes "
            f"{tuple(g.shape)}/{tuple(b.shape)}, not ({d},); it does not normalise the hidden size"
        )
    return g, b


def normalised_state(y: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """``zhat = (y - b) / g``: the LayerNorm's normalised input recovered from its output y
    (..., d). Raises if a weight entry is zero (the null space then has more directions)."""
    g, b = _affine(weight, bias, y)
    if bool((g == 0).any()):
        raise BlockCouplingError(
            "remove_norm_directions: the block's output LayerNorm has a zero weight entry; the "
            "normalisation directions are not defined there. Measure without the option."
        )
    return (y - b) / g  # (..., d)


def is_layernorm_output(y: Tensor, weight: Tensor | None, bias: Tensor | None,
                        tol: float = LAYERNORM_TOL) -> bool:
    """Whether every row of y (..., d) is an output of the LayerNorm (weight, bias): its
    normalised state ``zhat`` has mean 0 and mean square 1 up to ``tol``."""
    zh = normalised_state(y.double(), None if weight is None else weight.double(),
                          None if bias is None else bias.double())
    mean = zh.mean(-1).abs()  # (...,)
    msq = (zh * zh).mean(-1)  # (...,)
    return bool((mean <= tol).all() and ((msq - 1).abs() <= tol).all())


def layernorm_null_basis(y: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """Orthonormal basis of ``N = span{1 / g, zhat / g}`` for each output row y (..., d).

    N is the left null space of the LayerNorm's Jacobian at that output (module docstring).
    Returns (..., d, 2), in y's dtype; columns from a QR of ``[1/g, zhat/g]``.
    """
    g, _ = _affine(weight, bias, y)
    zh = normalised_state(y, weight, bias)  # (..., d)
    ones = torch.ones_like(zh) / g  # (..., d)
    M = torch.stack([ones, zh / g], dim=-1)  # (..., d, 2)
    Q, _ = torch.linalg.qr(M)  # (..., d, 2)
    return Q


def project_rows(J: Tensor, N: Tensor) -> Tensor:
    """``Q_N J = J - N (N^T J)``: J (..., d, m) with its rows in span(N) removed; N (..., d, r)
    orthonormal."""
    return J - N @ (N.mT @ J)


class ProjectedOperator:
    """``Q_N J`` for a matrix-free operator J (``matmat``/``rmatmat``, see `svd`)."""

    def __init__(self, op: LinearOperator, N: Tensor) -> None:
        self.op = op
        self.N = N.to(op.dtype)  # (d, r)
        self.d: int = op.d
        self.dtype: torch.dtype = op.dtype
        self.device: torch.device = op.device

    @property
    def shape(self) -> tuple[int, int]:
        return (self.d, self.d)

    def matmat(self, V: Tensor) -> Tensor:
        """(d, m) -> (d, m) = Q_N J V."""
        return project_rows(self.op.matmat(V), self.N.to(V.device))

    def rmatmat(self, U: Tensor) -> Tensor:
        """(d, m) -> (d, m) = J^T Q_N U."""
        return self.op.rmatmat(project_rows(U, self.N.to(U.device)))

    def jacobian(self) -> Tensor:
        """The dense ``Q_N J`` where the wrapped operator has ``jacobian()`` (the fast path)."""
        dense = getattr(self.op, "jacobian", None)
        if dense is None:
            raise AttributeError(f"{type(self.op).__name__} has no dense jacobian()")
        return project_rows(dense(), self.N)


def _detached(module: nn.Module | None, name: str) -> Tensor | None:
    """``module.<name>`` detached, or None where the module or that tensor is missing."""
    value = getattr(module, name, None) if module is not None else None
    return value.detach() if isinstance(value, Tensor) else None


def output_layernorm(block: nn.Module) -> nn.LayerNorm | None:
    """The last ``nn.LayerNorm`` among the block's submodules (registration order), or None.

    For a post-LN block (BERT, RoBERTa, original Transformer) it is the norm that produces the
    block's output; whether it really does is checked on the data with
    `is_layernorm_output`.
    """
    last = None
    for module in block.modules():
        if isinstance(module, nn.LayerNorm):
            last = module
    return last


def block_null_bases(model: nn.Module, cap: Any, layer: int, prompt: int, *,
                     dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> Tensor:
    """``N_t`` for every position t of block ``layer``'s output for ``prompt``: (n, d, 2).

    The output norm is the folded final norm for the last block of a ``final_norm`` capture,
    else the block's last ``nn.LayerNorm``; the recorded output must be that norm's output at
    every real token (`is_layernorm_output`), otherwise the block is not post-LN and this
    raises [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError]. ``cap`` is a `Capture`.
    """
    from blockcoupling.engine.blocks import get_blocks, get_module
    from blockcoupling.engine.offload import materialize  # offloaded weights: a loaded copy

    folded = cap.final_norm and layer == cap.n_layers and cap.spec.final_norm_path
    norm: nn.Module | None
    if folded:
        norm = materialize(get_module(model, cap.spec.final_norm_path))
        y = cap.final_output[prompt]  # (n, d)
    else:
        norm = output_layernorm(materialize(get_blocks(model, cap.spec)[layer - 1]))
        y = cap.calls[layer - 1].output[prompt]  # (n, d)
    real = cap.valid[prompt].to(y.device)  # (n,)
    w, b = _detached(norm, "weight"), _detached(norm, "bias")
    if norm is None or not is_layernorm_output(y[real], w, b):
        where = "has no nn.LayerNorm" if norm is None else "does not end in its last LayerNorm"
        raise BlockCouplingError(
            f"remove_norm_directions: block {layer} {where} (it is not a post-LN block, e.g. a "
            "pre-LN GPT-2/Llama block, whose Jacobian has no normalisation directions to "
            "remove); measure it without the option"
        )
    dev = torch.device(device) if device is not None else y.device
    cast = (lambda t: None if t is None else t.to(dev, dtype))  # noqa: E731
    return layernorm_null_basis(y.detach().to(dev, dtype), cast(w), cast(b))  # (n, d, 2)
