"""Token-wise coupling (issue 22, item 2): ``self`` and ``fixed_output`` against the released algorithm.

One process, a random-weight ``GPT2Model(GPT2Config())`` (GPT-2-small shape: d = 768, 12
layers, seed 0), float32, one random 32-token prompt, one block (``--layer``, default 6).
Interleaved repeats of

(a) ``released_<kind>``: benchmarks/released.py ``released_tokenwise`` (one forward with the
    graph kept, d pullbacks per output token through the whole prompt, full SVDs, the pair
    loops); for ``self`` only ``--pulled`` of the 32 output tokens are pulled back and the
    ``jacobians`` phase is extrapolated by 32 / pulled (marked ``extrapolated``);
(b) ``measure_<kind>``: what a user runs::

        measure(model, None, {"input_ids": ids}, coupling=(kind,), layers=(layer,),
                tokens=TOKENS, k=(10, 30, 50), progress=False)

    ``self``: ``tokens="all"`` (J_tt for the 32 tokens, all 32 x 32 pairs); ``fixed_output``:
    ``tokens="last"`` (J_{t1, 31} for t1 = 0..31, all 32 x 32 pairs). One call per repeat
    (the first-prompt checks included, as a user pays them).

Wall and process CPU seconds, peak RSS of each (``common.phase``), the load; medians and the
ratio released / measure in both. Prints one JSON line per record and saves them in
benchmarks/results/.

    OMP_NUM_THREADS=2 python benchmarks/bench_tokenwise.py     # ~3 min on 2 quiet cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, phase, save  # noqa: E402
from released import released_tokenwise  # noqa: E402

import blockcoupling  # noqa: E402

TOKENS = {"self": "all", "fixed_output": "last"}


def run_measure(model: torch.nn.Module, ids: torch.Tensor, kind: str, layer: int) -> Any:
    return blockcoupling.measure(model, None, {"input_ids": ids}, coupling=(kind,),
                                 layers=(layer,), tokens=TOKENS[kind], k=(10, 30, 50),
                                 progress=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--layer", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pulled", type=int, default=4,
                    help="released self: output tokens pulled back (the rest extrapolated)")
    ap.add_argument("--kinds", nargs="+", default=["self", "fixed_output"])
    ap.add_argument("--small", action="store_true", help="tiny GPT-2 smoke test")
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "config", **vars(args), "machine": machine()}, sink)
    torch.manual_seed(0)
    cfg = (tf.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000) if args.small
           else tf.GPT2Config())
    model = tf.GPT2Model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens),
                        generator=torch.Generator().manual_seed(0))
    n = args.tokens
    for kind in args.kinds:
        run_measure(model, ids, kind, args.layer)  # warm-up (imports, attention set-up)
        rows: dict[str, list[dict[str, float]]] = {"released": [], "measure": []}
        for r in range(args.repeats):
            order = ("released", "measure") if r % 2 == 0 else ("measure", "released")
            for who in order:
                with phase(who) as ph:
                    if who == "measure":
                        res = run_measure(model, ids, kind, args.layer)
                        parts = {}
                    else:
                        parts = released_tokenwise(model, ids, layer=args.layer, kind=kind,
                                                   pulled=args.pulled)
                wall, cpu = ph.seconds, ph.cpu_seconds
                rec: dict[str, Any] = {"record": f"{who}_{kind}", "repeat": r, **ph.as_dict(),
                                       "loadavg_1m": round(os.getloadavg()[0], 2)}
                if who == "released":
                    rec["phases"] = {k: v.as_dict() for k, v in parts.items()}
                    if kind == "self" and args.pulled < n:  # the pullbacks scale with tokens
                        jac = parts["jacobians"]
                        wall += jac.seconds * (n / args.pulled - 1)
                        cpu += jac.cpu_seconds * (n / args.pulled - 1)
                        rec["extrapolated"] = f"jacobians x {n}/{args.pulled}"
                else:
                    rec["coupling_rows"] = len(res.coupling)
                    rec["methods"] = sorted(set(res.diagnostics["method"]))
                rec["seconds_total"], rec["cpu_seconds_total"] = round(wall, 3), round(cpu, 3)
                rows[who].append({"wall": wall, "cpu": cpu})
                emit(rec, sink)
        med = {w: {c: statistics.median(x[c] for x in v) for c in ("wall", "cpu")}
               for w, v in rows.items()}
        emit({"record": f"summary_{kind}", "tokens": n, "layer": args.layer,
              "released_median": med["released"], "measure_median": med["measure"],
              "ratio_wall": round(med["released"]["wall"] / med["measure"]["wall"], 2),
              "ratio_cpu": round(med["released"]["cpu"] / med["measure"]["cpu"], 2),
              "loadavg_1m": round(os.getloadavg()[0], 2)}, sink)
    save(sink, "bench_tokenwise" + ("_small" if args.small else ""))


if __name__ == "__main__":
    main()
