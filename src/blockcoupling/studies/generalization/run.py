"""Running ``study generalization``: train the design's runs, read them, test, write.

Output folder ``OUT``::

    OUT/grid/          the runs: a ViT grid collection (``studies.vit.grid``; kind vit-grid,
                       extra axes train_limit and label_noise), one ``vit-train`` output per
                       run under ``grid/units/<id>/`` whose ``coupling/final`` is a run
                       directory (``blockcoupling show``); ``sweep-status OUT/grid`` lists them
    OUT/study.json     the design, the hypotheses, every run, the cells at the seed level, the
                       positive control, the tests, the power, the statement, the costs
    OUT/study.html     the page (``page.write_study_page``)
    OUT/runs.csv, OUT/cells.csv   the two tables

Resumable: a finished run is never trained again and an interrupted one resumes from its last
epoch (``train_vit``), so running the same command again after a kill continues, and the
result is a pure function of the spec (every run trains with one torch thread).
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.folder import GENERALIZATION_STUDY
from blockcoupling.studies import joins
from blockcoupling.studies.generalization.analysis import analyse, positive_control
from blockcoupling.studies.generalization.design import (
    GeneralizationSpec,
    describe_design,
    design_power,
    full_spec,
    quick_spec,
)
from blockcoupling.studies.generalization.result import GeneralizationResult

__all__ = ["run_study"]

GRID = GENERALIZATION_STUDY.record
#: a study's folder in the run protocol's words: its grid and what the study writes from it
LAYOUT = replace(GENERALIZATION_STUDY,
                 files=(GRID, "study.json", "study.html", "runs.csv", "cells.csv"))


def _say(progress: bool, line: str) -> None:
    if progress:
        print(f"[study] {line}", flush=True)


def _versions() -> dict[str, Any]:
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
    from blockcoupling.runs.executor import check_executor
    from blockcoupling.runs.protocol import has_results
    from blockcoupling.store.folder import open_folder

    spec = spec if spec is not None else (quick_spec() if quick else full_spec())
    out = Path(out)
    check_executor(executor)
    # the study's folder by the run protocol; its identity is its grid's (its base config)
    with open_folder(out, LAYOUT, resume=True, differences=lambda: [],
                     has_results=lambda: has_results(out / GRID)):
        return _run_study(out, spec, executor, address, cluster_cpus, progress)


def _run_study(out: Path, spec: GeneralizationSpec, executor: str, address: str | None,
               cluster_cpus: int | None, progress: bool) -> GeneralizationResult:
    """`run_study` once its folder is open and locked."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    runs = _train(spec, out, executor, address, cluster_cpus, progress)
    seconds = {"train": time.perf_counter() - t0}
    runs = _finished(runs, spec, out)
    _say(progress, "reading the runs' measurements")
    final = final_table(out / GRID, runs, spec)
    checkpoints = None
    if not positive_control(final, spec.variants, spec.alpha)["passed"]:
        _say(progress, "the positive control fails at the end of training: reading the "
                       "monitored checkpoints (matched steps)")
        checkpoints = checkpoint_table(runs, spec)
    analysis = analyse(final, spec.variants, alpha=spec.alpha, bound=spec.bound,
                       checkpoints=checkpoints)
    statement = _statement(spec, analysis)
    seconds["total"] = time.perf_counter() - t0
    seconds["cpu_driver"] = time.process_time() - cpu0
    seconds["cpu_runs"] = float(np.nansum([_run_cpu(p) for p in runs["path"]]))
    result = GeneralizationResult(spec=spec, runs=analysis["runs"], final=final,
                                  cells=analysis["cells"], analysis=analysis,
                                  statement=statement, reproducibility=_versions(),
                                  seconds=seconds, out=out)
    write_outputs(result, out)
    return result


def write_outputs(result: GeneralizationResult, out: Path) -> None:
    """``study.json``, ``runs.csv``, ``cells.csv`` and ``study.html`` into ``out``."""
    from blockcoupling.store.fileio import write_json
    from blockcoupling.studies.generalization.page import write_study_page

    write_json(out / "study.json", result.to_dict())
    result.runs.to_csv(out / "runs.csv", index=False)
    result.cells.to_csv(out / "cells.csv", index=False)
    write_study_page(result, out / "study.html")


def _train(spec: GeneralizationSpec, out: Path, executor: str, address: str | None,
           cluster_cpus: int | None, progress: bool) -> pd.DataFrame:
    """Train (or reuse) the design's runs as one ViT grid in ``out/grid``, saying so run by
    run; the grid's runs table."""
    from blockcoupling.studies.vit.grid import run_grid

    for line in describe_design(spec):
        _say(progress, line)
    done = [0]

    def on_run(rec: dict[str, Any]) -> None:
        done[0] += 1
        what = "reused" if rec.get("skipped") else rec["status"]
        msg = f": {rec['message']}" if rec.get("message") else ""
        _say(progress, f"run {done[0]} of {spec.n_runs} {what}: {rec['name']} "
                       f"({rec['seconds']:.0f} s){msg}")

    _say(progress, f"training into {out / GRID} ({executor}); a finished run is reused, an "
                   "interrupted one resumed")
    runs = run_grid(spec.train, out / GRID, **spec.grid(), executor=executor, address=address,
                    num_cpus=1, threads=1, progress=False, on_run=on_run,
                    cluster_cpus=cluster_cpus)
    if done[0] < spec.n_runs:
        _say(progress, f"{spec.n_runs - done[0]} of {spec.n_runs} runs were already trained "
                       f"in {out / GRID}: reused")
    return runs


def _finished(runs: pd.DataFrame, spec: GeneralizationSpec, out: Path) -> pd.DataFrame:
    """The design's runs of the grid's table, every one finished; else one line saying how
    many did not and how to retry them."""
    names = _run_names(spec)
    runs = runs[runs["name"].isin(names)]
    failed = runs[runs["status"] != "complete"]
    if len(failed) or len(runs) < len(names):
        first = failed.iloc[0] if len(failed) else None
        raise BlockCouplingError(
            f"{len(failed) or len(names) - len(runs)} of {len(names)} runs did not finish"
            + (f", e.g. {first['name']}: {first['message']}" if first is not None else "")
            + f"; run the study again to retry them (`blockcoupling sweep-status {out / GRID}`)")
    return runs


def _run_names(spec: GeneralizationSpec) -> list[str]:
    from blockcoupling.studies.vit.grid import grid_axes, run_name

    axes = grid_axes(spec.train_sizes, spec.label_noises)
    return [run_name(c, axes) for c in spec.configs()]


def _run_cpu(path: str) -> float:
    from blockcoupling.studies.vit.train import read_metrics

    try:
        return float(read_metrics(path).get("cpu_seconds_total", math.nan))
    except BlockCouplingError:
        return math.nan


def _cell(n: int, noise: float) -> str:
    return f"n{int(n)}-noise{float(noise):g}"


def final_table(root: Path, runs: pd.DataFrame, spec: GeneralizationSpec) -> pd.DataFrame:
    """One row per run at the end of training: its cell, seed, accuracies, and per variant
    the headline statistic of its final run (the grid's token rule, K of the spec) with its
    within-model se over the images."""
    from blockcoupling.runs.read import open_collection

    collection = open_collection(root)
    pairs = collection.table("coupling", columns=["unit_id", "variant"]).drop_duplicates()
    n_units = pairs["unit_id"].nunique()
    per_variant = pairs.groupby("variant")["unit_id"].nunique()
    missing = [v for v in spec.variants if per_variant.get(v, 0) < n_units]
    if missing:
        raise BlockCouplingError(
            f"the runs in {root} were measured without {', '.join(missing)} (trained before "
            "this version measured it); give a new --out to train and measure them again")
    stat = collection.coupling_statistic(variants=spec.variants, k=spec.train.k, n_boot=0,
                                         include_duplicates=True)
    wide = stat.pivot_table(index="label", columns="variant", values=["mean", "se"],
                            aggfunc="first")
    measured = pd.DataFrame({"name": wide.index.astype(str),
                             **{f"{q}_{v}": wide[(q, v)].to_numpy()
                                for v in spec.variants for q in ("mean", "se")}})
    values = joins.join_on(runs[["name"]].astype(str), measured, ["name"],
                           names=("the grid's runs", f"the coupling measured in {root}"),
                           what="resume the study (--out as before) to measure them",
                           right_may_have_more=True)
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


def _verdict(p: float, alpha: float) -> str:
    return "supported" if p < alpha else "not supported"


def _control(ctrl: dict[str, Any], where: str) -> str:
    """The positive control ``where`` in words, per variant."""
    parts = [f"{name}: {c['cells_passing']} of {c['n_cells']} cells above chance (lowest "
             f"cell mean {c['min_cell_mean']:.4f}, largest one-sided p {c['max_p']:.2g});"
             f" over all runs {c['runs']['mean']:.4f} ± {c['runs']['se']:.4f} "
             "(seed-level se)" for name, c in ctrl["variants"].items()]
    return (f"Positive control {where} ({'passed' if ctrl['passed'] else 'FAILED'}): "
            + "; ".join(parts) + ".")


def _h1_lines(h: dict[str, Any], v: str, alpha: float) -> list[str]:
    """H1 (one-sided correlation over the cells) and E1 (its equivalence test) in words."""
    if "r" not in h:
        return [f"H1 and E1 not computable: {h['skipped']}."]
    inside = "inside" if h["equivalent"] else "not inside"
    return [
        f"H1 ({v} rises with test accuracy across the {h['n']} cells, one-sided): "
        f"{_verdict(h['p_greater'], alpha)}: r = {h['r']:+.3f}, one-sided p = "
        f"{h['p_greater']:.3g}; slope {h['slope']:.4g} ± {h['slope_stderr']:.2g} per "
        "unit of accuracy.",
        f"E1 (equivalence within ±{h['bound']:g}, TOST): the {100 * h['ci_tost_level']:.0f} "
        f"% interval of r, [{h['ci_tost'][0]:+.3f}, {h['ci_tost'][1]:+.3f}], is {inside} "
        f"the bounds (p = {h['p_tost']:.3g}): "
        + ("a correlation as large as the smallest effect of interest is ruled out."
           if h["equivalent"] else "an effect of that size is not ruled out.")]


def _exploratory_lines(ex: dict[str, Any]) -> list[str]:
    """The exploratory fits (each manipulation with the other factor held fixed) in words."""
    held = [(ex[f], what) for f, what in (("label_noise", "label noise held fixed (the "
                                           "size manipulation)"),
                                          ("n_train", "training-set size held fixed (the "
                                           "noise manipulation)")) if "slope" in ex.get(f, {})]
    if not held:
        return []
    return ["Exploratory, not pre-registered (OLS of the cell means, the other factor as fixed "
            "effects): " + "; ".join(f"with {what}, slope {e['slope']:.4g} ± "
                                     f"{e['slope_stderr']:.2g} (two-sided p = {e['p']:.2g}, "
                                     f"{e['df']} df)" for e, what in held) + "."]


def _statement(spec: GeneralizationSpec, a: dict[str, Any]) -> list[str]:
    """The study's result in words, whatever it is."""
    from blockcoupling.studies.regression import tost_power

    v = spec.variants[0]
    cells, tests = a["cells"], a["tests"]
    sp = a["spread"]
    lines = [f"Design: {describe_design(spec)[0]}."]
    acc = cells["test_accuracy_mean"]
    cv = cells[f"{v}_mean"]
    lines.append(
        f"Test accuracy across the cells: {acc.min():.3f} to {acc.max():.3f} (between-cell "
        f"sd {sp['accuracy_between_cell_sd']:.3f}, seed sd within a cell "
        f"{sp['accuracy_seed_sd']:.3f}); {v}: {cv.min():.4f} to {cv.max():.4f} (between-cell "
        f"sd {sp[f'{v}_between_cell_sd']:.4f}, seed sd {sp[f'{v}_seed_sd']:.4f}; the "
        f"within-model se over one run's images is {sp[f'{v}_within_model_se']:.4f}, not a "
        "replication se).")
    where = "at the end of training" if a["point"] == "final" else f"at step {a['point']}"
    if a["point"] != "final":
        lines.append(_control(a["control_final"], "at the end of training"))
    lines.append(_control(a["control"], where))
    if a["point"] != "final" or not a["control"]["passed"]:
        lines.append(f"Comparison point: {a['reason']}.")
    lines += _h1_lines(tests["H1_E1"], v, spec.alpha)
    m = tests["H1b"]
    if "slope" in m:
        lines.append(
            f"H1b (over the {m['n_runs']} runs, random intercept per cell): slope "
            f"{m['slope']:.4g} ± {m['slope_stderr']:.2g}, one-sided p = {m['p_greater']:.3g}"
            f" ({_verdict(m['p_greater'], spec.alpha)}"
            + ("" if m["converged"] else "; the fit did not converge") + ").")
    lines += _exploratory_lines(tests.get("exploratory", {}))
    for name, o in tests["other_variants"].items():
        if "r" in o:
            lines.append(f"The same over the cells with {name}: r = {o['r']:+.3f}, one-sided "
                         f"p = {o['p_greater']:.3g}.")
    lines.append(
        f"Power: {design_power(spec):.2f} to detect a cell-level correlation of {spec.bound:g} "
        f"(alpha {spec.alpha:g}, one-sided; exact, for bivariate-normal cell means); "
        f"{tost_power(spec.n_cells, spec.bound, spec.alpha):.2f} to show equivalence when the "
        "correlation is 0.")
    lines.append(
        "What this cannot show: anything about LLMs or the paper's models (a tiny ViT on "
        f"{spec.train.dataset} for {spec.train.steps} steps); why coupling and accuracy move "
        "together where they do (both respond to the same data manipulation: a correlation "
        "across cells is not causation, and size and noise are the only causes varied); "
        f"correlations below {spec.bound:g} (the design's power is stated for "
        f"{spec.bound:g}); other architectures, widths or K (held fixed by design).")
    return lines
