"""``study lm-family``: trains the runs (cached, resumable), measures their checkpoints as
one sweep, evaluates them, tests and writes ``study.json`` and ``study.html``."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.folder import LM_STUDY, decide, open_folder
from blockcoupling.studies.lm_study.analysis import (
    emergence_table,
    hypothesis_tests,
    models_table,
    noise_floor,
    statement_lines,
)
from blockcoupling.studies.lm_study.design import (
    StudySpec,
    family_prompts,
    full_spec,
    quick_spec,
    study_measure,
    tiny_config,
)
from blockcoupling.studies.lm_study.page import write_study_page
from blockcoupling.studies.lm_study.result import StudyResult, versions
from blockcoupling.studies.tiny_lm import (
    TinyLMConfig,
    check_checkpoint,
    held_out_scores,
    held_out_text,
    train_tiny_lm,
    training_log,
    validation_chunk,
)


def evaluate_checkpoint(path: str | Path, cfg: TinyLMConfig) -> dict[str, float]:
    """Held-out next-character top-1 accuracy (``score``, percent) and mean cross-entropy
    (``val_loss``, nats) of a saved checkpoint, on the windows its training evaluated
    (``tiny_lm.validation_chunk``; the study's runs: the whole held-out split). The study
    takes these numbers from the training log; this recomputes them from the saved weights
    (tested equal)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_checkpoint(path)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = torch.tensor(tok.backend_tokenizer.encode(held_out_text(cfg),
                                                    add_special_tokens=False).ids)  # (N,)
    ev = held_out_scores(model, validation_chunk(cfg, ids))
    return {"val_loss": ev["val_loss"], "score": ev["accuracy"],
            "n_eval_tokens": ev["n_eval_tokens"]}


#: the study's own record of its spec (written under the lock before any training): a
#: second study of another spec on the same --out is refused before it trains
SPEC_FILE = LM_STUDY.record
#: per run, the content of the checkpoints its sweep units were measured on
#: (``tiny_lm.cache_digest``): a run trained again into other weights is measured again
TRAINED_FILE = "trained.json"
#: a study's output folder in the run protocol's words (`blockcoupling.store.folder`): what
#: it may hold (anything else: another's folder, refused); running it again continues it
LAYOUT = replace(LM_STUDY, files=("study.json", "study.html", "prompts.txt", "sweep", SPEC_FILE,
                                  TRAINED_FILE))


def _identity(out: Path, spec: StudySpec) -> dict[str, Any]:
    """How the protocol reads a study folder's identity: the spec it records (sealed)
    against this one (a lost record is written again: the study's sweep checks its own
    spec; a damaged one is replaced where nothing was measured, else one line), and
    whether its sweep has measured anything."""
    from blockcoupling.runs.protocol import spec_differences

    def differences() -> list[str] | None:
        try:
            stored = _stored_spec(out)
        except BlockCouplingError:
            if _has_results(out):
                raise
            return [f"{SPEC_FILE}: damaged"]
        return None if stored is None else spec_differences(
            stored, json.loads(json.dumps(spec.to_dict())))

    return {"differences": differences, "has_results": lambda: _has_results(out)}


def _stored_spec(out: Path) -> dict[str, Any] | None:
    """The spec a study folder records (``study-spec.json``, sealed), None where it records
    none; one line (``store.verified.load_sealed``) where the record is damaged."""
    from blockcoupling.store.verified import SEAL, load_sealed

    path = out / SPEC_FILE
    if not path.exists():
        return None
    stored = dict(load_sealed(path, _repair(out)))
    stored.pop(SEAL, None)
    return stored


def check_study(out: str | Path, spec: StudySpec, executor: str = "local", *,
                locked: bool = False) -> list[str]:
    """Every check of ``study lm-family`` that needs no training, run before any (and by
    ``--dry-run``): the executor, the held-out prompts (enough of them, each within the
    models' context), and ``out`` by the run protocol (`store.folder.decide`: a folder,
    writable, not another folder's contents, not in use by another study unless
    ``locked``, not a study of another spec that has measured something). Returns the
    prompts. Writes nothing."""
    from blockcoupling.runs.executor import check_executor
    from blockcoupling.studies.tiny_lm import build_tokenizer, corpus_text

    check_executor(executor)  # (the cluster is reached when the sweep starts)
    prompts = family_prompts(tiny_config(spec, spec.runs[0]), n=spec.n_prompts,
                             length=spec.prompt_length)
    if len(prompts) < spec.n_prompts:
        raise BlockCouplingError(f"the held-out text gave {len(prompts)} prompts of "
                                 f"{spec.prompt_length} characters; lower n_prompts")
    tok = build_tokenizer(corpus_text())
    for text in prompts:
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        if not 1 <= n <= spec.block_size:
            raise BlockCouplingError(f"a held-out prompt is {n} tokens, outside the models' "
                                     f"context of 1 to {spec.block_size}: lower prompt_length")
    decide(Path(out), LAYOUT, resume=True, locked=locked, **_identity(Path(out), spec))
    return prompts


def _repair(out: Path) -> str:
    """What a reader of a damaged study record is told."""
    return (f"Delete it and run the same `blockcoupling study lm-family --out {out}` command "
            "again: the record is written anew (checkpoints whose weights are not known are "
            "measured again)")


def _trained(out: Path) -> dict[str, str] | None:
    """The study's record of the checkpoints its sweep measured (run id -> cache digest),
    verified; None when it has none but its sweep measured something (a record lost, or a
    study of an older blockcoupling): then every measured checkpoint is measured again."""
    from blockcoupling.store.verified import SEAL, load_sealed

    path = out / TRAINED_FILE
    if not path.exists():
        return {} if not _has_results(out) else None
    data = dict(load_sealed(path, _repair(out)))
    data.pop(SEAL, None)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise BlockCouplingError(f"{path} is not a record of trained runs. {_repair(out)}")
    return data


def _has_results(out: Path) -> bool:
    """Whether the study's sweep has measured anything (else it can be replaced)."""
    from blockcoupling.store import collection as store

    root = out / "sweep"
    return store.is_sweep_dir(root) and any(r.get("status") == "done"
                                            for r in store.all_status(root))


def _remeasure_retrained(root: Path, digests: dict[str, str],
                         previous: dict[str, str] | None, progress: bool) -> None:
    """Mark again as pending the sweep units of runs whose checkpoints now hold other
    weights than those their units were measured on (a damaged cache trained again into
    different weights): the sweep's resume measures them again."""
    from blockcoupling.store import collection as store
    from blockcoupling.studies.sweep.units import Unit

    changed = (set(digests) if previous is None  # no record: everything measured is redone
               else {rid for rid, d in digests.items() if previous.get(rid) not in (None, d)})
    if not changed or not store.is_sweep_dir(root):
        return
    for rec in store.all_status(root):
        unit = rec.get("unit") or {}
        if unit.get("label") in changed and rec.get("status") != "pending":
            shutil.rmtree(store.unit_dir(root, str(unit.get("unit_id"))), ignore_errors=True)
            store.write_status(root, Unit.from_dict(unit), "pending", weights_hash=None,
                               repaired="its checkpoint was trained again")
    if progress:
        print(f"[study] {', '.join(sorted(changed))}: trained again into other weights; their "
              "checkpoints are measured again", flush=True)


def run_study(out: str | Path, spec: StudySpec | None = None, *, quick: bool = False,
              cache_dir: str | Path | None = None, progress: bool = True,
              executor: str = "local", replace: bool = False) -> StudyResult:
    """Train (or reuse the cached) runs, score and measure every checkpoint (a sweep in
    ``out/sweep``), test the hypotheses and write ``out/study.json`` and ``out/study.html``.

    Everything that can be checked without training is checked first (`check_study`);
    ``out`` is written only while this study holds its lock. A sweep in ``out/sweep`` of
    other checkpoints (another checkpoint cache, e.g. ``BLOCKCOUPLING_CACHE`` changed) that
    measured something is refused, unless ``replace``: then it is measured afresh (for a
    caller that owns ``out``, the demo)."""
    from blockcoupling.store.verified import write_sealed

    spec = spec if spec is not None else (quick_spec() if quick else full_spec())
    out = Path(out)
    prompts = check_study(out, spec, executor)  # before the folder is made, before training
    with open_folder(out, LAYOUT, resume=True, **_identity(out, spec)):
        write_sealed(out / SPEC_FILE, spec.to_dict())  # (another spec, nothing measured: replaced)
        return _run_study(out, spec, prompts, cache_dir, progress, executor, replace)


def _run_study(out: Path, spec: StudySpec, prompts: list[str], cache_dir: str | Path | None,
               progress: bool, executor: str, replace: bool = False) -> StudyResult:
    """`run_study` once its checks passed and its lock is held."""
    from blockcoupling.store.fileio import write_json

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    scores, paths, logs, digests = _train(spec, cache_dir, progress)
    seconds = {"train_and_score": time.perf_counter() - t0}
    t1 = time.perf_counter()
    stat = _measure(out, spec, prompts, paths, digests, executor, progress, replace)
    seconds["measure"] = time.perf_counter() - t1
    em = emergence_table(stat, scores, spec, where=f"the study in {out}")
    mt = models_table(spec, em, scores, logs)
    tests = hypothesis_tests(mt, em, spec.alpha)
    noise = noise_floor(mt)
    statement = statement_lines(mt, tests, spec, noise)
    seconds["total"] = time.perf_counter() - t0
    seconds["cpu_total"] = time.process_time() - cpu0
    result = StudyResult(spec=spec, models=mt, emergence=em, tests=tests, statement=statement,
                         noise_floor=noise, reproducibility=versions(), seconds=seconds,
                         out=out)
    write_json(out / "study.json", result.to_dict())
    write_study_page(result, out / "study.html")
    return result


def _train(spec: StudySpec, cache_dir: str | Path | None, progress: bool
           ) -> tuple[pd.DataFrame, dict[str, list[str]], dict[str, Any], dict[str, str]]:
    """Train (or reuse the cached) runs: every checkpoint's held-out scores (taken in the
    training loop, on the whole held-out split), and per run its checkpoints' paths, its
    training log and its cache digest."""
    from blockcoupling.studies.tiny_lm import cache_digest

    rows, paths, logs, digests = [], {}, {}, {}
    for run in spec.runs:
        cfg = tiny_config(spec, run)
        if progress:
            print(f"[study] train {run.run_id} (until the held-out loss plateaus; at most "
                  f"{run.max_steps} steps)", flush=True)
        ckpts = train_tiny_lm(cfg, cache_dir, progress=False, monitor=False)
        log = logs[run.run_id] = training_log(cfg, cache_dir)
        digests[run.run_id] = cache_digest(cfg, cache_dir)
        if progress:
            plat = log["plateau"]
            print(f"[study] {run.run_id}: stopped at step {log['end_step']} (held-out loss "
                  f"{log['final_val_loss']:.3f}, {100 * plat['rel_improvement']:+.1f} % over "
                  f"the last doubling; plateau {'reached' if plat['reached'] else 'NOT reached'})"
                  f", {log['seconds']:.0f} s", flush=True)
        paths[run.run_id] = [str(p) for _, p in ckpts]
        for step, _ in ckpts:
            ev = log["checkpoints"][str(step)]
            rows.append({"run_id": run.run_id, "step": step, "accuracy": ev["val_accuracy"],
                         "loss": ev["val_loss"], "n_params": int(log["n_params"]),
                         "train_tokens": step * run.batch_size * spec.block_size})
    return pd.DataFrame(rows), paths, logs, digests


def _measure(out: Path, spec: StudySpec, prompts: list[str], paths: dict[str, list[str]],
             digests: dict[str, str], executor: str, progress: bool, replace: bool = False
             ) -> pd.DataFrame:
    """Measure every checkpoint as one sweep in ``out/sweep`` (resumed; a run trained again
    into other weights measured again; a sweep of other checkpoints refused, or measured
    afresh with ``replace``); the headline statistic per checkpoint."""
    from blockcoupling.store.fileio import atomic_write_text
    from blockcoupling.store.verified import write_sealed
    from blockcoupling.studies.sweep import is_sweep_dir, open_sweep, run_sweep
    from blockcoupling.studies.sweep.runner import spec_matches

    text = "\n".join(prompts) + "\n"
    prompt_file = out / "prompts.txt"
    if not prompt_file.is_file() or prompt_file.read_text(encoding="utf-8") != text:
        atomic_write_text(prompt_file, text)
    sweep_spec = {"name": "lm-study",
                  "models": [{"label": rid, "checkpoints": p} for rid, p in paths.items()],
                  "prompts": [str(prompt_file)],
                  "measure": study_measure(spec)}
    root = out / "sweep"
    if is_sweep_dir(root) and not spec_matches(root, sweep_spec):
        if _has_results(out) and not replace:
            raise BlockCouplingError(f"{root} holds a sweep of other checkpoints (another "
                                     "study spec or checkpoint cache); give another --out or "
                                     "delete it")
        shutil.rmtree(root)  # nothing measured there, or the caller owns it: replaced
    _remeasure_retrained(root, digests, _trained(out), progress)
    write_sealed(out / TRAINED_FILE, digests)
    run_sweep(sweep_spec, root, executor=executor, resume=is_sweep_dir(root), progress=progress)
    sw = open_sweep(root)
    failed = sw.units[sw.units["status"] != "done"]
    if len(failed):
        raise BlockCouplingError(f"{len(failed)} checkpoint(s) could not be measured, e.g. "
                                 f"{failed.iloc[0]['unit_id']}: {failed.iloc[0]['message']}")
    return sw.coupling_statistic(k=spec.k, n_boot=0, include_duplicates=True)
