"""Depth-wise coupling at the last token: the released algorithm vs ``blockcoupling.engine.measure``.

One process, one random-weight GPT-2-small-shape model (d=768, 12 layers), 12-token random
prompts, ``OMP_NUM_THREADS`` as given (the documented runs use 2):

  (a) ``released``: benchmarks/released.py on prompt 0 (HF hidden_states, d VJPs per block
      through the whole prompt, J - I, full SVD, numpy pair loops; ``released_norm`` only);
  (b) ``measure_fast``: what a user runs, with the defaults (``fast_path=True``)::

          measure(model, None, {"input_ids": ids}, coupling=("depth",), k=(10, 30, 50),
                  final_norm=True, progress=False, batch_size=1)

      ONE call on ``--prompts`` prompts (prompt 0 first), default batch size. Per prompt we
      time, through the public ``on_event`` callback (``PromptClock``), its ``prompt`` event
      (all of its Jacobian / SVD / coupling / table work) plus its share of the batch's
      capture forward, and its process CPU seconds. Prompt 0 includes the one-time
      check of the fast path against the generic path (once per layer per call); prompts
      1.. are the steady state. The call's wall time and the rest (concatenating the
      tables, ``build_meta``) are reported too;
  (c) ``measure_generic``: the same call with ``fast_path=False`` on prompt 0 only.

Oracle, float64: prompt 0 by the engine's generic path (``jacobian_blocks`` on
``residual_branch`` of the float64 model, dense J_tt through the whole 12-token block); prompts
1.. by the fast path in float64 (``fastpath.token_branch(..., dtype=float64, verify=True)``: each
block checked against the generic float64 J v and J^T u at 1e-6), cross-checked against the
generic oracle on prompt 0. Then exact float64 SVD and float64 metrics
(``blockcoupling.engine.metrics.all_coupling_values``) for every variant, K and orientation. The
released values are computed by independent numpy code. Every method includes the final norm
in the last block (``final_norm=True``, the released convention).

``--curve``: prompts/s vs ``batch_size`` (1, 2, 4, 8) on 8 prompts, in one measure() call
per point: trajectory only (``coupling=(), spectra=False``; ``--traj-repeats`` repeats, median)
and depth-wise with the defaults as in (b) (``--depth-repeats`` sweeps, the second in reverse
order, median). Every record carries the 1-minute load average; ``uptime`` is recorded at the
start and the end. Prints one JSON line per record and saves all of them in benchmarks/results/.

    OMP_NUM_THREADS=2 python benchmarks/bench_depth.py --curve   # the documented run (~5 min)
    OMP_NUM_THREADS=2 python benchmarks/bench_depth.py --small   # tiny GPT-2 smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, phase, save  # noqa: E402
from released import released_depth  # noqa: E402

import blockcoupling  # noqa: E402
from blockcoupling.engine import (
    fastpath,
    metrics,  # noqa: E402
)
from blockcoupling.engine.blocks import find_blocks  # noqa: E402
from blockcoupling.engine.capture import capture, residual_branch  # noqa: E402
from blockcoupling.engine.jacobian import jacobian_blocks  # noqa: E402

KS = (10, 30, 50)
ORIENTS = ("ujv", "vju")
Values = dict[tuple[str, int, str, int, int], float]  # (variant, k, orientation, la, lb)


def gpt2(small: bool, seed: int = 0) -> torch.nn.Module:
    cfg = (tf.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000) if small
           else tf.GPT2Config())  # GPT-2 small: d=768, 12 layers, 12 heads
    torch.manual_seed(seed)
    return tf.GPT2Model(cfg).eval()


def load() -> dict[str, Any]:
    """``uptime`` text and the 1/5/15-minute load averages."""
    try:
        text = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        text = ""
    return {"uptime": text, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def la1() -> float:
    return round(os.getloadavg()[0], 2)


# ------------------------------------------------------------------ helpers (also used by the GPU script)
def topk_gram(J: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k SVD of a batch J (B, d, d) from the eigendecomposition of J^T J (float32 GEMMs).

    V = top-k eigenvectors of J^T J, S = sqrt(eigenvalues), U = J V / S. Accurate while
    s_k is not tiny relative to s_1 (relative error ~ eps * (s_1 / s_k)^2).
    """
    w, Q = torch.linalg.eigh(J.mT @ J)  # ascending
    V = Q[..., -k:].flip(-1)  # (B, d, k)
    S = w[..., -k:].flip(-1).clamp_min(0).sqrt()  # (B, k)
    U = (J @ V) / S[..., None, :]
    return U, S, V


def topk_full(J: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    U, S, Vh = torch.linalg.svd(J)
    return U[..., :k], S[..., :k], Vh[..., :k, :].mT


def pair_values(J: torch.Tensor, U: torch.Tensor, S: torch.Tensor, V: torch.Tensor,
                fro2: torch.Tensor) -> Values:
    """Every variant for all layer pairs, K in KS, both orientations; J (L, d, d), U/V (L, d, K)."""
    L, d, K = U.shape
    out: Values = {}
    # what coupling_vs_rotated needs besides: tr(J_a), tr(J_a^2) and the basis's U_b^T V_b
    # (its leading-block sums and diagonal are the same for either orientation)
    trace = J.diagonal(dim1=-2, dim2=-1).sum(-1)[:, None].expand(L, L)
    trace2 = (J * J.mT).sum((-2, -1))[:, None].expand(L, L)
    overlap = (U.mT @ V)[None].expand(L, L, K, K)
    for orient in ORIENTS:
        right, left = (V, U) if orient == "ujv" else (U, V)
        R = right.permute(1, 0, 2).reshape(d, L * K)  # (d, L*K): every basis side by side
        JR = (J @ R).reshape(L, d, L, K).permute(0, 2, 1, 3)  # (La, Lb, d, K)
        A = left.mT[None] @ JR  # (La, Lb, K, K)
        vals = metrics.all_coupling_values(
            A, S[:, None, :].expand(L, L, K), KS, ps=(1,),
            fro2=fro2[:, None].expand(L, L), d=d, trace=trace, trace2=trace2, overlap=overlap)
        for (variant, _p, k), v in vals.items():
            v = v.double().cpu()
            for a in range(L):
                for b in range(L):
                    out[(variant, k, orient, a + 1, b + 1)] = float(v[a, b])
    return out


def agreement(vals: Values, ref: Values, variants: tuple[str, ...] | None = None) -> dict[str, Any]:
    keys = [k for k in vals if (variants is None or k[0] in variants) and k in ref]
    if not keys:
        raise SystemExit("no values in common with the oracle")
    diffs = {k: abs(vals[k] - ref[k]) for k in keys}
    worst = max(diffs, key=lambda k: diffs[k])
    per_variant = {}
    for v in sorted({k[0] for k in keys}):
        per_variant[v] = max(d for k, d in diffs.items() if k[0] == v)
    return {"n_values": len(keys), "max_abs_diff": diffs[worst], "worst": list(worst),
            "max_abs_diff_by_variant": per_variant}


# ------------------------------------------------------------------ oracle
def oracle(model: torch.nn.Module, ids: torch.Tensor, how: str) -> tuple[Values, float]:
    """float64 dense J_tt at the last token of ``ids`` (1, n), exact float64 SVD and metrics.

    ``generic``: jacobian_blocks on residual_branch of the float64 model (the model is cast to
    float64 and back: float32 -> float64 -> float32 is exact). ``fast64``: the fast path in
    float64 with its check against the generic float64 products on every block.
    """
    t0 = time.perf_counter()
    m64 = model.double() if how == "generic" else model
    try:
        spec = find_blocks(m64)
        cap = capture(m64, {"input_ids": ids}, spec, final_norm=True, boundary_dtype=torch.float64)
        t = cap.lengths[0] - 1
        Js = []
        for layer in range(1, spec.num_layers + 1):
            if how == "generic":
                f, x = residual_branch(m64, cap, layer, 0, dtype=torch.float64)
                Js.append(jacobian_blocks(f, x, [t], in_tokens=[t], chunk_size=128)[0, 0])
            else:
                tb = fastpath.token_branch(m64, cap, layer, 0, t, dtype=torch.float64, verify=True)
                if tb is None:
                    raise SystemExit(f"float64 fast path refused or failed its check at layer {layer}")
                # the autodiff pullback (J^T I)^T, independent of engine.structured
                eye = torch.eye(tb.d, dtype=torch.float64)
                Js.append(tb.rmatmat(eye).T.contiguous())
        J = torch.stack(Js)  # (L, d, d)
    finally:
        if how == "generic":
            model.float()
    U, S, V = topk_full(J, max(KS))
    return pair_values(J, U, S, V, (J * J).sum((-2, -1))), time.perf_counter() - t0


# ------------------------------------------------------------------ measure(), timed per prompt
class PromptClock:
    """Per-prompt wall and CPU seconds from measure()'s public ``on_event`` callback.

    ``prompt`` events give each prompt's work (capture excluded); each batch's ``capture``
    event is shared evenly among its prompts. CPU seconds: ``time.process_time`` between
    consecutive ``prompt`` events (the first from the call's start), so a prompt's CPU time
    includes its share of the capture when it is in the first position of its batch.
    """

    def __init__(self) -> None:
        self.log: list[dict[str, float]] = []
        self._capture_share = 0.0
        self._cpu_mark = time.process_time()

    def __call__(self, ev: Any) -> None:
        if ev.phase == "capture":
            self._capture_share = ev.seconds / max(1, len(ev.prompt_ids))
        elif ev.phase == "prompt":
            now = time.process_time()
            self.log.append({"capture_s": round(self._capture_share, 4),
                             "work_s": round(ev.seconds, 4),
                             "seconds": round(self._capture_share + ev.seconds, 4),
                             "cpu_seconds": round(now - self._cpu_mark, 4)})
            self._cpu_mark = now


def coupling_values(df: Any) -> dict[str, Values]:
    """measure()'s coupling table as {prompt_id: values}."""
    out: dict[str, Values] = {}
    for r in df.itertuples(index=False):
        out.setdefault(str(r.prompt_id), {})[
            (str(r.variant), int(r.k), str(r.orientation), int(r.layer_a), int(r.layer_b))
        ] = float(r.value)
    return out


def run_measure(model: torch.nn.Module, ids: torch.Tensor, **options: Any
                ) -> tuple[Any, list[dict[str, float]], dict[str, Any]]:
    """The user's call on ``ids`` (B, n) with the defaults, timed per prompt by ``on_event``."""
    clock = PromptClock()
    with phase("measure") as ph:
        m = blockcoupling.measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS,
                                  final_norm=True, progress=False, on_event=clock, **options)
    return m, clock.log, ph.as_dict()


def structured_layers(model: torch.nn.Module, ids: torch.Tensor) -> list[int]:
    """Layers whose dense J_tt of prompt 0 the fast path assembles from the block's structure
    (``TokenBranch.structured`` after ``jacobian()``), as measure() would."""
    cap = capture(model, {"input_ids": ids[:1]}, find_blocks(model), final_norm=True)
    t = cap.lengths[0] - 1
    out = []
    for layer in range(1, cap.n_layers + 1):
        tb = fastpath.token_branch(model, cap, layer, 0, t, verify=False)
        if tb is not None and tb.structured:
            tb.jacobian()
            if tb.structured:
                out.append(layer)
    return out


def methods_used(m: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}


# ------------------------------------------------------------------ prompts/s vs batch size
def curve(model: torch.nn.Module, ids: torch.Tensor, batch_sizes: list[int], traj_repeats: int,
          depth_repeats: int, sink: list[dict[str, Any]]) -> None:
    n_prompts = ids.shape[0]
    inputs = {"input_ids": ids}

    def one(what: str, bs: int) -> float:
        t0 = time.perf_counter()
        if what == "trajectory_only":
            blockcoupling.measure(model, None, inputs, coupling=(), trajectory=True, spectra=False,
                      batch_size=bs, progress=False)
        else:
            blockcoupling.measure(model, None, inputs, coupling=("depth",), k=KS, final_norm=True,
                      batch_size=bs, progress=False)
        return time.perf_counter() - t0

    plans = {"trajectory_only": traj_repeats, "depth_measure": depth_repeats}
    for what, reps in plans.items():
        secs: dict[int, list[float]] = {bs: [] for bs in batch_sizes}
        loads: dict[int, list[float]] = {bs: [] for bs in batch_sizes}
        for r in range(reps):  # alternate the sweep direction so drift in load cancels
            for bs in (batch_sizes if r % 2 == 0 else list(reversed(batch_sizes))):
                secs[bs].append(round(one(what, bs), 3))
                loads[bs].append(la1())
        for bs in batch_sizes:
            med = statistics.median(secs[bs])
            emit({"record": "curve", "what": what, "batch_size": bs, "n_prompts": n_prompts,
                  "repeats": reps, "seconds_each": secs[bs], "seconds_median": round(med, 3),
                  "prompts_per_s_median": round(n_prompts / med, 3),
                  "prompts_per_s_each": [round(n_prompts / s, 3) for s in secs[bs]],
                  "loadavg_1m_each": loads[bs]}, sink)


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny GPT-2 (d=128, 4 layers) for a smoke test")
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=5, help="prompts of (b): 1 first + steady state")
    ap.add_argument("--curve", action="store_true", help="also prompts/s vs batch size")
    ap.add_argument("--curve-prompts", type=int, default=8)
    ap.add_argument("--traj-repeats", type=int, default=5)
    ap.add_argument("--depth-repeats", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3,
                    help="interleaved (released, measure) repeats; medians are compared")
    ap.add_argument("--oracle", choices=("generic", "fast64"), default="generic",
                    help="prompt 0's float64 oracle: the generic path (independent, slow) or the "
                         "float64 decode-step pullback checked against it on random vectors")
    ap.add_argument("--no-generic", action="store_true",
                    help="skip (c), the measure(fast_path=False) call")
    args = ap.parse_args()
    if args.prompts < 2:
        ap.error("--prompts must be at least 2 (one first prompt and one steady-state prompt)")

    sink: list[dict[str, Any]] = []
    name = "bench_depth" + ("_small" if args.small else "")
    complete = False
    try:
        info = machine()
        model = gpt2(args.small)
        d, L, V = model.config.n_embd, model.config.n_layer, model.config.vocab_size
        ids = torch.randint(0, V, (args.prompts, args.tokens), generator=torch.Generator().manual_seed(0))
        emit({"record": "config", "model": "gpt2-random", "d": d, "layers": L,
              "n_tokens": args.tokens, "n_prompts": args.prompts, "ks": list(KS), "token": "last",
              "final_norm": True, "machine": info, "load_start": load()}, sink)

        # oracles
        refs: dict[int, Values] = {}
        if args.oracle == "generic":
            refs[0], t_or = oracle(model, ids[:1], "generic")
            emit({"record": "oracle", "prompt": 0, "how": "generic", "seconds": round(t_or, 2),
                  "loadavg_1m": la1()}, sink)
            fast0, t_f = oracle(model, ids[:1], "fast64")
            emit({"record": "oracle_crosscheck", "prompt": 0, "how": "fast64 vs generic",
                  "seconds": round(t_f, 2), "agreement": agreement(fast0, refs[0])}, sink)
        else:
            refs[0], t_f = oracle(model, ids[:1], "fast64")
            emit({"record": "oracle", "prompt": 0, "how": "fast64", "seconds": round(t_f, 2),
                  "loadavg_1m": la1()}, sink)
        for i in range(1, args.prompts):
            refs[i], t_f = oracle(model, ids[i : i + 1], "fast64")
            emit({"record": "oracle", "prompt": i, "how": "fast64", "seconds": round(t_f, 2),
                  "loadavg_1m": la1()}, sink)

        # (a) released on prompt 0 and (b) measure() on every prompt, interleaved --repeats
        # times (the machine is shared: the medians of the interleaved runs are compared)
        rel_secs: list[float] = []
        rel_cpus: list[float] = []
        call_runs: list[dict[str, Any]] = []
        for rep in range(args.repeats):
            rel_vals, rel_ph = released_depth(model, ids[:1], ks=KS)
            rel_total = sum(p.seconds for p in rel_ph.values())
            rel_cpu = sum(p.cpu_seconds for p in rel_ph.values())
            rel_secs.append(rel_total)
            rel_cpus.append(rel_cpu)
            rel_as = {("released_norm", k, o, a, b): v for (k, o, a, b), v in rel_vals.items()}
            emit({"record": "method", "method": "released", "repeat": rep, "prompt": 0,
                  "dtype": "float32", "seconds": round(rel_total, 3),
                  "cpu_seconds": round(rel_cpu, 3),
                  "phases": {k: p.as_dict() for k, p in rel_ph.items()},
                  "agreement": agreement(rel_as, refs[0]), "loadavg_1m": la1()}, sink)

            m, log, ph = run_measure(model, ids)
            got = coupling_values(m.coupling)
            pids = list(dict.fromkeys(m.prompts["prompt_id"].astype(str)))
            per_prompt = []
            for i, (pid, clk) in enumerate(zip(pids, log, strict=True)):
                per_prompt.append({"prompt": i, "prompt_id": pid, **clk,
                                   "diagnostics_s": round(float(
                                       m.diagnostics.loc[m.diagnostics["prompt_id"] == pid, "seconds"].sum()), 4),
                                   "agreement": agreement(got[pid], refs[i])})
            first = log[0]["seconds"]
            steady = [c["seconds"] for c in log[1:]]
            first_cpu = log[0]["cpu_seconds"]
            steady_cpu = [c["cpu_seconds"] for c in log[1:]]
            run = {"record": "method", "method": "measure_fast", "repeat": rep, "dtype": "float32",
                   "call": "measure(model, None, {'input_ids': ids}, coupling=('depth',), k=(10,30,50), "
                           "final_norm=True, progress=False, batch_size=1)",
                   "n_prompts": len(log), "call_seconds": ph["seconds"], "call_phase": ph,
                   "per_prompt_of_call_s": round(ph["seconds"] / len(log), 4),
                   "per_prompt_of_call_cpu_s": round(ph["cpu_seconds"] / len(log), 4),
                   "first_prompt_cpu_s": first_cpu,
                   "steady_median_cpu_s": round(statistics.median(steady_cpu), 4),
                   "per_prompt": per_prompt, "first_prompt_s": first,
                   "steady_median_s": round(statistics.median(steady), 4),
                   "steady_mean_s": round(statistics.mean(steady), 4),
                   "steady_min_s": min(steady), "steady_max_s": max(steady),
                   "outside_prompts_s": round(ph["seconds"] - sum(c["seconds"] for c in log), 4),
                   "methods": methods_used(m), "structured_layers": structured_layers(model, ids),
                   "released_same_repeat_s": round(rel_total, 3),
                   "released_same_repeat_cpu_s": round(rel_cpu, 3),
                   "max_abs_diff_all_prompts": max(p["agreement"]["max_abs_diff"] for p in per_prompt),
                   "loadavg_1m": la1()}
            call_runs.append(run)
            emit(run, sink)
        rel_med = statistics.median(rel_secs)
        rel_cpu_med = statistics.median(rel_cpus)
        cpu = {
            "released_median_cpu_s": round(rel_cpu_med, 3),
            "released_cpu_s_each": [round(x, 3) for x in rel_cpus],
            "measure_per_prompt_of_call_median_cpu_s": round(statistics.median(
                r["per_prompt_of_call_cpu_s"] for r in call_runs), 4),
            "measure_first_prompt_median_cpu_s": round(statistics.median(
                r["first_prompt_cpu_s"] for r in call_runs), 4),
            "measure_steady_median_cpu_s": round(statistics.median(
                r["steady_median_cpu_s"] for r in call_runs), 4),
        }
        cpu["cpu_speedup_per_prompt_of_call"] = round(
            rel_cpu_med / cpu["measure_per_prompt_of_call_median_cpu_s"], 2)
        cpu["cpu_speedup_first_prompt"] = round(rel_cpu_med / cpu["measure_first_prompt_median_cpu_s"], 2)
        cpu["cpu_speedup_steady"] = round(rel_cpu_med / cpu["measure_steady_median_cpu_s"], 2)
        first_med = statistics.median(r["first_prompt_s"] for r in call_runs)
        steady_med = statistics.median(r["steady_median_s"] for r in call_runs)
        call_pp_med = statistics.median(r["per_prompt_of_call_s"] for r in call_runs)
        emit({"record": "summary", "repeats": args.repeats,
              "released_s_each": [round(x, 3) for x in rel_secs], "released_median_s": round(rel_med, 3),
              "measure_per_prompt_of_call_median_s": round(call_pp_med, 4),
              "measure_first_prompt_median_s": round(first_med, 4),
              "measure_steady_median_s": round(steady_med, 4),
              "speedup_per_prompt_of_call": round(rel_med / call_pp_med, 2),
              "speedup_first_prompt": round(rel_med / first_med, 2),
              "speedup_steady": round(rel_med / steady_med, 2),
              "speedup_per_repeat_per_prompt_of_call": [
                  round(r["released_same_repeat_s"] / r["per_prompt_of_call_s"], 2) for r in call_runs],
              "max_abs_diff_all": max(r["max_abs_diff_all_prompts"] for r in call_runs),
              **cpu, "loadavg": [round(x, 2) for x in os.getloadavg()]}, sink)
        rel_total = rel_med

        # (c) measure(fast_path=False), prompt 0
        if not args.no_generic:
            m, log, ph = run_measure(model, ids[:1], fast_path=False)
            got = coupling_values(m.coupling)
            emit({"record": "method", "method": "measure_generic", "dtype": "float32", "prompt": 0,
                  "call": "same as measure_fast with fast_path=False, prompt 0 only",
                  "call_seconds": ph["seconds"], "call_phase": ph, "per_prompt": log,
                  "seconds": log[0]["seconds"], "methods": methods_used(m),
                  "speedup_vs_released": round(rel_total / log[0]["seconds"], 2),
                  "agreement": agreement(next(iter(got.values())), refs[0]), "loadavg_1m": la1()}, sink)

        if args.curve:
            cids = torch.randint(0, V, (args.curve_prompts, args.tokens),
                                 generator=torch.Generator().manual_seed(1))
            curve(model, cids, [1, 2, 4, 8], args.traj_repeats, args.depth_repeats, sink)
        emit({"record": "end", "load_end": load()}, sink)
        complete = True
    finally:
        save(sink, name if complete else name + "_partial")


if __name__ == "__main__":
    main()
