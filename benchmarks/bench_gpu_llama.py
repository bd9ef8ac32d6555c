"""Issue 13 items 4-7 on a GPU: Llama-3-8B shape (bf16 weights, random init) and 70B-shape streaming.

One command runs every item (``--items 4 5 6 7``, the default) and writes the raw JSON to
benchmarks/results/ and, when ``$OUT`` is a folder, there too:

    python benchmarks/bench_gpu_llama.py                       # all items, Llama-3-8B shape on cuda
    OMP_NUM_THREADS=2 python benchmarks/bench_gpu_llama.py --small   # tiny shapes on the CPU (smoke test)

Item 4 (depth-wise, 12-token prompt, all 32 x 32 pairs). Methods in one process, same model and prompt (12 tokens, last token, K in 10/30/50, both
orientations, every variant, final norm folded into the last block):
  ``released`` (benchmarks/released.py; skipped with --skip-released),
  ``fast_dense``: fast-path dense J_tt (decode step, float32 copy of one block at a time) +
      top-K from eigh(J^T J) + batched pair GEMMs,
  ``fast_randomized``: fast-path operator + blockcoupling.engine.svd.randomized_topk_svd (K=50,
      oversample 10, 4 iterations) + J_l V_l' products through the operator,
  ``measure``: what a user runs, ``blockcoupling.measure(model, None, {"input_ids": ids},
      coupling=("depth",), k=(10, 30, 50), final_norm=True, progress=False)`` with the
      defaults (fast path on; ``method="auto"`` picks the matrix-free randomized SVD at
      d = 4096), one call on one prompt, so it includes the one-time fast-path check.
Oracle: float64 dense J_tt from the verified fast path (one block at a time, on the GPU).

    python benchmarks/bench_gpu_llama.py                  # Llama-3-8B shape on cuda
    OMP_NUM_THREADS=2 python benchmarks/bench_gpu_llama.py --small   # tiny Llama on CPU (smoke test)

``measure_dense``: the same call with ``method="dense"`` (the dense J_tt assembled from the
block's structure by GEMMs, engine/structured.py, then the exact top-K).
``measure_split``: the ``measure`` call again, instrumented: every ``svd.topk_svd`` call timed
between CUDA synchronisations (the eigensolve: Gram, subspace, float64 Rayleigh-Ritz,
certificate) with the route it took (``TopK.route``: ``gram-iter`` subspace iteration,
``gram-eigh`` the whole Gram's eigh, ``gram-f64``, ``svd``), and the ``on_event`` phases:
``jacobian_s`` = the "prompt" events less the eigensolve, "coupling" and "tables" (the
Jacobian work: fast-path replays and their first-prompt checks, the dense J), ``rest_s`` =
the call less both (capture, trajectory, the coupling GEMMs, tables).
``measure_eigh``: ``measure_split`` with the subspace iteration switched off (every Gram
decomposed whole, the code before it): the before/after of the top-K in the same run.
``measure_profile``: the ``measure`` call once under ``torch.profiler``, the 15 operators with
the most self device time (where the Jacobian phase's 1.93 s goes; profiler overhead
included, so read the shares).
``--iterate-anywhere`` tries the iterated route first for every Gram top-K, on any device and
at any width (`engine/svd._iterate_first` forced), so a CPU dry run (``--small``, d = 256)
goes through it too.

Item 5 (token-wise, 32-token prompt, layer 16 with itself): ``measure(..., coupling=("self",),
tokens="all", layers=(16,))`` (every token pair) and ``measure(..., coupling=("fixed_output",),
tokens="last", layers=(16,))`` (the last token's map, every input token pair).

Item 6 (trajectory only, 32 prompts of 12 tokens): ``measure(..., coupling=(), spectra=False,
batch_size=32)`` against a plain ``model(ids)`` forward under ``torch.no_grad`` (medians of 5,
interleaved), with the ``capture`` and ``trajectory`` phases of each call (``on_event``) and
the device the trajectory tables ran on (engine/tables.py, ``_trajectory_device``).

Item 7 (larger than the GPU): a random Llama with the Llama-3-70B block shape (d = 8192, MLP
28672, 64 heads, 8 kv heads) and ``--stream-layers`` blocks (default 4) kept in bf16 in host
memory; ``measure(..., layers=(1,), analysis_device="cuda", method="matrix_free")`` copies one
block at a time to the GPU in float32 (the streaming mechanism): seconds and peak GPU memory
per block, and the 80-block total extrapolated (labelled). Then the same model dispatched with
``accelerate.dispatch_model`` (half the blocks on the GPU, half on the CPU; skipped with a
record saying so if accelerate is not installed) and measured without ``analysis_device``.

Item 8 (the Jacobian phase against its GEMM floor, any device; issue 34 item 4): the depth-wise
``measure()`` call above on ``--prompts`` prompts (default 3) of ``--tokens`` tokens, timed
prompt by prompt (`item8_jacobian_phase`): the Jacobian phase (pass 1 less its top-K), the
structured dense J alone and the first prompt's one-time build check, each against the
floor: the block's three big GEMMs timed alone at this shape in float32 (`gemm_floor`) times
the number of blocks. On the CPU in process CPU seconds (run it with ``OMP_NUM_THREADS=1``), on
a GPU in synchronised wall seconds. ``--shape mid`` (d = 1024, MLP 3584, 16 heads, 4 kv heads,
4 blocks; ``--layers``) keeps the Llama-3-8B ratios at a width one CPU core measures in
seconds; ``--shape host`` (d = 128, 32 blocks) leaves the host's work per block, which a GPU pays too;
``--weights f32`` builds the model in float32 instead of bf16:

    OMP_NUM_THREADS=1 python benchmarks/bench_gpu_llama.py --shape mid --items 8
    python benchmarks/bench_gpu_llama.py --items 8                 # the 8B shape on cuda

``--spectrum trained flat`` measures each item on two models one after the other (built, run,
freed): ``trained`` is the random model with the trained models' Jacobian decay
(`spectrum.realistic_`, BENCHMARKS.md "Issue 43 items 1-2"), ``flat`` its initialisation (the
default, and every row before issue 43). ``--methods`` picks item 4's methods;
``--baselines first`` runs item 4's float64 oracle and released algorithm on the first model
only (the released algorithm's work does not depend on the spectrum; a later model's ratio is
then against it, ``released_on``), so both spectra fit one short GPU lease:

    python benchmarks/bench_gpu_llama.py --items 4 --spectrum trained flat --baselines first \
        --methods measure measure_split measure_eigh

Items run in the order ``--items`` gives; ``--item-timeout ITEM=SECONDS`` stops one item with a
record and goes on, and SIGTERM (an outer ``timeout``) still saves the records: a short GPU
lease gets every item that fits. Measured on one H200 on 2026-11-27: BENCHMARKS.md, "Issue 34
item 4: the GPU rows".
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spectrum  # noqa: E402
from bench_depth import KS, Values, agreement, pair_values, topk_full, topk_gram  # noqa: E402
from common import emit, machine, phase, save  # noqa: E402
from released import released_depth  # noqa: E402

from blockcoupling import measure  # noqa: E402
from blockcoupling.engine import fastpath, metrics, svd  # noqa: E402
from blockcoupling.engine import tables as tables_mod  # noqa: E402
from blockcoupling.engine.blocks import find_blocks  # noqa: E402
from blockcoupling.engine.capture import capture  # noqa: E402
from blockcoupling.engine.names import VARIANTS  # noqa: E402
from blockcoupling.engine.variants import get as get_variant  # noqa: E402

#: the randomized path keeps the top-K factors and ||J||_F^2 only: the variants they determine
#: (coupling_vs_rotated also needs tr(J) and tr(J^2); the dense oracle computes it)
MATRIX_FREE_VARIANTS = tuple(v for v in VARIANTS
                             if not {"trace", "trace2", "overlap"} & set(get_variant(v).needs))


#: ``--shape``: the model's width, MLP width, heads, kv heads and default number of layers
SHAPES = spectrum.LLAMA_SHAPES


def llama(small: bool, device: str, shape: str | None = None, layers: int | None = None,
          weights: torch.dtype = torch.bfloat16, kind: str = "flat") -> torch.nn.Module:
    """A random ``LlamaForCausalLM`` of ``shape`` (`SHAPES`; default "small" or "8b" by
    ``small``) with ``layers`` blocks (default the shape's), weights in ``weights``, its
    spectrum ``kind`` (`spectrum.build`: flat, the initialisation, or trained)."""
    return spectrum.build(f"llama-{shape or ('small' if small else '8b')}", kind, device,
                          layers, weights)


def fast_dense(model: torch.nn.Module, ids: torch.Tensor, device: str
               ) -> tuple[Values, dict[str, Any]]:
    spec = find_blocks(model)
    ph_out: dict[str, Any] = {}
    with phase("jacobians", device) as ph:
        cap = capture(model, {"input_ids": ids}, spec, final_norm=True)
        t = cap.lengths[0] - 1
        Js = []
        for layer in range(1, spec.num_layers + 1):
            tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=torch.float32)
            if tb is None:
                raise SystemExit(f"fast path refused layer {layer}")
            Js.append(tb.jacobian())
        J = torch.stack(Js)  # (L, d, d)
    ph_out["jacobians"] = ph.as_dict()
    with phase("svd", device) as ph:
        U, S, V = topk_gram(J, max(KS))
        fro2 = (J * J).sum((-2, -1))
    ph_out["svd"] = ph.as_dict()
    with phase("pairs", device) as ph:
        vals = pair_values(J, U, S, V, fro2)
    ph_out["pairs"] = ph.as_dict()
    return vals, ph_out


def fast_randomized(model: torch.nn.Module, ids: torch.Tensor, device: str
                    ) -> tuple[Values, dict[str, Any]]:
    spec = find_blocks(model)
    L = spec.num_layers
    ph_out: dict[str, Any] = {}
    with phase("jacobians+svd", device) as ph:
        cap = capture(model, {"input_ids": ids}, spec, final_norm=True)
        t = cap.lengths[0] - 1
        tops = []
        for layer in range(1, L + 1):
            tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=torch.float32)
            if tb is None:
                raise SystemExit(f"fast path refused layer {layer}")
            tops.append(svd.randomized_topk_svd(tb, max(KS), oversample=10, n_iter=4))
    ph_out["jacobians+svd"] = ph.as_dict()
    with phase("pairs", device) as ph:
        U = torch.stack([tp.U for tp in tops])  # (L, d, K)
        V = torch.stack([tp.V for tp in tops])
        S = torch.stack([tp.S for tp in tops])  # (L, K)
        fro2 = torch.stack([tp.fro2 for tp in tops])
        d, K = U.shape[1], U.shape[2]
        A = {o: torch.empty(L, L, K, K, device=U.device) for o in ("ujv", "vju")}
        for a in range(1, L + 1):
            tb = fastpath.token_branch(model, cap, a, 0, t, dtype=torch.float32, verify=False)
            assert tb is not None
            both = torch.cat([V.permute(1, 0, 2).reshape(d, L * K),
                              U.permute(1, 0, 2).reshape(d, L * K)], dim=1)  # (d, 2LK)
            JB = tb.matmat(both)  # (d, 2LK)
            JV = JB[:, : L * K].reshape(d, L, K).permute(1, 0, 2)  # (Lb, d, K)
            JU = JB[:, L * K :].reshape(d, L, K).permute(1, 0, 2)
            A["ujv"][a - 1] = U.mT @ JV
            A["vju"][a - 1] = V.mT @ JU
        vals: Values = {}
        for o, Ao in A.items():
            res = metrics.all_coupling_values(Ao, S[:, None, :].expand(L, L, K), KS, ps=(1,),
                                              fro2=fro2[:, None].expand(L, L), d=d,
                                              variants=MATRIX_FREE_VARIANTS)
            for (variant, _p, k), v in res.items():
                v = v.double().cpu()
                for i in range(L):
                    for j in range(L):
                        vals[(variant, k, o, i + 1, j + 1)] = float(v[i, j])
    ph_out["pairs"] = ph.as_dict()
    return vals, ph_out


def user_measure(model: torch.nn.Module, ids: torch.Tensor, device: str
                 ) -> tuple[Values, dict[str, Any]]:
    """blockcoupling.measure() with the defaults, as a user calls it (one prompt)."""
    with phase("measure", device) as ph:
        m = measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS, final_norm=True,
                    progress=False)
    vals: Values = {}
    for r in m.coupling.itertuples(index=False):
        vals[(str(r.variant), int(r.k), str(r.orientation), int(r.layer_a), int(r.layer_b))] = float(r.value)
    return vals, {"measure": ph.as_dict(),
                  "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}}


def user_measure_dense(model: torch.nn.Module, ids: torch.Tensor, device: str
                       ) -> tuple[Values, dict[str, Any]]:
    """measure() with method="dense": structured dense J_tt + exact top-K."""
    with phase("measure", device) as ph:
        m = measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS, final_norm=True,
                    progress=False, method="dense")
    vals: Values = {}
    for r in m.coupling.itertuples(index=False):
        vals[(str(r.variant), int(r.k), str(r.orientation), int(r.layer_a), int(r.layer_b))] = float(r.value)
    return vals, {"measure": ph.as_dict(),
                  "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}}


def user_measure_split(model: torch.nn.Module, ids: torch.Tensor, device: str,
                       iterate: bool | None = None) -> tuple[Values, dict[str, Any]]:
    """`user_measure`, with its time split into eigensolve / Jacobians / rest and the routes
    of the top-K (module docstring); ``iterate=False``: the subspace iteration off."""
    from collections import Counter

    phases: Counter[str] = Counter()
    routes: Counter[str] = Counter()
    eig = [0.0]
    topk, rule = svd.topk_svd, svd._iterate_first

    def timed(J: torch.Tensor, k: int) -> svd.TopK:
        _sync(device)
        t0 = time.perf_counter()
        top = topk(J, k)
        _sync(device)
        eig[0] += time.perf_counter() - t0
        routes[str(top.route)] += 1
        return top

    svd.topk_svd = timed
    if iterate is False:
        svd._iterate_first = lambda n, k, dev: False
    try:
        with phase("measure", device) as ph:
            m = measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS,
                        final_norm=True, progress=False,
                        on_event=lambda ev: phases.update({ev.phase: ev.seconds}))
            _sync(device)
    finally:
        svd.topk_svd, svd._iterate_first = topk, rule
    vals: Values = {}
    for r in m.coupling.itertuples(index=False):
        vals[(str(r.variant), int(r.k), str(r.orientation), int(r.layer_a), int(r.layer_b))] = float(r.value)
    jac = phases["prompt"] - eig[0] - phases["coupling"] - phases["tables"]
    split = {"total_s": round(ph.seconds, 3), "eigensolve_s": round(eig[0], 3),
             "jacobian_s": round(jac, 3), "rest_s": round(ph.seconds - eig[0] - jac, 3),
             "routes": dict(routes), "events_s": {k: round(v, 3) for k, v in phases.items()},
             "note": "each top-K timed between CUDA synchronisations (adds a few ms)"}
    return vals, {"measure": ph.as_dict(), "split": split,
                  "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}}


def user_measure_eigh(model: torch.nn.Module, ids: torch.Tensor, device: str
                      ) -> tuple[Values, dict[str, Any]]:
    """`user_measure_split` with the subspace iteration off (the whole Gram's eigh)."""
    return user_measure_split(model, ids, device, iterate=False)


def user_measure_profile(model: torch.nn.Module, ids: torch.Tensor, device: str
                         ) -> tuple[Values, dict[str, Any]]:
    """`user_measure` once under ``torch.profiler``: the 15 operators with the most self
    device time (CPU time on the CPU), so the next run says where the Jacobian phase goes
    (its GEMMs are about 24 TFLOP per prompt at this shape, 0.36 s at an H200's FP32 peak,
    against 1.93 s measured). The profiler's overhead inflates the total: read the shares."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        vals, info = user_measure(model, ids, device)
        _sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)
    total = sum(getattr(e, key, 0.0) for e in prof.key_averages()) or 1.0
    info["profile"] = {"by": key, "total_ms": round(total / 1e3, 1), "top": [
        {"op": e.key, "calls": int(e.count), "ms": round(getattr(e, key, 0.0) / 1e3, 2),
         "share": round(getattr(e, key, 0.0) / total, 4)} for e in rows[:15]]}
    return vals, info


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def item5_tokenwise(model: torch.nn.Module, device: str, n: int, layer: int,
                    sink: list[dict[str, Any]]) -> None:
    ids = torch.randint(0, model.config.vocab_size, (1, n),
                        generator=torch.Generator().manual_seed(5)).to(device)
    for kind, tokens in (("self", "all"), ("fixed_output", "last")):
        with phase(kind, device) as ph:
            m = measure(model, None, {"input_ids": ids}, coupling=(kind,), k=KS, tokens=tokens,
                        layers=(layer,), final_norm=False, progress=False, trajectory=False,
                        spectra=False)
        emit({"record": "item5", "kind": kind, "tokens": tokens, "n_tokens": n, "layer": layer,
              "phase": ph.as_dict(), "n_coupling_rows": len(m.coupling),
              "n_jacobians": len(m.diagnostics),
              "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()},
              "jac_svd_s": round(float(m.diagnostics["seconds"].sum()), 3)}, sink)


def item6_trajectory(model: torch.nn.Module, device: str, B: int, n: int, repeats: int,
                     sink: list[dict[str, Any]]) -> None:
    ids = torch.randint(0, model.config.vocab_size, (B, n),
                        generator=torch.Generator().manual_seed(6)).to(device)
    plain, traj, split = [], [], []
    where: list[str] = []
    pick = tables_mod._trajectory_device

    def seen(cap: Any, n_tokens: int) -> Any:
        got = pick(cap, n_tokens)
        where.append("model device" if got is not None else "cpu")
        return got

    tables_mod._trajectory_device = seen
    try:
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            with torch.no_grad():
                model(ids)
            _sync(device)
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ev: dict[str, float] = {}
            measure(model, None, {"input_ids": ids}, coupling=(), trajectory=True, spectra=False,
                    batch_size=B, progress=False,
                    on_event=lambda e, ev=ev: ev.update({e.phase: round(e.seconds, 4)}))
            _sync(device)
            traj.append(time.perf_counter() - t0)
            split.append(ev)
    finally:
        tables_mod._trajectory_device = pick
    import statistics

    emit({"record": "item6", "B": B, "n_tokens": n, "plain_s": [round(x, 4) for x in plain],
          "trajectory_s": [round(x, 4) for x in traj], "phases_s": split,
          "tables_on": sorted(set(where)),
          "ratio_of_medians": round(statistics.median(traj) / statistics.median(plain), 3)}, sink)


def llama70_shape(layers: int, small: bool) -> torch.nn.Module:
    if small:
        cfg = tf.LlamaConfig(hidden_size=512, intermediate_size=1792, num_hidden_layers=layers,
                             num_attention_heads=8, num_key_value_heads=2, vocab_size=1024)
    else:
        cfg = tf.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=layers,
                             num_attention_heads=64, num_key_value_heads=8, vocab_size=1024,
                             max_position_embeddings=8192, rope_theta=500000.0)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    # initialised on the GPU where there is one (the CPU's bf16 init of 3.5B values took over
    # 100 s on the first GPU run), then kept in host memory: the streaming case
    build_on = "cuda" if torch.cuda.is_available() and not small else "cpu"
    try:
        with torch.device(build_on):
            model = tf.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.to("cpu").eval()


def item7_streaming(device: str, layers: int, small: bool, sink: list[dict[str, Any]]) -> None:
    with phase("build", "cpu") as ph:
        model = llama70_shape(layers, small)  # bf16, host memory
    emit({"record": "item7_load", "layers": layers, "phase": ph.as_dict()}, sink)
    block_bytes = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(7))
    cuda = torch.device(device).type == "cuda"
    per_block = []
    for layer in range(1, layers + 1):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        with phase(f"block{layer}", device) as ph:
            m = measure(model, None, {"input_ids": ids}, coupling=("depth",), k=(10,),
                        layers=(layer,), method="matrix_free", analysis_device=device,
                        trajectory=False, spectra=False, progress=False)
        rec = {"record": "item7_block", "layer": layer, "phase": ph.as_dict(),
               "cuda_peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3) if cuda else None,
               "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}}
        per_block.append(ph.seconds)
        emit(rec, sink)
    import statistics

    emit({"record": "item7_total", "block_bf16_gb": round(block_bytes / 1e9, 3),
          "median_block_s": round(statistics.median(per_block), 3),
          "extrapolated_80_blocks_s": round(80 * statistics.median(per_block), 1),
          "extrapolated": True,
          "note": "K=10, one block per call (layers=(l,)); 80 x the median per-block call"}, sink)
    try:
        from accelerate import dispatch_model
    except ImportError:
        emit({"record": "item7_device_map", "skipped": "accelerate is not installed"}, sink)
        return
    if not cuda:
        emit({"record": "item7_device_map", "skipped": "no GPU"}, sink)
        return
    half = layers // 2
    dmap = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": "cpu", "lm_head": "cpu"}
    for i in range(layers):
        dmap[f"model.layers.{i}"] = 0 if i < half else "cpu"
    model = dispatch_model(model, device_map=dmap)
    torch.cuda.reset_peak_memory_stats()
    with phase("device_map", device) as ph:
        m = measure(model, None, {"input_ids": ids}, coupling=("depth",), k=(10,),
                    method="matrix_free", trajectory=False, spectra=False, progress=False)
    emit({"record": "item7_device_map", "device_map": {k: str(v) for k, v in dmap.items()},
          "phase": ph.as_dict(), "cuda_peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
          "n_coupling_rows": len(m.coupling),
          "methods": {str(k): int(v) for k, v in m.diagnostics["method"].value_counts().items()}}, sink)


def _clock(device: str) -> float:
    """Seconds for item 8: CPU seconds of this process on the CPU (run it on one thread: robust
    to a shared machine), wall seconds after a synchronisation on a GPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def gemm_floor(model: torch.nn.Module, device: str, repeats: int = 3) -> dict[str, Any]:
    """The GEMMs of one block's structured dense J (engine/structured.py, module docstring) at
    this model's shape, in float32, each timed alone in this process (best of ``repeats``):
    ``W_o J_o`` (d x H hd x d), the gated MLP's ``W_d [diag(.) W_g + diag(.) W_u]`` (d x I x d)
    and ``N J_a`` (d x d x d). The norm, rotary and per-head products are O(d^2 hd) or smaller
    and are not counted."""
    c = model.config
    d, width, heads = c.hidden_size, c.intermediate_size, c.num_attention_heads
    hd = getattr(c, "head_dim", None) or d // heads
    sizes = {"W_o J_o": (d, heads * hd, d), "W_d [.] (MLP)": (d, width, d), "N J_a": (d, d, d)}
    out: dict[str, Any] = {}
    for name, (m, k, n) in sizes.items():
        A = torch.randn(m, k, device=device)
        B = torch.randn(k, n, device=device)
        C = torch.empty(m, n, device=device)
        torch.mm(A, B, out=C)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = _clock(device)
            torch.mm(A, B, out=C)
            best = min(best, _clock(device) - t0)
        out[name] = {"m_k_n": [m, k, n], "gflop": round(2 * m * k * n / 1e9, 2),
                     "seconds": round(best, 5), "gflops_per_s": round(2 * m * k * n / best / 1e9, 1)}
    per_block = sum(v["seconds"] for v in out.values())
    return {"gemms": out, "gflop_per_block": round(sum(v["gflop"] for v in out.values()), 2),
            "seconds_per_block": round(per_block, 5),
            "seconds_per_prompt": round(per_block * c.num_hidden_layers, 4)}


def item8_jacobian_phase(model: torch.nn.Module, device: str, n: int, prompts: int,
                         repeats: int, sink: list[dict[str, Any]]) -> None:
    """The Jacobian phase of ``measure()`` (depth-wise, last token, the defaults) against its
    GEMM floor (`gemm_floor`), prompt by prompt: the first prompt includes the one-time
    build check of every layer (`fastpath._verify`), the later ones are what every further
    prompt costs. Per prompt: ``jacobian_s`` = pass 1 less its top-K (the blocks' dtype
    copies and replays, the check, the dense J, the diagnostics rows), ``dense_j_s`` = the
    structured J alone (`structured.decode_step_jacobian`), ``check_s`` = the build check,
    ``topk_s``; each against the floor (L x the block's GEMMs). Seconds are `_clock`'s; the
    call is repeated ``repeats`` times (each call checks every layer again on its first
    prompt) and each number is the median over the repeats, the minimum beside it. Then one
    more call of one prompt under ``torch.profiler``: the operators with the most self time,
    and per block the operator events and the host-device synchronisations
    (``aten::_local_scalar_dense``: a ``float()`` / ``bool()`` of a tensor) of the call; and
    the "jacobians" phase of `fast_dense` on one prompt (the 1.93 s row of the H200 run:
    capture, then per block the decode step with the build check, forward-mode products
    included, and the dense J)."""
    from blockcoupling.engine import measure as measure_mod
    from blockcoupling.engine import structured

    floor = gemm_floor(model, device)
    emit({"record": "item8_floor", "floor": floor}, sink)  # kept if the item runs out of time
    ids = torch.randint(0, model.config.vocab_size, (prompts, n),
                        generator=torch.Generator().manual_seed(8)).to(device)
    per: list[dict[str, float]] = []
    originals: list[tuple[Any, str, Any]] = []

    def timed(owner: Any, name: str, key: str, new_prompt: bool = False) -> None:
        fn = getattr(owner, name)
        originals.append((owner, name, fn))

        def wrapper(*a: Any, **k: Any) -> Any:
            if new_prompt:
                per.append({"pass1_s": 0.0, "topk_s": 0.0, "dense_j_s": 0.0, "check_s": 0.0})
            t0 = _clock(device)
            try:
                return fn(*a, **k)
            finally:
                per[-1][key] += _clock(device) - t0

        setattr(owner, name, wrapper)

    timed(measure_mod._PromptRun, "pass1", "pass1_s", new_prompt=True)
    timed(svd, "topk_svd", "topk_s")
    timed(structured, "decode_step_jacobian", "dense_j_s")
    timed(fastpath, "_verify", "check_s")
    calls = []
    try:
        for _ in range(repeats):
            with phase("measure", device) as ph:
                measure(model, None, {"input_ids": ids}, coupling=("depth",), k=KS,
                        final_norm=True, progress=False)
            calls.append(ph.as_dict())
    finally:
        for owner, name, fn in reversed(originals):
            setattr(owner, name, fn)
    f = floor["seconds_per_prompt"]
    for p in per:
        p["jacobian_s"] = p["pass1_s"] - p["topk_s"]
        p["check_less_dense_j_s"] = p["check_s"] - (p["dense_j_s"] if p["check_s"] else 0.0)

    def stats(values: list[float]) -> dict[str, float]:
        v = sorted(values)
        return {"median": round(v[len(v) // 2], 4), "min": round(v[0], 4),
                "median_over_floor": round(v[len(v) // 2] / f, 2)}

    rows = []
    for i in range(prompts):
        got = per[i::prompts]  # prompt i of every repeat
        rows.append({"prompt": i, **{k: stats([p[k] for p in got]) for k in got[0]}})
    later = [p for j, p in enumerate(per) if j % prompts]  # every prompt after the first
    summary = {k: stats([p[k] for p in later]) for k in ("jacobian_s", "dense_j_s")
               } if later else {}
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        measure(model, None, {"input_ids": ids[:1]}, coupling=("depth",), k=KS,
                final_norm=True, progress=False)
        _sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ops = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)
    total = sum(getattr(e, key, 0.0) for e in ops) or 1.0
    n_layers = model.config.num_hidden_layers
    counts = {e.key: int(e.count) for e in ops}
    _, fd = fast_dense(model, ids[:1], device)
    emit({"record": "item8", "shape": {"d": model.config.hidden_size,
                                       "mlp": model.config.intermediate_size,
                                       "heads": model.config.num_attention_heads,
                                       "kv_heads": model.config.num_key_value_heads,
                                       "layers": model.config.num_hidden_layers},
          "weights": str(next(model.parameters()).dtype).removeprefix("torch."),
          "n_tokens": n, "prompts": prompts, "repeats": repeats,
          "clock": "wall, synchronised" if cuda else "process CPU seconds",
          "floor": floor, "per_prompt": rows, "later_prompts_median": summary,
          "measure_calls": calls,
          "fast_dense_jacobians_s": round(fd["jacobians"]["seconds" if cuda else "cpu_seconds"], 4),
          "per_block_one_prompt_call": {
              "aten_op_events": round(sum(c for k, c in counts.items() if k.startswith("aten::"))
                                      / n_layers, 1),
              "syncs": round(counts.get("aten::_local_scalar_dense", 0) / n_layers, 1)},
          "profile_one_prompt": {"by": key, "total_ms": round(total / 1e3, 1), "top": [
              {"op": e.key, "calls": int(e.count), "ms": round(getattr(e, key, 0.0) / 1e3, 2),
               "share": round(getattr(e, key, 0.0) / total, 4)} for e in ops[:12]]}}, sink)


def oracle(model: torch.nn.Module, ids: torch.Tensor) -> tuple[Values, float]:
    t0 = time.perf_counter()
    spec = find_blocks(model)
    cap = capture(model, {"input_ids": ids}, spec, final_norm=True, boundary_dtype=torch.float64)
    t = cap.lengths[0] - 1
    Js = []
    for layer in range(1, spec.num_layers + 1):
        tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=torch.float64)
        assert tb is not None
        Js.append(tb.jacobian())
    J = torch.stack(Js)
    U, S, V = topk_full(J, max(KS))
    return pair_values(J, U, S, V, (J * J).sum((-2, -1))), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny Llama on the CPU (smoke test)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="the model's shape (default: small with --small, else 8b)")
    ap.add_argument("--layers", type=int, default=None, help="blocks (default: the shape's)")
    ap.add_argument("--weights", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--prompts", type=int, default=3, help="item 8: prompts in the call")
    ap.add_argument("--repeats", type=int, default=3, help="item 8: calls (medians)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--skip-released", action="store_true")
    ap.add_argument("--skip-oracle", action="store_true")
    ap.add_argument("--items", type=int, nargs="+", default=[4, 5, 6, 7])
    ap.add_argument("--stream-layers", type=int, default=4)
    ap.add_argument("--item-timeout", type=_item_budget, action="append", metavar="ITEM=SECONDS",
                    help="stop that item after SECONDS with a record, and go on (repeatable)")
    ap.add_argument("--iterate-anywhere", action="store_true",
                    help="try the iterated top-K first everywhere (a CPU dry run of that route)")
    ap.add_argument("--spectrum", nargs="+", default=["flat"], choices=spectrum.SPECTRA,
                    help="the models measured, one after the other: flat (the random "
                         "initialisation) and/or trained (benchmarks/spectrum.py: Jacobians "
                         "with the trained models' decay); every item runs on each")
    ap.add_argument("--methods", nargs="+", default=list(ITEM4_METHODS), choices=ITEM4_METHODS,
                    help="item 4's methods (the oracle and the released algorithm aside)")
    ap.add_argument("--baselines", choices=("all", "first"), default="all",
                    help="item 4's float64 oracle and released algorithm on every model, or "
                         "on the first --spectrum's only (a short GPU lease)")
    args = ap.parse_args()
    if args.iterate_anywhere:
        svd._iterate_first = lambda n, k, dev: True
    if 7 in args.items and (args.items[-1] != 7 or len(args.spectrum) > 1):
        ap.error("item 7 must come last in --items, with one --spectrum (it releases the "
                 "model the others measure)")
    shape = args.shape or ("small" if args.small else "8b")
    device = args.device or ("cuda" if shape == "8b" else "cpu")
    sink: list[dict[str, Any]] = []
    info = machine()
    name = "bench_gpu_llama" + ("" if shape == "8b" else f"_{shape}") + "".join(
        f"_{k}" for k in args.spectrum if args.spectrum != ["flat"])
    budgets = dict(args.item_timeout or [])
    signal.signal(signal.SIGTERM, _raise_timeout)  # an outer `timeout` still saves the records
    released: dict[str, Any] = {}  # the first model's released-algorithm seconds
    try:
        for i, kind in enumerate(args.spectrum):
            measure_model(args, kind, args.baselines == "all" or i == 0, shape, device, info,
                          budgets, released, sink)
    finally:
        save(sink, name)


def measure_model(args: argparse.Namespace, kind: str, baselines: bool, shape: str,
                  device: str, info: dict[str, Any], budgets: dict[int, int],
                  released: dict[str, Any], sink: list[dict[str, Any]]) -> None:
    """Build the model of spectrum ``kind``, run ``args.items`` on it, free it."""
    with phase("load", device) as ph:
        model = llama(args.small, device, shape, args.layers,
                      torch.bfloat16 if args.weights == "bf16" else torch.float32, kind)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens),
                        generator=torch.Generator().manual_seed(0)).to(device)
    emit({"record": "config", "model": f"llama-random-{shape}-shape", "spectrum": kind,
          "d": model.config.hidden_size, "layers": model.config.num_hidden_layers,
          "n_tokens": args.tokens, "ks": list(KS), "weights": args.weights,
          "weight_gb": round(weight_bytes / 1e9, 3), "device": device, "load": ph.as_dict(),
          "topk_iterates_first": svd._iterate_first(model.config.hidden_size, max(KS),
                                                    torch.device(device)),
          "topk_iter": {"oversample": svd._ITER_OVERSAMPLE, "max_products": svd._ITER_MAX,
                        "check_every": svd._ITER_CHECK, "window": svd._GRAM_WINDOW},
          "machine": info}, sink)
    runs = {4: lambda: item4(model, ids, device, weight_bytes, args, sink, kind, baselines,
                             released),
            5: lambda: item5_tokenwise(model, device, 32, min(16, model.config.num_hidden_layers),
                                       sink),
            6: lambda: item6_trajectory(model, device, 32, 12, 5, sink),
            7: lambda: item7_streaming(device, args.stream_layers, args.small, sink),
            8: lambda: item8_jacobian_phase(model, device, args.tokens, args.prompts,
                                            args.repeats, sink)}
    for item in args.items:  # in the order given: the cheap items first on a short lease
        if item == 7:  # the 70B-shape model needs the GPU to itself
            model.to("meta")
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
        _with_budget(item, budgets.get(item), runs[item], sink)
    model.to("meta")  # the next spectrum's model needs the memory
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


class ItemTimeout(Exception):
    """An item ran past its ``--item-timeout`` (or the process got SIGTERM)."""


def _raise_timeout(signum: int, frame: Any) -> None:
    raise ItemTimeout(signal.Signals(signum).name)


def _with_budget(item: int, seconds: int | None, run: Any, sink: list[dict[str, Any]]) -> None:
    """Run one item; past ``seconds`` it stops with a record saying so and the next item runs
    (the records it emitted so far are kept). SIGTERM stops the whole run, records saved."""
    if seconds:
        signal.signal(signal.SIGALRM, _raise_timeout)
        signal.alarm(seconds)
    t0 = time.perf_counter()
    try:
        run()
    except ItemTimeout as e:
        emit({"record": "item_timeout", "item": item, "signal": str(e),
              "after_s": round(time.perf_counter() - t0, 1), "budget_s": seconds}, sink)
        if str(e) == "SIGTERM":
            raise
    finally:
        signal.alarm(0)


def _item_budget(text: str) -> tuple[int, int]:
    item, _, seconds = text.partition("=")
    return int(item), int(seconds)


#: item 4's methods, in the order they run (`--methods`)
ITEM4_METHODS: tuple[str, ...] = ("fast_dense", "fast_randomized", "measure", "measure_dense",
                                  "measure_split", "measure_eigh", "measure_profile")


def item4(model: torch.nn.Module, ids: torch.Tensor, device: str, weight_bytes: int,
          args: argparse.Namespace, sink: list[dict[str, Any]], kind: str = "flat",
          baselines: bool = True, released: dict[str, Any] | None = None) -> None:
    """Item 4 on one model (``kind``: its spectrum): the float64 oracle and the released
    algorithm (unless skipped, or not ``baselines``), then ``args.methods``. ``released``
    keeps the first model's released-algorithm seconds: a model without baselines states its
    ratio against them (``released_on``; the released algorithm's work does not depend on
    the spectrum: full SVDs and pair loops)."""
    released = {} if released is None else released
    ref = None
    if not args.skip_oracle and baselines:
        ref, t_or = oracle(model, ids)
        emit({"record": "oracle", "how": "fast64", "spectrum": kind, "seconds": round(t_or, 2)},
             sink)
    rel_total = None
    if not args.skip_released and baselines:
        body = model.model if hasattr(model, "model") else model
        attention = "the model's own"
        try:
            rel_vals, rel_ph = released_depth(body, ids, ks=KS)
        except RuntimeError as e:  # e.g. a fused CUDA attention backward that vmap cannot batch
            from torch.nn.attention import SDPBackend, sdpa_kernel

            emit({"record": "released_retry", "error": str(e).splitlines()[0][:300],
                  "retry": "sdpa math backend"}, sink)
            attention = "sdpa math backend"
            with sdpa_kernel([SDPBackend.MATH]):
                rel_vals, rel_ph = released_depth(body, ids, ks=KS)
        rel_total = sum(p.seconds for p in rel_ph.values())
        released.setdefault("seconds", rel_total)
        released.setdefault("spectrum", kind)
        rel_as = {("released_norm", k, o, a, b): v for (k, o, a, b), v in rel_vals.items()}
        emit({"record": "method", "method": "released", "spectrum": kind,
              "seconds": round(rel_total, 3),
              "attention": attention,
              "phases": {k: p.as_dict() for k, p in rel_ph.items()},
              "agreement": agreement(rel_as, ref) if ref else None}, sink)
    fns = {"fast_dense": fast_dense, "fast_randomized": fast_randomized,
           "measure": user_measure, "measure_dense": user_measure_dense,
           "measure_split": user_measure_split, "measure_eigh": user_measure_eigh,
           "measure_profile": user_measure_profile}
    if rel_total is None and released:
        rel_total = released["seconds"]
    for name in ITEM4_METHODS:
        if name not in args.methods:
            continue
        vals, phs = fns[name](model, ids, device)
        timed = [p for p in phs.values() if isinstance(p, dict) and "seconds" in p]
        total = sum(p["seconds"] for p in timed)
        peak = max((p.get("cuda_peak_mb") or 0.0) for p in timed)
        emit({"record": "method", "method": name, "spectrum": kind, "seconds": round(total, 3),
              "phases": phs,
              "speedup_vs_released": round(rel_total / total, 2) if rel_total else None,
              "released_on": released.get("spectrum"),
              "cuda_peak_over_weights": round(peak * 2**20 / weight_bytes, 3) if peak else None,
              "agreement": agreement(vals, ref) if ref else None}, sink)


if __name__ == "__main__":
    main()
