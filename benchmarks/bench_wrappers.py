"""Wrapped models against the plain model: nnsight, TransformerLens 4 bridge, TransformerLens 3.

One ``measure()`` call per model and token rule (``tokens="last"`` and ``"all"``), the plain
HuggingFace GPT-2 and each wrapper of the same shape in ONE process, interleaved over
``--repeats`` (plain, wrappers, plain, ...), so the ratios hold on a loaded machine better than
seconds do. Model: random ``GPT2LMHeadModel`` with d = 384, 6 blocks, 6 heads (MiniLM's
width), ``--prompts`` prompts of ``--tokens`` tokens, K = 10, depth-wise coupling. nnsight
wraps the plain model itself (``LanguageModel(model)``); the TransformerLens 4 bridge boots
the same weights from a saved folder (``TransformerBridge.boot_transformers``); TransformerLens 3
is a ``HookedTransformer`` of the same shape from its config (random weights: the cost does
not depend on them). Each wrapper is also timed on the generic path (``fast_path=False``):
what it cost before it took the fast path. Wrappers whose package is missing are skipped:
TransformerLens 3 and 4 cannot share an environment, so run it in both (``.venv-tl3``,
``.venv-tl4``, see the Makefile's ``test-interop``).

    OMP_NUM_THREADS=1 .venv-tl4/bin/python benchmarks/bench_wrappers.py --repeats 3
    OMP_NUM_THREADS=1 .venv-tl3/bin/python benchmarks/bench_wrappers.py --repeats 3

Reports per model and rule the median wall and process CPU seconds of the call, each
repeat, the ratio to the plain model's median, the layers on the fast path, and the largest
difference of its coupling values from the plain model's (the bridge and nnsight: the same
weights).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save, word_tokenizer  # noqa: E402

import blockcoupling as bc  # noqa: E402

D, LAYERS, HEADS, VOCAB = 384, 6, 6, 512


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _plain() -> tf.GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=LAYERS, n_embd=D, n_head=HEADS, vocab_size=VOCAB,
                        n_positions=64, attn_implementation="eager")
    return tf.GPT2LMHeadModel(cfg).eval()


def models(folder: Path) -> dict[str, Callable[[], Any]]:
    """name -> a builder of the model, for each wrapper installed here."""
    plain = _plain()
    out: dict[str, Callable[[], Any]] = {"plain": lambda: plain}
    major = (_version("transformer-lens") or "0").split(".")[0]
    if _version("nnsight"):
        import nnsight

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lm = nnsight.LanguageModel(plain, tokenizer=word_tokenizer())
        out["nnsight"] = lambda: lm
    if major == "4":
        from transformer_lens.model_bridge import TransformerBridge

        plain.save_pretrained(folder / "gpt2")
        bridge = TransformerBridge.boot_transformers(str(folder / "gpt2"), device="cpu")
        out["tl4_bridge"] = lambda: bridge
    if major == "3":
        import transformer_lens as tl

        cfg = tl.HookedTransformerConfig(n_layers=LAYERS, d_model=D, n_ctx=64, d_head=D // HEADS,
                                         n_heads=HEADS, d_mlp=4 * D, d_vocab=VOCAB,
                                         act_fn="gelu_new", normalization_type="LN")
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hooked = tl.HookedTransformer(cfg).eval()
        out["tl3_hooked"] = lambda: hooked
    return out


def one_call(model: Any, ids: torch.Tensor, tokens: str, fast: bool) -> tuple[float, float, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = bc.measure(model, None, {"input_ids": ids}, coupling=("depth",), k=(10,),
                       tokens=tokens, fast_path=fast, progress=False)
    return time.perf_counter() - t0, time.process_time() - c0, m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--rules", nargs="+", default=["last", "all"])
    args = ap.parse_args()
    ids = torch.randint(0, VOCAB, (args.prompts, args.tokens),
                        generator=torch.Generator().manual_seed(1))
    info = machine()
    info.update({p: _version(p) for p in ("transformer-lens", "nnsight")})
    with tempfile.TemporaryDirectory() as tmp:
        built = {name: make() for name, make in models(Path(tmp)).items()}
        cases = [(name, fast) for name in built for fast in (True, False)
                 if fast or name != "plain"]
        rows: list[dict[str, Any]] = []
        for rule in args.rules:
            times: dict[tuple[str, bool], list[tuple[float, float]]] = {c: [] for c in cases}
            values: dict[tuple[str, bool], Any] = {}
            for _ in range(args.repeats):
                for case in cases:
                    wall, cpu, m = one_call(built[case[0]], ids, rule, case[1])
                    times[case].append((wall, cpu))
                    values[case] = m
            ref = values[("plain", True)].coupling["value"].to_numpy()
            base = statistics.median(w for w, _ in times[("plain", True)])
            base_cpu = statistics.median(c for _, c in times[("plain", True)])
            for (name, fast), got in times.items():
                m = values[(name, fast)]
                wall = statistics.median(w for w, _ in got)
                cpu = statistics.median(c for _, c in got)
                same = name in ("plain", "nnsight", "tl4_bridge")
                row = {"model": name, "tokens": rule, "fast_path_option": fast,
                       "fast_layers": sum(v is True for v in m.fast_path.values()),
                       "layers": len(m.fast_path), "wall_s": round(wall, 3),
                       "cpu_s": round(cpu, 3), "walls": [round(w, 3) for w, _ in got],
                       "cpus": [round(c, 3) for _, c in got],
                       "ratio_wall": round(wall / base, 3), "ratio_cpu": round(cpu / base_cpu, 3),
                       "max_abs_diff_vs_plain": float(abs(m.coupling["value"].to_numpy()
                                                          - ref).max()) if same else None}
                rows.append(row)
                print(f"{rule:4s} {name:11s} fast_path={str(fast):5s} layers on the fast path "
                      f"{row['fast_layers']}/{row['layers']}  wall {wall:7.3f} s  "
                      f"cpu {cpu:7.3f} s  x{row['ratio_wall']:.2f} (cpu x{row['ratio_cpu']:.2f})"
                      + (f"  diff {row['max_abs_diff_vs_plain']:.1e}" if same else ""))
    info["load_end"] = list(os.getloadavg())
    records: list[dict[str, Any]] = []
    emit({"machine": info, "d": D, "layers": LAYERS, "prompts": args.prompts,
          "tokens": args.tokens, "repeats": args.repeats}, records)
    for row in rows:
        emit(row, records)
    save(records, "bench_wrappers")


if __name__ == "__main__":
    main()
