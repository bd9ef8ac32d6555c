"""Commands on one model and its runs: ``measure``, ``report``, ``show``, ``models``, ``demo``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import app, echo_json, guarded, user_errors
from blockcoupling.cli.options import (
    JsonFlag,
    LimitOption,
    ModelOption,
    PromptsOption,
    Record,
    checked,
    given_record,
    record_command,
)
from blockcoupling.errors import BlockCouplingError
from blockcoupling.validate import EXECUTOR


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def measure(
    ctx: typer.Context,
    model: ModelOption,
    prompts: PromptsOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory to write.")],
    limit: LimitOption = None,
    prompt_column: Annotated[str | None, typer.Option(help="Text column of a .csv/.jsonl prompt file.")] = None,
    split: Annotated[str | None, typer.Option(help="Dataset split for hf: prompts.")] = None,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Continue an interrupted run in --out.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check everything and print the plan (prompts, tokens, pairs, Jacobians, memory, an estimated time); write nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Measure a model on a prompt set and write a resumable run directory."""
    from blockcoupling.prompts.sources import load_prompts
    from blockcoupling.store.record import measure_to_dir

    with guarded(saved=f"finished prompts are saved in {out}",
                 again="continue with the same command and --resume"):
        _check_out(out, resume)
        # the records of the options given, checked as the options were parsed
        cfg, source = given_record(ctx), given_record(ctx, "source")
        items = load_prompts(prompts, limit=limit, seed=cfg.seed, column=prompt_column, split=split)
        net, tok = source.load(require_tokenizer=True, progress=not _STATE["quiet"],
                               head=cfg.logit_lens)
        meta = source.meta(prompts_spec=prompts)
        if dry_run:
            from blockcoupling.store.record import plan_run

            plan = plan_run(net, tok, items, config=cfg, model_name=model, out_dir=out,
                            meta=meta, prompts_spec=prompts, resume=resume)
            if as_json:
                echo_json(plan.to_dict())
            else:
                typer.echo(plan.describe())
            return
        result = measure_to_dir(net, tok, items, out, meta=meta, prompts_spec=prompts,
                                resume=resume, progress=not _STATE["quiet"], config=cfg)
    if as_json:
        from blockcoupling.store.reader import run_progress

        echo_json(run_json(out, result, run_progress(out)))
    else:  # -q hides progress and chatter, never results
        typer.echo(result.summary())
        typer.echo(f"wrote {out}")


def run_json(run_dir: Path, m: Any, progress: Any) -> dict[str, Any]:
    """What ``show`` / ``measure --json`` print: status, identity, configuration, table sizes
    and the headline statistic (``Measurement.coupling_statistic``) per K measured."""
    from blockcoupling.engine.results import HEADLINE_VARIANTS, TABLES

    stats = []
    if "depth" in m.config.coupling and not m.coupling.empty:
        variants = [v for v in HEADLINE_VARIANTS if v in m.config.variants]
        for k in m.config.k:
            try:
                stats.append(m.coupling_statistic(variants=variants, k=k))
            except (BlockCouplingError, ValueError):  # not measured at this K
                continue
    return {"run_dir": str(run_dir), "status": progress.status, "complete": progress.finished,
            "prompts_done": progress.done, "prompts_total": progress.total,
            "writer_pid": progress.writer_pid, "meta": m.meta, "config": m.config.to_dict(),
            "rows": {name: len(m.table(name)) for name in TABLES},
            "statistic": [r for df in stats for r in df.to_dict(orient="records")]}


def _measure_options() -> list[Any]:
    from blockcoupling.engine.config import measure_options

    return measure_options()


def _measure_config(params: Any, given: dict[str, Any]) -> Any:
    from blockcoupling.engine.config import parse_config

    return parse_config(None, **given)  # the raw strings given, through the one parser


def source_record(exclude: tuple[str, ...] = ()) -> Record:
    """The loading options of a command that loads ``--model`` (`ModelSource`'s fields,
    less ``exclude``) and the record they make."""
    def options() -> list[Any]:
        from blockcoupling.loading import source_options

        return source_options(exclude=exclude)

    def build(params: Any, given: dict[str, Any]) -> Any:
        from blockcoupling.fields import from_options
        from blockcoupling.loading import ModelSource

        return from_options(ModelSource, given, model=params["model"])

    return Record(options, build)


app.command(cls=record_command(Record(_measure_options, _measure_config),
                               source=source_record()))(measure)


def _check_out(out: Path, resume: bool) -> None:
    """Refuse an --out that cannot become a run directory before any work is done."""
    from blockcoupling.store.reader import is_run_dir

    if out.exists() and not out.is_dir():
        raise BlockCouplingError(f"--out {out} is a file; choose a directory for the run")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BlockCouplingError(
            f"--out {out}: {parent} is a file, so no directory can be created under it; "
            "choose another --out"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BlockCouplingError(
            f"--out {out}: {parent} is not writable; choose a --out in a folder you can write to"
        )
    if out.is_dir() and not resume and any(out.iterdir()) and not is_run_dir(out):
        raise BlockCouplingError(
            f"--out {out} is a folder that holds other files; choose a new or empty --out"
        )


def _folder_page(path: Path) -> Callable[[Path, Path], Path] | None:
    """The page of the folder ``path`` where it holds a collection kind's loose outputs (a
    folder of ``vit-train`` runs: ``CollectionKind.recognises``, ``folder_page``), else None:
    a run directory, a collection or a file is none."""
    from blockcoupling.store.collection import is_collection_dir
    from blockcoupling.store.reader import is_run_dir

    if not path.is_dir() or is_run_dir(path) or is_collection_dir(path):
        return None
    from blockcoupling.runs import kinds

    kind = kinds.recognising(path)
    return kind.folder_page if kind is not None else None


def _sort_rule() -> Any:
    from blockcoupling.report.summaries.profiles import SORT_KEYS
    from blockcoupling.validate import choice, rule

    return rule(choice, choices=tuple(SORT_KEYS))


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories, one collection (its kind's page: a sweep or monitor directory, the emergence report; a vit-grid, the ViT study page) or one folder of vit-train runs (the ViT study page).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    labels: Annotated[str | None, typer.Option(help="Comma-separated labels, one per run.")] = None,
    sort: Annotated[str, typer.Option("--sort", help="Order of the runs on the per-model figures: given, params (parameter count), layers, d_model, or score (with --scores; the paper sorts by size, fig. 37, or by score, fig. 23). Run directories only (a sweep's are SWEEP/units/*).", callback=checked(_sort_rule))] = "given",
    scores: Annotated[str | None, typer.Option("--scores", help="With --sort score: paper, a CSV (model, score) or an lm-evaluation-harness folder, matched to the runs as correlate does.")] = None,
) -> None:
    """Write one self-contained HTML report (plus PNG/SVG/PDF figures) from stored runs."""
    from blockcoupling.report.html import write_report_from_dirs
    from blockcoupling.store.collection import is_collection_dir

    with user_errors("cannot write the report"):
        folder = _folder_page(run_dirs[0]) if len(run_dirs) == 1 else None
        single = len(run_dirs) == 1 and (is_collection_dir(run_dirs[0]) or folder is not None)
        if sort != "given" and single:
            raise BlockCouplingError(
                "--sort orders run directories; for a sweep pass its units' run directories "
                f"({run_dirs[0]}/units/*)")
        if not single:  # runs side by side: each run once (joins by content)
            from blockcoupling.store.manifest import load_manifest
            from blockcoupling.studies.joins import check_distinct_runs

            check_distinct_runs([(str(d), load_manifest(d).get("digest")) for d in run_dirs])
        if sort != "given" or scores is not None:
            path = _sorted_report(run_dirs, out, _csv(labels), sort, scores)
        elif len(run_dirs) == 1 and is_collection_dir(run_dirs[0]):  # its manifest says the kind
            from blockcoupling.runs.collection import open_collection, write_collection_report

            path = write_collection_report(open_collection(run_dirs[0]), out)
        elif folder is not None:  # a kind's loose outputs (a folder of vit-train runs)
            path = folder(run_dirs[0], out)
        else:
            path = write_report_from_dirs(run_dirs, out, labels=_csv(labels))
    typer.echo(f"wrote {path}")


def _sorted_report(run_dirs: list[Path], out: Path, labels: list[str] | None, key: str,
                   scores: str | None) -> Path:
    """The runs report with the runs in the order of ``key`` (studies/ordering.py)."""
    from blockcoupling.report.html import write_report
    from blockcoupling.report.summaries import run_labels
    from blockcoupling.store.reader import open_run
    from blockcoupling.studies.ordering import order_runs

    ms = [open_run(d) for d in run_dirs]
    labs = run_labels(ms, labels)
    order, name = order_runs(ms, labs, key, run_dirs=run_dirs, scores=scores)
    return write_report([ms[i] for i in order], out, labels=[labs[i] for i in order],
                        order_name=name)


@app.command()
def show(run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
         as_json: JsonFlag = False) -> None:
    """A short text summary of a run; says whether it is complete ("2 of 3 prompts")."""
    from blockcoupling.errors import RunDirError
    from blockcoupling.store.integrity import damaged_files, repair_hint
    from blockcoupling.store.manifest import load_manifest
    from blockcoupling.store.reader import open_run, run_progress

    with user_errors("cannot read the run"):
        progress = run_progress(run_dir)
        m = open_run(run_dir)
        damaged = damaged_files(run_dir, load_manifest(run_dir))  # stored bases: read lazily
        if damaged:
            raise RunDirError(repair_hint(run_dir, damaged))
        if as_json:
            echo_json(run_json(run_dir, m, progress))
            return
        summary = m.summary()
    typer.echo(f"status: {progress.describe(run_dir)}")
    typer.echo(summary)


@app.command()
def models(as_json: JsonFlag = False) -> None:
    """The architectures blockcoupling finds blocks in by itself."""
    from blockcoupling.engine.blocks import SUPPORTED_ARCHITECTURES

    if as_json:
        echo_json(SUPPORTED_ARCHITECTURES)
        return
    width = max(map(len, SUPPORTED_ARCHITECTURES))
    for arch, desc in SUPPORTED_ARCHITECTURES.items():
        typer.echo(f"{arch:<{width}}  {desc}")
    typer.echo("\nAny other nn.Module: pass --blocks dotted.path.to.ModuleList (API: blocks_path=...).")


@app.command()
def demo(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for the demo's runs and report (default demo_run, or demo_run_quick).")] = None,
    quick: Annotated[bool, typer.Option("--quick/--no-quick", help="A much smaller demo: one prompt per model, K = 10 only, and a 2-layer d = 32 LM trained for 20 steps instead of the 6-layer d = 128 one trained for 400 (the numbers are a smoke test, not the story).")] = False,
    cache_dir: Annotated[Path | None, typer.Option(help="Where trained demo checkpoints are cached.")] = None,
    family: Annotated[bool, typer.Option("--family/--no-family", help="Also run the coupling-vs-generalisation study on a family of tiny LMs (about a minute more).")] = True,
    executor: Annotated[str, typer.Option(help="Where the tiny LMs' checkpoint sweeps run: ray (a local Ray cluster, started for the demo) or local (in this process, no Ray).", callback=checked(EXECUTOR))] = "ray",
) -> None:
    """The offline demo: pretrained MiniLM vs random init, and a tiny LM across training
    (trained with the coupling monitor, its checkpoints measured by a sweep on local Ray)."""
    from blockcoupling.studies.demo import run_demo

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = out or Path("demo_run_quick" if quick else "demo_run")
    with guarded(saved=f"finished runs are saved in {out} and trained checkpoints cached",
                 again="run the demo again to continue"):
        path = run_demo(out, quick=quick, cache_dir=cache_dir, progress=not _STATE["quiet"],
                        family=family, executor=executor)
    typer.echo(f"report: {path}")
