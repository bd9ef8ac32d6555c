"""Does one float32 forward pass give the same bits in every process? (docs/how-to/faults.md)

The case where a killed and resumed ``study lm-family --quick`` first differed from an
uninterrupted one: its run ``L2-d24-b8`` (2 blocks, d = 24) at its last checkpoint, the
study's 4 held-out prompts padded into one batch (``engine.inputs.make_batch``), one forward
pass with hidden states. The run is trained into ``--cache`` (seconds), then ``--n`` fresh
processes per thread count each hash every hidden state; the record counts the distinct
results. ``--env KEY=VALUE`` adds a variable to the children's environment (e.g.
``MKL_CBWR=AUTO``).

    python benchmarks/bench_repeatability.py --n 30
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402


def child(checkpoint: str, prompts_file: str) -> None:
    import torch

    from blockcoupling.engine.inputs import make_batch, normalise_inputs
    from blockcoupling.studies.tiny_lm import load_checkpoint

    model, tok = load_checkpoint(checkpoint)
    prompts = Path(prompts_file).read_text(encoding="utf-8").splitlines()
    inputs = make_batch(tok, normalise_inputs(prompts), model, torch.device("cpu"))
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, use_cache=False)
    print(" ".join(hashlib.sha1(h.numpy().tobytes()).hexdigest()[:8] for h in out.hidden_states))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="processes per thread count")
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--cache", default="/tmp/bc_repeatability_cache")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the children")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    from blockcoupling.studies import lm_study as S
    from blockcoupling.studies.tiny_lm import train_tiny_lm

    spec = S.quick_spec()
    run = next(r for r in spec.runs if r.run_id.startswith("L2-d24-b8"))
    cfg = S.tiny_config(spec, run)
    checkpoint = str(train_tiny_lm(cfg, args.cache, progress=False, monitor=False)[-1][1])
    prompts = Path(args.cache) / "prompts.txt"
    prompts.write_text("\n".join(S.family_prompts(cfg, n=spec.n_prompts,
                                                  length=spec.prompt_length)) + "\n",
                       encoding="utf-8")
    extra = dict(kv.split("=", 1) for kv in args.env)
    sink: list[dict[str, Any]] = []
    emit({"record": "machine", **machine()}, sink)
    for threads in args.threads.split(","):
        env = {**os.environ, **extra, "OMP_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1"}
        seen: collections.Counter[str] = collections.Counter()
        for _ in range(args.n):
            res = subprocess.run([sys.executable, __file__, "--child", checkpoint, str(prompts)],
                                 capture_output=True, text=True, env=env, timeout=300, check=True)
            seen[res.stdout.strip().splitlines()[-1]] += 1
        emit({"record": "repeatability", "checkpoint": checkpoint, "omp_num_threads": threads,
              "env": extra, "processes": args.n, "distinct_results": len(seen),
              "counts": sorted(seen.values(), reverse=True)}, sink)
    save(sink, "bench_repeatability")


if __name__ == "__main__":
    main()
