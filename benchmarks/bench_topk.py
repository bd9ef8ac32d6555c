"""Top-50 of a d = 768 block Jacobian: the engine's Gram route against the alternatives (issue 22).

One process, the decode-step J of blocks 1-3 of a random GPT-2-small-shaped model (12-token
prompt, last token, the structured route), float32. Per J, interleaved, ``--repeats`` times,
median process CPU and wall milliseconds of:

- ``engine``: ``svd.topk_svd(J, 50)`` (float64 Gram, scipy ``eigh`` subset, MRRR, one thread);
- ``scipy_evr``: that ``eigh`` alone; ``torch_eigh64`` / ``torch_eigh32``: a full ``eigh`` of
  the Gram by torch (MKL, torch's threads), float64 / float32; ``torch_svd32``: full SVD of J;
- ``eigsh``: ARPACK Lanczos on the float64 Gram (k = 50, tol 1e-13);
- ``lobpcg``: scipy LOBPCG on the float64 Gram (block k + 10, tol 1e-10, 200 iterations).

Also s_50 / s_51 (how flat the spectrum is where K ends: iterative methods converge with the
gap) and each iterative method's largest eigenvector / eigenvalue error against ``scipy_evr``.

    OMP_NUM_THREADS=2 python benchmarks/bench_topk.py      # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse.linalg as sla
import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402

from blockcoupling.engine import fastpath, svd  # noqa: E402
from blockcoupling.engine.blocks import find_blocks  # noqa: E402
from blockcoupling.engine.capture import capture  # noqa: E402

K = 50


def jacobians() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(n_layer=3)).eval()
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(0))
    cap = capture(model, {"input_ids": ids}, find_blocks(model), final_norm=True)
    out = []
    for layer in (1, 2, 3):
        tb = fastpath.token_branch(model, cap, layer, 0, 11, verify=False)
        assert tb is not None
        out.append(tb.jacobian().clone())
    return out


def candidates(J: torch.Tensor, G: torch.Tensor, x0: np.ndarray) -> dict[str, Callable[[], Any]]:
    """The timed calls on one J (d, d) float32 and its float64 Gram G (d, d)."""
    Gn, n = G.numpy(), int(G.shape[0])
    return {
        "engine": lambda: svd.topk_svd(J, K),
        "scipy_evr": lambda: scipy.linalg.eigh(Gn, subset_by_index=[n - K, n - 1], driver="evr"),
        "torch_eigh64": lambda: torch.linalg.eigh(G),
        "torch_eigh32": lambda: torch.linalg.eigh(G.float()),
        "torch_svd32": lambda: torch.linalg.svd(J, full_matrices=False),
        "eigsh": lambda: sla.eigsh(Gn, k=K, which="LA", tol=1e-13),
        "lobpcg": lambda: sla.lobpcg(Gn, x0, largest=True, tol=1e-10, maxiter=200),
    }


def clock(f: Callable[[], Any]) -> tuple[Any, float, float]:
    c, w = time.process_time(), time.perf_counter()
    r = f()
    return r, (time.process_time() - c) * 1e3, (time.perf_counter() - w) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "config", "repeats": args.repeats, "machine": machine()}, sink)
    for i, J in enumerate(jacobians()):
        J64 = J.double()
        G = J64.mT @ J64  # (d, d)
        x0 = np.random.default_rng(0).standard_normal((G.shape[0], K + 10))
        cands = candidates(J, G, x0)
        with svd.one_blas_thread():
            times: dict[str, list[tuple[float, float]]] = {c: [] for c in cands}
            got: dict[str, Any] = {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # LOBPCG's "did not reach the tolerance"
                for r in range(args.repeats):
                    for name in (list(cands) if r % 2 == 0 else list(reversed(cands))):
                        got[name], cpu, wall = clock(cands[name])
                        times[name].append((cpu, wall))
        w, Q = got["scipy_evr"]
        V_ref = Q[:, ::-1]  # (n, K) descending
        errs: dict[str, dict[str, float]] = {}
        for name in ("eigsh", "lobpcg"):
            wi, Qi = got[name]
            o = np.argsort(wi)[::-1][:K]
            errs[name] = {
                "eigenvalue": float(np.abs(wi[o] - w[::-1]).max()),
                "vector": float(np.abs(np.abs((V_ref.T @ Qi[:, o]).diagonal()) - 1).max())}
        s = torch.linalg.svdvals(J64)
        emit({"record": "topk", "block": i + 1, "s50_over_s51": round(float(s[K - 1] / s[K]), 5),
              "cpu_ms_median": {c: round(statistics.median(t[0] for t in v), 1)
                                for c, v in times.items()},
              "wall_ms_median": {c: round(statistics.median(t[1] for t in v), 1)
                                 for c, v in times.items()},
              "errors_vs_scipy_evr": errs, "loadavg_1m": round(os.getloadavg()[0], 2)}, sink)
    save(sink, "bench_topk")


if __name__ == "__main__":
    main()
