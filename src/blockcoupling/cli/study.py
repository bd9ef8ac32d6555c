"""``blockcoupling study ...``: the built-in studies that test the paper's claims."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    quick: Annotated[bool, typer.Option("--quick", help="The test-suite's tiny version (18 runs of a 16-wide ViT, under a minute; a smoke test without power).")] = False,
    spec: Annotated[Path | None, typer.Option("--spec", help="A YAML design (train_sizes, label_noises, seeds, train: {...}, variants, alpha, bound, power); default: the full design.")] = None,
    executor: Annotated[str, typer.Option("--executor", help="How the runs train: local (one after the other in this process) or ray (one task per run, one CPU and one torch thread each).", callback=checked(EXECUTOR))] = "local",
    address: AddressOption = None,
    cluster_cpus: ClusterCpusOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the design (its power included) and print its plan (runs, steps, measured checkpoints, the measurement of each, an estimated time); train and write nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train ViTs of one architecture with generalisation moved by the data (training-set size
    x label noise, seeds per cell), and test whether coupling above chance tracks test
    accuracy (a positive control, one-sided tests, an equivalence test, the design's power)."""
    from blockcoupling.studies.generalization import full_spec, load_spec, quick_spec, run_study

    with guarded(saved=f"finished runs are kept in {out / 'grid'}; run the same command "
                       "again to continue"):
        design = load_spec(spec) if spec is not None else (quick_spec() if quick else
                                                           full_spec())
        if dry_run:  # every check of the real run (--out included), then the plan
            from blockcoupling.studies.generalization.plan import plan_generalization
            from blockcoupling.studies.generalization.run import check_study

            check_study(out, design, executor, address=address, cluster_cpus=cluster_cpus)
            print_plan(plan_generalization(design), as_json)
            return
        result = run_study(out, design, executor=executor, address=address,
                           cluster_cpus=cluster_cpus, progress=not _STATE["quiet"])
    if as_json:
        echo_json(result.to_dict())
    else:
        typer.echo(result.summary())
        typer.echo(f"wrote {out / 'study.json'} and {out / 'study.html'}")
