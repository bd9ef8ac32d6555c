"""The Gram route's two subspaces, iterated and the eigh of the whole Gram: time and accuracy.

``engine/svd.py`` finds the top-K of a float32 J (d x d) from its Gram ``J^T J``: on a GPU it
first tries block subspace iteration, certified (route ``gram-iter``), and decomposes the whole
Gram only where that certificate does not hold (``gram-eigh``); on the CPU it uses LAPACK's
subset MRRR (``_iterate_first``, the rule). This script times both routes, forced, on the
same matrices, per K:

- ``--models`` (`spectrum.build`'s names; `LAYERS` the blocks measured): the last token's
  J^l_tt of a random GPT-2-small-shaped model (``gpt2``, d = 768; layers 1, 6, 12), a mid
  Llama (``llama-mid``, d = 1024, the Llama-3-8B ratios; layers 1 and 4 of 4) or the
  Llama-3-8B shape (``llama-8b``, d = 4096; layers 1 and 2 of 2), built by the engine's fast
  path in float32, each with ``--spectrum`` ``flat`` (the random initialisation: the
  iteration's hard case) and ``trained`` (`spectrum.realistic_`: weights whose J have the
  trained models' decay, BENCHMARKS.md "Issue 43 items 1-2");
- ``decay``: J with singular values ``10 / sqrt(i)`` and random singular vectors (seeded) at
  each width met: a decaying spectrum, the iteration's good case.

For each: seconds per call of ``topk_svd`` with the route forced (CPU: ``time.process_time``
of this process, one thread, so a shared machine's load does not enter; CUDA: wall clock
between synchronisations), the route each took, the certificate's ratio at each check, and
the largest |s_i - s_i(float64 SVD of the same float32 J)| / s_1; for the iteration the Gram
products it spent and whether it fell back to the eigh. With ``--lobpcg-iters``, the
ecosystem's alternative, not used by the package: ``torch.lobpcg`` (largest K + window eigenpairs of the
float32 Gram, ``--lobpcg-iters`` iterations from the same seeded Gaussian start) followed by
the same float64 Rayleigh-Ritz step and certificate: seconds and the certificate's ratio.

    OMP_NUM_THREADS=1 python benchmarks/bench_gram_iter.py                # CPU, d = 768, 1024
    OMP_NUM_THREADS=1 python benchmarks/bench_gram_iter.py --models llama-8b   # CPU, d = 4096
    python benchmarks/bench_gram_iter.py --device cuda                     # + d = 4096
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spectrum  # noqa: E402
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


#: the blocks measured per model (`spectrum.build`'s names): (layers built, layers measured)
LAYERS: dict[str, tuple[int, tuple[int, ...]]] = {
    "gpt2": (12, (1, 6, 12)), "llama-mid": (4, (1, 4)), "llama-1b": (2, (1, 2)),
    "llama-8b": (2, (1, 2)),
    "gpt2-small": (4, (1, 4)), "llama-small": (4, (1, 4)),
}


def decay_matrix(d: int, device: str) -> torch.Tensor:
    """J with singular values ``10 / sqrt(i)`` and seeded random singular vectors."""
    g = torch.Generator().manual_seed(d)
    Q1 = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
    Q2 = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
    s = 10 / torch.arange(1, d + 1, dtype=torch.float64).sqrt()
    return ((Q1 * s) @ Q2.T).float().to(device)


def matrices(device: str, models: list[str], spectra: list[str]
             ) -> Iterator[tuple[str, str, list[torch.Tensor]]]:
    """(model, spectrum, its last-token J^l_tt at `LAYERS`) for every model and spectrum
    (`spectrum.build`), built one at a time; ``decay``: `decay_matrix` at each width met."""
    widths = []
    for name in models:
        if name == "decay":
            continue
        n_layers, layers = LAYERS[name]
        for kind in spectra:
            model = spectrum.build(name, kind, device, layers=n_layers, vocab_size=1000)
            widths.append(int(model.config.hidden_size))
            Js = _last_token_jacobians(model, layers, device)
            del model
            yield name, kind, Js
    if "decay" in models:
        yield "decay", "10/sqrt(i)", [decay_matrix(d, device) for d in sorted(set(widths) or {768})]


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
    ap.add_argument("--models", nargs="+", default=None, choices=[*LAYERS, "decay"],
                    help="default: gpt2 llama-mid decay on the CPU, + llama-8b on cuda")
    ap.add_argument("--spectrum", nargs="+", default=list(spectrum.SPECTRA),
                    choices=spectrum.SPECTRA,
                    help="the random models' weights: flat (their initialisation), trained "
                         "(benchmarks/spectrum.py: the trained models' Jacobian decay)")
    ap.add_argument("--lobpcg-iters", type=int, nargs="*", default=[])
    args = ap.parse_args()
    cuda = torch.device(args.device).type == "cuda"
    models = args.models or ["gpt2", "llama-mid", *(["llama-8b"] if cuda else []), "decay"]
    sink: list[dict[str, Any]] = []
    emit({"record": "config", "device": args.device, "ks": args.ks, "repeats": args.repeats,
          "models": models, "spectrum": args.spectrum,
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
        for name, kind, Js in matrices(args.device, models, args.spectrum):
            for i, J in enumerate(Js):
                s64 = torch.linalg.svdvals(J.double())
                for k in args.ks:
                    rec: dict[str, Any] = {"record": "topk", "matrix": name, "spectrum": kind,
                                           "layer": (LAYERS[name][1][i] if name in LAYERS
                                                     else None), "index": i,
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
                        checks = ratios[: len(ratios) // args.repeats]
                        rec[forced] = {"seconds": round(sec, 5), "route": top.route,
                                       "ratios": checks,
                                       # the iteration checks every _ITER_CHECK products
                                       "products": (svd_mod._ITER_CHECK * len(checks)
                                                    if forced == "iter" else 0),
                                       "fell_back": forced == "iter" and top.route != "gram-iter",
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
