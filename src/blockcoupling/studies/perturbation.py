"""The perturbation experiment on a prompt set, into a resumable folder (paper fig. 34):
``blockcoupling perturb --model M --prompts P --out DIR``.

``run_perturbation`` measures prompt after prompt with `engine.perturb.perturbation_rows`
(the rule is stated there and in ``OUT/perturbation.json``), each prompt's rows written
atomically to ``OUT/parts/<index>.parquet``, then its checksum into the sealed record
``OUT/perturbation.json`` (the commit). A killed run continues with the same command (the
settings, the model's weights hash and the prompts must match: otherwise one error line).
When every prompt is done: ``OUT/perturbation.parquet`` (every row), ``OUT/summary.csv``
(``report.perturb.perturbation_summary``), their checksums in the record, and
``OUT/perturbation.html`` (the figure). The folder is opened, written and read by the run
protocol (``store.folder``; docs/DESIGN.md, "Recipe: add a command"): the worked example of
a command that is not a collection.
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
from blockcoupling.store.folder import Layout

SETTINGS = "perturbation.json"
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
LAYOUT = Layout(what="perturbation run", record=SETTINGS,
                files=(SETTINGS, PARTS, TABLE, SUMMARY, PAGE), resume_flag=None)


def _again(out: Path) -> str:
    return (f"delete {out} (or choose a new --out) and run the same command again: its "
            "prompts are measured again")


def _record(out: Path) -> dict[str, Any]:
    """The folder's record (``perturbation.json``), its seal checked, or one line."""
    from blockcoupling.store.integrity import seal_problem

    path = out / SETTINGS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise BlockCouplingError(f"{path} is unreadable ({err}); {_again(out)}") from err
    problem = seal_problem(data)
    if problem is not None:
        raise BlockCouplingError(f"{path} cannot be trusted: {problem}; {_again(out)}")
    return dict(data)


def _write_record(out: Path, record: dict[str, Any]) -> None:
    from blockcoupling.store.fileio import atomic_write_text
    from blockcoupling.store.integrity import sealed_text

    atomic_write_text(out / SETTINGS, sealed_text(record) + "\n")


def _stored_parts(out: Path) -> list[Path]:
    folder = out / PARTS
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def _differences(out: Path, settings: dict[str, Any]) -> list[str]:
    """What differs between the run ``out`` records and ``settings`` (the protocol's
    ``differences``): each identity key, one line; a record that cannot be trusted is one
    line when nothing was measured (the folder is then replaced), else a refusal."""
    try:
        stored = _record(out)
    except BlockCouplingError:
        if _stored_parts(out):
            raise
        return [f"{SETTINGS}: unreadable"]
    return [f"{k}: stored {stored.get(k)!r}, now {settings[k]!r}" for k in IDENTITY
            if stored.get(k) != settings[k]]


def _checked_inputs(model: Any, tokenizer: Any, items: list[Any], token: int) -> None:
    """Every prompt tokenizes within the model's context, and the perturbed token is one of
    its tokens: checked before the folder is opened."""
    import torch

    from blockcoupling.engine.inputs import make_batch

    for it in items:
        batch = make_batch(tokenizer, [it], model, torch.device("cpu"))
        mask = batch.get("attention_mask")
        ids = batch.get("input_ids")
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
    each prompt's part recorded with its checksum in the sealed ``perturbation.json`` and
    verified when read (a damaged part is measured again); the table and summary rebuilt
    from the parts."""
    import sys

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
    from blockcoupling.store.fileio import atomic_write_bytes, disk_errors, sha256_bytes
    from blockcoupling.store.fingerprint import weights_hash
    from blockcoupling.store.folder import open_folder
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
                     has_results=lambda: bool(_stored_parts(out))) as state, disk_errors(out):
        record = _record(out) if state == "continue" else {**settings, "parts": {}}
        record.pop("files", None)  # the table is written again below
        _write_record(out, record)
        parts = out / PARTS
        parts.mkdir(exist_ok=True)
        names = [f"{i:05d}.parquet" for i in range(len(items))]
        todo = [(i, it) for i, it in enumerate(items) if _part(out, record, names[i]) is None]
        damaged = [names[i] for i, _ in todo if names[i] in record["parts"]]
        if damaged and progress:
            print(f"perturbation: {len(damaged)} stored part(s) damaged ({damaged[0]}, ...); "
                  "their prompts are measured again", file=sys.stderr)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        with preserved(model):
            model.eval()
            for i, it in bar(todo, desc="perturbation", unit="prompt", enabled=progress):
                inputs = make_batch(tokenizer, [it], model, device)
                rows = perturbation_rows(model, inputs, spec, it.prompt_id, levels=levels,
                                         draws=draws, seed=seed, token=token,
                                         batch_size=batch_size)
                sink = io.BytesIO()
                rows.to_parquet(sink, index=False)
                atomic_write_bytes(parts / names[i], sink.getvalue())
                record["parts"][names[i]] = sha256_bytes(sink.getvalue())
                _write_record(out, record)  # the commit point of the part
        rows = pd.concat([pd.read_parquet(io.BytesIO(_part(out, record, n) or b""))
                          for n in names], ignore_index=True)
        summary = perturbation_summary(rows)
        files = {TABLE: _parquet(rows), SUMMARY: summary.to_csv(index=False).encode()}
        for name, data in files.items():
            atomic_write_bytes(out / name, data)
        record["files"] = {name: sha256_bytes(data) for name, data in files.items()}
        _write_record(out, record)
        write_perturbation_html(rows, settings, out / PAGE)
    return PerturbationResult(rows, summary, settings, out)


def _part(out: Path, record: dict[str, Any], name: str) -> bytes | None:
    """A part's bytes, if recorded and matching its checksum (else None: measured again)."""
    from blockcoupling.store.fileio import sha256_bytes

    want = record["parts"].get(name)
    try:
        data = (out / PARTS / name).read_bytes()
    except OSError:
        return None
    return data if want is not None and sha256_bytes(data) == want else None


def _parquet(rows: pd.DataFrame) -> bytes:
    sink = io.BytesIO()
    rows.to_parquet(sink, index=False)
    return sink.getvalue()


def read_perturbation(out: str | Path) -> PerturbationResult:
    """A finished experiment folder, read back and verified: its sealed record, and its
    table against the checksum recorded when it was written."""
    from blockcoupling.report.perturb import perturbation_summary
    from blockcoupling.store.integrity import verified_bytes

    out = Path(out)
    record = _record(out)
    files = record.get("files") or {}
    if TABLE not in files:
        raise BlockCouplingError(f"{out} holds no finished perturbation run ({TABLE} not "
                                 "recorded); run the same blockcoupling perturb command "
                                 "again to finish it")
    data = verified_bytes(out / TABLE, files[TABLE],
                          "Run the same blockcoupling perturb command again: it is rebuilt "
                          "from the stored parts.")
    rows = pd.read_parquet(io.BytesIO(data))
    settings = {k: v for k, v in record.items() if k not in ("parts", "files", "digest")}
    return PerturbationResult(rows, perturbation_summary(rows), settings, out)


__all__ = ["PAGE", "RULE", "SETTINGS", "SUMMARY", "TABLE", "PerturbationResult",
           "read_perturbation", "run_perturbation"]
