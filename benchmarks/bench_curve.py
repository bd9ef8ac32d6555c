"""The curve (issue 13, item 3): seconds per prompt and the ratio to the released algorithm
for prompt lengths 12, 32, 128 and widths d = 768, 2048, at fixed K (10, 30, 50).

For each cell (d, n): a random-weight GPT-2-shaped ``GPT2Model`` of width d (d / 64 heads, MLP
4 d) with ``--layers`` blocks (default 4: the per-prompt ratio barely depends on the depth,
the released pair loops grow as L^2 and are ~2 % of its time), ``--prompts`` random prompts of
n tokens, then ``--repeats`` times, interleaved:

* ``released``: benchmarks/released.py on prompt 0. Where d full pullbacks through n tokens
  would take too long (estimated above ``--released-budget`` seconds from a first timed
  chunk), only ``rows`` cotangents per block are pulled back and the pullback phase is
  extrapolated linearly (``d / rows``; the cost of a chunk of cotangents is linear in its
  size): such cells say ``"released_extrapolated": true``.
* ``measure``: ONE public call on all the prompts, the defaults::

      measure(model, None, {"input_ids": ids}, coupling=("depth",), k=(10, 30, 50),
              final_norm=True, progress=False)

  seconds per prompt = call wall time / prompts (the first prompt's one-time checks
  included). Where the time goes, from the public ``diagnostics`` table: ``jac_svd_s`` (the
  Jacobians and their top-K SVDs, summed per call) and the rest (capture, trajectories,
  pass 2 -- every J applied to every basis -- and the tables).

Every record carries the 1-minute load average, wall seconds and process CPU seconds (with
``OMP_NUM_THREADS=1`` on a loaded machine CPU seconds are the robust measure; the ratios of
both are reported). JSON lines to stdout and
benchmarks/results/<stamp>_<host>_bench_curve.json.

    OMP_NUM_THREADS=2 python benchmarks/bench_curve.py                 # all 6 cells
    OMP_NUM_THREADS=2 python benchmarks/bench_curve.py --d 768 --n 12  # one cell
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402
from released import released_depth  # noqa: E402

import blockcoupling  # noqa: E402

KS = (10, 30, 50)


def la1() -> float:
    return round(os.getloadavg()[0], 2)


def model_of(d: int, layers: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = tf.GPT2Config(n_embd=d, n_head=d // 64, n_layer=layers, n_positions=1024)
    return tf.GPT2Model(cfg).eval()


def released_time(model: torch.nn.Module, ids: torch.Tensor, d: int, budget: float
                  ) -> dict[str, Any]:
    """Released seconds for prompt ``ids`` (1, n): full if affordable, else extrapolated."""
    probe_rows = min(d, 64)
    _, ph = released_depth(model, ids, ks=KS, rows=probe_rows)
    jac = ph["jacobians"].cpu_seconds
    estimate = jac * d / probe_rows + sum(p.cpu_seconds for k, p in ph.items() if k != "jacobians")
    if estimate <= budget:
        _, ph = released_depth(model, ids, ks=KS)
        phases = {k: round(p.seconds, 4) for k, p in ph.items()}
        cpu = {k: round(p.cpu_seconds, 4) for k, p in ph.items()}
        return {"seconds": round(sum(phases.values()), 3), "phases": phases,
                "cpu_seconds": round(sum(cpu.values()), 3), "cpu_phases": cpu,
                "released_extrapolated": False}
    phases = {k: round(p.seconds, 4) for k, p in ph.items()}
    cpu = {k: round(p.cpu_seconds, 4) for k, p in ph.items()}
    phases["jacobians"] = round(ph["jacobians"].seconds * d / probe_rows, 3)
    cpu["jacobians"] = round(jac * d / probe_rows, 3)
    return {"seconds": round(sum(phases.values()), 3), "phases": phases,
            "cpu_seconds": round(sum(cpu.values()), 3), "cpu_phases": cpu,
            "released_extrapolated": True, "rows_pulled_back": probe_rows,
            "measured_pullback_cpu_s": round(jac, 4)}


def measure_time(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    m = blockcoupling.measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS,
                              final_norm=True, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    P = ids.shape[0]
    jac = float(m.diagnostics["seconds"].sum())
    return {"call_seconds": round(wall, 3), "per_prompt_s": round(wall / P, 4),
            "call_cpu_seconds": round(cpu, 3), "per_prompt_cpu_s": round(cpu / P, 4),
            "jac_svd_s": round(jac, 3), "rest_s": round(wall - jac, 3),
            "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, nargs="+", default=[768, 2048])
    ap.add_argument("--n", type=int, nargs="+", default=[12, 32, 128])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--released-budget", type=float, default=120.0,
                    help="run the released algorithm in full only below this estimate (s)")
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    complete = False
    try:
        emit({"record": "config", "ds": args.d, "ns": args.n, "layers": args.layers,
              "prompts": args.prompts, "repeats": args.repeats, "ks": list(KS),
              "machine": machine(), "loadavg_start": list(os.getloadavg())}, sink)
        for d in args.d:
            model = model_of(d, args.layers)
            for n in args.n:
                ids = torch.randint(0, model.config.vocab_size, (args.prompts, n),
                                    generator=torch.Generator().manual_seed(n))
                rel, mea = [], []
                for rep in range(args.repeats):
                    r = released_time(model, ids[:1], d, args.released_budget)
                    r.update(record="released", d=d, n=n, repeat=rep, loadavg_1m=la1())
                    emit(r, sink)
                    rel.append(r)
                    m = measure_time(model, ids)
                    m.update(record="measure", d=d, n=n, repeat=rep, loadavg_1m=la1())
                    emit(m, sink)
                    mea.append(m)
                rel_med = statistics.median(r["seconds"] for r in rel)
                pp_med = statistics.median(m["per_prompt_s"] for m in mea)
                rel_cpu = statistics.median(r["cpu_seconds"] for r in rel)
                pp_cpu = statistics.median(m["per_prompt_cpu_s"] for m in mea)
                emit({"record": "cell", "d": d, "n": n, "layers": args.layers,
                      "released_median_cpu_s": rel_cpu, "measure_per_prompt_median_cpu_s": pp_cpu,
                      "cpu_ratio": round(rel_cpu / pp_cpu, 2),
                      "released_median_s": rel_med,
                      "released_extrapolated": any(r["released_extrapolated"] for r in rel),
                      "measure_per_prompt_median_s": pp_med,
                      "ratio": round(rel_med / pp_med, 2),
                      "jac_svd_share": round(statistics.median(
                          m["jac_svd_s"] / m["call_seconds"] for m in mea), 3),
                      "loadavg": [round(x, 2) for x in os.getloadavg()]}, sink)
        emit({"record": "end", "loadavg_end": list(os.getloadavg())}, sink)
        complete = True
    finally:
        save(sink, "bench_curve" if complete else "bench_curve_partial")


if __name__ == "__main__":
    main()
