"""Target 3 of issue 4: trajectory metrics ride on the capture pass (<= 1.2x a plain forward).

One process, a random-weight ``GPT2Model(GPT2Config())`` (GPT-2-small shape: d = 768, 12
layers), float32, 32 random prompts (``torch.randint``, seed 0) of mixed lengths 10-30 tokens,
right padded to 30 with an ``attention_mask`` (so ``capture`` derives each prompt's real
length from the mask and the trajectory metrics use only real tokens). For each batch size
B in (8, 32), interleaved repeats (after one warm-up of each) of

(a) ``plain``: the plain batched forward over the 32 prompts in batches of B,
    ``model(input_ids=ids[i:i+B], attention_mask=mask[i:i+B])`` under ``torch.no_grad()``
    (and ``plain_nocache``: the same with ``use_cache=False``, which is what ``capture`` passes);
(b) ``measure``: ``blockcoupling.measure(model, None, {"input_ids": ids, "attention_mask":
    mask}, coupling=(), trajectory=True, spectra=False, batch_size=B, progress=False)``.

Reports the medians, the ratio measure / plain, and a breakdown of the measure call from the
engine's public per-phase events (``on_event``: ``capture``, ``trajectory``). With ``--profile`` (or when a
ratio is above 1.2) one extra measure call per B runs under cProfile and the top functions by
cumulative and by own time go to the JSON. Every record carries ``uptime``.

    OMP_NUM_THREADS=2 python benchmarks/bench_trajectory.py            # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402

import blockcoupling  # noqa: E402

N_PROMPTS = 32
MIN_LEN, MAX_LEN = 10, 30


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def make_inputs(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """32 right-padded random prompts: input_ids (32, 30), attention_mask (32, 30)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (N_PROMPTS,), generator=g)  # (32,)
    n = int(lengths.max())
    ids = torch.randint(0, vocab, (N_PROMPTS, n), generator=g)  # (32, n)
    mask = (torch.arange(n)[None, :] < lengths[:, None]).long()  # (32, n)
    ids = ids * mask  # pad id 0 after the real tokens
    return {"input_ids": ids, "attention_mask": mask}


def plain(model: torch.nn.Module, inputs: dict[str, torch.Tensor], B: int,
          use_cache: bool | None) -> None:
    extra = {} if use_cache is None else {"use_cache": use_cache}
    with torch.no_grad():
        for i in range(0, N_PROMPTS, B):
            model(input_ids=inputs["input_ids"][i:i + B],
                  attention_mask=inputs["attention_mask"][i:i + B], **extra)


def run_measure(model: torch.nn.Module, inputs: dict[str, torch.Tensor], B: int,
                totals: dict[str, float] | None = None) -> Any:
    """``measure()`` trajectory-only; ``totals`` sums the seconds of each engine phase
    (the public ``on_event`` callback: capture, trajectory)."""
    def on_event(e: Any) -> None:
        if totals is not None:
            totals[e.phase] = totals.get(e.phase, 0.0) + e.seconds

    return blockcoupling.measure(model, None, dict(inputs), coupling=(), trajectory=True,
                                 spectra=False, batch_size=B, progress=False, on_event=on_event)


def profile_call(model: torch.nn.Module, inputs: dict[str, torch.Tensor], B: int,
                 top: int = 25) -> dict[str, str]:
    pr = cProfile.Profile()
    pr.enable()
    run_measure(model, inputs, B)
    pr.disable()
    out = {}
    for key in ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).strip_dirs().sort_stats(key).print_stats(top)
        out[key] = s.getvalue()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="always profile one call per B")
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "machine", **machine(), "uptime_start": uptime()}, sink)
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config()).eval()
    inputs = make_inputs(model.config.vocab_size)
    lengths = inputs["attention_mask"].sum(1).tolist()
    emit({"record": "inputs", "n_prompts": N_PROMPTS, "padded_length": int(inputs["input_ids"].shape[1]),
          "lengths": lengths, "real_tokens": int(sum(lengths)),
          "attn_implementation": getattr(model.config, "_attn_implementation", None)}, sink)

    for B in (8, 32):
        # warm-up (also lets capture() settle the attention implementation before timing)
        m = run_measure(model, inputs, B)
        assert len(m.token_metrics) == sum(lengths), "trajectory rows should cover real tokens only"
        plain(model, inputs, B, None)
        plain(model, inputs, B, False)
        times: dict[str, list[float]] = {"plain": [], "plain_nocache": [], "measure": []}
        cpu: dict[str, list[float]] = {k_: [] for k_ in times}  # process CPU seconds
        parts: dict[str, list[float]] = {"capture": [], "trajectory": []}
        loads = []
        for _ in range(args.repeats):
            for label in ("plain", "measure", "plain_nocache"):
                t0, c0 = time.perf_counter(), time.process_time()
                if label == "measure":
                    tot: dict[str, float] = {}
                    run_measure(model, inputs, B, tot)
                    dt = time.perf_counter() - t0
                    for k_ in parts:
                        parts[k_].append(tot.get(k_, 0.0))
                else:
                    plain(model, inputs, B, None if label == "plain" else False)
                    dt = time.perf_counter() - t0
                times[label].append(dt)
                cpu[label].append(time.process_time() - c0)
            loads.append(os.getloadavg()[0])
        med = {k_: statistics.median(v) for k_, v in times.items()}
        part_med = {k_: statistics.median(v) for k_, v in parts.items()}
        rec: dict[str, Any] = {
            "record": "trajectory_vs_forward",
            "batch_size": B,
            "repeats": args.repeats,
            "seconds_median": {k_: round(v, 4) for k_, v in med.items()},
            "seconds_all": {k_: [round(x, 4) for x in v] for k_, v in times.items()},
            "ratio_measure_over_plain": round(med["measure"] / med["plain"], 3),
            "cpu_seconds_median": {k_: round(statistics.median(v), 4) for k_, v in cpu.items()},
            "ratio_cpu_measure_over_plain": round(statistics.median(cpu["measure"])
                                                  / statistics.median(cpu["plain"]), 3),
            "ratio_measure_over_plain_nocache": round(med["measure"] / med["plain_nocache"], 3),
            "measure_breakdown_median_s": {
                "capture_forward": round(part_med["capture"], 4),
                "trajectory_rows": round(part_med["trajectory"], 4),
                "rest_of_call": round(med["measure"] - part_med["capture"] - part_med["trajectory"], 4),
            },
            "loadavg_1m_per_repeat": loads,
            "uptime": uptime(),
        }
        emit(rec, sink)
        if args.profile or rec["ratio_measure_over_plain"] > 1.2:
            prof = profile_call(model, inputs, B)
            emit({"record": "profile", "batch_size": B, **prof, "uptime": uptime()}, sink)
            print(prof["cumulative"])
            print(prof["tottime"])
    emit({"record": "end", "uptime_end": uptime(), "loadavg_1m": os.getloadavg()[0]}, sink)
    save(sink, "bench_trajectory")


if __name__ == "__main__":
    main()
