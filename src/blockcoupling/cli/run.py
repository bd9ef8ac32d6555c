"""Commands on one model and its runs: ``measure``, ``report``, ``show``, ``models``, ``demo``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import app
from blockcoupling.cli.app import fail as _fail
from blockcoupling.errors import BlockCouplingError


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


@app.command()
def measure(
    model: Annotated[str, typer.Option("--model", "-m", help="Hub id or local model folder.")],
    prompts: Annotated[str, typer.Option("--prompts", help="File (.txt/.jsonl/.csv), builtin:NAME or hf:DATASET.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory to write.")],
    revision: Annotated[str | None, typer.Option(help="Model revision (branch, tag, commit, e.g. step1000).")] = None,
    dtype: Annotated[str, typer.Option(help="Model weight dtype: auto, float32, bfloat16, float16.")] = "auto",
    analysis_dtype: Annotated[str, typer.Option(help="Precision of the analysis: float32 or float64.")] = "float32",
    device: Annotated[str, typer.Option(help="Where the model runs: auto, cpu, cuda, cuda:N.")] = "auto",
    analysis_device: Annotated[str | None, typer.Option(help="Where the Jacobian work runs (default: with each block). A model that does not fit the GPU: --device cpu --analysis-device cuda streams one block at a time.")] = None,
    coupling: Annotated[str, typer.Option(help="Kinds: depth,self,fixed_input,fixed_output (or none).")] = "depth",
    k: Annotated[str, typer.Option("--k", help="Top-K sizes, e.g. 10,30,50.")] = "10,30,50",
    tokens: Annotated[str, typer.Option(help="last, all, or positions such as 0,5,-1.")] = "last",
    layers: Annotated[str | None, typer.Option(help="Layer window A..B or a list (1-based).")] = None,
    layer_pairs: Annotated[str, typer.Option(help="Token-wise kinds: same (l = l') or all.")] = "same",
    variant: Annotated[str | None, typer.Option("--variant", help="Variants to store (default: all).")] = None,
    p: Annotated[str, typer.Option(help="Norms for miscoupling: 1,2,inf.")] = "1",
    orientation: Annotated[str, typer.Option(help="ujv,vju.")] = "ujv,vju",
    final_norm: Annotated[bool, typer.Option("--final-norm/--no-final-norm", help="Fold the final norm into the last block (the paper's eq. 7).")] = False,
    method: Annotated[str, typer.Option(help="auto, dense or matrix-free.")] = "auto",
    influence: Annotated[bool, typer.Option("--influence/--no-influence", help="Cross-token influence on the last token.")] = False,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 8,
    limit: Annotated[int | None, typer.Option(help="Use at most this many prompts (seeded subset).")] = None,
    prompt_column: Annotated[str | None, typer.Option(help="Text column of a .csv/.jsonl prompt file.")] = None,
    split: Annotated[str | None, typer.Option(help="Dataset split for hf: prompts.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for prompt subsets and randomized SVDs.")] = 0,
    blocks: Annotated[str | None, typer.Option(help="Dotted path to the list of blocks (custom models).")] = None,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Continue an interrupted run in --out.")] = False,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code/--no-trust-remote-code", help="Run the model repository's own Python code (transformers trust_remote_code); only for repositories you trust.")] = False,
) -> None:
    """Measure a model on a prompt set and write a resumable run directory."""
    from blockcoupling.engine.config import VARIANTS, MeasureConfig
    from blockcoupling.loading import load_model
    from blockcoupling.prompts.sources import load_prompts
    from blockcoupling.store.record import measure_to_dir

    try:
        kinds = [] if coupling.strip().lower() in ("", "none") else _csv(coupling)
        cfg = MeasureConfig(
            coupling=tuple(kinds or ()), k=tuple(int(v) for v in _csv(k) or ()), tokens=tokens,
            p=tuple(_csv(p) or ["1"]), dtype=analysis_dtype,
            variants=tuple(_csv(variant) or VARIANTS), orientations=tuple(_csv(orientation) or ()),
            layers=layers, layer_pairs=layer_pairs, final_norm=final_norm, method=method,
            influence=influence, batch_size=batch_size, seed=seed, blocks_path=blocks,
            analysis_device=analysis_device,
        )
        items = load_prompts(prompts, limit=limit, seed=seed, column=prompt_column, split=split)
        net, tok = load_model(model, revision=revision, dtype=dtype, device=device,
                              trust_remote_code=trust_remote_code)
        meta = {"model": model, "revision": revision, "prompts_spec": prompts}
        result = measure_to_dir(net, tok, items, out, meta=meta, prompts_spec=prompts,
                                resume=resume, progress=not _STATE["quiet"], config=cfg)
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted: finished prompts are saved in {out}; "
                   "continue with the same command and --resume", err=True)
        raise typer.Exit(130) from None
    except BlockCouplingError as err:
        _fail(err)
        return
    if not _STATE["quiet"]:
        typer.echo(result.summary())
        typer.echo(f"wrote {out}")


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    labels: Annotated[str | None, typer.Option(help="Comma-separated labels, one per run.")] = None,
) -> None:
    """Write one self-contained HTML report (plus PNG/SVG/PDF figures) from stored runs."""
    from blockcoupling.report.html import write_report_from_dirs

    try:
        path = write_report_from_dirs(run_dirs, out, labels=_csv(labels))
    except BlockCouplingError as err:
        _fail(err)
        return
    if not _STATE["quiet"]:
        typer.echo(f"wrote {path}")


@app.command()
def show(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """A short text summary of a run."""
    from blockcoupling.store.rundir import open_run

    try:
        typer.echo(open_run(run_dir).summary())
    except BlockCouplingError as err:
        _fail(err)


@app.command()
def models() -> None:
    """The architectures blockcoupling finds blocks in by itself."""
    from blockcoupling.engine.blocks import SUPPORTED_ARCHITECTURES

    width = max(map(len, SUPPORTED_ARCHITECTURES))
    for arch, desc in SUPPORTED_ARCHITECTURES.items():
        typer.echo(f"{arch:<{width}}  {desc}")
    typer.echo("\nAny other nn.Module: pass --blocks dotted.path.to.ModuleList (API: blocks_path=...).")


@app.command()
def demo(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for the demo's runs and report (default demo_run, or demo_run_quick).")] = None,
    quick: Annotated[bool, typer.Option("--quick/--no-quick", help="A much smaller demo (for tests).")] = False,
    cache_dir: Annotated[Path | None, typer.Option(help="Where trained demo checkpoints are cached.")] = None,
) -> None:
    """The offline demo: pretrained MiniLM vs random init, and a tiny LM across training."""
    from blockcoupling.studies.demo import run_demo

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = out or Path("demo_run_quick" if quick else "demo_run")
    try:
        path = run_demo(out, quick=quick, cache_dir=cache_dir, progress=not _STATE["quiet"])
    except BlockCouplingError as err:
        _fail(err)
        return
    typer.echo(f"report: {path}")
