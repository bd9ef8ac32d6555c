"""Where a default depth-wise ``measure()`` call spends its time: cProfile of one call.

Random GPT-2-small-shaped model (12 layers, d = 768), 3 prompts of 12 tokens, the item-2 call
of bench_depth.py (``coupling=("depth",), k=(10, 30, 50), final_norm=True, batch_size=1``)
after one warm-up call; prints the functions by own time and by cumulative time. Profiling
slows the call (~7.5 s instead of ~7.1 s on 2 cores): read shares, not seconds.

    OMP_NUM_THREADS=2 python benchmarks/profile_depth.py
"""

from __future__ import annotations

import cProfile
import pstats
import time

import torch
import transformers as tf

import blockcoupling as bc


def main() -> None:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=12, n_embd=768, n_head=12)
    model = tf.GPT2Model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    kw = dict(coupling=("depth",), k=(10, 30, 50), final_norm=True, progress=False,
              batch_size=1)
    bc.measure(model, None, {"input_ids": ids[:1]}, **kw)  # warm-up
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    bc.measure(model, None, {"input_ids": ids}, **kw)
    prof.disable()
    print(f"one call on {len(ids)} prompts: {time.perf_counter() - t0:.2f} s (profiled)")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
