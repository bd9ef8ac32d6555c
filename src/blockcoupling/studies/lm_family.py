"""The correlation study on a laptop: a family of tiny causal LMs trained here, scored, measured
and correlated.

No real LLM can be downloaded offline, so this reproduces the *procedure* of the paper's
coupling-vs-generalisation study (fig. 1a, 9) on models anyone can train in a minute or two on
two CPU cores:

- **The family** (:func:`default_family`): character-level GPT-2-architecture LMs trained with
  the demo's training function :func:`blockcoupling.studies.demo.train_tiny_lm` on the pydoc
  help texts (shipped with Python), varying width (d = 32, 64, 96), depth (2 or 4 blocks),
  the amount of training data seen (batch of 8 or 16 windows) and training steps (each run
  is saved at several steps; every checkpoint is one model of the family). Step 0 (random
  weights) is left out: it would make the correlation a trained-vs-untrained contrast.
- **The score** (:func:`evaluate_checkpoint`): on the held-out pydoc topics (the demo's
  validation split: every ``val_every``-th topic), next-character top-1 accuracy in percent
  (the ``score``) and the mean cross-entropy in nats (``val_loss``), on the same fixed,
  evenly spaced windows for every model.
- **The coupling** of each checkpoint: depth-wise, last token, K = round(d / 10), variant
  ``coupling``, p = 1, ``ujv``, on held-out windows (:func:`family_prompts`), measured by a
  sweep (:func:`blockcoupling.studies.sweep.run_sweep`, on Ray or in this process, resumable).
- **The correlation**: :func:`blockcoupling.studies.correlate.correlate` on the sweep with
  the scores, plus the same with ``-val_loss`` as the score, and with the statistic
  ``coupling_vs_null`` (raw coupling at different K has different chance levels).

:func:`run_lm_family` does everything and writes ``scores.csv``, ``correlation.json`` and
``correlation.html`` under its output folder. Whatever the numbers show is reported as is.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.demo import (
    TinyLMConfig,
    corpus_documents,
    train_tiny_lm,
    training_log,
)


@dataclass(frozen=True)
class FamilyMember:
    """One training run of the family: a name and its :class:`TinyLMConfig`."""

    name: str
    config: TinyLMConfig


def _member(n_layer: int, n_embd: int, batch_size: int, steps: int, checkpoints: tuple[int, ...],
            *, block_size: int = 64, seed: int = 0) -> FamilyMember:
    cfg = TinyLMConfig(n_layer=n_layer, n_embd=n_embd, n_head=4 if n_embd % 4 == 0 else 2,
                       block_size=block_size, batch_size=batch_size, max_steps=steps,
                       checkpoints=checkpoints, warmup_steps=max(1, steps // 20),
                       val_windows=16, seed=seed)
    return FamilyMember(f"L{n_layer}-d{n_embd}-b{batch_size}", cfg)


def default_family() -> list[FamilyMember]:
    """Five training runs x three checkpoints = 15 models (about a minute of training on two
    quiet cores; the measurements add a few seconds)."""
    ck = (20, 60, 150)
    return [
        _member(2, 32, 8, 150, ck),
        _member(2, 64, 16, 150, ck),
        _member(4, 32, 16, 150, ck),
        _member(4, 64, 8, 150, ck),
        _member(4, 96, 16, 150, ck),
    ]


def quick_family() -> list[FamilyMember]:
    """Two tiny runs x two checkpoints = 4 models, for tests (seconds)."""
    ck = (4, 12)
    return [
        _member(2, 16, 4, 12, ck, block_size=24),
        _member(3, 24, 8, 12, ck, block_size=24),
    ]


def _held_out_text(cfg: TinyLMConfig) -> str:
    """The demo's validation split: every ``val_every``-th pydoc topic (sorted by key)."""
    docs = corpus_documents()
    return "\n\n\n".join(d for i, d in enumerate(docs) if i % cfg.val_every == cfg.val_every - 1)


def family_prompts(cfg: TinyLMConfig, n: int = 4, length: int = 24) -> list[str]:
    """``n`` held-out windows of ``length`` characters at evenly spaced offsets (whitespace at
    the ends stripped): the prompts the coupling is measured on."""
    text = _held_out_text(cfg)
    step = max(1, (len(text) - length) // max(1, n))
    out = []
    for i in range(n):
        window = " ".join(text[i * step: i * step + length].split())
        if window:
            out.append(window)
    return out


def evaluate_checkpoint(path: str | Path, cfg: TinyLMConfig, *, windows: int = 64
                        ) -> dict[str, float]:
    """Held-out next-character top-1 accuracy (percent) and mean cross-entropy (nats) of a
    checkpoint, on ``windows`` evenly spaced windows of ``cfg.block_size + 1`` characters of
    the held-out split (the same windows for every model with this block size)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = torch.tensor(tok.backend_tokenizer.encode(_held_out_text(cfg),
                                                    add_special_tokens=False).ids)  # (N,)
    span = cfg.block_size + 1
    starts = torch.linspace(0, len(ids) - span, windows).long()  # (W,)
    chunk = ids[starts[:, None] + torch.arange(span)[None, :]]  # (W, span)
    with torch.no_grad():
        logits = model(input_ids=chunk[:, :-1]).logits  # (W, T, V)
    target = chunk[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             target.reshape(-1))
    acc = (logits.argmax(-1) == target).double().mean()
    return {"val_loss": float(loss), "score": 100.0 * float(acc), "n_eval_tokens": int(target.numel())}


def _train_and_score(member: FamilyMember, cache_dir: str | Path | None, progress: bool
                     ) -> list[tuple[dict[str, Any], Path]]:
    """Train one member (or reuse its cache) and score each checkpoint: (score row, folder)."""
    cfg = member.config
    checkpoints = train_tiny_lm(cfg, cache_dir, progress=progress, monitor=False)
    log = training_log(cfg, cache_dir)
    out = []
    for step, path in checkpoints:
        scores = evaluate_checkpoint(path, cfg)
        out.append(({"model": f"{member.name}-step{step}", "score": scores["score"],
                     "val_loss": scores["val_loss"], "params_b": log["n_params"] / 1e9,
                     "layers": cfg.n_layer, "d_model": cfg.n_embd,
                     "train_tokens_t": step * cfg.batch_size * cfg.block_size / 1e12,
                     "group": f"{cfg.n_layer} layers", "step": step}, Path(path)))
    return out


def _measure_by_sweep(members: list[FamilyMember], checkpoints: dict[str, list[Path]], out: Path,
                      progress: bool, executor: str = "local") -> Path:
    """Measure every checkpoint with a sweep (resumable; ``executor`` ``"local"``: in this
    process, ``"ray"``: one Ray task per checkpoint) into ``out/sweep``;
    K = round(d / 10) of every width is measured for all (nested top-K: one SVD serves all)."""
    from blockcoupling.studies.sweep import is_sweep_dir, open_sweep, run_sweep
    from blockcoupling.studies.sweep.runner import spec_matches

    prompts = out / "prompts.txt"
    prompts.write_text("\n".join(family_prompts(members[0].config)) + "\n", encoding="utf-8")
    ks = sorted({max(1, round(m.config.n_embd / 10)) for m in members})
    spec = {"name": "lm_family",
            "models": [{"label": m.name, "checkpoints": [str(p) for p in checkpoints[m.name]]}
                       for m in members],
            "prompts": [str(prompts)],
            "measure": {"coupling": ["depth"], "k": ks, "tokens": "last", "p": [1],
                        "variants": ["coupling", "coupling_vs_null"], "orientations": ["ujv"]}}
    root = out / "sweep"
    if is_sweep_dir(root) and not spec_matches(root, spec):
        shutil.rmtree(root)  # derived output of an older family or cache: measure afresh
    run_sweep(spec, root, executor=executor, resume=is_sweep_dir(root), progress=progress)
    units = open_sweep(root).units
    failed = units[units["status"] != "done"]
    if len(failed):
        row = failed.iloc[0]
        raise BlockCouplingError(f"{len(failed)} checkpoint(s) of the family could not be "
                                 f"measured, e.g. {row['unit_id']}: {row.get('message')}")
    return root


@contextmanager
def _quiet_loading(quiet: bool) -> Iterator[None]:
    """Hide transformers' weight-loading progress bars while ``quiet`` (restored after)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


@dataclass
class LMFamilyResult:
    """What :func:`run_lm_family` produced."""

    accuracy: Any  # CorrelationResult: score = held-out top-1 accuracy (%); both predictors
    loss: Any  # CorrelationResult: score = -held-out loss
    scores: pd.DataFrame  # one row per model (the scores.csv)
    sweep_dir: Path  # the sweep directory of the measurements (bc.open_sweep reads it)
    json_path: Path
    html_path: Path

    def summary(self) -> str:
        def fit(result: Any, name: str) -> str:
            r = result.overall["predictors"].get(name, {})
            if "r2" not in r:
                return f"skipped ({r.get('skipped', 'not measured')})"
            return f"R^2={r['r2']:.2f} (p={r['p']:.2g}, rho={r['spearman_rho']:+.2f})"

        return (f"tiny-LM family: {len(self.scores)} models. Held-out accuracy against coupling "
                f"above chance (coupling_vs_null): {fit(self.accuracy, 'coupling_vs_null_mean')}"
                f"; against raw c_K: {fit(self.accuracy, 'coupling_mean')}; -loss against "
                f"coupling_vs_null: {fit(self.loss, 'coupling_vs_null_mean')}. "
                f"Report: {self.html_path}")


def run_lm_family(out_dir: str | Path, *, quick: bool = False,
                  members: list[FamilyMember] | None = None, cache_dir: str | Path | None = None,
                  progress: bool = True, n_boot: int = 1000, seed: int = 0,
                  executor: str = "local") -> LMFamilyResult:
    """Train (or reuse), score, measure and correlate the family; write the outputs.

    Under ``out_dir``: ``sweep/`` (the measurements: a sweep directory with one unit per
    checkpoint, ``prompts.txt`` its prompts), ``scores.csv``
    (model, score, val_loss, params_b, layers, d_model, train_tokens_t, group, step),
    ``correlation.json`` (``{"accuracy": ..., "neg_loss": ...}``: raw coupling and
    coupling_vs_null against accuracy and against -loss; each the JSON of
    :meth:`CorrelationResult.to_dict`) and ``correlation.html`` (the accuracy study).
    Trained checkpoints are cached as the demo's are (``cache_dir``); run directories are
    resumed, so a second call only re-does the scores and the statistics. ``executor``: the
    sweep's (``"local"``, in this process, or ``"ray"``: see :func:`run_sweep`).
    """
    from blockcoupling.report.correlation import write_correlation_html
    from blockcoupling.studies.correlate import correlate

    members = members if members is not None else (quick_family() if quick else default_family())
    if len({m.name for m in members}) != len(members):
        raise BlockCouplingError("family members need distinct names")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    checkpoints: dict[str, list[Path]] = {}
    with _quiet_loading(not progress):
        for member in members:
            scored = _train_and_score(member, cache_dir, progress)
            rows += [row for row, _ in scored]
            checkpoints[member.name] = [path for _, path in scored]
        sweep_dir = _measure_by_sweep(members, checkpoints, out, progress, executor)
    table = pd.DataFrame(rows)
    table.to_csv(out / "scores.csv", index=False)
    acc = correlate([sweep_dir], table.drop(columns=["val_loss", "step"]), n_boot=n_boot,
                    seed=seed)
    neg = table.drop(columns=["score", "step"]).rename(columns={"val_loss": "score"})
    neg["score"] = -neg["score"]
    loss = correlate([sweep_dir], neg, n_boot=n_boot, seed=seed)
    json_path = out / "correlation.json"
    json_path.write_text(json.dumps({"accuracy": acc.to_dict(), "neg_loss": loss.to_dict()},
                                    indent=1, allow_nan=False) + "\n")
    intro = (f"A family of {len(table)} tiny character-level GPT-2 LMs trained on the pydoc help "
             "texts (widths, depths, batch sizes and training steps vary); score = held-out "
             "next-character top-1 accuracy (%). Toy scale: this checks the procedure, not the "
             "paper's claim about LLMs.")
    html_path = write_correlation_html(acc, out / "correlation.html",
                                       title="Coupling vs held-out accuracy: tiny-LM family",
                                       intro=intro)
    return LMFamilyResult(accuracy=acc, loss=loss, scores=table, sweep_dir=sweep_dir,
                          json_path=json_path, html_path=html_path)


__all__ = [
    "FamilyMember",
    "LMFamilyResult",
    "default_family",
    "evaluate_checkpoint",
    "family_prompts",
    "quick_family",
    "run_lm_family",
]
