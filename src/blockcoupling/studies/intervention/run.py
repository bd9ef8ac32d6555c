"""Running ``study intervention``: train the arms, read them, test, write.

Output folder ``OUT``::

    OUT/grid/          the runs: a ViT grid collection (kind vit-grid, extra axis
                       coupling_term), one ``vit-train`` output per run under
                       ``grid/units/<id>/`` (``metrics.json``: per epoch the training
                       cross-entropy, the term's estimate, the exact alignment, the weight
                       norm; ``coupling/final``: the engine's measurement)
    OUT/study.json     the design, the hypotheses, every run, the arms at the seed level, the
                       manipulation check, the tests, the power, the statement, the costs
    OUT/runs.csv, OUT/arms.csv, OUT/study.html

Resumable as every ViT grid: a finished run is reused, an interrupted one resumes.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.folder import Layout
from blockcoupling.studies.intervention.analysis import analyse
from blockcoupling.studies.intervention.design import (
    InterventionSpec,
    describe_design,
    design_powers,
    full_spec,
    quick_spec,
)
from blockcoupling.studies.intervention.result import InterventionResult

__all__ = ["check_study", "read_runs", "run_study"]

GRID = "grid"
#: the study's folder in the run protocol's words: its grid and what the study writes from it
LAYOUT = Layout(what="intervention study", record=GRID,
                files=(GRID, "study.json", "study.html", "runs.csv", "arms.csv"),
                resume_flag=None)
#: the variants read from every run (the design's first)
READ_VARIANTS = ("coupling_vs_rotated", "coupling_vs_null", "coupling")


def read_runs(root: Path, runs: pd.DataFrame, spec: InterventionSpec) -> pd.DataFrame:
    """One row per run at the end of training: strength, seed, accuracies and losses, the
    engine's statistic per variant (K of the spec, the grid's token rule) with its
    within-model se, the last epoch's training cross-entropy and term estimate, the final
    exact alignment and weight norm, and the trajectory metrics of the headline token
    averaged over the final images."""
    from blockcoupling.studies.generalization.run import run_statistics
    from blockcoupling.studies.vit.train import read_metrics

    variants = tuple(dict.fromkeys((spec.variant, *READ_VARIANTS)))
    values = run_statistics(root, runs, variants, spec.train.k)
    rows = []
    for r, value in zip(runs.itertuples(), values.to_dict("records"), strict=True):
        m = read_metrics(r.path)
        last, final = m["epochs"][-1], m.get("final") or {}
        row: dict[str, Any] = {
            "name": r.name, "strength": float(m["config"].get("coupling_term") or 0.0),
            "seed": int(r.seed), "test_accuracy": float(r.test_accuracy),
            "train_accuracy": float(r.train_accuracy), "test_loss": float(r.test_loss),
            "train_loss": float(r.train_loss), "train_ce": last.get("train_ce", math.nan),
            "coupling_term": last.get("coupling_term", math.nan),
            "alignment": final.get("alignment", math.nan),
            "weight_norm": final.get("weight_norm", math.nan), "path": r.path,
            "run_dir": str(Path(r.path) / "coupling" / "final")}
        for v in variants:
            row[v] = float(value[f"mean_{v}"])
            row[f"{v}_se"] = float(value[f"se_{v}"])
        row.update(_trajectory(Path(row["run_dir"]), spec.train.tokens))
        rows.append(row)
    return pd.DataFrame(rows)


def _trajectory(run_dir: Path, tokens: str) -> dict[str, float]:
    """LSS, expodistance and equidistance CV of the headline token, mean over the images
    (the run read verified, `store.open_run`)."""
    from blockcoupling.store import open_run

    t = open_run(run_dir).token_metrics
    pos = t.groupby("prompt_id")["token"].transform("min" if tokens == "cls" else "max")
    at = t[t["token"] == pos]
    return {c: float(at[c].mean()) for c in ("lss", "expodistance", "equidistance_cv")}


def run_study(out: str | Path, spec: InterventionSpec | None = None, *, quick: bool = False,
              executor: str = "local", address: str | None = None,
              cluster_cpus: int | None = None, progress: bool = True) -> InterventionResult:
    """Train (or reuse) every run of ``spec`` into ``out/grid``, read them, run the tests and
    write ``study.json``, ``runs.csv``, ``arms.csv`` and ``study.html`` into ``out``; the
    folder is opened and locked by the run protocol (``store.folder.open_folder``)."""
    from blockcoupling.studies.generalization.run import in_study_folder

    spec = spec if spec is not None else (quick_spec() if quick else full_spec())
    out = Path(out)
    return in_study_folder(
        out, LAYOUT, lambda: check_study(out, spec, executor, address=address,
                                         cluster_cpus=cluster_cpus),
        lambda: _run_study(out, spec, executor, address, cluster_cpus, progress))


def check_study(out: str | Path, spec: InterventionSpec, executor: str = "local", *,
                address: str | None = None, cluster_cpus: int | None = None) -> str:
    """Every check of the study that needs no training, made before any (and by
    ``--dry-run``): `generalization.run.check_grids` of its grid."""
    from blockcoupling.studies.generalization.run import check_grids

    out = Path(out)
    return check_grids(out, LAYOUT, [(out / GRID, spec.train, spec.grid())], executor,
                       address=address, cluster_cpus=cluster_cpus)


def _run_study(out: Path, spec: InterventionSpec, executor: str, address: str | None,
               cluster_cpus: int | None, progress: bool) -> InterventionResult:
    """`run_study` once its folder is open and locked."""
    from blockcoupling.store.fileio import write_json
    from blockcoupling.studies.generalization.run import run_cpu, run_reporter, say, versions
    from blockcoupling.studies.intervention.page import write_study_page
    from blockcoupling.studies.intervention.statement import statement
    from blockcoupling.studies.vit.grid import run_grid

    t0 = time.perf_counter()
    for line in describe_design(spec):
        say(progress, line)
    done, on_run = run_reporter(progress, spec.n_runs)
    runs = run_grid(spec.train, out / GRID, **spec.grid(), executor=executor, address=address,
                    num_cpus=1, threads=1, progress=False, on_run=on_run,
                    cluster_cpus=cluster_cpus)
    if done[0] < spec.n_runs:
        say(progress, f"{spec.n_runs - done[0]} of {spec.n_runs} runs were already trained "
                      f"in {out / GRID}: reused")
    seconds = {"train": time.perf_counter() - t0}
    failed = runs[runs["status"] != "complete"]
    if len(failed) or len(runs) < spec.n_runs:
        raise BlockCouplingError(
            f"{len(failed) or spec.n_runs - len(runs)} of {spec.n_runs} runs did not finish; "
            f"run the study again to retry them (`blockcoupling sweep-status {out / GRID}`)")
    say(progress, "reading the runs' measurements")
    table = read_runs(out / GRID, runs, spec)
    analysis = analyse(table, spec.variant, alpha=spec.alpha, bound=spec.bound,
                       variants=READ_VARIANTS)
    say(progress, "simulating each test's power")
    powers = design_powers(spec)
    result = InterventionResult(spec, table, analysis, powers,
                                statement(spec, analysis, powers), seconds, versions())
    seconds["total"] = time.perf_counter() - t0
    seconds["cpu_runs"] = float(np.nansum([run_cpu(p) for p in table["path"]]))
    write_json(out / "study.json", result.to_dict())
    table.to_csv(out / "runs.csv", index=False)
    analysis["arms"].to_csv(out / "arms.csv", index=False)
    write_study_page(result, out / "study.html")
    return result
