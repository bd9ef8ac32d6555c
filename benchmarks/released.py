"""The released method's depth-wise algorithm, re-implemented from its description (issue 4).

Written from the description only, as the baseline of the benchmarks:

1. one forward pass with ``output_hidden_states=True``; block l's input is
   ``hidden_states[l-1]`` and its output ``hidden_states[l]`` (so the last "block" includes the
   final norm, as in the released code);
2. per block, d batched VJPs through the whole block on the whole prompt (one one-hot
   cotangent per output coordinate of token t) give the block Jacobian at token t, which
   includes the skip connection, so ``J = J_block - I``;
3. a full ``torch.linalg.svd`` per block;
4. every layer pair, every K and both orientations compared on the CPU in Python loops with
   numpy, with the released normalisation ``|| |A_K| - S_K ||_F / ||s_K||_2``.

The block is called with the keyword arguments the model itself passed it (recorded by a
forward pre-hook), so that masks and position embeddings are those of the forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from common import Phase, phase
from torch import Tensor, nn
from torch.func import vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel


def _blocks_and_norm(model: nn.Module) -> tuple[nn.ModuleList, nn.Module]:
    base = getattr(model, "transformer", None) or getattr(model, "model", None) or model
    blocks = getattr(base, "h", None) or base.layers
    norm = getattr(base, "ln_f", None) or base.norm
    return blocks, norm


def released_depth(model: nn.Module, input_ids: Tensor, *, token: int = -1,
                   ks: Sequence[int] = (10, 30, 50), chunk: int = 256,
                   ) -> tuple[dict[tuple[int, str, int, int], float], dict[str, Phase]]:
    """Depth-wise released_norm for every (K, orientation, layer_a, layer_b) (1-based layers).

    Returns ``values[(k, orientation, la, lb)]`` and the phases ``jacobians``, ``svd``,
    ``pairs`` (time and peak memory).
    """
    blocks, norm = _blocks_and_norm(model)
    L = len(blocks)
    device = input_ids.device
    calls: list[dict[str, Any]] = []

    def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append(dict(kwargs, _args=args[1:]))

    phases: dict[str, Phase] = {}
    with phase("jacobians", device) as ph:
        hooks = [b.register_forward_pre_hook(pre, with_kwargs=True) for b in blocks]
        try:
            with torch.no_grad():
                out = model(input_ids, output_hidden_states=True, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        hs = out.hidden_states  # L+1 tensors (1, n, d)
        n, d = hs[0].shape[1], hs[0].shape[2]
        t = token % n
        Js: list[Tensor] = []
        for layer in range(1, L + 1):
            kw = {k: v for k, v in calls[layer - 1].items() if k != "_args"}
            for cache_name in ("past_key_values", "layer_past"):
                if cache_name in kw:
                    kw[cache_name] = None
            extra = calls[layer - 1]["_args"]
            extra = tuple(None if not isinstance(a, Tensor) and a is not None and
                          type(a).__name__.endswith("Cache") else a for a in extra)
            block = blocks[layer - 1]

            def fn(x: Tensor, block: nn.Module = block, kw: dict[str, Any] = kw,
                   extra: tuple[Any, ...] = extra, last: bool = layer == L) -> Tensor:
                y = block(x, *extra, **kw)
                y = y[0] if isinstance(y, tuple) else y
                return norm(y) if last else y

            x = hs[layer - 1].detach()
            with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
                _, pull = vjp(fn, x)
                rows = []
                for s in range(0, d, chunk):
                    idx = torch.arange(s, min(s + chunk, d), device=device)
                    cot = torch.zeros(len(idx), 1, n, d, device=device, dtype=x.dtype)
                    cot[torch.arange(len(idx)), 0, t, idx] = 1
                    g = vmap(lambda c: pull(c)[0])(cot)  # (c, 1, n, d)  # noqa: B023 - called at once
                    rows.append(g[:, 0, t, :])  # (c, d): rows of J_block
            J = torch.cat(rows) - torch.eye(d, device=device, dtype=x.dtype)  # (d, d)
            Js.append(J.float())
    phases["jacobians"] = ph

    with phase("svd", device) as ph:
        svds = [torch.linalg.svd(J) for J in Js]
        J_np = [J.cpu().numpy() for J in Js]
        U_np = [u.cpu().numpy() for u, _, _ in svds]
        S_np = [s.cpu().numpy() for _, s, _ in svds]
        V_np = [vh.mT.cpu().numpy() for _, _, vh in svds]
    phases["svd"] = ph

    values: dict[tuple[int, str, int, int], float] = {}
    with phase("pairs") as ph:
        for k in ks:
            for orient in ("ujv", "vju"):
                for a in range(L):
                    s1 = S_np[a][:k]
                    for b in range(L):
                        if orient == "ujv":
                            A = U_np[b][:, :k].T @ J_np[a] @ V_np[b][:, :k]
                        else:
                            A = V_np[b][:, :k].T @ J_np[a] @ U_np[b][:, :k]
                        num = np.linalg.norm(np.abs(A) - np.diag(s1))
                        values[(k, orient, a + 1, b + 1)] = float(num / np.linalg.norm(s1))
    phases["pairs"] = ph
    return values, phases
