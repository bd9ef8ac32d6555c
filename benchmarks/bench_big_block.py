"""Target 5 of issue 4 on the CPU: one block of the Llama-3-70B shape, streamed to float32.

A random ``LlamaModel`` with the Llama-3-70B block shape (hidden 8192, intermediate 28672, 64
heads, 8 key-value heads) but only 2 layers and a 1024-token vocabulary (the vocabulary does
not enter the block Jacobians; 128256 would add 2 GB of embeddings), initialised directly in
bfloat16 on the CPU (``torch.set_default_dtype(torch.bfloat16)`` around ``from_config``), one
8-token random prompt. The model stays in bf16; the analysis runs in float32: each analysed
block is copied to float32 one at a time (on a GPU,
``analysis_device="cuda"`` copies it there instead), which is the streaming mechanism.

Measured (``--mode measure``, the default):

  ``measure(model, None, {"input_ids": ids}, coupling=("depth",), k=(10,), layers=(1,),
  method="matrix_free", fast_path=True, trajectory=False, spectra=False, progress=False,
  on_event=events.append)``

i.e. all the depth-wise work for ONE block (capture forward of the 2-layer bf16 model; block 1
copied to float32; decode-step fast path built and checked against the generic path; top-10
randomized SVD with the defaults oversample 10, 4 iterations, tol 1e-3; the coupling of the
pair (1, 1)), with its wall time, the peak RSS (sampled every 5 ms by ``common.phase``) and a
breakdown per phase from the engine's public events (``on_event``: capture, jacobian, svd,
prompt) and the SVD residuals from ``diagnostics``. Then the pieces for the whole-model figure: on one fast-path
operator, ``matmat`` (J V) and ``rmatmat`` (J^T U) timed on a batch of 60 vectors each.

Extrapolated (clearly labelled in the JSON): 80 blocks on this CPU, K = 10, both orientations:
per block the measured one-block call (without its capture) plus the pass-2 columns a full run
adds (each J_l applied to the 80 x 10 bases of both orientations: 1600 columns instead of the
20 of the one-block run) at the measured per-vector J V cost. A second, pieces-only estimate
(float32 copies, fast-path build, the SVD's operator columns at the 60-vector rates, which
underestimates the SVD: its 20-vector calls are memory-bound) is given too, and is the only one
with ``--pieces-only``.

On paper: the memory one block needs on the analysis device (float32 block copy + activations)
for the 70B and 405B shapes.

    OMP_NUM_THREADS=2 python benchmarks/bench_big_block.py            # ~5-10 min, <= ~12 GB
    OMP_NUM_THREADS=2 python benchmarks/bench_big_block.py --small    # tiny shape smoke test
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, phase, save  # noqa: E402

import blockcoupling  # noqa: E402
from blockcoupling.engine import capture as capture_mod  # noqa: E402
from blockcoupling.engine import (
    fastpath,  # noqa: E402
)

measure_mod = importlib.import_module("blockcoupling.engine.measure")  # the module, not the function
from blockcoupling.engine.blocks import find_blocks  # noqa: E402

SHAPES: dict[str, dict[str, int]] = {
    "llama3_70b": dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                       num_key_value_heads=8, num_hidden_layers=80),
    "llama3_405b": dict(hidden_size=16384, intermediate_size=53248, num_attention_heads=128,
                        num_key_value_heads=8, num_hidden_layers=126),
    "small": dict(hidden_size=256, intermediate_size=896, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=80),
}
GB = 1e9


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def block_params(h: int, inter: int, heads: int, kv_heads: int) -> int:
    """Parameters of one Llama decoder layer: q, k, v, o, gate/up/down, two RMSNorm weights."""
    hd = h // heads
    attn = h * h + 2 * h * kv_heads * hd + h * h
    mlp = 3 * h * inter
    return attn + mlp + 2 * h


def on_paper(shape: dict[str, int], n_tokens: int = 8, m: int = 60, k: int = 10) -> dict[str, Any]:
    """Analysis-device memory per block: float32 block copy (x2 where two copies coexist) and
    the activations of one decode-step batch of m vectors (forward + what the JVP/VJP keeps)."""
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kvh, L = shape["num_attention_heads"], shape["num_key_value_heads"], shape["num_hidden_layers"]
    hd = h // heads
    P = block_params(h, inter, heads, kvh)
    f32 = 4 * P
    # per vector row: ~48 d-sized and ~6 intermediate-sized float32 activations (fastpath's
    # _ROW_FACTOR for d, plus the MLP's gate/up/act/product and their tangents)
    act = 4 * m * (48 * h + 6 * inter)
    kv = 4 * 2 * n_tokens * kvh * hd
    bases = 4 * 2 * L * h * k * 2  # U and V (d, K) of every layer, float32, both kept
    return {
        "params_per_block": P,
        "bf16_block_GB": round(2 * P / GB, 3),
        "float32_block_GB": round(f32 / GB, 3),
        "activations_m60_GB": round(act / GB, 3),
        "kv_prefix_MB": round(kv / 1e6, 3),
        "all_layers_topk_bases_GB": round(bases / GB, 3),
        "one_copy_total_GB": round((f32 + act + kv + bases) / GB, 2),
        "two_copies_total_GB": round((2 * f32 + act + kv + bases) / GB, 2),
        "whole_model_bf16_blocks_GB": round(L * 2 * P / GB, 1),
        "num_layers": L,
    }


def build_model(shape: dict[str, int]) -> torch.nn.Module:
    cfg = tf.LlamaConfig(vocab_size=1024, num_hidden_layers=2, max_position_embeddings=256,
                         **{k: v for k, v in shape.items() if k != "num_hidden_layers"})
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        torch.manual_seed(0)
        model = tf.AutoModel.from_config(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def measured_one_block(model: torch.nn.Module, ids: torch.Tensor,
                       sink: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole measure() path for block 1 only, timed, with a per-phase breakdown from the
    engine's public events (``on_event``)."""
    events: list[Any] = []
    with phase("measure_one_block") as ph:
        m = blockcoupling.measure(model, None, {"input_ids": ids}, coupling=("depth",), k=(10,),
                                  layers=(1,), method="matrix_free", fast_path=True,
                                  trajectory=False, spectra=False, progress=False,
                                  on_event=events.append)
    per_phase: dict[str, list[float]] = {}
    for e in events:
        per_phase.setdefault(e.phase, []).append(round(e.seconds, 3))
    rec = {"record": "measured_one_block", "what": "MEASURED", **ph.as_dict(),
           "call": ("measure(model, None, {'input_ids': ids}, coupling=('depth',), k=(10,), "
                    "layers=(1,), method='matrix_free', fast_path=True, trajectory=False, "
                    "spectra=False, progress=False, on_event=events.append)"),
           "diagnostics": m.diagnostics.drop(columns=["prompt_id"]).to_dict(orient="records"),
           "seconds_per_phase": per_phase,
           "uptime": uptime()}
    emit(rec, sink)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shape, smoke test")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--vectors", type=int, default=60)
    ap.add_argument("--pieces-only", action="store_true",
                    help="skip the one-block measure() call (if it would take too long); time "
                         "only the fast-path build, J V and J^T U on --vectors vectors")
    args = ap.parse_args()
    name = "small" if args.small else "llama3_70b"
    shape = SHAPES[name]
    sink: list[dict[str, Any]] = []
    emit({"record": "machine", **machine(), "uptime_start": uptime()}, sink)
    for s in ("llama3_70b", "llama3_405b"):
        emit({"record": "on_paper", "what": "ON PAPER (not measured)", "shape": s, **SHAPES[s],
              **on_paper(SHAPES[s], n_tokens=args.tokens, m=args.vectors)}, sink)

    with phase("build_model") as ph_build:
        model = build_model(shape)
    n_par = sum(p.numel() for p in model.parameters())
    emit({"record": "model", "shape": name, "dtype": str(next(model.parameters()).dtype),
          "params": n_par, "param_GB": round(2 * n_par / GB, 3), **ph_build.as_dict(),
          "uptime": uptime()}, sink)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1024, (1, args.tokens), generator=g)  # (1, n)

    # ---- measured: one block, the whole measure() path ----------------------------------
    one: dict[str, Any] | None = None
    if not args.pieces_only:
        one = measured_one_block(model, ids, sink)

    # ---- measured pieces: a float32 copy, the fast-path build, J V and J^T U ---------------
    spec = find_blocks(model)
    cap = capture_mod.capture(model, {"input_ids": ids}, spec)
    block = model.layers[0]
    with phase("one_float32_copy") as ph_c:
        copy32 = copy.deepcopy(block).to(torch.float32)  # what the analysis copies
    del copy32
    t_last = args.tokens - 1
    with phase("build_fast_operator_with_check") as ph_b:
        tbs = fastpath.token_branches(model, cap, 1, 0, [t_last], dtype=torch.float32, verify=True)
    assert tbs is not None, "the fast path should support Llama"
    tb = tbs[t_last]
    V = torch.randn(tb.d, args.vectors, generator=g)  # (d, m)
    tb.matmat(V[:, :2])  # warm-up
    with phase("matmat") as ph_mm:
        tb.matmat(V)
    with phase("rmatmat") as ph_rm:
        tb.rmatmat(V)
    mm_col = ph_mm.seconds / args.vectors
    rm_col = ph_rm.seconds / args.vectors
    emit({"record": "measured_pieces", "what": "MEASURED", "vectors": args.vectors,
          "one_float32_block_copy": ph_c.as_dict(),
          "build_fast_operator_with_check": ph_b.as_dict(), "matmat": ph_mm.as_dict(),
          "rmatmat": ph_rm.as_dict(), "matmat_s_per_vector": mm_col,
          "rmatmat_s_per_vector": rm_col, "chunk_size": tb.chunk_size, "uptime": uptime(),
          "rss_MB_now": round(psutil.Process().memory_info().rss / 2**20, 1)}, sink)
    del tbs, tb

    # ---- extrapolated: 80 blocks on this CPU ---------------------------------------------
    k, over, L = 10, 10, SHAPES[name]["num_hidden_layers"]
    mcols = k + over

    def svd_cols(n_iter: int) -> tuple[int, int]:
        """(J V columns, J^T U columns) of one randomized SVD that ended after n_iter subspace
        iterations (svd.py: 4 fixed ones, then one more per residual check above tol)."""
        return (n_iter + 1) * mcols + (n_iter - 4 + 1) * k, (n_iter + 1) * mcols

    pass2_cols = 2 * L * k  # both orientations, bases of all L layers
    iters = [one["svd_subspace_iterations"][0]] if one else [4, 30]
    variants = {}
    if one is not None:  # the measured one-block call + the pass-2 columns it did not do
        extra = (pass2_cols - 2 * k) * mm_col
        tot = one["seconds"] - sum(one["seconds_per_piece"]["capture"]) + extra
        variants["measured_call_plus_pass2"] = {
            "per_block_s": {"one_block_measure_call_minus_capture_s":
                            round(tot - extra, 2), "pass2_extra_columns_s": round(extra, 2)},
            "per_block_total_s": round(tot, 1),
            "whole_model_s": round(L * tot, 0), "whole_model_h": round(L * tot / 3600, 2)}
    for it in iters:
        c_mm, c_rm = svd_cols(it)
        per_block = {
            "fast_build_and_check_incl_2_copies_s": ph_b.seconds,
            "pass2_rebuild_2_more_copies_s": 2 * ph_c.seconds,
            "randomized_svd_s_from_60_vector_rates": c_mm * mm_col + c_rm * rm_col,
            "pass2_all_layers_s": pass2_cols * mm_col,
        }
        tot = sum(per_block.values())
        variants[f"pieces_svd_iterations_{it}"] = {
            "per_block_s": {k_: round(v, 2) for k_, v in per_block.items()},
            "per_block_total_s": round(tot, 1),
            "whole_model_s": round(L * tot, 0), "whole_model_h": round(L * tot / 3600, 2)}
    emit({"record": "extrapolated_whole_model", "what": "EXTRAPOLATED (not measured)",
          "num_blocks": L, "k": k,
          "from": "measured one-block measure() call" if one else "pieces only",
          "assumptions": ("every block costs the measured pieces of block 1: the fast-path "
                          "build with its check (2 float32 copies), 2 more copies in pass 2, "
                          "the randomized SVD's operator columns at the measured per-vector "
                          "J V / J^T U cost (n_iter subspace iterations: the measured one, or "
                          "4 (no extension) and 30 (svd.py's max_iter) when not measured), and "
                          "pass 2 against all L layers' bases: 2 orientations x L x K J V "
                          "columns; the one capture forward of the whole model is not included"),
          "variants": variants,
          "one_block_measure_call_s": round(one["seconds"], 1) if one else None,
          "uptime": uptime()}, sink)
    emit({"record": "end", "uptime_end": uptime(), "loadavg_1m": os.getloadavg()[0]}, sink)
    save(sink, f"bench_big_block{'_small' if args.small else ''}")


if __name__ == "__main__":
    main()
