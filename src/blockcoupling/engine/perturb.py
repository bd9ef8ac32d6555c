"""The perturbation experiment (paper fig. 34): the embedding of token t (the last by default)
perturbed with noise of several sizes, its trajectory compared with the true one.

The paper does not state the noise; the reading here (docs/conventions.md, "The perturbation
experiment", and every output): ``x~^0_t = x^0_t + level ||x^0_t|| u`` with ``u`` a uniformly
random unit direction (`directions`, seeded), every other token unchanged; at every layer
l = 0..L the response is the cosine of ``x~^l_t`` with ``x^l_t`` and their relative distance.
`perturbation_rows` runs one prompt (a forward pre-hook on block 1 adds the noise);
`directions`, `perturbations` and `responses` are the pure parts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from blockcoupling import validate
from blockcoupling.engine.blocks import BlockSpec, get_blocks
from blockcoupling.engine.capture import capture
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, opt
from blockcoupling.validate import OptionError

__all__ = ["COLUMNS", "PerturbSettings", "check_levels", "directions", "perturbation_rows",
           "perturbations", "responses"]

#: the columns of the perturbation table, one row per (prompt, level, draw, layer)
COLUMNS = ("prompt_id", "token", "level", "draw", "layer", "cosine", "rel_distance")


def _levels(name: str, value: Any) -> tuple[Any, ...]:
    """``--levels``: comma-separated numbers (``0.01,0.1,1``) or a sequence of them."""
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",") if v.strip()]
        try:
            return tuple(float(v) for v in items)
        except ValueError:
            raise OptionError(f"{name} {value!r}: give comma-separated numbers such as "
                              "0.01,0.1,1") from None
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


@dataclass(frozen=True)
class PerturbSettings:
    """The settings of the perturbation experiment, each declared once (`fields.opt`): the
    options of ``perturb`` and the arguments `run_perturbation` checks (``levels`` end up
    sorted and distinct)."""

    levels: tuple[float, ...] = opt(
        (0.01, 0.03, 0.1, 0.3, 1.0), "Noise levels: the perturbation's norm relative to the "
        "embedding's, comma-separated.", cli=True, parse=_levels,
        check=validate.rule(validate.number, above=0))
    draws: int = opt(8, "Random directions per level (the same for every prompt).", cli=True,
                     check=validate.COUNT)
    token: int = opt(-1, "The perturbed token (0-based; negative from the end; the paper's: "
                     "the last, -1).", cli=True, check=validate.rule(validate.whole))
    seed: int = opt(0, "Seed of the directions and of the prompt subset.", cli=True,
                    check=validate.SEED)
    batch_size: int = opt(16, "Perturbed copies per forward pass.", cli=True,
                          check=validate.COUNT)

    def __post_init__(self) -> None:
        check_fields(self, dashes=False)
        if not self.levels:
            raise OptionError("levels: give at least one noise level, e.g. 0.01,0.1,1")
        object.__setattr__(self, "levels", tuple(sorted({float(v) for v in self.levels})))


def check_levels(levels: Sequence[float], draws: int) -> tuple[float, ...]:
    """The noise levels as floats (each > 0 and finite, sorted, distinct) and ``draws`` >= 1
    (`PerturbSettings`'s rules); anything else is one error saying what to give."""
    return PerturbSettings(levels=_levels("levels", levels), draws=draws).levels


def directions(d: int, n: int, seed: int, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """``n`` uniformly random unit vectors in R^d: (n, d). Standard Gaussian vectors from
    ``torch.Generator().manual_seed(seed)``, each divided by its norm (the global RNG is not
    touched; the same (d, n, seed) gives the same directions on every machine)."""
    g = torch.Generator().manual_seed(int(seed))
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    return (z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)).to(dtype)


def perturbations(x: Tensor, levels: Sequence[float], dirs: Tensor) -> Tensor:
    """``level * ||x|| * u`` for every level and direction: x (d,), dirs (n, d) ->
    (len(levels), n, d)."""
    lv = torch.as_tensor(list(levels), dtype=dirs.dtype)[:, None, None]  # (m, 1, 1)
    return lv * torch.linalg.vector_norm(x.to(dirs.dtype)) * dirs[None]


def responses(true: Tensor, perturbed: Tensor) -> tuple[Tensor, Tensor]:
    """Cosine similarity and relative distance of perturbed states to the true ones, per
    layer: true (L+1, d), perturbed (..., L+1, d) -> two (..., L+1) float64 tensors. A layer
    whose true or perturbed state is exactly zero has a NaN cosine (no direction)."""
    t = true.double()
    p = perturbed.double()
    nt = torch.linalg.vector_norm(t, dim=-1)  # (L+1,)
    npn = torch.linalg.vector_norm(p, dim=-1)  # (..., L+1)
    denom = nt * npn
    cos = (p * t).sum(-1) / torch.where(denom > 0, denom, torch.ones_like(denom))
    cos = torch.where(denom > 0, cos, torch.full_like(cos, float("nan")))
    dist = torch.linalg.vector_norm(p - t, dim=-1)
    rel = dist / torch.where(nt > 0, nt, torch.ones_like(nt))
    rel = torch.where(nt > 0, rel, torch.full_like(rel, float("nan")))
    return cos, rel


@contextlib.contextmanager
def _added_to_block_input(block: nn.Module, token: int, delta: Tensor) -> Iterator[None]:
    """A forward pre-hook on ``block`` that adds ``delta`` (B, d) to its hidden input at
    ``token`` of each batch row (the hidden state is its first positional argument or its
    ``hidden_states`` keyword)."""

    def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args and isinstance(args[0], Tensor):
            h = args[0].clone()
            h[:, token] += delta.to(h.device, h.dtype)
            return (h, *args[1:]), kwargs
        h = kwargs["hidden_states"].clone()
        h[:, token] += delta.to(h.device, h.dtype)
        return args, {**kwargs, "hidden_states": h}

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def perturbation_rows(model: nn.Module, inputs: dict[str, Tensor], spec: BlockSpec,
                      prompt_id: str, *, levels: Sequence[float], draws: int, seed: int,
                      token: int = -1, batch_size: int = 16) -> pd.DataFrame:
    """The perturbation table of one prompt (``inputs``: its model inputs, batch of one, no
    padding): one row per (level, draw, layer) with `COLUMNS`. The directions are
    `directions` ``(d, draws, seed)``, the same for every level and prompt; the prompt's
    perturbed copies run ``batch_size`` at a time, in the model's dtype."""
    levels = check_levels(levels, draws)
    clean = capture(model, inputs, spec, keep_calls=False, boundary_dtype=torch.float64)
    n = clean.lengths[0]
    t = token + n if token < 0 else token
    if not 0 <= t < n:
        raise BlockCouplingError(f"token {token} is outside the prompt's {n} tokens")
    true = clean.boundaries[:, 0, t]  # (L+1, d)
    d = true.shape[-1]
    deltas = perturbations(true[0], levels, directions(d, draws, seed)).reshape(-1, d)  # (m*n, d)
    block1 = get_blocks(model, clean.spec)[0]
    states = []
    for a in range(0, deltas.shape[0], batch_size):
        chunk = deltas[a:a + batch_size]
        batch = {k: v.expand(len(chunk), *v.shape[1:]) if isinstance(v, Tensor) else v
                 for k, v in inputs.items()}
        with _added_to_block_input(block1, t, chunk):
            cap = capture(model, batch, clean.spec, keep_calls=False,
                          boundary_dtype=torch.float64)
        states.append(cap.boundaries[:, :, t].transpose(0, 1))  # (b, L+1, d)
    pert = torch.cat(states)  # (m*n, L+1, d)
    cos, rel = responses(true, pert)  # (m*n, L+1)
    Lp1 = true.shape[0]
    m = len(levels)
    lv = np.repeat(np.asarray(levels, dtype=float), draws * Lp1)
    dr = np.tile(np.repeat(np.arange(draws), Lp1), m)
    layer = np.tile(np.arange(Lp1), m * draws)
    return pd.DataFrame({"prompt_id": prompt_id, "token": t, "level": lv, "draw": dr,
                         "layer": layer, "cosine": cos.reshape(-1).numpy(),
                         "rel_distance": rel.reshape(-1).numpy()}, columns=list(COLUMNS))
