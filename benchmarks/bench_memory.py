"""Peak memory of ``measure()`` per phase (issue 22, item 4), against what it must hold.

Each case runs in its own process (the resident set size never shrinks back to a baseline),
on a random-weight GPT-2-shaped model, float32, ``measure()`` with the defaults
(``coupling=("depth",), k=(10, 30, 50), final_norm=True, batch_size=1``):

- ``default``: d = 768, 12 layers, 4 prompts of 12 tokens (the call of bench_depth.py);
- ``d2048``: d = 2048 (32 heads, MLP 8192), ``--layers`` blocks (default 2, as bench_curve.py),
  one 128-token prompt.

A thread samples the RSS (``psutil``) every 2 ms; every ``on_event`` event (capture, jacobian,
svd, coupling, tables, prompt) gets the highest RSS seen during its interval. Reported in MB
above the RSS just before the call (model and imports loaded): the peak of each phase and of
the call, next to what the engine holds by design: the dense Jacobians of ONE block (its
selected tokens: ``d^2 * 4`` bytes each), of ALL blocks (``measure`` keeps every dense J of a
prompt for pass 2 while they fit ``STRUCTURED_KEEP_BYTES``), and the top-K bases (U and V,
``2 * d * K_max * 4`` bytes per Jacobian). torch's CPU allocator returns large blocks to the
system, so the RSS follows what is alive (within glibc's caching).

    OMP_NUM_THREADS=2 python benchmarks/bench_memory.py             # both cases, ~2 min
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402

MB = 2**20
CASES = {"default": dict(d=768, heads=12, layers=12, prompts=4, tokens=12),
         "d2048": dict(d=2048, heads=32, layers=2, prompts=1, tokens=128)}


def run_case(name: str, layers: int | None) -> dict[str, Any]:
    """One case in this process: per-phase peak RSS above the RSS before the call."""
    import blockcoupling

    c = dict(CASES[name])
    if layers:
        c["layers"] = layers
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(n_embd=c["d"], n_head=c["heads"], n_layer=c["layers"])).eval()
    ids = torch.randint(0, model.config.vocab_size, (c["prompts"], c["tokens"]),
                        generator=torch.Generator().manual_seed(0))
    kw: dict[str, Any] = dict(coupling=("depth",), k=(10, 30, 50), final_norm=True,
                              progress=False, batch_size=1)
    blockcoupling.measure(model, None, {"input_ids": ids[:1, :12]}, **kw)  # warm-up (imports)
    proc = psutil.Process()
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), proc.memory_info().rss))
            stop.wait(0.002)

    events: list[tuple[str, float, float]] = []  # (phase, start, end)

    def on_event(e: Any) -> None:
        now = time.perf_counter()
        events.append((e.phase, now - e.seconds, now))

    before = proc.memory_info().rss
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0, c0 = time.perf_counter(), time.process_time()
    res = blockcoupling.measure(model, None, {"input_ids": ids}, on_event=on_event, **kw)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    th.join()
    peak: dict[str, float] = {}
    for ph, a, b in events:
        inside = [r for t, r in samples if a <= t <= b] or [0]
        peak[ph] = max(peak.get(ph, 0.0), (max(inside) - before) / MB)
    d, kmax = c["d"], 50
    keys_per_block = 1  # depth-wise: J^l_tt at the last token
    j_one = keys_per_block * d * d * 4 / MB
    return {"record": "memory", "case": name, **c,
            "rss_before_call_mb": round(before / MB, 1),
            "peak_rss_mb": round(max(r for _, r in samples) / MB, 1),
            "peak_above_before_mb": round((max(r for _, r in samples) - before) / MB, 1),
            "peak_above_before_by_phase_mb": {k: round(v, 1) for k, v in peak.items()},
            "held_by_design_mb": {
                "jacobians_one_block": round(j_one, 1),
                "jacobians_all_blocks": round(c["layers"] * j_one, 1),
                "bases_all_blocks": round(c["layers"] * keys_per_block * 2 * d * kmax * 4 / MB, 1),
                "model_weights": round(sum(p.numel() for p in model.parameters()) * 4 / MB, 1)},
            "methods": sorted(set(res.diagnostics["method"])),
            "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=sorted(CASES), help="run one case in this process")
    ap.add_argument("--layers", type=int, default=None, help="blocks of the d2048 case")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.layers if args.case == "d2048" else None)))
        return
    sink: list[dict[str, Any]] = []
    emit({"record": "machine", **machine()}, sink)
    for name in CASES:
        cmd = [sys.executable, __file__, "--case", name]
        if args.layers and name == "d2048":
            cmd += ["--layers", str(args.layers)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        emit(json.loads(out.strip().splitlines()[-1]), sink)
    save(sink, "bench_memory")


if __name__ == "__main__":
    main()
