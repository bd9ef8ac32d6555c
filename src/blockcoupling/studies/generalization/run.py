"""Running ``study generalization``: train the design's runs, read them, test, write.

Output folder ``OUT``::

    OUT/grid/          the runs: a ViT grid collection (``studies.vit.grid``; kind vit-grid,
                       extra axes train_limit and label_noise), one ``vit-train`` output per
                       run under ``grid/units/<id>/`` whose ``coupling/final`` is a run
                       directory (``blockcoupling show``); ``sweep-status OUT/grid`` lists them
    OUT/study.json     the design, the hypotheses, every run, the cells at the seed level, the
                       positive control, the tests, the power, the statement, the costs
    OUT/study.html     the page (``page.write_study_page``)
    OUT/control/       the positive control's runs (the contrast drop-path rate at the
                       control cell; a second vit-grid collection)
    OUT/runs.csv, OUT/cells.csv, OUT/control.csv   the tables

Resumable: a finished run is never trained again and an interrupted one resumes from its last
epoch (``train_vit``), so running the same command again after a kill continues, and the
result is a pure function of the spec (every run trains with one torch thread).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.folder import GENERALIZATION_STUDY, Layout
from blockcoupling.studies import joins
from blockcoupling.studies.generalization.analysis import analyse, positive_control
from blockcoupling.studies.generalization.design import (
    PLANNING,
    GeneralizationSpec,
    control_direction,
    describe_design,
    design_powers,
    full_spec,
    quick_spec,
)
from blockcoupling.studies.generalization.result import GeneralizationResult
from blockcoupling.studies.generalization.statement import statement

__all__ = ["check_grids", "check_study", "in_study_folder", "run_cpu", "run_reporter",
           "run_statistics", "run_study", "say", "versions"]

T = TypeVar("T")

GRID = GENERALIZATION_STUDY.record
CONTROL = "control"
#: a study's folder in the run protocol's words: its grids and what the study writes from them
LAYOUT = replace(GENERALIZATION_STUDY,
                 files=(GRID, CONTROL, "study.json", "study.html", "runs.csv", "cells.csv",
                        "control.csv"))


def say(progress: bool, line: str) -> None:
    """A study's progress line (``[study] ...``) when ``progress``."""
    if progress:
        print(f"[study] {line}", flush=True)


def versions() -> dict[str, Any]:
    """The library versions and the thread rule of a study's runs (its reproducibility)."""
    from importlib.metadata import version

    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "blockcoupling": version("blockcoupling"),
            "numpy": np.__version__, "pandas": pd.__version__, "torch_threads_per_run": 1,
            "note": "every run trains with one torch thread (bit-reproducible only at the same "
                    "thread count and versions)"}


def run_study(out: str | Path, spec: GeneralizationSpec | None = None, *, quick: bool = False,
              executor: str = "local", address: str | None = None,
              cluster_cpus: int | None = None, progress: bool = True) -> GeneralizationResult:
    """Train (or reuse) every run of ``spec`` into ``out/grid``, read them, run the tests and
    write ``study.json``, ``study.html``, ``runs.csv`` and ``cells.csv`` into ``out``.
    ``executor``: ``local`` (one run after the other in this process) or ``ray`` (one task
    per run, one CPU and one torch thread each)."""
    spec = spec if spec is not None else (quick_spec() if quick else full_spec())
    out = Path(out)
    return in_study_folder(
        out, LAYOUT, lambda: check_study(out, spec, executor, address=address,
                                         cluster_cpus=cluster_cpus),
        lambda: _run_study(out, spec, executor, address, cluster_cpus, progress))


def in_study_folder(out: Path, layout: Layout, check: Callable[[], object],
                    body: Callable[[], T]) -> T:
    """``body()`` once ``check()`` (every check that needs no training: `check_grids`) has
    passed, with the study's folder ``out`` opened and locked by the run protocol
    (``store.folder.open_folder``, ``layout``; its record is the study's grid, whose base
    config is its identity), so an interrupted study continues."""
    from blockcoupling.runs.protocol import has_results
    from blockcoupling.store.folder import open_folder

    check()
    with open_folder(out, layout, resume=True, differences=lambda: [],
                     has_results=lambda: has_results(out / layout.record)):
        return body()


def check_grids(out: Path, layout: Layout, grids: Sequence[tuple[Path, Any, dict[str, Any]]],
                executor: str, *, address: str | None = None,
                cluster_cpus: int | None = None) -> str:
    """Every check of a grid-trained study that needs no training, made before any (and by
    ``--dry-run``): the executor, the study's folder by the run protocol
    (``store.folder.decide``: a folder, writable, not another command's, not in use) and
    each of its ``grids`` (root, base training config, ``run_grid`` axes) by the grid's own
    run (``runs.protocol.checks_only``: another base config refused). Returns what opening
    the study's folder does; writes nothing."""
    from blockcoupling.runs.executor import check_executor
    from blockcoupling.runs.protocol import checks_only, has_results
    from blockcoupling.store.folder import decide
    from blockcoupling.studies.vit.grid import run_grid

    check_executor(executor)
    state = decide(out, layout, resume=True, differences=lambda: [],
                   has_results=lambda: has_results(out / layout.record))
    with checks_only():
        for root, train, axes in grids:
            run_grid(train, root, **axes, executor=executor, address=address, num_cpus=1,
                     threads=1, progress=False, cluster_cpus=cluster_cpus)
    return state


def check_study(out: str | Path, spec: GeneralizationSpec, executor: str = "local", *,
                address: str | None = None, cluster_cpus: int | None = None) -> str:
    """`check_grids` of the design's grid and the positive control's."""
    out = Path(out)
    return check_grids(out, LAYOUT, [(out / GRID, spec.train, spec.grid()),
                                     (out / CONTROL, spec.train, spec.control_grid())],
                       executor, address=address, cluster_cpus=cluster_cpus)


def _run_study(out: Path, spec: GeneralizationSpec, executor: str, address: str | None,
               cluster_cpus: int | None, progress: bool) -> GeneralizationResult:
    """`run_study` once its folder is open and locked."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    trained = _train(spec, out, executor, address, cluster_cpus, progress)
    seconds = {"train": time.perf_counter() - t0}
    runs, control_runs = _finished(trained, spec, out)
    say(progress, "reading the runs' measurements")
    final = final_table(out / GRID, runs, spec)
    control = final_table(out / CONTROL, control_runs, spec)
    checkpoints = None
    if not positive_control(final, spec.variants, spec.alpha)["passed"]:
        say(progress, "the positive control fails at the end of training: reading the "
                       "monitored checkpoints (matched steps)")
        checkpoints = checkpoint_table(runs, spec)
    analysis = analyse(final, spec.variants, alpha=spec.alpha, bound=spec.bound,
                       checkpoints=checkpoints, within_bound=PLANNING["across_slope"],
                       control=control, control_direction=control_direction(spec))
    say(progress, "simulating each test's power")
    powers = design_powers(spec)
    seconds["total"] = time.perf_counter() - t0
    seconds["cpu_driver"] = time.process_time() - cpu0
    seconds["cpu_runs"] = float(np.nansum([run_cpu(p) for p in (*runs["path"],
                                                                *control_runs["path"])]))
    result = GeneralizationResult(spec=spec, runs=analysis["runs"], final=final,
                                  cells=analysis["cells"], analysis=analysis, powers=powers,
                                  control=control,
                                  statement=statement(spec, analysis, powers),
                                  reproducibility=versions(), seconds=seconds, out=out)
    write_outputs(result, out)
    return result


def write_outputs(result: GeneralizationResult, out: Path) -> None:
    """``study.json``, ``runs.csv``, ``cells.csv``, ``control.csv`` and ``study.html`` into
    ``out``."""
    from blockcoupling.store.fileio import write_json
    from blockcoupling.studies.generalization.page import write_study_page

    write_json(out / "study.json", result.to_dict())
    result.runs.to_csv(out / "runs.csv", index=False)
    result.cells.to_csv(out / "cells.csv", index=False)
    if result.control is not None:
        result.control.to_csv(out / "control.csv", index=False)
    write_study_page(result, out / "study.html")


def run_reporter(progress: bool, n_runs: int
                 ) -> tuple[list[int], Callable[[dict[str, Any]], None]]:
    """(the count of runs reported, the grid's ``on_run`` that prints each: "run i of n
    done|failed|reused: name (seconds)")."""
    done = [0]

    def on_run(rec: dict[str, Any]) -> None:
        done[0] += 1
        what = "reused" if rec.get("skipped") else rec["status"]
        msg = f": {rec['message']}" if rec.get("message") else ""
        say(progress, f"run {done[0]} of {n_runs} {what}: {rec['name']} "
                      f"({rec['seconds']:.0f} s){msg}")

    return done, on_run


def _train(spec: GeneralizationSpec, out: Path, executor: str, address: str | None,
           cluster_cpus: int | None, progress: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train (or reuse) the design's runs as one ViT grid in ``out/grid`` and the positive
    control's in ``out/control``, saying so run by run; the two grids' runs tables."""
    from blockcoupling.studies.vit.grid import run_grid

    for line in describe_design(spec):
        say(progress, line)
    out.mkdir(parents=True, exist_ok=True)
    done, on_run = run_reporter(progress, spec.n_runs)

    say(progress, f"training into {out / GRID} ({executor}); a finished run is reused, an "
                   "interrupted one resumed")
    runs = run_grid(spec.train, out / GRID, **spec.grid(), executor=executor, address=address,
                    num_cpus=1, threads=1, progress=False, on_run=on_run,
                    cluster_cpus=cluster_cpus)
    if done[0] < spec.n_runs:
        say(progress, f"{spec.n_runs - done[0]} of {spec.n_runs} runs were already trained "
                       f"in {out / GRID}: reused")
    say(progress, f"training the positive control's {len(spec.seeds)} runs (drop-path "
                  f"{spec.control_drop_path:g} at the control cell) into {out / CONTROL}")
    _, on_control = run_reporter(progress, len(spec.seeds))
    control = run_grid(spec.train, out / CONTROL, **spec.control_grid(), executor=executor,
                       address=address, num_cpus=1, threads=1, progress=False,
                       on_run=on_control, cluster_cpus=cluster_cpus)
    return runs, control


def _finished(trained: tuple[pd.DataFrame, pd.DataFrame], spec: GeneralizationSpec,
              out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The design's and the control's runs of the two grids' tables, every one finished;
    else one line saying how many did not and how to retry them."""
    from blockcoupling.studies.vit.grid import grid_axes, run_name

    axes = grid_axes(spec.train_sizes, spec.label_noises)
    out_runs = []
    for runs, configs, folder in ((trained[0], spec.configs(), out / GRID),
                                  (trained[1], spec.control_configs(), out / CONTROL)):
        names = [run_name(c, axes) for c in configs]
        runs = runs[runs["name"].isin(names)]
        failed = runs[runs["status"] != "complete"]
        if len(failed) or len(runs) < len(names):
            first = failed.iloc[0] if len(failed) else None
            raise BlockCouplingError(
                f"{len(failed) or len(names) - len(runs)} of {len(names)} runs did not finish"
                + (f", e.g. {first['name']}: {first['message']}" if first is not None else "")
                + "; run the study again to retry them (`blockcoupling sweep-status "
                  f"{folder}`)")
        out_runs.append(runs)
    return out_runs[0], out_runs[1]


def run_cpu(path: str) -> float:
    """The CPU seconds a ViT run's ``metrics.json`` records (NaN when unreadable)."""
    from blockcoupling.studies.vit.train import read_metrics

    try:
        return float(read_metrics(path).get("cpu_seconds_total", math.nan))
    except BlockCouplingError:
        return math.nan


def _cell(n: int, noise: float) -> str:
    return f"n{int(n)}-noise{float(noise):g}"


def run_statistics(root: Path, runs: pd.DataFrame, variants: tuple[str, ...], k: int
                   ) -> pd.DataFrame:
    """The headline statistic of each run of the grid ``root`` (its final run, the grid's
    token rule, K = ``k``) per variant: ``runs``' order, columns ``mean_<v>`` and ``se_<v>``
    (the within-model se over the images), joined by the run's name (`joins.join_on`)."""
    from blockcoupling.runs.read import open_collection

    collection = open_collection(root)
    pairs = collection.table("coupling", columns=["unit_id", "variant"]).drop_duplicates()
    n_units = pairs["unit_id"].nunique()
    per_variant = pairs.groupby("variant")["unit_id"].nunique()
    missing = [v for v in variants if per_variant.get(v, 0) < n_units]
    if missing:
        raise BlockCouplingError(
            f"the runs in {root} were measured without {', '.join(missing)} (trained before "
            "this version measured it); give a new --out to train and measure them again")
    stat = collection.coupling_statistic(variants=variants, k=k, n_boot=0,
                                         include_duplicates=True)
    wide = stat.pivot_table(index="label", columns="variant", values=["mean", "se"],
                            aggfunc="first")
    measured = pd.DataFrame({"name": wide.index.astype(str),
                             **{f"{q}_{v}": wide[(q, v)].to_numpy()
                                for v in variants for q in ("mean", "se")}})
    return joins.join_on(runs[["name"]].astype(str), measured, ["name"],
                         names=("the grid's runs", f"the coupling measured in {root}"),
                         what="resume the study (--out as before) to measure them",
                         right_may_have_more=True)


def final_table(root: Path, runs: pd.DataFrame, spec: GeneralizationSpec) -> pd.DataFrame:
    """One row per run at the end of training: its cell, seed, accuracies, and per variant
    the headline statistic of its final run (`run_statistics`)."""
    values = run_statistics(root, runs, spec.variants, spec.train.k)
    rows = []
    for r, value in zip(runs.itertuples(), values.to_dict("records"), strict=True):
        row = {"name": r.name, "cell": _cell(r.n_train, r.label_noise),
               "n_train": int(r.n_train), "label_noise": float(r.label_noise),
               "seed": int(r.seed), "test_accuracy": float(r.test_accuracy),
               "train_accuracy": float(r.train_accuracy), "path": r.path,
               "run_dir": str(Path(r.path) / "coupling" / "final")}
        for v in spec.variants:
            row[v] = float(value[f"mean_{v}"])
            row[f"{v}_se"] = float(value[f"se_{v}"])
        rows.append(row)
    return pd.DataFrame(rows)


def checkpoint_table(runs: pd.DataFrame, spec: GeneralizationSpec) -> pd.DataFrame:
    """One row per run and monitored step mark (``monitor_every`` steps apart): the run's
    coupling (per variant, on the monitored images) and test accuracy at the end of the epoch
    in which the mark falls, i.e. at matched progress across training-set sizes."""
    from blockcoupling.runs.statistic import coupling_statistic
    from blockcoupling.studies.vit.train import STATISTIC_TOKENS, read_metrics

    t = spec.train
    if t.monitor_every == 0 or t.steps is None:
        return pd.DataFrame()
    rows = []
    for r in runs.itertuples():
        spe = t.steps_per_epoch(int(r.n_train))
        epochs = {e["epoch"]: e for e in read_metrics(r.path)["epochs"]}
        for mark in range(t.monitor_every, t.steps + 1, t.monitor_every):
            epoch = math.ceil(mark / spe)
            run_dir = Path(r.path) / "coupling" / f"epoch-{epoch:04d}"
            if epoch not in epochs or not run_dir.is_dir():
                continue
            stat = coupling_statistic(run_dir, variant=list(spec.variants), k=t.k, n_boot=0,
                        tokens=STATISTIC_TOKENS[t.tokens]).set_index("variant")
            row = {"name": r.name, "cell": _cell(r.n_train, r.label_noise),
                   "n_train": int(r.n_train), "label_noise": float(r.label_noise),
                   "seed": int(r.seed), "step": mark, "epoch": epoch,
                   "test_accuracy": float(epochs[epoch]["test_accuracy"]),
                   "train_accuracy": float(epochs[epoch]["train_accuracy"])}
            for v in spec.variants:
                row[v] = float(stat.loc[v, "mean"])
                row[f"{v}_se"] = float(stat.loc[v, "se"])
            rows.append(row)
    return pd.DataFrame(rows)
