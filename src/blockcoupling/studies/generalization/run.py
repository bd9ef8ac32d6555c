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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import joins
from blockcoupling.studies.generalization.analysis import analyse, positive_control
from blockcoupling.studies.generalization.design import (
    PLANNING,
    GeneralizationSpec,
    control_direction,
    describe_design,
    design_power,
    design_powers,
    full_spec,
    quick_spec,
)
from blockcoupling.studies.generalization.result import GeneralizationResult

__all__ = ["run_study"]

GRID = "grid"
CONTROL = "control"


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


def run_study(out: str | Path, spec: GeneralizationSpec | None = None, *, quick: bool = False,
              executor: str = "local", address: str | None = None,
              cluster_cpus: int | None = None, progress: bool = True) -> GeneralizationResult:
    """Train (or reuse) every run of ``spec`` into ``out/grid``, read them, run the tests and
    write ``study.json``, ``study.html``, ``runs.csv`` and ``cells.csv`` into ``out``.
    ``executor``: ``local`` (one run after the other in this process) or ``ray`` (one task
    per run, one CPU and one torch thread each)."""
    from blockcoupling.studies.vit.grid import run_grid

    spec = spec if spec is not None else (quick_spec() if quick else full_spec())
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BlockCouplingError(f"--out {out} is a file; give a folder for the study")
    t0, cpu0 = time.perf_counter(), time.process_time()
    for line in describe_design(spec):
        say(progress, line)
    out.mkdir(parents=True, exist_ok=True)
    done, on_run = run_reporter(progress, spec.n_runs)
    say(progress, f"training into {out / GRID} ({executor}); a finished run is reused, an "
                   "interrupted one resumed")
    runs = run_grid(spec.train, out / GRID, drop_paths=(spec.train.drop_path,),
                    weight_decays=(spec.train.weight_decay,), seeds=spec.seeds,
                    executor=executor, address=address, num_cpus=1, threads=1,
                    progress=False, on_run=on_run, cluster_cpus=cluster_cpus,
                    **spec.grid_axes())
    if done[0] < spec.n_runs:
        say(progress, f"{spec.n_runs - done[0]} of {spec.n_runs} runs were already trained "
                       f"in {out / GRID}: reused")
    say(progress, f"training the positive control's {len(spec.seeds)} runs (drop-path "
                   f"{spec.control_drop_path:g} at the control cell) into {out / CONTROL}")
    _, on_control = run_reporter(progress, len(spec.seeds))
    control_runs = run_grid(spec.train, out / CONTROL, weight_decays=(spec.train.weight_decay,),
                            seeds=spec.seeds, executor=executor, address=address, num_cpus=1,
                            threads=1, progress=False, on_run=on_control,
                            cluster_cpus=cluster_cpus, **spec.control_axes())
    seconds = {"train": time.perf_counter() - t0}
    names = _run_names(spec)
    runs = runs[runs["name"].isin(names)]
    failed = runs[runs["status"] != "complete"]
    if len(failed) or len(runs) < len(names):
        first = failed.iloc[0] if len(failed) else None
        raise BlockCouplingError(
            f"{len(failed) or len(names) - len(runs)} of {len(names)} runs did not finish"
            + (f", e.g. {first['name']}: {first['message']}" if first is not None else "")
            + f"; run the study again to retry them (`blockcoupling sweep-status {out / GRID}`)")
    say(progress, "reading the runs' measurements")
    final = final_table(out / GRID, runs, spec)
    control = final_table(out / CONTROL, control_runs[control_runs["status"] == "complete"],
                          spec)
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
    statement = _statement(spec, analysis, powers)
    seconds["total"] = time.perf_counter() - t0
    seconds["cpu_driver"] = time.process_time() - cpu0
    seconds["cpu_runs"] = float(np.nansum([run_cpu(p) for p in runs["path"]]))
    result = GeneralizationResult(spec=spec, runs=analysis["runs"], final=final,
                                  cells=analysis["cells"], analysis=analysis, powers=powers,
                                  control=control,
                                  statement=statement, reproducibility=versions(),
                                  seconds=seconds, out=out)
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


def _run_names(spec: GeneralizationSpec) -> list[str]:
    from blockcoupling.studies.vit.grid import grid_axes, run_name

    axes = grid_axes(**spec.grid_axes())
    return [run_name(c, axes) for c in spec.configs()]


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


def _verdict(p: float, alpha: float) -> str:
    return "supported" if p < alpha else "not supported"


def _p(p: float) -> str:
    return f"{p:.2g}"


def _pow(powers: dict[str, Any], name: str) -> str:
    r = powers.get(name, {})
    return f"power {r['power']:.2f}" if "power" in r else "power not computed"


def _slope(e: dict[str, Any], unit: str) -> str:
    return (f"{e['slope']:+.4g} ± {e['slope_stderr']:.2g} {unit} (95 % CI {e['ci95'][0]:+.3g} "
            f"to {e['ci95'][1]:+.3g}, {e['alternative']} p = {_p(e['p'])}, {e['df']} df)")


def _factor_lines(spec: GeneralizationSpec, a: dict[str, Any], powers: dict[str, Any]
                  ) -> list[str]:
    v = spec.variants[0]
    f = a["tests"]["factors"]
    lines = []
    for name, what, unit in (("S1", "training-set size with clean labels (the key contrast; "
                              "over the clean cells' means)", "per ln(images)"),
                             ("S2", "training-set size over all cells (noise levels held "
                              "fixed)", "per ln(images)"),
                             ("N1", "label noise (size levels held fixed)",
                              "per unit of noise")):
        e = f.get(name, {})
        if "coupling" not in e or "slope" not in e["coupling"]:
            lines.append(f"{name} ({what}): not computable ({e.get('skipped', 'skipped')}).")
            continue
        c, acc = e["coupling"], e["accuracy"]
        verdict = _verdict(c["p"], spec.alpha)
        lines.append(
            f"{name}, {what}: accuracy {_slope(acc, unit)}; {v} {_slope(c, unit)}: "
            f"{verdict} ({_pow(powers, name)} to detect "
            f"{powers.get(name, {}).get('effect', 'the planned slope')}).")
    by = f.get("size_by_noise", {})
    parts = [f"noise {100 * float(e):g} %: {v} {g['coupling']['slope']:+.4g} ± "
             f"{g['coupling']['slope_stderr']:.2g}, accuracy {g['accuracy']['slope']:+.3g}"
             for e, g in by.items() if "slope" in g.get("coupling", {})]
    if parts:
        lines.append("Size slopes per ln(images) at each noise level (exploratory): "
                     + "; ".join(parts) + ".")
    beyond = f.get("accuracy_beyond_factors")
    if beyond:
        lines.append(f"Accuracy beyond both factors (exploratory: cell means on accuracy with "
                     f"both factors' levels as fixed effects): slope {beyond['slope']:+.4g} ± "
                     f"{beyond['slope_stderr']:.2g} (two-sided p = {_p(beyond['p'])}, "
                     f"{beyond['df']} df).")
    return lines


def _statement(spec: GeneralizationSpec, a: dict[str, Any], powers: dict[str, Any]
               ) -> list[str]:
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

    def control(ctrl: dict[str, Any], where: str) -> str:
        parts = [f"{name}: {c['cells_passing']} of {c['n_cells']} cells above chance (lowest "
                 f"cell mean {c['min_cell_mean']:.4f}, largest one-sided p {c['max_p']:.2g});"
                 f" over all runs {c['runs']['mean']:.4f} ± {c['runs']['se']:.4f} "
                 "(seed-level se)" for name, c in ctrl["variants"].items()]
        return (f"Positive control C {where} ({'passed' if ctrl['passed'] else 'FAILED'}): "
                + "; ".join(parts) + ".")

    if a["point"] != "final":
        lines.append(control(a["control_final"], "at the end of training"))
    lines.append(control(a["control"], where))
    if a["point"] != "final" or not a["control"]["passed"]:
        lines.append(f"Comparison point: {a['reason']}.")
    pc = tests.get("PC")
    if pc and "difference" in pc.get(v, {}):
        c, acc_c = pc[v], pc["test_accuracy"]
        n_c, _ = spec.control_cell()
        lines.append(
            f"PC, the positive control of the assay (drop-path {spec.train.drop_path:g} vs "
            f"{spec.control_drop_path:g} at {n_c} clean images, {c['design']['n']} vs "
            f"{c['control']['n']} seeds): {v} {c['design']['mean']:.4f} vs "
            f"{c['control']['mean']:.4f}, difference {c['difference']:+.4f} (Welch t = "
            f"{c['t']:.2f}, {c['df']:.1f} df, one-sided p = {_p(c['p'])}): "
            f"{'detected' if c['p'] < spec.alpha else 'NOT detected'} ({_pow(powers, 'PC')} "
            f"at the planned difference {PLANNING['control_difference']:g}); test accuracy "
            f"{acc_c['design']['mean']:.3f} vs {acc_c['control']['mean']:.3f} (difference "
            f"{acc_c['difference']:+.3f}, two-sided p = {_p(acc_c['p'])}).")
    w = tests["W1_EW"]
    if "within" in w:
        wi, fe, eq = w["within"], w["fixed_effects"], w["equivalence"]
        inside = "inside" if eq["equivalent"] else "not inside"
        lines.append(
            f"W1, the primary test (within cells: seed to seed, {w['n_runs']} runs in "
            f"{w['n_cells']} cells, Mundlak split of the mixed model): within slope "
            f"{wi['slope']:+.4g} ± {wi['slope_stderr']:.2g} per unit of accuracy, one-sided "
            f"p = {_p(wi['p_greater'])}: {_verdict(wi['p_greater'], spec.alpha)} "
            f"({_pow(powers, 'W1')} at a within slope of {PLANNING['across_slope']:g}, the "
            f"across-cell slope of the first run); pooled within-cell r = "
            f"{fe['within_r']:+.3f}; between-cell slope {w['between']['slope']:+.4g} ± "
            f"{w['between']['slope_stderr']:.2g}. EW (equivalence within "
            f"±{eq['bound']:g}): the {100 * eq['ci_tost_level']:.0f} % interval of the within "
            f"slope, [{eq['ci_tost'][0]:+.4f}, {eq['ci_tost'][1]:+.4f}], is {inside} the "
            f"bounds (p = {_p(eq['p_tost'])}; {_pow(powers, 'EW_at_0')} at a slope of 0).")
    else:
        lines.append(f"W1 not computable: {w['skipped']}.")
    lines += _factor_lines(spec, a, powers)
    h = tests["H1_E1"]
    if "r" in h:
        lines.append(
            f"H1 (across the {h['n']} cells, {v} rises with test accuracy, one-sided): "
            f"{_verdict(h['p_greater'], spec.alpha)}: r = {h['r']:+.3f}, one-sided p = "
            f"{h['p_greater']:.3g}; slope {h['slope']:.4g} ± {h['slope_stderr']:.2g} per "
            f"unit of accuracy (power {design_power(spec):.2f} at r = {spec.bound:g}, exact).")
        inside = "inside" if h["equivalent"] else "not inside"
        lines.append(
            f"E1 (equivalence within ±{h['bound']:g}, TOST): the {100 * h['ci_tost_level']:.0f} "
            f"% interval of r, [{h['ci_tost'][0]:+.3f}, {h['ci_tost'][1]:+.3f}], is {inside} "
            f"the bounds (p = {h['p_tost']:.3g}; power "
            f"{tost_power(spec.n_cells, spec.bound, spec.alpha):.2f} at r = 0).")
    else:
        lines.append(f"H1 and E1 not computable: {h['skipped']}.")
    m = tests["H1b"]
    if "slope" in m:
        lines.append(
            f"H1b (over the {m['n_runs']} runs, random intercept per cell; it mixes the "
            f"between- and within-cell slopes): slope {m['slope']:.4g} ± "
            f"{m['slope_stderr']:.2g}, one-sided p = {m['p_greater']:.3g}"
            f" ({_verdict(m['p_greater'], spec.alpha)}"
            + ("" if m["converged"] else "; the fit did not converge") + ").")
    tr = tests.get("exploratory", {}).get("train_accuracy", {})
    if "r" in tr:
        lines.append(f"Exploratory: across the cells {v} correlates with the training "
                     f"accuracy on the (noisy) training labels r = {tr['r']:+.3f}, with the "
                     f"test accuracy r = {h.get('r', math.nan):+.3f}.")
    for name, o in tests["other_variants"].items():
        if "r" in o:
            lines.append(f"The same over the cells with {name}: r = {o['r']:+.3f}, one-sided "
                         f"p = {o['p_greater']:.3g}.")
    lines.append(
        "Power: H1 and E1 exact (bivariate-normal cell means); every other test by "
        f"simulation ({powers['W1']['reps']} data sets each) from planning values fixed "
        "before this run (design.PLANNING, from the first run of 2026-11-27).")
    lines.append(
        "What this cannot show: anything about LLMs or the paper's models (a tiny ViT on "
        f"{spec.train.dataset} for {spec.train.steps} steps); a cause (the factors are "
        "manipulated, coupling and accuracy are both outcomes: a relation between them "
        "here is a correlation; the intervention study manipulates coupling itself); "
        f"correlations below {spec.bound:g} across cells and within slopes below the "
        "planned one (the power is stated for those); other architectures, widths or K "
        "(held fixed by design). Confounds named: every cell of a seed starts from the same "
        "initialisation; label noise changes what the training accuracy measures (fit to "
        "wrong labels).")
    return lines
