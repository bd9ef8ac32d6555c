"""Depth-wise coupling at the last token: released algorithm vs blockcoupling, one process.

Same random-weight model and prompt for every method:
  (a) ``released``: benchmarks/released.py (HF hidden_states, d VJPs per block, J - I, full SVD,
      numpy pair loops);
  (b) ``measure_dense``: ``blockcoupling.measure(..., method="dense")`` (the engine's generic
      dense path: batched VJPs through the whole block);
  (c) ``fastpath``: ``blockcoupling.fastpath.token_branches`` dense J_tt (one batched
      reverse pass of the decode step per block), top-K from ``--svd`` (``gram``: eigh of
      J^T J; ``full``: torch.linalg.svd), coupling matrices of all pairs and both orientations
      by batched GEMMs, every variant from ``blockcoupling.metrics``. Called directly from this
      script: measure() does not use the fast path yet.
Oracle: float64 dense J_tt of the same blocks (``--oracle generic``: jacobian_blocks on
residual_branch; ``fast64``: the verified fast path in float64), exact float64 SVD, float64
metrics. Every method includes the final norm in the last block (the released convention,
``final_norm=True``). Prints one JSON line per record and saves them in benchmarks/results/.

    OMP_NUM_THREADS=2 python benchmarks/bench_depth.py            # GPT-2-small shape
    OMP_NUM_THREADS=2 python benchmarks/bench_depth.py --curve    # + prompts/s vs batch size
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, phase, save  # noqa: E402
from released import released_depth  # noqa: E402

from blockcoupling import fastpath, metrics  # noqa: E402
from blockcoupling.blocks import find_blocks  # noqa: E402
from blockcoupling.capture import capture, residual_branch  # noqa: E402
from blockcoupling.jacobian import jacobian_blocks  # noqa: E402
from blockcoupling.measure import measure  # noqa: E402

KS = (10, 30, 50)
ORIENTS = ("ujv", "vju")
Values = dict[tuple[str, int, str, int, int], float]  # (variant, k, orientation, la, lb)


def gpt2(small: bool, seed: int = 0) -> torch.nn.Module:
    cfg = (tf.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000) if small
           else tf.GPT2Config())  # GPT-2 small: d=768, 12 layers, 12 heads
    torch.manual_seed(seed)
    return tf.GPT2Model(cfg).eval()


def topk_gram(J: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k SVD of a batch J (B, d, d) from the eigendecomposition of J^T J (float32 GEMMs).

    V = top-k eigenvectors of J^T J, S = sqrt(eigenvalues), U = J V / S. Accurate while
    s_k is not tiny relative to s_1 (relative error ~ eps * (s_1 / s_k)^2).
    """
    w, Q = torch.linalg.eigh(J.mT @ J)  # ascending
    V = Q[..., -k:].flip(-1)  # (B, d, k)
    S = w[..., -k:].flip(-1).clamp_min(0).sqrt()  # (B, k)
    U = (J @ V) / S[..., None, :]
    return U, S, V


def topk_full(J: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    U, S, Vh = torch.linalg.svd(J)
    return U[..., :k], S[..., :k], Vh[..., :k, :].mT


def pair_values(J: torch.Tensor, U: torch.Tensor, S: torch.Tensor, V: torch.Tensor,
                fro2: torch.Tensor) -> Values:
    """Every variant for all layer pairs, K in KS, both orientations; J (L, d, d), U/V (L, d, K)."""
    L, d, K = U.shape
    out: Values = {}
    for orient in ORIENTS:
        right, left = (V, U) if orient == "ujv" else (U, V)
        R = right.permute(1, 0, 2).reshape(d, L * K)  # (d, L*K): every basis side by side
        JR = (J @ R).reshape(L, d, L, K).permute(0, 2, 1, 3)  # (La, Lb, d, K)
        A = left.mT[None] @ JR  # (La, Lb, K, K)
        vals = metrics.all_coupling_values(
            A, S[:, None, :].expand(L, L, K), KS, ps=(1,),
            fro2=fro2[:, None].expand(L, L), d=d)
        for (variant, _p, k), v in vals.items():
            v = v.double().cpu()
            for a in range(L):
                for b in range(L):
                    out[(variant, k, orient, a + 1, b + 1)] = float(v[a, b])
    return out


def fast_depth(model: torch.nn.Module, ids: torch.Tensor, svd: str, dtype: torch.dtype
               ) -> tuple[Values, dict[str, Any], torch.Tensor]:
    spec = find_blocks(model)
    phases: dict[str, Any] = {}
    with phase("jacobians") as ph:
        cap = capture(model, {"input_ids": ids}, spec, final_norm=True,
                      boundary_dtype=torch.promote_types(dtype, torch.float32))
        t = cap.lengths[0] - 1
        Js = []
        for layer in range(1, spec.num_layers + 1):
            tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=dtype)
            if tb is None:
                raise SystemExit(f"fast path refused layer {layer}")
            Js.append(tb.jacobian())
        J = torch.stack(Js)  # (L, d, d)
    phases["jacobians"] = ph.as_dict()
    with phase("svd") as ph:
        U, S, V = (topk_gram if svd == "gram" else topk_full)(J, max(KS))
        fro2 = (J * J).sum((-2, -1))
    phases["svd"] = ph.as_dict()
    with phase("pairs") as ph:
        vals = pair_values(J, U, S, V, fro2)
    phases["pairs"] = ph.as_dict()
    return vals, phases, J


def oracle(model: torch.nn.Module, ids: torch.Tensor, how: str) -> tuple[Values, float]:
    """float64 dense J_tt of the same blocks, exact float64 SVD and metrics."""
    t0 = time.perf_counter()
    m64 = model.double() if how == "generic" else model
    spec = find_blocks(m64)
    cap = capture(m64, {"input_ids": ids}, spec, final_norm=True, boundary_dtype=torch.float64)
    t = cap.lengths[0] - 1
    Js = []
    for layer in range(1, spec.num_layers + 1):
        if how == "generic":
            f, x = residual_branch(m64, cap, layer, 0, dtype=torch.float64)
            Js.append(jacobian_blocks(f, x, [t], in_tokens=[t], chunk_size=128)[0, 0])
        else:
            tb = fastpath.token_branch(m64, cap, layer, 0, t, dtype=torch.float64)
            assert tb is not None
            Js.append(tb.jacobian())
    J = torch.stack(Js)
    if how == "generic":
        model.float()
    U, S, V = topk_full(J, max(KS))
    return pair_values(J, U, S, V, (J * J).sum((-2, -1))), time.perf_counter() - t0


def measure_values(model: torch.nn.Module, ids: torch.Tensor) -> tuple[Values, dict[str, Any]]:
    with phase("total") as ph:
        m = measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS, final_norm=True,
                    method="dense", trajectory=False, spectra=False, progress=False)
    df = m.coupling
    vals: Values = {}
    for r in df.itertuples(index=False):
        vals[(r.variant, int(r.k), r.orientation, int(r.layer_a), int(r.layer_b))] = float(r.value)
    return vals, {"total": ph.as_dict()}


def agreement(vals: Values, ref: Values, variants: tuple[str, ...] | None = None) -> dict[str, Any]:
    keys = [k for k in vals if (variants is None or k[0] in variants) and k in ref]
    diffs = {k: abs(vals[k] - ref[k]) for k in keys}
    worst = max(diffs, key=lambda k: diffs[k])
    per_variant = {}
    for v in sorted({k[0] for k in keys}):
        per_variant[v] = max(d for k, d in diffs.items() if k[0] == v)
    return {"n_values": len(keys), "max_abs_diff": diffs[worst], "worst": list(worst),
            "max_abs_diff_by_variant": per_variant}


def curve(model: torch.nn.Module, n_tokens: int, n_prompts: int, batch_sizes: list[int],
          svd: str, sink: list[dict[str, Any]], info: dict[str, Any]) -> None:
    """prompts/s vs batch size: trajectory only (measure), and depth-wise (fast path per prompt)."""
    g = torch.Generator().manual_seed(1)
    V = model.config.vocab_size
    ids = torch.randint(0, V, (n_prompts, n_tokens), generator=g)
    spec = find_blocks(model)
    for bs in batch_sizes:
        t0 = time.perf_counter()
        measure(model, None, {"input_ids": ids}, coupling=(), trajectory=True, spectra=False,
                batch_size=bs, progress=False)
        dt = time.perf_counter() - t0
        emit({"record": "curve", "what": "trajectory_only", "batch_size": bs,
              "n_prompts": n_prompts, "seconds": round(dt, 3),
              "prompts_per_s": round(n_prompts / dt, 3), "loadavg_1m": __import__("os").getloadavg()[0],
              **{"machine": info}}, sink)
    for bs in batch_sizes:
        t0 = time.perf_counter()
        for s in range(0, n_prompts, bs):
            batch = ids[s : s + bs]
            cap = capture(model, {"input_ids": batch}, spec, final_norm=True)
            for b in range(batch.shape[0]):
                Js = []
                for layer in range(1, spec.num_layers + 1):
                    tb = fastpath.token_branch(model, cap, layer, b, n_tokens - 1, verify=False)
                    assert tb is not None
                    Js.append(tb.jacobian())
                J = torch.stack(Js)
                U, S, Vv = (topk_gram if svd == "gram" else topk_full)(J, max(KS))
                pair_values(J, U, S, Vv, (J * J).sum((-2, -1)))
        dt = time.perf_counter() - t0
        emit({"record": "curve", "what": "depth_fastpath", "batch_size": bs,
              "n_prompts": n_prompts, "seconds": round(dt, 3),
              "prompts_per_s": round(n_prompts / dt, 3), "loadavg_1m": __import__("os").getloadavg()[0],
              "note": "Jacobians are per prompt; batching shares only the capture pass"}, sink)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny GPT-2 (d=128, 4 layers) for a smoke test")
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--svd", choices=("gram", "full"), default="gram")
    ap.add_argument("--oracle", choices=("generic", "fast64"), default="generic")
    ap.add_argument("--skip-measure", action="store_true", help="skip (b), the engine's dense path")
    ap.add_argument("--curve", action="store_true", help="also the prompts/s vs batch size curve")
    ap.add_argument("--curve-prompts", type=int, default=8)
    args = ap.parse_args()

    sink: list[dict[str, Any]] = []
    info = machine()
    model = gpt2(args.small)
    d, L = model.config.n_embd, model.config.n_layer
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens),
                        generator=torch.Generator().manual_seed(0))
    base = {"model": "gpt2-random", "d": d, "layers": L, "n_tokens": args.tokens, "ks": list(KS),
            "token": "last", "final_norm": True, "machine": info}
    emit({"record": "config", **base, "svd": args.svd, "oracle": args.oracle}, sink)

    ref, t_oracle = oracle(model, ids, args.oracle)
    emit({"record": "oracle", "how": args.oracle, "seconds": round(t_oracle, 2)}, sink)

    rel_vals, rel_ph = released_depth(model, ids, ks=KS)
    rel_total = sum(p.seconds for p in rel_ph.values())
    rel_as = {("released_norm", k, o, a, b): v for (k, o, a, b), v in rel_vals.items()}
    emit({"record": "method", "method": "released", "dtype": "float32",
          "seconds": round(rel_total, 3), "phases": {k: p.as_dict() for k, p in rel_ph.items()},
          "agreement": agreement(rel_as, ref), "loadavg_1m": __import__("os").getloadavg()[0]}, sink)

    fast_vals, fast_ph, _ = fast_depth(model, ids, args.svd, torch.float32)
    fast_total = sum(p["seconds"] for p in fast_ph.values())
    emit({"record": "method", "method": f"fastpath+{args.svd}", "dtype": "float32",
          "seconds": round(fast_total, 3), "phases": fast_ph,
          "speedup_vs_released": round(rel_total / fast_total, 2),
          "agreement": agreement(fast_vals, ref), "loadavg_1m": __import__("os").getloadavg()[0]}, sink)

    if not args.skip_measure:
        m_vals, m_ph = measure_values(model, ids)
        m_total = m_ph["total"]["seconds"]
        emit({"record": "method", "method": "measure_dense", "dtype": "float32",
              "seconds": round(m_total, 3), "phases": m_ph,
              "speedup_vs_released": round(rel_total / m_total, 2),
              "agreement": agreement(m_vals, ref), "loadavg_1m": __import__("os").getloadavg()[0]}, sink)

    if args.curve:
        curve(model, args.tokens, args.curve_prompts, [1, 2, 4, 8], args.svd, sink, info)
    save(sink, "bench_depth" + ("_small" if args.small else ""))


if __name__ == "__main__":
    main()
