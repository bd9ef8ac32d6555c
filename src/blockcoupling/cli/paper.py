"""The paper's experiments that are not a measurement of coupling: ``perturb`` (fig. 34, the
last token's embedding perturbed) and ``difficulty`` (fig. 10, per-prompt coupling against
Easy2Hard difficulty and prompt length)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import app, echo_json, guarded, one_value, user_errors
from blockcoupling.cli.correlate import _write_and_say, statistic_option
from blockcoupling.cli.options import (
    BootSeedOption,
    JsonFlag,
    LimitOption,
    ModelOption,
    NBootOption,
    PromptsOption,
    Record,
    given_record,
    record_command,
)
from blockcoupling.cli.run import source_record

#: the loading options perturb leaves out: it runs the whole model on one device
_DISPATCH_OPTIONS = ("device_map", "max_memory", "offload_folder", "quantize")


def _settings_options() -> list[Any]:
    from blockcoupling.engine.perturb import PerturbSettings
    from blockcoupling.fields import cli_options

    return cli_options(PerturbSettings, render=lambda name, v: ",".join(
        f"{x:g}" for x in v) if isinstance(v, tuple) else str(v))


def _settings(params: Any, given: dict[str, Any]) -> Any:
    from blockcoupling.engine.perturb import PerturbSettings
    from blockcoupling.fields import from_options

    return from_options(PerturbSettings, given)


@app.command(cls=record_command(Record(_settings_options, _settings),
                                source=source_record(_DISPATCH_OPTIONS)))
def perturb(
    ctx: typer.Context,
    model: ModelOption,
    prompts: PromptsOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write (resumable: run the same command again to continue).")],
    limit: LimitOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Perturb a token's embedding (the input of block 1) with noise of several sizes and
    compare its trajectory with the true one, layer by layer (the paper's fig. 34).

    The experiment's settings are PerturbSettings' fields (below the command's own)."""
    from blockcoupling.prompts.sources import load_prompts
    from blockcoupling.studies.perturbation import PAGE, run_perturbation

    settings, source = given_record(ctx), given_record(ctx, "source")
    with guarded(saved=f"finished prompts are saved in {out}",
                 again="continue with the same command"):
        items = load_prompts(prompts, limit=limit, seed=settings.seed)
        net, tok = source.load(require_tokenizer=True, progress=not _STATE["quiet"])
        meta = source.meta(prompts_spec=prompts)
        result = run_perturbation(net, tok, items, out, levels=settings.levels,
                                  draws=settings.draws, seed=settings.seed,
                                  token=settings.token, batch_size=settings.batch_size,
                                  meta=meta, progress=not _STATE["quiet"])
    if as_json:
        echo_json({"settings": result.settings,
                   "summary": result.summary.to_dict("records")})
        return
    typer.echo(result.describe())
    typer.echo(f"wrote {out / PAGE}")


@app.command()
def difficulty(
    run_dir: Annotated[Path, typer.Argument(help="A run directory measured on a rated prompt set (hf:e2h-arc, hf:e2h-gsm8k, hf:e2h-winogrande).")],
    ratings: Annotated[str | None, typer.Option("--ratings", help="The rated set: hf:e2h-arc, hf:e2h-gsm8k or hf:e2h-winogrande (from the hub, or @/path/to/rows.jsonl|.parquet); default: the run's own prompt set.")] = None,
    k: Annotated[str | None, typer.Option("--k", help="Top-K (default: the run's smallest).", callback=statistic_option("k"))] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the HTML page here.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json-out", help="Write the table and the fits as JSON here.")] = None,
    n_boot: NBootOption = 2000,
    seed: BootSeedOption = 0,
    as_json: JsonFlag = False,
) -> None:
    """Per-prompt depth-wise coupling against the prompt's difficulty rating (Easy2Hard-Bench)
    and its length in tokens (the paper's fig. 10)."""
    from blockcoupling.report.difficulty import write_difficulty_html
    from blockcoupling.studies.difficulty import difficulty_study

    with user_errors("cannot read the run or the ratings"):
        result = difficulty_study(run_dir, ratings, k=None if k is None else
                                  one_value(k, "--k", int), n_boot=n_boot, seed=seed)
        _write_and_say(result, json_out, out, write_difficulty_html, as_json)
