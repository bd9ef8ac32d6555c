"""The Gram route's two subspaces, iterated and the eigh of the whole Gram: time and accuracy.

``engine/svd.py`` finds the top-K of a float32 J (d x d) from its Gram ``J^T J``: on a GPU it
first tries block subspace iteration, certified (route ``gram-iter``), and decomposes the whole
Gram only where that certificate does not hold (``gram-eigh``); on the CPU it uses LAPACK's
subset MRRR (``_iterate_first``, the rule). This script times both routes, forced, on the
same matrices, per K:

- ``gpt2`` / ``llama``: the last token's J^l_tt of a random GPT-2-small-shaped model
  (d = 768; layers 1, 6, 12) or a random Llama-shaped one (``--llama-d``, default 4096 on
  cuda, 768 on the CPU; layers 1 and 2 of 2), built by the engine's fast path in float32:
  random weights give flat spectra, the iteration's hard case;
- ``decay``: J with singular values ``10 / sqrt(i)`` and random singular vectors (seeded):
  a decaying spectrum, the iteration's good case.

For each: seconds per call of ``topk_svd`` with the route forced (CPU: ``time.process_time``
of this process, one thread, so a shared machine's load does not enter; CUDA: wall clock
between synchronisations), the route each took, the certificate's ratio at each check, and
the largest |s_i - s_i(float64 SVD of the same float32 J)| / s_1. And the ecosystem's
alternative, not used by the package: ``torch.lobpcg`` (largest K + window eigenpairs of the
float32 Gram, ``--lobpcg-iters`` iterations from the same seeded Gaussian start) followed by
the same float64 Rayleigh-Ritz step and certificate: seconds and the certificate's ratio.

    OMP_NUM_THREADS=1 python benchmarks/bench_gram_iter.py                # CPU, d = 768
    python benchmarks/bench_gram_iter.py --device cuda                     # + d = 4096
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402

from blockcoupling.engine import fastpath  # noqa: E402
from blockcoupling.engine import svd as svd_mod  # noqa: E402
from blockcoupling.engine.blocks import find_blocks  # noqa: E402
from blockcoupling.engine.capture import capture  # noqa: E402


def _last_token_jacobians(model: torch.nn.Module, layers: tuple[int, ...], device: str
                          ) -> list[torch.Tensor]:
    ids = torch.randint(0, model.config.vocab_size, (1, 12),
                        generator=torch.Generator().manual_seed(0)).to(device)
    cap = capture(model, {"input_ids": ids}, find_blocks(model), final_norm=True)
    out = []
    for layer in layers:
        tb = fastpath.token_branch(model, cap, layer, 0, cap.lengths[0] - 1, verify=False)
        assert tb is not None, "the fast path refused this model"
        out.append(tb.jacobian())
    return out


def matrices(device: str, llama_d: int) -> dict[str, list[torch.Tensor]]:
    torch.manual_seed(0)
    with torch.device(device):
        gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config()).eval()
    out = {"gpt2": _last_token_jacobians(gpt2, (1, 6, 12), device)}
    del gpt2
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=llama_d, intermediate_size=int(3.5 * llama_d),
                         num_hidden_layers=2, num_attention_heads=max(1, llama_d // 128),
                         num_key_value_heads=max(1, llama_d // 512), vocab_size=1000)
    with torch.device(device):
        llama = tf.LlamaForCausalLM(cfg).eval()
    out["llama"] = _last_token_jacobians(llama, (1, 2), device)
    del llama
    decay = []
    for d in sorted({768, llama_d}):
        g = torch.Generator().manual_seed(d)
        Q1 = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
        Q2 = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
        s = 10 / torch.arange(1, d + 1, dtype=torch.float64).sqrt()
        decay.append(((Q1 * s) @ Q2.T).float().to(device))
    out["decay"] = decay
    return out


def timed(fn: Callable[[], Any], device: str, repeats: int) -> tuple[Any, float]:
    """(last result, median seconds): CPU seconds of this process, or CUDA wall clock."""
    cuda = torch.device(device).type == "cuda"
    times, out = [], None
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter() if cuda else time.process_time()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() if cuda else time.process_time()) - t0)
    return out, statistics.median(times)


def lobpcg(J: torch.Tensor, k: int, niter: int) -> tuple[bool, float]:
    """torch.lobpcg on the float32 Gram, then the package's float64 Rayleigh-Ritz step and
    certificate (`svd._ritz64`): (certified, the certificate's ratio)."""
    n = int(J.shape[-1])
    w = min(n, k + svd_mod._GRAM_WINDOW)
    G = J.mT @ J
    gen = torch.Generator(device=J.device)
    gen.manual_seed(0)
    X0 = torch.randn(n, w, generator=gen, dtype=J.dtype, device=J.device)
    try:
        _vals, X = torch.lobpcg(G, k=w, X=X0, niter=niter, tol=1e-7, largest=True)
    except Exception:  # its own failures (e.g. a singular Gram block) count as not certified
        return False, float("inf")
    got, ratio, _decay = svd_mod._ritz64(J, torch.linalg.qr(X.double()).Q, k)
    return got is not None, float(ratio)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ks", type=int, nargs="+", default=[10, 50, 77])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama-d", type=int, default=None)
    ap.add_argument("--lobpcg-iters", type=int, nargs="*", default=[20, 40])
    args = ap.parse_args()
    cuda = torch.device(args.device).type == "cuda"
    llama_d = args.llama_d or (4096 if cuda else 768)
    sink: list[dict[str, Any]] = []
    emit({"record": "config", "device": args.device, "ks": args.ks, "repeats": args.repeats,
          "clock": "cuda wall clock" if cuda else "time.process_time (CPU seconds, 1 thread)",
          "torch_threads": torch.get_num_threads(), "machine": machine(),
          "iter": {"oversample": svd_mod._ITER_OVERSAMPLE, "max_products": svd_mod._ITER_MAX,
                   "check_every": svd_mod._ITER_CHECK, "window": svd_mod._GRAM_WINDOW}}, sink)
    rule, ritz = svd_mod._iterate_first, svd_mod._ritz64
    ratios: list[float] = []

    def counted(J: torch.Tensor, W: torch.Tensor, k: int) -> Any:
        got = ritz(J, W, k)
        ratios.append(round(float(got[1]), 3))
        return got

    svd_mod._ritz64 = counted
    # an outer `timeout` (SIGTERM) still saves the records measured so far
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    try:
        for name, Js in matrices(args.device, llama_d).items():
            for i, J in enumerate(Js):
                s64 = torch.linalg.svdvals(J.double())
                for k in args.ks:
                    rec: dict[str, Any] = {"record": "topk", "matrix": name, "index": i,
                                           "d": int(J.shape[0]), "k": k,
                                           "p": svd_mod._iter_width(int(J.shape[0]), k),
                                           "s_k_over_s_1": round(float(s64[k - 1] / s64[0]), 4)}
                    p = rec["p"]
                    if p < J.shape[0]:
                        rec["s_p1_over_s_k"] = round(float(s64[p] / s64[k - 1]), 4)
                    for forced in ("eigh", "iter"):
                        def force(n: int, kk: int, device: torch.device, f: str = forced) -> bool:
                            return f == "iter"

                        svd_mod._iterate_first = force
                        ratios.clear()
                        top, sec = timed(lambda J=J, k=k: svd_mod.topk_svd(J, k), args.device,
                                         args.repeats)
                        err = float((top.S.double() - s64[:k]).abs().max() / s64[0])
                        rec[forced] = {"seconds": round(sec, 5), "route": top.route,
                                       "ratios": ratios[: len(ratios) // args.repeats],
                                       "max_ds_rel": err}
                    rec["iter_over_eigh"] = round(rec["iter"]["seconds"]
                                                  / rec["eigh"]["seconds"], 3)
                    for niter in args.lobpcg_iters:
                        (ok, ratio), sec = timed(lambda J=J, k=k, it=niter: lobpcg(J, k, it),
                                                 args.device, 1)
                        rec[f"lobpcg{niter}"] = {"seconds": round(sec, 5), "certified": ok,
                                                 "ratio": round(ratio, 3)}
                    emit(rec, sink)
    finally:
        svd_mod._iterate_first, svd_mod._ritz64 = rule, ritz
        save(sink, "bench_gram_iter" + ("_cuda" if cuda else ""))


if __name__ == "__main__":
    main()
