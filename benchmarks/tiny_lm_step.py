"""Seconds per training step of the lm-family's 4-block d = 64 tiny LM (batch 16 x 64
characters), wall and CPU, with the machine's load: the cost behind `study lm-family`.

    OMP_NUM_THREADS=2 python benchmarks/tiny_lm_step.py [--steps 40] [--deterministic]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from blockcoupling.studies import tiny_lm as T
from blockcoupling.studies.lm_study import full_spec, tiny_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--deterministic", action="store_true")
    args = ap.parse_args()
    spec = full_spec()
    cfg = tiny_config(spec, spec.runs[0])
    tok = T.build_tokenizer(T.corpus_text())
    ids = T._encode(tok, T.corpus_text())  # (N,)
    torch.manual_seed(0)
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(T.gpt2_config(cfg, len(tok), tok.pad_token_id))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    torch.use_deterministic_algorithms(args.deterministic, warn_only=True)
    span = cfg.block_size + 1
    wall, cpu = [], []
    load0 = os.getloadavg()[0]
    for _ in range(args.steps):
        t, c = time.perf_counter(), time.process_time()
        starts = torch.randint(0, len(ids) - span, (cfg.batch_size,))
        loss = T._lm_loss(model, T._windows(ids, starts, span))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    print(json.dumps({"threads": torch.get_num_threads(), "deterministic": args.deterministic,
                      "median_ms_wall": 1e3 * statistics.median(wall[5:]),
                      "median_ms_cpu": 1e3 * statistics.median(cpu[5:]),
                      "max_ms_wall": 1e3 * max(wall[5:]), "load_start": load0,
                      "load_end": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
