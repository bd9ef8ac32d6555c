"""Token-wise coupling (issues 22 item 2, 34 item 1): ``self``, ``fixed_output`` and
``fixed_input`` against the released algorithm, and against this CPU's floor.

One process, a random-weight ``GPT2Model(GPT2Config())`` (GPT-2-small shape: d = 768, 12
layers, seed 0), float32, one random 32-token prompt, one block (``--layer``, default 6).
Interleaved repeats of

(a) ``released_<kind>``: benchmarks/released.py ``released_tokenwise`` (one forward with the
    graph kept, d pullbacks per output token through the whole prompt, full SVDs, the pair
    loops); for ``self`` and ``fixed_input`` only ``--pulled`` of the 32 output tokens are
    pulled back and the ``jacobians`` phase is extrapolated by 32 / pulled (marked
    ``extrapolated``);
(b) ``measure_<kind>``: what a user runs::

        measure(model, None, {"input_ids": ids}, coupling=(kind,), layers=(layer,),
                tokens=TOKENS[kind], k=(10, 30, 50), progress=False)

    ``self``: ``tokens="all"`` (J_tt for the 32 tokens, all 32 x 32 pairs); ``fixed_output``:
    ``tokens="last"`` (J_{t1, 31} for t1 = 0..31, all 32 x 32 pairs); ``fixed_input``:
    ``tokens=(0,)`` (J_{0, t2} for t2 = 0..31, all 32 x 32 pairs). One call per repeat (the
    first-prompt checks included, as a user pays them); its time per phase from ``on_event``.

``--floor``: the kernels each kind cannot avoid on the route it takes (dense J from the
block's structure, the certified float32 top-K, every pair as GEMMs), counted from the
problem's sizes (:func:`floor_counts`) and each timed here in the same process
(:func:`time_kernels`, best of ``--kernel-repeats``): the floor is the sum of count x time,
in CPU and wall seconds, and the record gives the call's ratio to it.
``--oracle``: every coupling value of the call against two float64 oracles, both the same
call with ``dtype=torch.float64, fast_path=False`` (VJP / JVP batches of the generic path
and exact float64 SVDs, independent of the structured Jacobians and of the float32 top-K):
``model64`` on the model cast to float64 (its own float64 forward pass), ``trajectory64`` on
the float32 model (its float32 hidden states, analysed in float64). The first includes the
float32 forward pass's rounding, which no Jacobian route can remove; the second is the
engine's own error.

Wall and process CPU seconds, peak RSS of each (``common.phase``), the load; medians and the
ratio released / measure in both. Prints one JSON line per record and saves them in
benchmarks/results/.

    OMP_NUM_THREADS=2 python benchmarks/bench_tokenwise.py --floor --oracle   # ~5 min, 2 quiet cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, phase, save  # noqa: E402
from released import released_tokenwise  # noqa: E402

import blockcoupling  # noqa: E402

TOKENS: dict[str, Any] = {"self": "all", "fixed_output": "last", "fixed_input": (0,)}
KS = (10, 30, 50)


def run_measure(model: torch.nn.Module, ids: torch.Tensor, kind: str, layer: int,
                on_event: Callable[[Any], None] | None = None, **options: Any) -> Any:
    return blockcoupling.measure(model, None, {"input_ids": ids}, coupling=(kind,),
                                 layers=(layer,), tokens=TOKENS[kind], k=KS, progress=False,
                                 on_event=on_event, **options)


# ------------------------------------------------------------------ the floor
def floor_counts(kind: str, n: int, d: int, width: int, k: int) -> dict[str, int]:
    """How many of each kernel of :func:`time_kernels` one call of ``kind`` cannot avoid on
    its route, for one prompt of n tokens at one block (d, MLP ``width``), K_max = k.

    Jacobians (engine/structured.py): a decode step at an output token t costs the MLP's
    ``N = W_out diag(act') W_in J_n`` (``mlp``: (d, I) x (I, d)); its own J_tt two (d, d)^3
    GEMMs (``W_o J_o``, ``N J_a``); a cross-token J_{s t} one more (d, d)^3 GEMM per s, after
    ``A = (I + N) W_o`` (one per t). ``self``: n decode steps with their J_tt; ``fixed_output``
    (t = n-1): one decode step, its J_tt, A and n-1 cross GEMMs; ``fixed_input`` (s = 0): n
    decode steps, J_00, and per t > 0 A and one cross GEMM. Every kind has P = n Jacobians:
    P certified float32 top-K (``topk``: Gram, float32 eigensolve of the top K + 16,
    float64 Rayleigh-Ritz), and P^2 pairs in both orientations: per Jacobian and orientation
    one (d, d) x (d, P K) GEMM (``pass2``) and P (K, d) x (d, K) products (``pass2_small``).
    No VJP or JVP pass is counted: the structured route needs none (the first prompt's checks
    run a few, reported in the call's time, not in the floor)."""
    P = n
    if kind == "self":
        mlp, d3 = n, 2 * n
    elif kind == "fixed_output":
        mlp, d3 = 1, 2 + 1 + (n - 1)
    elif kind == "fixed_input":
        mlp, d3 = n, 2 + 2 * (n - 1)
    else:
        raise ValueError(kind)
    return {"mlp": mlp, "d3": d3, "topk": P, "pass2": 2 * P, "pass2_small": 2 * P}


def time_kernels(d: int, width: int, k: int, P: int, repeats: int) -> dict[str, dict[str, float]]:
    """Each kernel of :func:`floor_counts` on random data of its shape, best of ``repeats``:
    CPU and wall seconds, and its flop rate (GEMMs). ``topk`` is the engine's own
    ``svd.topk_svd`` on a d x d float32 J (its parts timed alone too: ``gram`` and the
    float32 ``eigh``)."""
    import numpy as np
    import scipy.linalg

    from blockcoupling.engine import svd

    g = torch.Generator().manual_seed(0)
    J = torch.randn(d, d, generator=g) / d**0.5
    Wout, Min = torch.randn(d, width, generator=g), torch.randn(width, d, generator=g)
    X = torch.randn(d, P * k, generator=g)
    Ub, JX = torch.randn(P, k, d, generator=g), torch.randn(P, d, k, generator=g)
    G = (J.mT @ J).numpy()
    w = k + 16

    def eigh() -> None:
        with svd.one_blas_thread():
            scipy.linalg.eigh(np.array(G), subset_by_index=[d - w, d - 1], driver="evr",
                              overwrite_a=True, check_finite=False)

    kernels: dict[str, tuple[Callable[[], Any], float]] = {
        "mlp": (lambda: Wout @ Min, 2.0 * d * width * d),
        "d3": (lambda: J @ J, 2.0 * d**3),
        "topk": (lambda: svd.topk_svd(J, k), 0.0),
        "gram": (lambda: J.mT @ J, 2.0 * d**3),
        "eigh": (eigh, 0.0),
        "pass2": (lambda: J @ X, 2.0 * d * d * P * k),
        "pass2_small": (lambda: Ub @ JX, 2.0 * P * k * d * k),
    }
    out: dict[str, dict[str, float]] = {}
    for name, (fn, flops) in kernels.items():
        fn()
        cpu, wall = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        rec = {"cpu_s": min(cpu), "wall_s": min(wall)}
        if flops:
            rec["gflop"] = flops / 1e9
            rec["gflops_per_wall_s"] = flops / 1e9 / min(wall)
        out[name] = rec
    return out


def floor_record(kind: str, counts: dict[str, int], kern: dict[str, dict[str, float]],
                 call_cpu: float, call_wall: float) -> dict[str, Any]:
    parts = {name: {"count": c, "cpu_s": round(c * kern[name]["cpu_s"], 4),
                    "wall_s": round(c * kern[name]["wall_s"], 4)} for name, c in counts.items()}
    cpu = sum(p["cpu_s"] for p in parts.values())
    wall = sum(p["wall_s"] for p in parts.values())
    gemm = sum(c * kern[name].get("gflop", 0.0) for name, c in counts.items())
    gemm += counts["topk"] * kern["gram"]["gflop"]
    return {"record": f"floor_{kind}", "kernels": parts, "floor_cpu_s": round(cpu, 4),
            "floor_wall_s": round(wall, 4), "gemm_gflop": round(gemm, 1),
            "eigensolves": counts["topk"],
            "call_over_floor_cpu": round(call_cpu / cpu, 3),
            "call_over_floor_wall": round(call_wall / wall, 3)}


# ------------------------------------------------------------------ the oracle
def oracle_diff(model: torch.nn.Module, ids: torch.Tensor, kind: str, layer: int,
                got: Any, which: str) -> dict[str, Any]:
    """Largest |value - float64 oracle| of the call's coupling table. ``which``: ``model64``,
    the float64 model (its own float64 forward pass: what bench_depth.py compares with);
    ``trajectory64``: the float32 model's hidden states analysed in float64 (blocks copied to
    float64), which isolates the engine's arithmetic from the float32 forward pass."""
    t0 = time.perf_counter()
    if which == "model64":
        model.double()
    try:
        ref = run_measure(model, ids, kind, layer, dtype=torch.float64, fast_path=False)
    finally:
        model.float()
    cols = ["layer_a", "layer_b", "token_in_a", "token_out_a", "token_in_b", "token_out_b",
            "variant", "p", "k", "orientation"]
    a, b = got.coupling.fillna({"p": -1.0}), ref.coupling.fillna({"p": -1.0})
    m = a.merge(b, on=cols, suffixes=("", "_ref"))
    assert len(m) == len(a) == len(b), (len(m), len(a), len(b))
    diff = (m["value"] - m["value_ref"]).abs()
    by_variant = diff.groupby(m["variant"]).max()
    worst = m.loc[diff.idxmax()]
    return {"record": f"oracle_{kind}", "oracle": which, "n_values": int(len(m)),
            "max_abs_diff": float(diff.max()),
            "max_abs_diff_by_variant": {str(k): float(v) for k, v in by_variant.items()},
            "worst": {c: (str(worst[c])) for c in ("variant", "k", "orientation",
                                                   "token_in_a", "token_in_b",
                                                   "token_out_a", "token_out_b")},
            "oracle_methods": sorted(set(ref.diagnostics["method"])),
            "seconds": round(time.perf_counter() - t0, 2)}


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--layer", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pulled", type=int, default=4,
                    help="released self / fixed_input: output tokens pulled back (the rest "
                         "extrapolated)")
    ap.add_argument("--kinds", nargs="+", default=["self", "fixed_output", "fixed_input"])
    ap.add_argument("--no-released", action="store_true", help="measure() only")
    ap.add_argument("--floor", action="store_true", help="time the floor's kernels too")
    ap.add_argument("--kernel-repeats", type=int, default=5)
    ap.add_argument("--oracle", action="store_true", help="values against a float64 oracle")
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
    n, d = args.tokens, cfg.n_embd
    width = cfg.n_inner or 4 * d
    who_all = ("measure",) if args.no_released else ("released", "measure")
    for kind in args.kinds:
        res = run_measure(model, ids, kind, args.layer)  # warm-up (imports, attention set-up)
        rows: dict[str, list[dict[str, float]]] = {w: [] for w in who_all}
        for r in range(args.repeats):
            order = who_all if r % 2 == 0 else tuple(reversed(who_all))
            for who in order:
                events: dict[str, float] = defaultdict(float)
                with phase(who) as ph:
                    if who == "measure":
                        res = run_measure(model, ids, kind, args.layer,
                                          on_event=lambda e, ev=events: ev.__setitem__(
                                              e.phase, ev[e.phase] + e.seconds))
                        parts = {}
                    else:
                        parts = released_tokenwise(model, ids, layer=args.layer, kind=kind,
                                                   pulled=args.pulled)
                wall, cpu = ph.seconds, ph.cpu_seconds
                rec: dict[str, Any] = {"record": f"{who}_{kind}", "repeat": r, **ph.as_dict(),
                                       "loadavg_1m": round(os.getloadavg()[0], 2)}
                if who == "released":
                    rec["phases"] = {k: v.as_dict() for k, v in parts.items()}
                    if kind in ("self", "fixed_input") and args.pulled < n:  # linear in tokens
                        jac = parts["jacobians"]
                        wall += jac.seconds * (n / args.pulled - 1)
                        cpu += jac.cpu_seconds * (n / args.pulled - 1)
                        rec["extrapolated"] = f"jacobians x {n}/{args.pulled}"
                else:
                    rec["coupling_rows"] = len(res.coupling)
                    rec["methods"] = sorted(set(res.diagnostics["method"]))
                    rec["phases_s"] = {k: round(v, 4) for k, v in events.items()}
                rec["seconds_total"], rec["cpu_seconds_total"] = round(wall, 3), round(cpu, 3)
                rows[who].append({"wall": wall, "cpu": cpu})
                emit(rec, sink)
        med = {w: {c: statistics.median(x[c] for x in v) for c in ("wall", "cpu")}
               for w, v in rows.items()}
        summary: dict[str, Any] = {"record": f"summary_{kind}", "tokens": n, "layer": args.layer,
                                   "measure_median": med["measure"],
                                   "loadavg_1m": round(os.getloadavg()[0], 2)}
        if "released" in med:
            summary.update(released_median=med["released"],
                           ratio_wall=round(med["released"]["wall"] / med["measure"]["wall"], 2),
                           ratio_cpu=round(med["released"]["cpu"] / med["measure"]["cpu"], 2))
        emit(summary, sink)
        if args.floor:
            kern = time_kernels(d, width, max(KS), n, args.kernel_repeats)
            emit({"record": f"kernels_{kind}", "d": d, "width": width, "k": max(KS), "P": n,
                  "kernels": {k: {kk: round(vv, 5) for kk, vv in v.items()}
                              for k, v in kern.items()}}, sink)
            emit(floor_record(kind, floor_counts(kind, n, d, width, max(KS)), kern,
                              med["measure"]["cpu"], med["measure"]["wall"]), sink)
        if args.oracle:
            for which in ("model64", "trajectory64"):
                emit(oracle_diff(model, ids, kind, args.layer, res, which), sink)
    save(sink, "bench_tokenwise" + ("_small" if args.small else ""))


if __name__ == "__main__":
    main()
