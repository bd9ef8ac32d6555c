"""Target 6 of issue 4: accuracy of the matrix-free top-K where spectra are realistic.

For each model variant, depth-wise coupling at the last token (``coupling=("depth",)``,
``tokens="last"``, every variant, both orientations), on 4 built-in prompts
(``builtin:all_styles_small``: science-00, math-00, commonsense-00, truthfulness-00), one
``measure()`` call per method, same process, same prompts:

* ``dense64``  -- ``method="dense", dtype=torch.float64``: the reference (exact SVD of the dense
  float64 Jacobians);
* ``dense32``  -- ``method="dense"``, float32 (the exact path in the default precision);
* ``mf32``     -- ``method="matrix_free"``, float32, the defaults ``svd_oversample=10,
  svd_iters=4, svd_tol=1e-3`` (the randomized SVD keeps iterating, up to 30 subspace
  iterations in all, until its residual ``max_i ||J v_i - s_i u_i|| / s_1`` is <= 1e-3);
* ``mf32_fixed`` -- the same with ``svd_tol=None``: exactly 4 subspace iterations, no
  adaptive extension (what the randomized SVD gives on its own);
* what ``method="auto"`` would recompute densely at these sizes is counted from ``mf32``:
  every Jacobian whose residual after the adaptive iterations is still above ``svd_tol``
  (``auto`` itself picks ``dense`` below d = 2048: :func:`blockcoupling.engine.measure.choose_method`).

Variants: (i) the pretrained MiniLM (all-MiniLM-L6-v2, BERT encoder, d = 384, 6 layers, generic
path), (ii) the same architecture at random init (``demo.random_like``, seed 0), (iii) the
demo's tiny character LM (GPT-2, d = 128, 6 layers, causal: the decode-step fast path) at its
last checkpoint (step 400) and at step 0 (its random init). K = (10, 30) for MiniLM, (10,) for
the tiny LM. The tiny LM's context is 64 characters, so its prompts are the first 56
characters of the same 4 prompts.

Reported per variant and method: max and mean abs diff of every coupling value against
``dense64`` (and of mf32 against dense32), per coupling variant; the SVD residuals from
``diagnostics``; the fallback count; and the spectral decay ``s_K / s_1`` of the exact float64
spectra (``m.spectra``) so a reader sees why random weights are the hard case.

    OMP_NUM_THREADS=2 python benchmarks/bench_accuracy.py          # ~3-6 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402

import blockcoupling  # noqa: E402
from blockcoupling.engine.measure import choose_method  # noqa: E402
from blockcoupling.studies import demo, tiny_lm  # noqa: E402

PROMPT_IDS = ("science-00", "math-00", "commonsense-00", "truthfulness-00")
KEYS = ["prompt_id", "kind", "layer_a", "layer_b", "token_in_a", "token_out_a", "token_in_b",
        "token_out_b", "k", "variant", "p", "orientation"]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def diff_stats(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, Any]:
    """Max / mean abs diff of coupling values, overall and per variant (b is the reference)."""
    key_a = a[KEYS].astype({"p": "float64"}).fillna({"p": -1.0})
    key_b = b[KEYS].astype({"p": "float64"}).fillna({"p": -1.0})
    A = key_a.assign(value=a["value"].to_numpy())
    B = key_b.assign(ref=b["value"].to_numpy())
    m = A.merge(B, on=KEYS, how="inner", validate="one_to_one")
    if len(m) != len(a) or len(m) != len(b):
        raise RuntimeError(f"coupling tables do not line up: {len(a)} vs {len(b)} -> {len(m)}")
    err = (m["value"] - m["ref"]).abs()
    out: dict[str, Any] = {
        "n_values": int(len(m)),
        "n_nan_mismatch": int((m["value"].isna() != m["ref"].isna()).sum()),
        "max_abs": float(np.nanmax(err.to_numpy())),
        "mean_abs": float(np.nanmean(err.to_numpy())),
        "per_variant": {},
        "coupling_by_k": {},
    }
    for v, g in m.assign(err=err).groupby("variant"):
        out["per_variant"][str(v)] = {"max_abs": float(np.nanmax(g["err"])),
                                     "mean_abs": float(np.nanmean(g["err"]))}
    c = m.assign(err=err)[m["variant"] == "coupling"]
    for k, g in c.groupby("k"):
        out["coupling_by_k"][int(k)] = {"max_abs": float(np.nanmax(g["err"])),
                                        "mean_abs": float(np.nanmean(g["err"]))}
    return out


def spectral_decay(spec: pd.DataFrame, ks: tuple[int, ...]) -> dict[str, Any]:
    """s_K / s_1 per Jacobian (prompt, layer) from an exact spectra table; summary and per layer."""
    out: dict[str, Any] = {}
    piv = spec.pivot_table(index=["prompt_id", "layer"], columns="rank", values="singular_value")
    for k in ks:
        r = piv[k] / piv[1]  # (prompts * layers,)
        per_layer = r.groupby(level="layer").median()
        out[f"s{k}_over_s1"] = {
            "median": float(r.median()), "min": float(r.min()), "max": float(r.max()),
            "median_per_layer": {int(la): float(v) for la, v in per_layer.items()},
        }
    s1 = piv[1]
    out["s1"] = {"median": float(s1.median()), "min": float(s1.min()), "max": float(s1.max())}
    return out


def residual_stats(diag: pd.DataFrame, tol: float = 1e-3) -> dict[str, Any]:
    r = diag["residual"].to_numpy(dtype=float)
    return {
        "n_jacobians": int(len(r)),
        "max": float(r.max()), "median": float(np.median(r)), "min": float(r.min()),
        "n_above_1e-3": int((r > tol).sum()),
        "methods": {str(k): int(v) for k, v in diag["method"].value_counts().items()},
        "jacobian_seconds_total": float(diag["seconds"].sum()),
    }


def run_variant(name: str, model: torch.nn.Module, tok: Any, prompts: list[Any],
                ks: tuple[int, ...], sink: list[dict[str, Any]]) -> None:
    common = dict(coupling=("depth",), k=ks, tokens="last", trajectory=False, spectra=True,
                  progress=False, batch_size=len(prompts))
    runs: dict[str, Any] = {}
    secs: dict[str, float] = {}
    plan: list[tuple[str, dict[str, Any]]] = [
        ("dense64", dict(method="dense", dtype=torch.float64)),
        ("dense32", dict(method="dense")),
        ("mf32", dict(method="matrix_free")),
        ("mf32_fixed", dict(method="matrix_free", svd_tol=None)),
    ]
    for label, opts in plan:
        t0 = time.perf_counter()
        runs[label] = blockcoupling.measure(model, tok, prompts, **common, **opts)
        secs[label] = time.perf_counter() - t0
    cfg = runs["dense32"].config.replace(method="auto")
    d = int(runs["dense32"].meta.get("hidden_size", 0))
    ref = runs["dense64"].coupling
    mf_diag = runs["mf32"].diagnostics
    tol = runs["mf32"].config.svd_tol
    rec: dict[str, Any] = {
        "record": "accuracy",
        "variant": name,
        "d": d,
        "num_layers": int(runs["dense32"].meta.get("num_layers", 0)),
        "k": list(ks),
        "n_tokens": [int(n) for n in runs["dense32"].prompts["n_tokens"]],
        "fast_path_used": sorted(set(runs["dense32"].diagnostics["method"])),
        "auto_choice": choose_method(cfg, d),
        "seconds": {k: round(v, 2) for k, v in secs.items()},
        "vs_dense64": {lab: diff_stats(runs[lab].coupling, ref)
                       for lab in ("dense32", "mf32", "mf32_fixed")},
        "mf32_vs_dense32": diff_stats(runs["mf32"].coupling, runs["dense32"].coupling),
        "residuals": {lab: residual_stats(runs[lab].diagnostics)
                      for lab in ("mf32", "mf32_fixed")},
        "auto_would_recompute_densely": int((mf_diag["residual"] > tol).sum()) if tol else 0,
        "spectral_decay_float64": spectral_decay(runs["dense64"].spectra, ks),
        "loadavg_1m": os.getloadavg()[0],
        "uptime": uptime(),
    }
    # top singular values of mf vs exact, relative (the spectra tables, rank <= K_max)
    s_ref = runs["dense64"].spectra.set_index(["prompt_id", "layer", "rank"])["singular_value"]
    for lab in ("mf32", "mf32_fixed"):
        s = runs[lab].spectra.set_index(["prompt_id", "layer", "rank"])["singular_value"]
        rel = ((s - s_ref).abs() / s_ref.groupby(level=["prompt_id", "layer"]).transform("max"))
        rec.setdefault("singular_values_rel_err_vs_s1", {})[lab] = float(rel.max())
    emit(rec, sink)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None,
                    help="subset of: minilm minilm_random tinylm_last tinylm_step0")
    ap.add_argument("--n-prompts", type=int, default=4, help="use the first N of the 4 prompts")
    args = ap.parse_args()
    torch.manual_seed(0)
    sink: list[dict[str, Any]] = []
    emit({"record": "machine", **machine(), "uptime_start": uptime()}, sink)
    all_p = {p.prompt_id: p for p in blockcoupling.load_prompts("builtin:all_styles_small")}
    prompts = [all_p[i] for i in PROMPT_IDS[: args.n_prompts]]
    short = [(p.prompt_id, p.text[:56]) for p in prompts]
    want = set(args.only or ["minilm", "minilm_random", "tinylm_last", "tinylm_step0"])

    if want & {"minilm", "minilm_random"}:
        mini, mtok = demo.load_minilm()
        if "minilm" in want:
            run_variant("minilm_pretrained", mini, mtok, prompts, (10, 30), sink)
        if "minilm_random" in want:
            run_variant("minilm_random_init", demo.random_like(mini, seed=0), mtok, prompts,
                        (10, 30), sink)
    if want & {"tinylm_last", "tinylm_step0"}:
        t0 = time.perf_counter()
        ckpts = tiny_lm.train_tiny_lm(tiny_lm.TinyLMConfig(), progress=False)
        emit({"record": "tiny_lm_cache", "seconds_to_train_or_load": round(time.perf_counter() - t0, 1),
              "checkpoints": [[s, str(p)] for s, p in ckpts]}, sink)
        by_step = dict(ckpts)
        last = max(by_step)
        for label, step in (("tinylm_last", last), ("tinylm_step0", 0)):
            if label in want:
                model, tok = tiny_lm.load_checkpoint(by_step[step])
                run_variant(f"tinylm_step{step}", model, tok, short, (10,), sink)
    emit({"record": "end", "uptime_end": uptime(), "loadavg_1m": os.getloadavg()[0]}, sink)
    save(sink, "bench_accuracy")


if __name__ == "__main__":
    main()
