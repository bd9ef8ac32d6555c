"""The perturbation experiment on a prompt set, into a resumable folder (paper fig. 34):
``blockcoupling perturb --model M --prompts P --out DIR``.

``run_perturbation`` measures prompt after prompt with `engine.perturb.perturbation_rows`,
each prompt's rows committed to ``OUT/parts/<index>.parquet`` with its checksum in the
folder's ledger (``OUT/checksums.json``); a killed run continues with the same command (same
settings, weights and prompts, else one error line). When every prompt is done:
``perturbation.parquet``, ``summary.csv`` and ``perturbation.html``, each in the ledger. The
worked example of a command that is not a collection (docs/DESIGN.md, "Recipe: add a command").
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.folder import PERTURBATION_RUN
from blockcoupling.store.verified import LEDGER, Ledger, parquet_bytes
from blockcoupling.studies.joins import canonical_order, prompt_key

SETTINGS = PERTURBATION_RUN.record
PARTS = "parts"
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


#: what identifies a perturbation run: a folder holding one of other values is refused
IDENTITY = ("levels", "draws", "seed", "token", "weights_hash", "prompts")
#: a perturbation folder in the run protocol's words: what it may hold; running the same
#: command again continues it (no ``--resume``)
LAYOUT = replace(PERTURBATION_RUN, files=(SETTINGS, PARTS, TABLE, SUMMARY, PAGE, LEDGER))


def _recorded(out: Path) -> dict[str, str]:
    """The checksums the folder's ledger records (none where it has no trustworthy one: its
    files are then checked, and measured again, as they are read)."""
    ledger = _ledger(out)
    return ledger.entries() if ledger.exists() and ledger.problem() is None else {}


def _ledger(out: Path) -> Ledger:
    """The folder's ledger: every file the command wrote, with its checksum."""
    return Ledger(out, f"Run the same blockcoupling perturb command again into {out} (a "
                       "damaged part is measured again), or delete the folder to start afresh.")


def _parts(out: Path) -> list[Path]:
    folder = out / PARTS
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def _differences(out: Path, settings: dict[str, Any]) -> list[str]:
    """What differs between the run ``out`` records and ``settings`` (the protocol's
    ``differences``): each identity key, one line; a record that cannot be trusted is one
    line when nothing was measured (the folder is then replaced), else a refusal."""
    try:
        stored = _ledger(out).json(SETTINGS)
    except BlockCouplingError:
        if _parts(out):
            raise
        return [f"{SETTINGS}: damaged"]
    return [f"{k}: stored {stored.get(k)!r}, now {settings[k]!r}" for k in IDENTITY
            if stored.get(k) != settings[k]]


def _checked_inputs(model: Any, tokenizer: Any, items: list[Any], token: int) -> None:
    """Every prompt tokenizes within the model's context, and the perturbed token is one of
    its tokens: checked before the folder is opened."""
    import torch

    from blockcoupling.engine.inputs import make_batch

    for it in items:
        batch = make_batch(tokenizer, [it], model, torch.device("cpu"))
        mask, ids = batch.get("attention_mask"), batch.get("input_ids")
        n = int(mask.sum()) if mask is not None else int(ids.shape[-1]) if ids is not None \
            else None
        if n is not None and not -n <= token < n:
            raise BlockCouplingError(f"token {token} is outside the prompt's {n} tokens "
                                     f"(prompt {it.prompt_id}); give a --token within every "
                                     "prompt (negative: from the end)")


def run_perturbation(model: Any, tokenizer: Any, prompts: Any, out: str | Path, *,
                     levels: Sequence[float] = (0.01, 0.03, 0.1, 0.3, 1.0), draws: int = 8,
                     seed: int = 0, token: int = -1, batch_size: int = 16,
                     meta: dict[str, Any] | None = None, progress: bool = True
                     ) -> PerturbationResult:
    """Run (or continue) the experiment on ``prompts`` into ``out`` by the run protocol
    (`blockcoupling.store.folder.open_folder`): every input checked before the folder is
    opened; a folder of other settings with results refused, one without results replaced;
    every file written through the folder's ledger (`store.verified.Ledger`) and read back
    verified (a damaged part is measured again); the table and summary rebuilt from the
    parts."""
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
    from blockcoupling.store.fileio import disk_errors
    from blockcoupling.store.fingerprint import weights_hash
    from blockcoupling.store.folder import CONTINUE, open_folder
    from blockcoupling.validate import whole

    levels = check_levels(levels, draws)
    batch_size = whole(batch_size, "batch-size", minimum=1)
    model = as_module(model)
    items = normalise_inputs(prompts)
    if not items:
        raise BlockCouplingError("no prompts to perturb; give a prompt set")
    out = Path(out)
    spec = model_spec(model, MeasureConfig(), tokenizer, items[:1])
    _checked_inputs(model, tokenizer, items, token)
    settings: dict[str, Any] = {
        **(meta or {}), "levels": list(levels), "draws": int(draws), "seed": int(seed),
        "token": int(token), "weights_hash": weights_hash(model), "rule": RULE,
        "prompts": canonical_hash([[it.prompt_id, it.text] for it in items]),
        "n_prompts": len(items)}
    with open_folder(out, LAYOUT, resume=True, differences=lambda: _differences(out, settings),
                     has_results=lambda: bool(_parts(out)),
                     records=lambda: _recorded(out)) as state, disk_errors(out):
        ledger = _ledger(out)
        if state != CONTINUE:
            ledger.write_json(SETTINGS, settings)
        names = [f"{PARTS}/{i:05d}.parquet" for i in range(len(items))]
        todo = [(i, it) for i, it in enumerate(items) if ledger.check([names[i]]) is not None]
        damaged = [names[i] for i, _ in todo if (out / names[i]).exists()]
        if damaged and progress:
            print(f"perturbation: {len(damaged)} stored part(s) damaged or unrecorded "
                  f"({damaged[0]}, ...); their prompts are measured again", file=sys.stderr)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        with preserved(model):
            model.eval()
            for i, it in bar(todo, desc="perturbation", unit="prompt", enabled=progress):
                inputs = make_batch(tokenizer, [it], model, device)
                rows = perturbation_rows(model, inputs, spec, it.prompt_id, levels=levels,
                                         draws=draws, seed=seed, token=token,
                                         batch_size=batch_size)
                ledger.write(names[i], parquet_bytes(rows))  # the part's commit
        # the table in one canonical order, the prompts' content (``joins.canonical_order``):
        # the same prompts in another order give the same table's values and summary, bit
        # for bit (a mean sums in row order)
        order = canonical_order(range(len(items)), key=lambda i: prompt_key(
            items[i].prompt_id, items[i].text))
        rows = pd.concat([ledger.parquet(names[i]) for i in order], ignore_index=True)
        summary = perturbation_summary(rows)
        ledger.write(TABLE, parquet_bytes(rows))
        ledger.write(SUMMARY, summary.to_csv(index=False).encode())
        write_perturbation_html(rows, settings, out / PAGE)
        ledger.record([PAGE])
    return PerturbationResult(rows, summary, settings, out)


def read_perturbation(out: str | Path) -> PerturbationResult:
    """A finished experiment folder, read back verified (its ledger: the settings and the
    table against the checksums recorded when they were written)."""
    from blockcoupling.report.perturb import perturbation_summary

    ledger = _ledger(Path(out))
    if not (Path(out) / TABLE).exists() and not ledger.has(TABLE):  # a table there: verified
        raise BlockCouplingError(f"{out} holds no finished perturbation run ({TABLE} not "
                                 "recorded); run the same blockcoupling perturb command "
                                 "again to finish it")
    rows = ledger.parquet(TABLE)
    return PerturbationResult(rows, perturbation_summary(rows), ledger.json(SETTINGS),
                              Path(out))


__all__ = ["PAGE", "RULE", "SETTINGS", "SUMMARY", "TABLE", "PerturbationResult",
           "read_perturbation", "run_perturbation"]
