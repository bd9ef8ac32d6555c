"""The logit lens: the entropy of the next-token distribution read off every layer (paper
fig. 24; the paper does not say how, this is the standard lens, docs/conventions.md):

    H^l_t = -sum_v p^l_t[v] ln p^l_t[v],   p^l_t = softmax(W_U N(x^l_t))   (nats)

for every boundary x^l (l = 0..L) and real token, ``N`` the model's final norm (not applied
again at l = L under ``final_norm=True``) and ``W_U`` its unembedding with its bias. `entropy`
is the formula, `lens_entropy` the read-out of a captured batch, and `readout` finds ``N`` and
``W_U`` on a model (one line saying what to do where there is no usable unembedding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from blockcoupling.engine.blocks import BlockSpec, get_module
from blockcoupling.errors import BlockCouplingError

__all__ = ["Readout", "entropy", "lens_entropy", "readout"]


def entropy(logits: Tensor) -> Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` over the last axis, in float64:
    (..., V) -> (...,). ``-sum p log p`` with ``log p`` from ``log_softmax`` (stable for
    large logits); a logit of ``-inf`` contributes 0."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)


@dataclass(frozen=True)
class Readout:
    """A model's read-out: ``norm`` (the final norm, None where there is none), ``unembed``
    (hidden (..., d) -> logits (..., V)) and ``softcap`` (Gemma-2's final logit soft-capping
    ``c tanh(logits / c)``, None where the model has none)."""

    norm: nn.Module | None
    unembed: nn.Module
    softcap: float | None = None


def readout(model: nn.Module, spec: BlockSpec) -> Readout:
    """The final norm and the unembedding of ``model`` (a causal LM with its head)."""
    if not spec.causal:
        raise BlockCouplingError(
            f"the logit lens reads a decoder's next-token distribution; this {spec.arch} model "
            "is an encoder (its masked-LM head has a transform before the unembedding); "
            "measure without logit_lens")
    getter = getattr(model, "get_output_embeddings", None)
    unembed = getter() if callable(getter) else None
    if not isinstance(unembed, nn.Module):
        raise BlockCouplingError(
            "logit_lens needs the model's unembedding (its LM head), which this model does not "
            "have: load it with AutoModelForCausalLM (the CLI does so under --logit-lens), "
            "not AutoModel")
    norm = get_module(model, spec.final_norm_path) if spec.final_norm_path else None
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    return Readout(norm, unembed, float(cap) if cap else None)


def lens_entropy(boundaries: Tensor, read: Readout, *, normed_last: bool = False,
                 dtype: torch.dtype | None = None, device: torch.device | None = None,
                 chunk: int = 256) -> Tensor:
    """Logit-lens entropy of every boundary: ``boundaries`` (L+1, N, d) -> (L+1, N) float64.

    ``normed_last``: ``boundaries[L]`` was captured after the final norm, which is then not
    applied to it again. The read-out runs in ``dtype`` on ``device`` (the model's: the norm
    and the unembedding are the model's own modules), ``chunk`` tokens at a time (a
    vocabulary of 128k logits per token)."""
    Lp1, N = boundaries.shape[0], boundaries.shape[1]
    out = torch.empty(Lp1, N, dtype=torch.float64)
    norm: Callable[[Tensor], Tensor] = read.norm if read.norm is not None else (lambda h: h)
    with torch.no_grad():
        for layer in range(Lp1):
            for a in range(0, N, chunk):
                h = boundaries[layer, a:a + chunk].to(device=device, dtype=dtype)
                if not (normed_last and layer == Lp1 - 1):
                    h = norm(h)
                logits = read.unembed(h)
                logits = logits[0] if isinstance(logits, tuple) else logits
                if read.softcap is not None:
                    logits = read.softcap * torch.tanh(logits / read.softcap)
                out[layer, a:a + chunk] = entropy(logits).cpu()
    return out
