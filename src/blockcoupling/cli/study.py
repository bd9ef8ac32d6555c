"""``blockcoupling study ...``: the built-in studies that test the paper's claims."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import (
    Group,
    app,
    echo_json,
    guarded,
    print_plan,
)
from blockcoupling.cli.options import (
    AddressOption,
    ClusterCpusOption,
    JsonFlag,
    checked,
    record_command,
)
from blockcoupling.validate import EXECUTOR

TRAIN_EXECUTOR_HELP = ("How the runs train: local (one after the other in this process) or ray "
                       "(one task per run, one CPU and one torch thread each).")
STUDY_DRY_RUN_HELP = ("Check the design and print its plan (runs, steps, measured checkpoints, "
                      "the measurement of each, an estimated time); train and write nothing.")

study_app = typer.Typer(cls=Group, help="Built-in studies that test the paper's claims end to end.",
                        no_args_is_help=True)
app.add_typer(study_app, name="study")


@study_app.command("lm-family", cls=record_command(exclusive={"runs": ("quick",)}))
def lm_family(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (study.json, study.html, sweep/).")],
    quick: Annotated[bool, typer.Option("--quick", help="The test-suite's tiny version (about a minute).")] = False,
    runs: Annotated[Path | None, typer.Option("--runs", help="A YAML study spec (runs, k, n_prompts, ...); default: the full family.")] = None,
    executor: Annotated[str, typer.Option("--executor", help="How the checkpoints are measured: local (this process) or ray.", callback=checked(EXECUTOR))] = "local",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the study spec and print its plan (runs, training steps, checkpoints, the measurement of each, an estimated time); train and write nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train a family of tiny LMs, measure every checkpoint, and test whether coupling above
    chance tracks held-out accuracy across runs (H1) and emerges with training (H2)."""
    from blockcoupling.studies.lm_study import load_study_spec, run_study

    with guarded(saved=f"trained checkpoints are cached and measured units kept in {out}"):
        spec = load_study_spec(runs) if runs is not None else None
        if dry_run:  # every check of the real run (--out included), then the plan
            from blockcoupling.studies.lm_study import (
                check_study,
                full_spec,
                plan_lm_study,
                quick_spec,
            )

            spec = spec or (quick_spec() if quick else full_spec())
            check_study(out, spec, executor)
            print_plan(plan_lm_study(spec), as_json)
            return
        result = run_study(out, spec, quick=quick, progress=not _STATE["quiet"],
                           executor=executor)
    if as_json:
        echo_json(result.to_dict())
    else:
        typer.echo(result.summary())
        typer.echo(f"wrote {out / 'study.json'} and {out / 'study.html'}")


@study_app.command("generalization", cls=record_command(
    exclusive={"spec": ("quick",)},
    requires={k: ("executor", "ray") for k in ("address", "cluster_cpus")}))
def generalization(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (study.json, study.html, runs.csv, cells.csv, grid/).")],
    quick: Annotated[bool, typer.Option("--quick", help="The test-suite's tiny version (18 runs of a 16-wide ViT and 3 control runs, about a minute; a smoke test without power).")] = False,
    spec: Annotated[Path | None, typer.Option("--spec", help="A YAML design (train_sizes, label_noises, seeds, train: {...}, variants, alpha, bound, power); default: the full design.")] = None,
    executor: Annotated[str, typer.Option("--executor", help=TRAIN_EXECUTOR_HELP, callback=checked(EXECUTOR))] = "local",
    address: AddressOption = None,
    cluster_cpus: ClusterCpusOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the design (its power included) and print its plan (runs, steps, measured checkpoints, the measurement of each, an estimated time); train and write nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train ViTs of one architecture with generalisation moved by the data (training-set size
    x label noise, seeds per cell, a fresh training subset per seed), and test whether
    coupling above chance tracks test accuracy within cells (seed to seed: the primary test)
    and across them, each factor's own effect on both, with positive controls (coupling above
    chance; a drop-path contrast the assay must detect) and the power of each test."""
    from blockcoupling.studies import generalization as g
    from blockcoupling.studies.generalization.plan import plan_generalization
    from blockcoupling.studies.generalization.run import check_study

    _run_design_study(out, spec, quick, g.load_spec, g.quick_spec, g.full_spec,
                      plan_generalization, check_study, g.run_study, executor=executor,
                      address=address, cluster_cpus=cluster_cpus, dry_run=dry_run,
                      as_json=as_json)


def _run_design_study(out: Path, spec: Path | None, quick: bool, load: Any, quick_spec: Any,
                      full_spec: Any, plan: Any, check: Any, run: Any, *, executor: str,
                      address: str | None, cluster_cpus: int | None, dry_run: bool,
                      as_json: bool) -> None:
    """A built-in study trained as one ViT grid (generalization, intervention): its design
    (``--spec``, ``--quick`` or the full one), its ``--dry-run`` plan, or its run and result."""
    with guarded(saved=f"finished runs are kept in {out / 'grid'}; run the same command "
                       "again to continue"):
        design = load(spec) if spec is not None else (quick_spec() if quick else full_spec())
        if dry_run:  # every check of the real run (--out included), then the plan
            check(out, design, executor, address=address, cluster_cpus=cluster_cpus)
            print_plan(plan(design), as_json)
            return
        result = run(out, design, executor=executor, address=address,
                     cluster_cpus=cluster_cpus, progress=not _STATE["quiet"])
    if as_json:
        echo_json(result.to_dict())
    else:
        typer.echo(result.summary())
        typer.echo(f"wrote {out / 'study.json'} and {out / 'study.html'}")


@study_app.command("intervention", cls=record_command(
    exclusive={"spec": ("quick",)},
    requires={k: ("executor", "ray") for k in ("address", "cluster_cpus")}))
def intervention(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (study.json, study.html, runs.csv, arms.csv, grid/).")],
    quick: Annotated[bool, typer.Option("--quick", help="The test-suite's tiny version (9 runs of a 16-wide ViT, about a minute; a smoke test without power).")] = False,
    spec: Annotated[Path | None, typer.Option("--spec", help="A YAML design (strengths, seeds, train: {...}, variant, alpha, bound); default: the full design.")] = None,
    executor: Annotated[str, typer.Option("--executor", help=TRAIN_EXECUTOR_HELP, callback=checked(EXECUTOR))] = "local",
    address: AddressOption = None,
    cluster_cpus: ClusterCpusOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=STUDY_DRY_RUN_HELP)] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train ViTs of one architecture with a loss term that raises or lowers their depth-wise
    coupling (several strengths each way and 0, seeds), measure the coupling reached and the
    test accuracy, and test whether changing coupling changes accuracy (a manipulation check,
    paired one-sided tests, equivalence tests, the power of each)."""
    from blockcoupling.studies import intervention as i
    from blockcoupling.studies.intervention.plan import plan_intervention
    from blockcoupling.studies.intervention.run import check_study, run_study

    _run_design_study(out, spec, quick, i.load_spec, i.quick_spec, i.full_spec,
                      plan_intervention, check_study, run_study, executor=executor,
                      address=address, cluster_cpus=cluster_cpus, dry_run=dry_run,
                      as_json=as_json)
