"""The perturbation experiment on a prompt set, into a resumable folder (paper fig. 34):
``blockcoupling perturb --model M --prompts P --out DIR``.

``run_perturbation`` measures prompt after prompt with `engine.perturb.perturbation_rows`
(the rule is stated there and in ``OUT/perturbation.json``), each prompt's rows written
atomically to ``OUT/parts/<index>.parquet``; a killed run continues with the same command (the
settings, the model's weights hash and the prompts must match: otherwise one error line). When
every prompt is done: ``OUT/perturbation.parquet`` (every row), ``OUT/summary.csv``
(``report.perturb.perturbation_summary``) and ``OUT/perturbation.html`` (the figure).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError

SETTINGS = "perturbation.json"
TABLE = "perturbation.parquet"
PAGE = "perturbation.html"
SUMMARY = "summary.csv"

#: the rule, as every output states it
RULE = ("delta = level * ||x^0_t|| * u added to the input of block 1 at token t (u a uniformly "
        "random unit direction, Gaussian normalised, seeded), every other token unchanged; the "
        "response at layer l is cos(x~^l_t, x^l_t) and ||x~^l_t - x^l_t|| / ||x^l_t||. The "
        "paper states neither the noise distribution nor its scale: this is blockcoupling's "
        "reading.")


@dataclass
class PerturbationResult:
    """The finished experiment: every row, its summary and where they were written."""

    rows: pd.DataFrame
    summary: pd.DataFrame
    settings: dict[str, Any]
    out: Path

    def describe(self) -> str:
        s = self.summary
        L = int(s["layer"].max())
        lines = [f"{self.rows['prompt_id'].nunique()} prompts, {self.settings['draws']} "
                 f"directions per level; mean cosine with the true state (± se over prompts):"]
        for lv, g in s.groupby("level"):
            g = g.set_index("layer")
            lines.append(f"  level {lv:<8g} input {g.loc[0, 'cosine_mean']:.3f}  layer 1 "
                         f"{g.loc[1, 'cosine_mean']:.3f} ± {g.loc[1, 'cosine_se']:.3f}  "
                         f"layer {L} {g.loc[L, 'cosine_mean']:.3f} ± {g.loc[L, 'cosine_se']:.3f}")
        return "\n".join(lines)


def _identity(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: settings[k] for k in ("levels", "draws", "seed", "token", "weights_hash",
                                     "prompts")}


def run_perturbation(model: Any, tokenizer: Any, prompts: Any, out: str | Path, *,
                     levels: Sequence[float] = (0.01, 0.03, 0.1, 0.3, 1.0), draws: int = 8,
                     seed: int = 0, token: int = -1, batch_size: int = 16,
                     meta: dict[str, Any] | None = None, progress: bool = True
                     ) -> PerturbationResult:
    """Run (or continue) the experiment on ``prompts`` into ``out``; see the module doc."""
    import torch

    from blockcoupling.engine.causality import model_spec
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.engine.inputs import make_batch, normalise_inputs
    from blockcoupling.engine.perturb import check_levels, perturbation_rows
    from blockcoupling.engine.state import preserved
    from blockcoupling.engine.wrappers import as_module
    from blockcoupling.hashing import canonical_hash
    from blockcoupling.progress import bar
    from blockcoupling.report.perturb import perturbation_summary, write_perturbation_html
    from blockcoupling.store.fileio import (
        LOCK,
        atomic_path,
        atomic_write_bytes,
        dir_lock,
        write_json,
    )
    from blockcoupling.store.fingerprint import weights_hash

    levels = check_levels(levels, draws)
    model = as_module(model)
    items = normalise_inputs(prompts)
    if not items:
        raise BlockCouplingError("no prompts to perturb; give a prompt set")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BlockCouplingError(f"--out {out} is a file; choose a folder")
    settings: dict[str, Any] = {
        **(meta or {}), "levels": list(levels), "draws": int(draws), "seed": int(seed),
        "token": int(token), "weights_hash": weights_hash(model), "rule": RULE,
        "prompts": canonical_hash([[it.prompt_id, it.text] for it in items]),
        "n_prompts": len(items)}
    with dir_lock(out, busy=f"{out} is being written by another process"):
        old = out / SETTINGS
        if old.is_file():
            stored = json.loads(old.read_text(encoding="utf-8"))
            if _identity(stored) != _identity(settings):
                diff = [k for k in _identity(settings) if stored.get(k) != settings[k]]
                raise BlockCouplingError(
                    f"--out {out} holds a perturbation run with other {', '.join(diff)}; "
                    "continue it with the same settings, or choose a new --out")
        elif any(p.name != LOCK for p in out.iterdir()):
            raise BlockCouplingError(f"--out {out} holds other files; choose a new or empty "
                                     "folder")
        else:
            write_json(old, settings)
        parts = out / "parts"
        parts.mkdir(exist_ok=True)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        with preserved(model):
            model.eval()
            spec = model_spec(model, MeasureConfig(), tokenizer, items[:1])
            todo = [(i, it) for i, it in enumerate(items)
                    if not (parts / f"{i:05d}.parquet").is_file()]
            for i, it in bar(todo, desc="perturbation", unit="prompt", enabled=progress):
                inputs = make_batch(tokenizer, [it], model, device)
                rows = perturbation_rows(model, inputs, spec, it.prompt_id, levels=levels,
                                         draws=draws, seed=seed, token=token,
                                         batch_size=batch_size)
                sink = io.BytesIO()
                rows.to_parquet(sink, index=False)
                atomic_write_bytes(parts / f"{i:05d}.parquet", sink.getvalue())
        rows = pd.concat([pd.read_parquet(parts / f"{i:05d}.parquet")
                          for i in range(len(items))], ignore_index=True)
        with atomic_path(out / TABLE) as tmp:
            rows.to_parquet(tmp, index=False)
        summary = perturbation_summary(rows)
        with atomic_path(out / SUMMARY) as tmp:
            summary.to_csv(tmp, index=False)
        write_perturbation_html(rows, settings, out / PAGE)
    return PerturbationResult(rows, summary, settings, out)


def read_perturbation(out: str | Path) -> PerturbationResult:
    """A finished experiment folder, read back."""
    from blockcoupling.report.perturb import perturbation_summary

    out = Path(out)
    if not (out / TABLE).is_file():
        raise BlockCouplingError(f"{out} holds no finished perturbation run ({TABLE} missing); "
                                 "run blockcoupling perturb (again) into it")
    rows = pd.read_parquet(out / TABLE)
    settings = json.loads((out / SETTINGS).read_text(encoding="utf-8"))
    return PerturbationResult(rows, perturbation_summary(rows), settings, out)


__all__ = ["PAGE", "RULE", "SETTINGS", "SUMMARY", "TABLE", "PerturbationResult",
           "read_perturbation", "run_perturbation"]
