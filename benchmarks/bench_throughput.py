"""Per-prompt cost of the default call against the number of prompts (issue 34 item 2).

One process, ONE model load: a random-weight GPT-2-shaped model (``--shape``: ``gpt2-small``
d = 768, 12 layers; ``small`` d = 256, 4 layers, for a quick or a shared machine; ``narrow``
d = 64, 12 layers: GPT-2-small's coupling rows per prompt at a width where the prompts cost
little, so what is outside them is a large share; ``--layers`` overrides the blocks), float32, a
word-level tokenizer of the built-in prompts (common.word_tokenizer). For each N of ``--ns``
(4, 64, 256, 1,024): ONE call with the defaults (depth-wise at the last token, K = 10, 30,
50, every variant, both orientations, batch size 8) on the first N prompts of
``builtin:benchmark_styles`` (300 prompts: beyond them the set repeats, with ids ``~r1``,
``~r2``, ... so that every prompt is measured); ``--to-dir``: ``measure_to_dir`` into a new
folder instead (its parts and consolidation included).

Per call: wall and CPU seconds in all and per prompt; the CPU seconds per phase (``on_event``,
common.PhaseCPU: capture, trajectory, jacobian, svd, coupling, tables, prompt); the first
prompt's work (the one-time checks of the fast path) against the median of the others; and
the trajectory tables' seconds (``trajectory_s``, per batch); and what is outside all of
these (the call's start, the batches' splits, the final concatenation: ``outside_s``;
``outside_with_trajectory_s`` is the definition of the 2026-11-27 rows, the trajectory
tables included). ``--count-calls N ...``: one more call per N under cProfile, the Python
function calls per prompt (load-independent). ``--spectrum trained``: the model's weights
with the trained models' Jacobian decay (`spectrum.realistic_`).
What batching can amortise is the first prompt's checks and the call's fixed costs; the
Jacobians, SVDs and pairs are per prompt.

    OMP_NUM_THREADS=2 python benchmarks/bench_throughput.py                 # gpt2-small, ~30 min
    OMP_NUM_THREADS=1 python benchmarks/bench_throughput.py --shape small   # ~5 min
    OMP_NUM_THREADS=1 python benchmarks/bench_throughput.py --shape small --ns 2 --count-calls 8 32
    OMP_NUM_THREADS=1 python benchmarks/bench_throughput.py --shape narrow --ns 4 64 256  # outside
    OMP_NUM_THREADS=2 python benchmarks/bench_throughput.py --layers 6 --ns 4 64 1024   # ~12 min
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
import spectrum  # noqa: E402
from common import PhaseCPU, emit, machine, phase, save, word_tokenizer  # noqa: E402

import blockcoupling as bc  # noqa: E402

PROMPTS = "builtin:benchmark_styles"
#: ``--shape``: (width, blocks, heads) of the GPT-2-shaped model
SHAPES: dict[str, tuple[int, int, int]] = {"gpt2-small": (768, 12, 12), "small": (256, 4, 4),
                                           "narrow": (64, 12, 2)}


def prompts(n: int) -> list[Any]:
    """The first n prompts of the set, repeated (with new ids) beyond its length."""
    base = bc.load_prompts(PROMPTS)
    out = []
    for i in range(n):
        p, r = base[i % len(base)], i // len(base)
        out.append(p if r == 0 else bc.Prompt(f"{p.prompt_id}~r{r}", p.text, p.label))
    return out


class PromptLog(PhaseCPU):
    """PhaseCPU plus each prompt's work seconds (the ``prompt`` events), the capture's and
    the trajectory tables' (per batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt_s: list[float] = []
        self.capture_s = 0.0
        self.trajectory_s = 0.0

    def __call__(self, ev: Any) -> None:
        super().__call__(ev)
        if ev.phase == "prompt":
            self.prompt_s.append(ev.seconds)
        elif ev.phase == "capture":
            self.capture_s += ev.seconds
        elif ev.phase == "trajectory":
            self.trajectory_s += ev.seconds


def count_calls(fn: Any) -> tuple[int, list[tuple[str, int]]]:
    """Python function calls made by ``fn()`` (cProfile): the total and the 15 functions
    called most often. Counts do not depend on the machine's load, seconds do."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(((f"{Path(k[0]).name}:{k[2]}", int(v[1])) for k, v in stats.items()),
                  key=lambda r: -r[1])
    return sum(n for _, n in rows), rows[:15]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    ap.add_argument("--layers", type=int, default=None, help="blocks (default: the shape's)")
    ap.add_argument("--ns", type=int, nargs="+", default=[4, 64, 256, 1024])
    ap.add_argument("--to-dir", action="store_true", help="measure_to_dir instead of measure")
    ap.add_argument("--spectrum", choices=spectrum.SPECTRA, default="flat",
                    help="the model's weights: flat (the random initialisation) or trained "
                         "(benchmarks/spectrum.py: Jacobians with the trained models' decay)")
    ap.add_argument("--count-calls", type=int, nargs="*", default=[], metavar="N",
                    help="after the timed calls, one call per N under cProfile: Python "
                         "function calls per prompt (load-independent; no seconds)")
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "config", **vars(args), "machine": machine()}, sink)
    tok = word_tokenizer(PROMPTS)
    torch.manual_seed(0)
    width, blocks, heads = SHAPES[args.shape]
    model = tf.GPT2Model(tf.GPT2Config(n_layer=args.layers or blocks, n_embd=width, n_head=heads,
                                       vocab_size=len(tok))).eval()
    if args.spectrum == "trained":
        spectrum.realistic_(model)
    root = Path(tempfile.mkdtemp(prefix="bench_throughput_"))
    try:
        bc.measure(model, tok, prompts(2), progress=False)  # warm-up: imports, set-up
        for n in args.ns:
            items = prompts(n)
            lengths = [len(tok(p.text)["input_ids"]) for p in items]
            log = PromptLog()
            with phase(f"n{n}") as ph:
                if args.to_dir:
                    bc.measure_to_dir(model, tok, items, root / f"run{n}", progress=False,
                                      on_event=log)
                else:
                    bc.measure(model, tok, items, progress=False, on_event=log)
            rest = log.prompt_s[1:] or log.prompt_s
            emit({"record": "call", "prompts": n, **ph.as_dict(),
                  "per_prompt_s": round(ph.seconds / n, 4),
                  "per_prompt_cpu_s": round(ph.cpu_seconds / n, 4),
                  "phase_cpu_s": {k: round(v, 3) for k, v in log.cpu.items()},
                  "first_prompt_s": round(log.prompt_s[0], 4),
                  "other_prompts_median_s": round(statistics.median(rest), 4),
                  "capture_s": round(log.capture_s, 3),
                  "trajectory_s": round(log.trajectory_s, 3),
                  # the call less its measured pieces (capture, trajectory tables, prompts):
                  # the start, the batches' splits, the final concatenation
                  "outside_s": round(ph.seconds - sum(log.prompt_s) - log.capture_s
                                     - log.trajectory_s, 3),
                  # the definition of the 2026-11-27 rows (trajectory tables included)
                  "outside_with_trajectory_s": round(ph.seconds - sum(log.prompt_s)
                                                     - log.capture_s, 3),
                  "tokens_mean": round(sum(lengths) / n, 1), "tokens_max": max(lengths),
                  "loadavg_1m": round(os.getloadavg()[0], 2),
                  "time": time.strftime("%H:%M:%S")}, sink)
        for n in args.count_calls:
            items = prompts(n)
            total, top = count_calls(lambda items=items: bc.measure(model, tok, items,
                                                                    progress=False))
            emit({"record": "calls", "prompts": n, "python_calls": total,
                  "per_prompt": round(total / n, 1), "most_called": top}, sink)
        save(sink, f"bench_throughput_{args.shape}"
             + (f"_{args.layers}layers" if args.layers else "") + ("_to_dir" if args.to_dir else "")
             + ("_trained" if args.spectrum == "trained" else ""))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
