"""Where a checkpoint sweep's time goes (issue 34 item 2): load, measure, write; local and Ray.

Units: ``--checkpoints`` (16) checkpoint folders (HF Trainer layout) of a random-weight
GPT-NeoX-shaped model (``--shape``: ``pythia-14m`` d = 128, 6 layers, 4 heads, MLP 512;
``pythia-70m`` d = 512, 6 layers, 8 heads, MLP 2048; rotary on a quarter of each head,
parallel residual, as Pythia), each with a word-level tokenizer of the built-in prompts (the
hub's tokenizers are not reachable here), measured on ``--prompts`` (64) prompts of
``builtin:benchmark_styles`` with the default measurement (depth-wise coupling at the last
token, K = 10, 30, 50, every variant, both orientations).

Phases, in one process, one after the other (``--executors``):

* ``local``: ``run_sweep(..., executor="local")``: the units one after the other here;
* ``ray``: ``run_sweep(..., executor="ray", address="local")``: a local Ray cluster of
  ``--cluster-cpus`` started by the sweep (its start-up and shutdown included), each unit a
  task of ``--unit-cpus`` CPUs.

Per unit, from its status record (``studies/sweep/runner.unit_timings``): ``load`` (model,
tokenizer, prompts), ``setup`` (the run's checks, the weights' fingerprint, the directory),
``measure`` (the engine), ``write`` (the parts, then the consolidation). Per sweep: its wall
time and the **measuring share**, the units' measure seconds over the wall time the sweep
could have measured in (wall x the units it runs at once: 1 locally, cluster CPUs / unit CPUs
on Ray). The stored values of every executor are compared with the local sweep's.

    OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py                        # ~3-5 min
    OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py --shape pythia-70m     # longer units
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, machine, phase, save, word_tokenizer  # noqa: E402

from blockcoupling import studies  # noqa: E402

PROMPTS = "builtin:benchmark_styles"
SHAPES: dict[str, dict[str, int]] = {
    "pythia-14m": {"hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
                   "intermediate_size": 512},
    "pythia-70m": {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8,
                   "intermediate_size": 2048},
}


def make_checkpoints(root: Path, shape: str, n: int) -> list[Path]:
    """``n`` checkpoint folders of one random GPT-NeoX-shaped model (a seed per checkpoint),
    each with the word-level tokenizer of the built-in prompts."""
    tok = word_tokenizer(PROMPTS)
    cfg = tf.GPTNeoXConfig(vocab_size=len(tok), max_position_embeddings=512,
                           rotary_pct=0.25, use_parallel_residual=True, **SHAPES[shape])
    out = []
    for i in range(n):
        torch.manual_seed(i)
        path = root / "train" / f"checkpoint-{1000 * i}"
        tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
        tok.save_pretrained(path)
        out.append(path)
    return out


def unit_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    from blockcoupling.store import collection as store

    return [{"unit": r["unit"]["unit_id"], "status": r["status"], "seconds": r.get("seconds"),
             **{k: round(v, 4) for k, v in (r.get("timings") or {}).items()}}
            for r in store.all_status(sweep_dir)]


def summarise(name: str, wall: float, rows: list[dict[str, Any]], concurrent: float
              ) -> dict[str, Any]:
    parts = ("load", "setup", "measure", "write")
    totals = {p: round(sum(r.get(p, 0.0) for r in rows), 3) for p in parts}
    medians = {p: round(statistics.median(r.get(p, 0.0) for r in rows), 4) for p in parts}
    share = totals["measure"] / (wall * concurrent)
    return {"record": f"summary_{name}", "wall_s": round(wall, 3), "units": len(rows),
            "concurrent_units": concurrent, "unit_totals_s": totals, "unit_medians_s": medians,
            "unit_seconds_total": round(sum(r["seconds"] or 0.0 for r in rows), 3),
            "measuring_share": round(share, 4),
            "not_in_units_s": round(wall * concurrent - sum(r["seconds"] or 0 for r in rows), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="pythia-14m")
    ap.add_argument("--checkpoints", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--executors", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    ap.add_argument("--cluster-cpus", type=int, default=2)
    ap.add_argument("--unit-cpus", type=float, default=1.0)
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "config", **vars(args), "machine": machine()}, sink)
    root = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    try:
        with phase("make") as ph:
            make_checkpoints(root, args.shape, args.checkpoints)
        emit({"record": "make_checkpoints", **ph.as_dict()}, sink)
        spec = {"models": [{"label": "neox", "checkpoints": str(root / "train" / "checkpoint-*"),
                            "resources": {"num_cpus": args.unit_cpus}}],
                "prompts": [PROMPTS], "limit": args.prompts}
        ref = None
        for ex in args.executors:
            out = root / f"sweep-{ex}"
            load0 = os.getloadavg()[0]
            t0, c0 = time.perf_counter(), time.process_time()
            if ex == "local":
                s = studies.run_sweep(spec, out, executor="local", progress=False)
                concurrent = 1.0
            else:
                s = studies.run_sweep(spec, out, executor="ray", address="local", progress=False,
                                 num_cpus=args.cluster_cpus)
                concurrent = max(1.0, args.cluster_cpus // args.unit_cpus)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            rows = unit_rows(out)
            for r in rows:
                emit({"record": f"unit_{ex}", **r}, sink)
            rec = summarise(ex, wall, rows, concurrent)
            rec.update(driver_cpu_s=round(cpu, 3), load_start=load0,
                       load_end=os.getloadavg()[0])
            vals = s.coupling.sort_values(["unit_id", "prompt_id", "layer_a", "layer_b", "k",
                                           "variant", "orientation"])["value"].to_numpy()
            if ref is None:
                ref = vals
            else:
                rec["max_abs_diff_vs_first"] = float(abs(vals - ref).max())
            emit(rec, sink)
        save(sink, f"bench_sweep_{args.shape}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
