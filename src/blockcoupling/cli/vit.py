"""The ViT study's commands: ``vit-train``, ``vit-grid``, ``vit-figures``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import (
    app,
    echo_json,
    guarded,
    print_plan,
    spec_runner,
    user_errors,
)
from blockcoupling.cli.options import (
    AddressOption,
    ClusterCpusOption,
    JsonFlag,
    Record,
    checked,
    checked_field,
    given_options,
    given_record,
    record_command,
)
from blockcoupling.validate import COUNT

#: VitTrainConfig fields that are not options of vit-grid: the grid's own list options
#: (--drop-path, --weight-decay, --seeds) set them per run
_GRID_OWN = ("drop_path", "weight_decay", "seed")


def _train_options() -> list[Any]:
    from blockcoupling.fields import cli_options
    from blockcoupling.studies.vit.train import VitTrainConfig

    return cli_options(VitTrainConfig)


def _grid_options() -> list[Any]:
    from blockcoupling.fields import cli_options
    from blockcoupling.studies.vit.train import VitTrainConfig

    return cli_options(VitTrainConfig, exclude=_GRID_OWN)


def _train_config(params: Any, given: dict[str, Any]) -> Any:
    """The config of the options given (the others unset; ``--preset paper`` starts from the
    recipe)."""
    from blockcoupling.studies.vit.train import VitTrainConfig

    return VitTrainConfig.from_options(**given)


def _grid_field(name: str) -> Callable[..., Any]:
    """The check of a vit-grid option that is a `GridSpec` key: its field's parser and
    rule (a grid spec's key and the option are one declaration)."""
    def where() -> tuple[Any, str]:
        from blockcoupling.studies.vit.grid import GridSpec

        return GridSpec, name

    return checked_field(where)


@app.command("vit-train", cls=record_command(Record(_train_options, _train_config),
                                             exclusive={"dry_run": ("estimate",)}))
def vit_train(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (model/, metrics.json, coupling/).")],
    threads: Annotated[int | None, typer.Option(help="torch threads (default: torch's).", callback=checked(COUNT))] = None,
    estimate: Annotated[bool, typer.Option("--estimate", help="Time a few training steps of this config on random images and print the estimated cost of the whole training; train nothing.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the options and print the plan (epochs, steps, measured checkpoints and the measurement plan of each); write nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train a DeiT-style ViT with stochastic depth and measure its coupling as it trains.

    The training options are VitTrainConfig's fields (below the command's own)."""
    from blockcoupling.studies.vit.train import estimate_cost, read_metrics, train_vit

    cfg = given_record(ctx)
    with guarded(saved=f"finished epochs are saved in {out}"):
        if dry_run:
            from blockcoupling.studies.vit.plan import plan_vit_training
            from blockcoupling.studies.vit.train import check_training

            check_training(cfg, out)  # --out as the training checks it, nothing written
            print_plan(plan_vit_training([cfg]), as_json)
            return
        if estimate:
            e = estimate_cost(cfg, threads=threads)
            if as_json:
                echo_json(e)
                return
            typer.echo(f"estimated (not run): {e['seconds_per_step']:.2f} s per step x "
                       f"{e['steps_per_epoch']} steps + eval of {e['eval_images_per_epoch']} "
                       f"images = {e['seconds_per_epoch'] / 60:.1f} min per epoch; "
                       f"{e['epochs']} epochs = {e['hours_total']:.1f} h on {e['threads']} "
                       f"thread(s) (from {e['measured_steps']} timed steps; not counted: "
                       f"{e['not_counted']}); CPU time {e['cpu_seconds_per_step']:.2f} s per "
                       f"step, {e['cpu_hours_training']:.1f} h of training steps (the wall "
                       "time on an idle machine)")
            return
        path = train_vit(cfg, out, progress=not _STATE["quiet"], threads=threads)
        m = read_metrics(path)
    if as_json:
        echo_json({"out": str(path), **m})
    else:  # -q hides progress and chatter, never results
        typer.echo(vit_headline(path, m))
        typer.echo(f"wrote {path}")


def _side(f: dict[str, Any], token: str) -> str:
    """The leading variant at one token of a final measurement (``coupling_vs_null`` for a
    run trained before ``metrics.json`` carried ``coupling_vs_rotated``)."""
    v = "coupling_vs_rotated" if f"coupling_vs_rotated_{token}" in f else "coupling_vs_null"
    return f"{v} {f[f'{v}_{token}']:.4f} ± {f[f'{v}_se_{token}']:.4f}"


def vit_headline(path: Path, m: dict[str, Any]) -> str:
    """What ``vit-train`` states of a finished output: accuracies, the headline of its final
    run as ``show`` states it (the run's own token rule), [CLS] and the last patch side by
    side, and the rule."""
    from blockcoupling.engine.statistic import headline, headline_rule
    from blockcoupling.store.reader import open_run
    from blockcoupling.studies.vit.grid import FINAL_RUN
    from blockcoupling.studies.vit.train import STATISTIC_TOKENS

    f = m["final"]
    tokens = STATISTIC_TOKENS[str(m["config"].get("tokens", "cls"))]  # its final run's rule
    stat = open_run(path / FINAL_RUN).coupling_statistic(k=int(m["config"]["k"]), n_boot=0,
                                                         tokens=tokens)
    return (f"test accuracy {f['test_accuracy']:.3f}, train accuracy {f['train_accuracy']:.3f}"
            f"; final measurement ({f['images']} test images), depth-wise coupling, "
            f"{headline(stat)}\n  [CLS] {_side(f, 'cls')}, last patch {_side(f, 'last')}"
            "\n  (rule: "
            f"{headline_rule(tokens=tokens)}; ± is one standard error over "
            "the images, within this trained model)")


#: what a --spec file states: the options that must not be given beside it (they would be
#: dropped); the run's environment (--executor, --address, --cluster-cpus) applies to both
_SPEC_STATES = ("drop_paths", "weight_decays", "seeds", "cpus_per_run", "threads", "config")


@app.command("vit-grid", cls=record_command(
    Record(_grid_options), exclusive={"spec": _SPEC_STATES},
    requires={k: ("executor", "ray") for k in ("address", "cpus_per_run", "cluster_cpus")}))
def vit_grid(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Grid folder: a vit-grid collection (sweep.json, status/, units/<id>/).")],
    spec: Annotated[Path | None, typer.Option("--spec", help="YAML grid spec (drop_path, weight_decay, seeds, train: {...}); replaces the grid and training options (given beside it, they are refused).")] = None,
    drop_paths: Annotated[str, typer.Option("--drop-path", help="Comma-separated rates (default: the paper's 8).", callback=_grid_field("drop_path"))] = "0,0.025,0.05,0.075,0.1,0.15,0.2,0.3",
    weight_decays: Annotated[str, typer.Option("--weight-decay", help="Comma-separated decays (default: the paper's 8).", callback=_grid_field("weight_decay"))] = "0.005,0.01,0.02,0.04,0.06,0.08,0.1,0.2",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.", callback=_grid_field("seeds"))] = "0",
    executor: Annotated[str | None, typer.Option(help="ray (one task per run) or local (default: the spec's executor, else ray).", callback=_grid_field("executor"))] = None,
    address: AddressOption = None,
    cpus_per_run: Annotated[int, typer.Option(help="CPUs of each run's Ray task.", callback=_grid_field("cpus_per_run"))] = 1,
    cluster_cpus: ClusterCpusOption = None,
    threads: Annotated[int, typer.Option(help="torch threads per run.", callback=_grid_field("threads"))] = 1,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the grid and print its plan (runs, epochs, steps, measured checkpoints and the measurement plan of each); write nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train the drop-path x weight-decay grid (one run per point; finished runs are skipped).

    The training options of every run are VitTrainConfig's fields (below the command's own)."""
    from blockcoupling.studies.vit.grid import GridSpec, load_grid_spec, run_grid

    with guarded(saved=f"finished runs are saved in {out}"):
        if spec is not None:
            base, kwargs = load_grid_spec(spec)
        else:  # the options as a grid spec's keys: one declaration, one check
            from blockcoupling.fields import from_mapping

            grid = from_mapping(GridSpec, {
                "drop_path": drop_paths, "weight_decay": weight_decays, "seeds": seeds,
                "cpus_per_run": cpus_per_run, "threads": threads,
                "train": {k: v for k, v in given_options(ctx).items()}})
            base, kwargs = grid.base(), grid.run_grid_kwargs()
        # the run's environment: the command line's where given, else the spec's
        kwargs.update({k: v for k, v in (("executor", executor), ("address", address),
                                         ("cluster_cpus", cluster_cpus)) if v is not None})
        if dry_run:
            from blockcoupling.runs.protocol import checks_only
            from blockcoupling.studies.vit.plan import plan_grid

            with checks_only():  # every check of the run itself (--out too), nothing written
                run_grid(base, out, progress=False, **kwargs)
            print_plan(plan_grid(base, kwargs), as_json)
            return
        runs = run_grid(base, out, progress=not _STATE["quiet"], **kwargs)
    report_grid(runs, out, as_json=as_json)


def _seed_level(runs: Any) -> Any:
    """Per grid point with more than one seed: the statistic with the runs as the unit of
    replication (``engine.statistic.seed_level``) for the coupling and the test accuracy;
    None where no point has two seeds."""
    import pandas as pd

    from blockcoupling.engine.statistic import seed_level

    keys = ["drop_path", "weight_decay"]
    if runs.empty or "seed" not in runs or runs.groupby(keys)["seed"].nunique().max() < 2:
        return None
    parts = []
    for col, se in (("coupling_vs_rotated", "coupling_vs_rotated_se"),
                    ("coupling_vs_null", "coupling_vs_null_se"), ("test_accuracy", None)):
        if col not in runs or runs[col].isna().all():
            continue
        t = seed_level(runs, by=keys, value=col, within_se=se or "")
        parts.append(t.assign(value=col)[[*keys, "value", "n_runs", "mean", "se", "ci_low",
                                          "ci_high", "within_se"]])
    return pd.concat(parts, ignore_index=True)


def report_grid(runs: Any, out: Path, *, as_json: bool = False) -> None:
    """Print a finished grid's runs (test accuracy, coupling above chance with its se, raw
    coupling and its chance level; ``as_json``: every column as JSON); exit 1 if any did not
    finish. Shared by ``vit-grid`` and ``sweep`` on a grid spec."""
    failed = runs[runs["status"] != "complete"]
    if as_json:
        seeds = _seed_level(runs[runs["status"] == "complete"])
        echo_json({"grid_dir": str(out), "complete": len(runs) - len(failed),
                   "failed": len(failed), "runs": runs,
                   **({"seed_level": seeds} if seeds is not None else {})})
    else:  # -q hides progress and chatter, never results
        cols = ["name", "test_accuracy", "coupling_vs_rotated", "coupling_vs_rotated_se",
                "coupling_vs_null", "coupling", "coupling_chance", "coupling_vs_rotated_cls",
                "coupling_vs_rotated_last"]
        typer.echo(runs[cols].rename(columns={"coupling_vs_rotated_se": "se (within model)"})
                   .to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        seeds = _seed_level(runs[runs["status"] == "complete"])
        if seeds is not None:
            typer.echo("seed level (runs as the unit of replication; se over seeds, t interval "
                       "with n_runs - 1 df):")
            typer.echo(seeds.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        typer.echo(f"{len(runs) - len(failed)} of {len(runs)} training runs complete; wrote {out}")
    if len(failed):
        typer.echo(f"error: {len(failed)} run(s) did not finish; see `blockcoupling "
                   f"sweep-status {out}`", err=True)
        raise typer.Exit(1)


@app.command("vit-figures")
def vit_figures(
    root: Annotated[Path, typer.Argument(help="A vit-grid collection, or any folder of vit-train outputs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the figures and tables.")] = Path("vit_figures"),
) -> None:
    """Coupling vs drop-path rate, vs test accuracy, across epochs, and the pooled and
    conditional fits (PNG + CSV + fits.json)."""
    from blockcoupling.studies.vit.report import write_vit_figures

    with user_errors("cannot read the runs or write the figures"):
        paths = write_vit_figures(root, out)
    if not _STATE["quiet"]:
        for p in paths:
            typer.echo(f"wrote {p}")


@spec_runner("vit-grid")
def grid_from_spec(spec: Path, out: Path, *, executor: str | None, address: str | None,
                   as_json: bool = False, cluster_cpus: int | None = None,
                   resume: bool = False, retries: int | None = None,
                   connect_timeout: float = 60.0) -> None:
    """``blockcoupling sweep GRID.yaml``: the grid by the sweep's rules (``--resume`` to
    continue one that holds trained runs), the spec's own executor unless ``--executor``."""
    from blockcoupling.studies.vit.grid import load_grid_spec, run_grid

    with guarded(saved=f"finished runs are saved in {out}",
                 again="continue with the same command and --resume"):
        base, kwargs = load_grid_spec(spec)
        if executor is not None:
            kwargs["executor"] = executor
        if address is not None:
            kwargs["address"] = address
        runs = run_grid(base, out, progress=not _STATE["quiet"], cluster_cpus=cluster_cpus,
                        resume=resume, retries=retries, connect_timeout=connect_timeout,
                        **kwargs)
    report_grid(runs, out, as_json=as_json)
