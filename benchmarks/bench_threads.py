"""Why ``measure()`` keeps scipy's BLAS on one thread (engine/svd.py: ``one_blas_thread``).

One step of the depth-wise pipeline at the GPT-2-small shape, repeated: the float64 Gram
matrix of a (768, 768) J (torch), the top-50 eigenpairs of it (``scipy.linalg.eigh``,
OpenBLAS), U = J V (torch), then an MLP-sized GEMM (768 x 3072 x 768, torch). Once with
scipy's OpenBLAS on its default threads and once inside ``one_blas_thread()``, in
alternating blocks; per step the milliseconds of each part, medians of the recorded steps. On a machine with few
cores the two thread pools (torch's OpenMP, OpenBLAS's pthreads) spin against each other and
the torch GEMM after ``eigh`` slows down.

    OMP_NUM_THREADS=2 python benchmarks/bench_threads.py
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import scipy.linalg
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402

from blockcoupling.engine.svd import one_blas_thread  # noqa: E402

PARTS = ("gram", "eigh", "u", "gemm")


def step(J: torch.Tensor, W: torch.Tensor, k: int, limit: bool) -> dict[str, float]:
    ts = [time.perf_counter()]
    J64 = J.double()
    G = (J64.mT @ J64).numpy()
    ts.append(time.perf_counter())
    d = G.shape[0]
    with one_blas_thread() if limit else contextlib.nullcontext():
        _, Q = scipy.linalg.eigh(G, subset_by_index=[d - k, d - 1], driver="evr")
    ts.append(time.perf_counter())
    J64 @ torch.from_numpy(Q.copy())
    ts.append(time.perf_counter())
    W @ W.T
    ts.append(time.perf_counter())
    return {p: (b - a) * 1e3 for p, a, b in zip(PARTS, ts[:-1], ts[1:], strict=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=4, help="blocks per mode")
    ap.add_argument("--block", type=int, default=5, help="steps per block")
    args = ap.parse_args()
    torch.manual_seed(0)
    J = torch.randn(args.d, args.d) / args.d**0.5 + 0.1 * torch.eye(args.d)
    W = torch.randn(args.d, 4 * args.d)
    sink: list[dict[str, Any]] = []
    emit({"record": "config", "d": args.d, "k": args.k, "repeats": args.repeats,
          "block": args.block,
          "machine": machine()}, sink)
    runs: dict[str, list[dict[str, float]]] = {"default": [], "one_blas_thread": []}
    # blocks of --block steps per mode, alternating; the first step of each block is not
    # recorded (it follows the other mode's steps)
    for _ in range(args.repeats):
        for name, limit in (("default", False), ("one_blas_thread", True)):
            block = [step(J, W, args.k, limit) for _ in range(args.block)]
            runs[name] += block[1:]
    for name, rs in runs.items():
        med = {p: round(statistics.median(r[p] for r in rs), 2) for p in PARTS}
        emit({"record": "summary", "scipy_blas": name, "median_ms": med,
              "total_median_ms": round(statistics.median(sum(r.values()) for r in rs), 2)},
             sink)
    save(sink, "bench_threads")


if __name__ == "__main__":
    main()
