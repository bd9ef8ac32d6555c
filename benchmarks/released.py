"""The released method's depth-wise algorithm (sugolov/coupling), as fast as it honestly runs.

The baseline of every speed-up in BENCHMARKS.md. Written for this project after reading the
released code (``coupling/main.py``, ``jacobian.py``, ``metrics.py``); the structure is the
released one, only the batching is tuned:

1. ONE forward pass of the whole prompt with ``output_hidden_states=True`` and the autograd
   graph kept. Block l's input is ``hidden_states[l-1]``, its output ``hidden_states[l]``
   (so the last "block" includes the final norm, as in the released code).
2. Per block, the d rows of the block Jacobian at token t by reverse mode through that graph:
   one-hot cotangents ``e_a`` on ``hidden_states[l][0, t, :]``, pulled back to
   ``hidden_states[l-1]`` with ``torch.autograd.grad(..., retain_graph=True)``. The released
   code batches them with ``functorch``'s ``chunk_vmap`` over ``grad``; here the same thing
   is ``is_grads_batched=True`` (vmap over the backward) in chunks of ``chunk`` cotangents
   (default: all d at once, the fastest on the CPU runs of BENCHMARKS.md; the released code
   uses ``2 * (n // 20) + 5 + i`` chunks). Every pullback goes through all n tokens of the
   block -- that is the algorithm. Then ``J = J_block - I``.
3. A full ``torch.linalg.svd`` per block.
4. Every layer pair, K and orientation in Python loops (torch on the CPU, as the released
   ``metrics`` does): ``M = U2^T J1 V2``, ``diff = || |M| - S1 ||_F``, storing both released
   normalisations ``diff / tr(S1)`` and ``diff / ||s1||_2`` as float32.

No block is re-run: the only forward is step 1 (the released code's graph reuse). The model's
own attention implementation is used for the forward; if its backward cannot be batched by
vmap the run raises (no silent slow path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from common import Phase, phase
from torch import Tensor, nn


def released_depth(model: nn.Module, input_ids: Tensor, *, token: int = -1,
                   ks: Sequence[int] = (10, 30, 50), chunk: int | None = None,
                   rows: int | None = None,
                   ) -> tuple[dict[tuple[int, str, int, int], float], dict[str, Phase]]:
    """Depth-wise released_norm for every (K, orientation, layer_a, layer_b) (1-based layers).

    Returns ``values[(k, orientation, la, lb)]`` (the ``diff / ||s_K||_2`` normalisation;
    ``diff / tr`` is computed and stored too, as the released code does) and the phases
    ``forward``, ``jacobians`` (the pullbacks), ``svd``, ``pairs`` (time and peak memory).

    ``rows`` (timing only, for shapes where d full pullbacks take hours): pull back only the
    first ``rows`` cotangents of each block and fill the other rows of J with random numbers;
    the pullback time is linear in the number of cotangents, so the caller extrapolates
    ``jacobians`` by ``d / rows``. The values are then meaningless (not returned: empty dict).
    """
    device = input_ids.device
    out, phases = _forward(model, input_ids)
    with phase("jacobians", device) as ph:
        with torch.enable_grad():
            hs = out.hidden_states  # L+1 tensors (1, n, d), one graph
            L = len(hs) - 1
            n, d = hs[0].shape[1], hs[0].shape[2]
            t = token % n
            if not hs[0].requires_grad:
                raise ValueError("the model's hidden states do not require grad; the released "
                                 "algorithm differentiates through the forward graph")
            c = chunk or d
            n_rows = min(rows or d, d)
            eye = torch.eye(d, device=device, dtype=hs[0].dtype)
            Js: list[Tensor] = []
            for layer in range(1, L + 1):
                y = hs[layer][0, t, :]  # (d,)
                got = []
                for s in range(0, n_rows, c):
                    (g,) = torch.autograd.grad(y, hs[layer - 1], eye[s : min(s + c, n_rows)],
                                               retain_graph=True, is_grads_batched=True)
                    got.append(g[:, 0, t, :])  # (c, d): rows of J_block at input token t
                if n_rows < d:
                    got.append(torch.randn(d - n_rows, d, device=device, dtype=hs[0].dtype))
                Js.append((torch.cat(got) - eye).detach().float())  # (d, d)
        del out, hs
    phases["jacobians"] = ph

    pair_values, more = _svd_and_pairs(Js, ks, device)
    phases.update(more)
    values = {(k, o, i + 1, j + 1): v for (k, o, i, j), v in pair_values.items()}
    return (values if not rows or rows >= d else {}), phases


def _forward(model: nn.Module, input_ids: Tensor) -> tuple[Any, dict[str, Phase]]:
    """Step 1: one forward with ``hidden_states`` and the autograd graph kept; its phase."""
    with phase("forward", input_ids.device) as ph:
        with torch.enable_grad():
            out = model(input_ids, output_hidden_states=True, use_cache=False)
    return out, {"forward": ph}


def _svd_and_pairs(Js: Sequence[Tensor], ks: Sequence[int], device: torch.device
                   ) -> tuple[dict[tuple[int, str, int, int], float], dict[str, Phase]]:
    """Steps 3 and 4 on the Jacobians ``Js`` (each (d, d)): a full SVD each, then every ordered
    pair (i, j) of them, K and orientation in Python loops. Values by (k, orientation, i, j),
    0-based; the phases ``svd`` and ``pairs``."""
    phases: dict[str, Phase] = {}
    L = len(Js)
    with phase("svd", device) as ph:
        svds = [torch.linalg.svd(J) for J in Js]  # full matrices, as released
        Us = [u.cpu() for u, _, _ in svds]
        Ss = torch.stack([s for _, s, _ in svds]).cpu()  # (L, d)
        Vhs = [vh.cpu() for _, _, vh in svds]
        Jc = [J.cpu() for J in Js]
    phases["svd"] = ph

    values: dict[tuple[int, str, int, int], float] = {}
    with phase("pairs") as ph:
        for k in ks:
            U = [u[:, :k] for u in Us]
            V = [vh[:k, :].T for vh in Vhs]
            trace = {o: torch.zeros(L, L) for o in ("ujv", "vju")}
            norm = {o: torch.zeros(L, L) for o in ("ujv", "vju")}
            for i in range(L):
                S1 = torch.diag(Ss[i][:k])
                tr, nrm = torch.trace(S1), torch.linalg.norm(Ss[i][:k])
                for j in range(L):
                    for orient, (left, right) in (("ujv", (U[j], V[j])), ("vju", (V[j], U[j]))):
                        M = left.T @ Jc[i] @ right
                        diff = torch.linalg.norm(torch.abs(M) - S1)
                        trace[orient][i, j] = diff / tr
                        norm[orient][i, j] = diff / nrm
            for orient in ("ujv", "vju"):
                for i in range(L):
                    for j in range(L):
                        values[(k, orient, i, j)] = float(norm[orient][i, j])
    phases["pairs"] = ph
    return values, phases


def released_tokenwise(model: nn.Module, input_ids: Tensor, *, layer: int, kind: str,
                       ks: Sequence[int] = (10, 30, 50), pulled: int | None = None,
                       ) -> dict[str, Phase]:
    """The released algorithm's token-wise coupling at one block ``layer`` (1-based), timed.

    ``kind="self"``: ``J_tt`` for every token t of the prompt (one batch of d pullbacks from
    output token t each: n batches), every pair (t, t'); ``kind="fixed_output"``: ``J_{t1,
    n-1}`` for every input t1 (ONE batch of d pullbacks from the last token gives them all),
    every pair (t1, t1'); ``kind="fixed_input"``: ``J_{0, t2}`` for every output t2 (the
    released code computes every block by reverse mode: one batch of d pullbacks from each
    output token t2, n batches), every pair (t2, t2'). Then a full SVD per Jacobian and the
    pair loops, as in :func:`released_depth`. ``pulled`` (timing only, ``self`` and
    ``fixed_input``): pull back from the first ``pulled`` output tokens and reuse their
    Jacobians for the others; the caller extrapolates ``jacobians`` by ``n / pulled`` (each
    batch costs the same: every pullback goes through all n tokens). Returns the phases
    ``forward``, ``jacobians``, ``svd``, ``pairs``.
    """
    device = input_ids.device
    out, phases = _forward(model, input_ids)
    hs = out.hidden_states
    n, d = hs[0].shape[1], hs[0].shape[2]
    eye = torch.eye(d, device=device, dtype=hs[0].dtype)

    def rows_from(hs: Sequence[Tensor], t: int) -> Tensor:  # (n, d, d): J_block[t1 -> t], all t1
        (g,) = torch.autograd.grad(hs[layer][0, t, :], hs[layer - 1], eye, retain_graph=True,
                                   is_grads_batched=True)  # (d, 1, n, d)
        return g[:, 0].permute(1, 0, 2)

    with phase("jacobians", device) as ph:
        with torch.enable_grad():
            if kind == "fixed_output":
                J = rows_from(hs, n - 1)
                Js = [(J[t1] - (eye if t1 == n - 1 else 0)).detach().float() for t1 in range(n)]
            elif kind == "self":
                m = min(pulled or n, n)
                Js = [(rows_from(hs, t)[t] - eye).detach().float() for t in range(m)]
                Js += [Js[t % m] for t in range(m, n)]
            elif kind == "fixed_input":
                m = min(pulled or n, n)
                Js = [(rows_from(hs, t)[0] - (eye if t == 0 else 0)).detach().float()
                      for t in range(m)]
                Js += [Js[t % m] for t in range(m, n)]
            else:
                raise ValueError(f"unknown kind {kind!r}")
    phases["jacobians"] = ph
    del out, hs
    phases.update(_svd_and_pairs(Js, ks, device)[1])
    return phases
