"""Depth-wise coupling on a Llama-3-8B-shaped model (bf16 weights, random init) on a GPU.

Methods in one process, same model and prompt (12 tokens, last token, K in 10/30/50, both
orientations, every variant, final norm folded into the last block):
  ``released`` (benchmarks/released.py; skipped with --skip-released),
  ``fast_dense``: fast-path dense J_tt (decode step, float32 copy of one block at a time) +
      top-K from eigh(J^T J) + batched pair GEMMs,
  ``fast_randomized``: fast-path operator + blockcoupling.engine.svd.randomized_topk_svd (K=50,
      oversample 10, 4 iterations) + J_l V_l' products through the operator,
  ``measure``: what a user runs, ``blockcoupling.engine.measure(model, None, {"input_ids": ids},
      coupling=("depth",), k=(10, 30, 50), final_norm=True, progress=False)`` with the
      defaults (fast path on; ``method="auto"`` picks the matrix-free randomized SVD at
      d = 4096), one call on one prompt, so it includes the one-time fast-path check.
Oracle: float64 dense J_tt from the verified fast path (one block at a time, on the GPU).

    python benchmarks/bench_gpu_llama.py                  # Llama-3-8B shape on cuda
    OMP_NUM_THREADS=2 python benchmarks/bench_gpu_llama.py --small   # tiny Llama on CPU (smoke test)

GPU numbers were NOT measured in the session that wrote this script (no GPU was lent to it).
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
from bench_depth import KS, Values, agreement, pair_values, topk_full, topk_gram  # noqa: E402
from common import emit, machine, phase, save  # noqa: E402
from released import released_depth  # noqa: E402

from blockcoupling.engine import (
    fastpath,
    measure,
    metrics,
    svd,  # noqa: E402
)
from blockcoupling.engine.blocks import find_blocks  # noqa: E402
from blockcoupling.engine.capture import capture  # noqa: E402


def llama(small: bool, device: str) -> torch.nn.Module:
    if small:
        cfg = tf.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)
    else:  # Llama-3-8B shape
        cfg = tf.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                             max_position_embeddings=8192, rope_theta=500000.0)
    torch.manual_seed(0)
    with torch.device(device):
        model = tf.LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model.eval()


def fast_dense(model: torch.nn.Module, ids: torch.Tensor, device: str
               ) -> tuple[Values, dict[str, Any]]:
    spec = find_blocks(model)
    ph_out: dict[str, Any] = {}
    with phase("jacobians", device) as ph:
        cap = capture(model, {"input_ids": ids}, spec, final_norm=True)
        t = cap.lengths[0] - 1
        Js = []
        for layer in range(1, spec.num_layers + 1):
            tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=torch.float32)
            if tb is None:
                raise SystemExit(f"fast path refused layer {layer}")
            Js.append(tb.jacobian())
        J = torch.stack(Js)  # (L, d, d)
    ph_out["jacobians"] = ph.as_dict()
    with phase("svd", device) as ph:
        U, S, V = topk_gram(J, max(KS))
        fro2 = (J * J).sum((-2, -1))
    ph_out["svd"] = ph.as_dict()
    with phase("pairs", device) as ph:
        vals = pair_values(J, U, S, V, fro2)
    ph_out["pairs"] = ph.as_dict()
    return vals, ph_out


def fast_randomized(model: torch.nn.Module, ids: torch.Tensor, device: str
                    ) -> tuple[Values, dict[str, Any]]:
    spec = find_blocks(model)
    L = spec.num_layers
    ph_out: dict[str, Any] = {}
    with phase("jacobians+svd", device) as ph:
        cap = capture(model, {"input_ids": ids}, spec, final_norm=True)
        t = cap.lengths[0] - 1
        tops = []
        for layer in range(1, L + 1):
            tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=torch.float32)
            if tb is None:
                raise SystemExit(f"fast path refused layer {layer}")
            tops.append(svd.randomized_topk_svd(tb, max(KS), oversample=10, n_iter=4))
    ph_out["jacobians+svd"] = ph.as_dict()
    with phase("pairs", device) as ph:
        U = torch.stack([tp.U for tp in tops])  # (L, d, K)
        V = torch.stack([tp.V for tp in tops])
        S = torch.stack([tp.S for tp in tops])  # (L, K)
        fro2 = torch.stack([tp.fro2 for tp in tops])
        d, K = U.shape[1], U.shape[2]
        A = {o: torch.empty(L, L, K, K, device=U.device) for o in ("ujv", "vju")}
        for a in range(1, L + 1):
            tb = fastpath.token_branch(model, cap, a, 0, t, dtype=torch.float32, verify=False)
            assert tb is not None
            both = torch.cat([V.permute(1, 0, 2).reshape(d, L * K),
                              U.permute(1, 0, 2).reshape(d, L * K)], dim=1)  # (d, 2LK)
            JB = tb.matmat(both)  # (d, 2LK)
            JV = JB[:, : L * K].reshape(d, L, K).permute(1, 0, 2)  # (Lb, d, K)
            JU = JB[:, L * K :].reshape(d, L, K).permute(1, 0, 2)
            A["ujv"][a - 1] = U.mT @ JV
            A["vju"][a - 1] = V.mT @ JU
        vals: Values = {}
        for o, Ao in A.items():
            res = metrics.all_coupling_values(Ao, S[:, None, :].expand(L, L, K), KS, ps=(1,),
                                              fro2=fro2[:, None].expand(L, L), d=d)
            for (variant, _p, k), v in res.items():
                v = v.double().cpu()
                for i in range(L):
                    for j in range(L):
                        vals[(variant, k, o, i + 1, j + 1)] = float(v[i, j])
    ph_out["pairs"] = ph.as_dict()
    return vals, ph_out


def user_measure(model: torch.nn.Module, ids: torch.Tensor, device: str
                 ) -> tuple[Values, dict[str, Any]]:
    """blockcoupling.engine.measure() with the defaults, as a user calls it (one prompt)."""
    with phase("measure", device) as ph:
        m = measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS, final_norm=True,
                    progress=False)
    vals: Values = {}
    for r in m.coupling.itertuples(index=False):
        vals[(str(r.variant), int(r.k), str(r.orientation), int(r.layer_a), int(r.layer_b))] = float(r.value)
    return vals, {"measure": ph.as_dict(),
                  "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}}


def oracle(model: torch.nn.Module, ids: torch.Tensor) -> tuple[Values, float]:
    t0 = time.perf_counter()
    spec = find_blocks(model)
    cap = capture(model, {"input_ids": ids}, spec, final_norm=True, boundary_dtype=torch.float64)
    t = cap.lengths[0] - 1
    Js = []
    for layer in range(1, spec.num_layers + 1):
        tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=torch.float64)
        assert tb is not None
        Js.append(tb.jacobian())
    J = torch.stack(Js)
    U, S, V = topk_full(J, max(KS))
    return pair_values(J, U, S, V, (J * J).sum((-2, -1))), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny Llama on the CPU (smoke test)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--skip-released", action="store_true")
    ap.add_argument("--skip-oracle", action="store_true")
    args = ap.parse_args()
    device = args.device or ("cpu" if args.small else "cuda")
    sink: list[dict[str, Any]] = []
    info = machine()
    with phase("load", device) as ph:
        model = llama(args.small, device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens),
                        generator=torch.Generator().manual_seed(0)).to(device)
    emit({"record": "config", "model": "llama-random" + ("-small" if args.small else "-8b-shape"),
          "d": model.config.hidden_size, "layers": model.config.num_hidden_layers,
          "n_tokens": args.tokens, "ks": list(KS), "weights": "bf16",
          "weight_gb": round(weight_bytes / 1e9, 3), "device": device, "load": ph.as_dict(),
          "machine": info}, sink)
    ref = None
    if not args.skip_oracle:
        ref, t_or = oracle(model, ids)
        emit({"record": "oracle", "how": "fast64", "seconds": round(t_or, 2)}, sink)
    rel_total = None
    if not args.skip_released:
        rel_vals, rel_ph = released_depth(model.model if hasattr(model, "model") else model, ids, ks=KS)
        rel_total = sum(p.seconds for p in rel_ph.values())
        rel_as = {("released_norm", k, o, a, b): v for (k, o, a, b), v in rel_vals.items()}
        emit({"record": "method", "method": "released", "seconds": round(rel_total, 3),
              "phases": {k: p.as_dict() for k, p in rel_ph.items()},
              "agreement": agreement(rel_as, ref) if ref else None}, sink)
    for name, fn in (("fast_dense", fast_dense), ("fast_randomized", fast_randomized),
                     ("measure", user_measure)):
        vals, phs = fn(model, ids, device)
        timed = [p for p in phs.values() if isinstance(p, dict) and "seconds" in p]
        total = sum(p["seconds"] for p in timed)
        peak = max((p.get("cuda_peak_mb") or 0.0) for p in timed)
        emit({"record": "method", "method": name, "seconds": round(total, 3), "phases": phs,
              "speedup_vs_released": round(rel_total / total, 2) if rel_total else None,
              "cuda_peak_over_weights": round(peak * 2**20 / weight_bytes, 3) if peak else None,
              "agreement": agreement(vals, ref) if ref else None}, sink)
    save(sink, "bench_gpu_llama" + ("_small" if args.small else ""))


if __name__ == "__main__":
    main()
