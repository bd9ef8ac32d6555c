"""Commands on one model and its runs: ``measure``, ``report``, ``show``, ``models``, ``demo``."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import app
from blockcoupling.cli.app import fail as _fail
from blockcoupling.errors import BlockCouplingError


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, so that it unwinds like Ctrl-C."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill PID``, a batch scheduler's stop) ends a measure like Ctrl-C: the parts
    already written stay, the lock is released, and the user is told how to continue."""
    def handler(signum: int, frame: object) -> None:
        raise _Terminated

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. a test runner's worker): leave it
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _os_error(err: OSError, what: str) -> BlockCouplingError:
    """An operating-system error outside the run store (model or prompt files), as one line."""
    where = f" {err.filename}" if err.filename else ""
    return BlockCouplingError(f"{what}:{where}: {err.strerror or err}; check the path and try again")


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
    final_norm: Annotated[bool, typer.Option("--final-norm", help="Fold the final norm into the last block.")] = False,
    method: Annotated[str, typer.Option(help="auto, dense or matrix-free.")] = "auto",
    influence: Annotated[bool, typer.Option("--influence", help="Cross-token influence on the last token.")] = False,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 8,
    limit: Annotated[int | None, typer.Option(help="Use at most this many prompts (seeded subset).")] = None,
    prompt_column: Annotated[str | None, typer.Option(help="Text column of a .csv/.jsonl prompt file.")] = None,
    split: Annotated[str | None, typer.Option(help="Dataset split for hf: prompts.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for prompt subsets and randomized SVDs.")] = 0,
    blocks: Annotated[str | None, typer.Option(help="Dotted path to the list of blocks (custom models).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --out.")] = False,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code")] = False,
) -> None:
    """Measure a model on a prompt set and write a resumable run directory."""
    from blockcoupling.engine.config import VARIANTS, MeasureConfig
    from blockcoupling.loading import load_model
    from blockcoupling.prompts.sources import load_prompts
    from blockcoupling.store.record import measure_to_dir

    try:
        _check_out(out, resume)
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
                              trust_remote_code=trust_remote_code, require_tokenizer=True,
                              progress=not _STATE["quiet"])
        meta = {"model": model, "revision": revision, "prompts_spec": prompts}
        with _sigterm_as_interrupt():
            result = measure_to_dir(net, tok, items, out, meta=meta, prompts_spec=prompts,
                                    resume=resume, progress=not _STATE["quiet"], config=cfg)
    except KeyboardInterrupt as stop:
        typer.echo(f"\ninterrupted: finished prompts are saved in {out}; "
                   "continue with the same command and --resume", err=True)
        # the shell's convention: 128 + the signal's number
        raise typer.Exit(143 if isinstance(stop, _Terminated) else 130) from None
    except BlockCouplingError as err:
        _fail(err)
        return
    except OSError as err:
        _fail(_os_error(err, "cannot read or write a file"))
        return
    if not _STATE["quiet"]:
        typer.echo(result.summary())
        typer.echo(f"wrote {out}")


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


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories, or one sweep directory (emergence report).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    labels: Annotated[str | None, typer.Option(help="Comma-separated labels, one per run.")] = None,
) -> None:
    """Write one self-contained HTML report (plus PNG/SVG/PDF figures) from stored runs."""
    from blockcoupling.report.html import write_report_from_dirs
    from blockcoupling.studies.sweep.store import is_sweep_dir

    try:
        if len(run_dirs) == 1 and is_sweep_dir(run_dirs[0]):  # a sweep or monitor directory
            from blockcoupling.report.emergence import write_emergence_report

            path = write_emergence_report(run_dirs[0], out)
        else:
            path = write_report_from_dirs(run_dirs, out, labels=_csv(labels))
    except BlockCouplingError as err:
        _fail(err)
        return
    except OSError as err:
        _fail(_os_error(err, "cannot write the report"))
        return
    if not _STATE["quiet"]:
        typer.echo(f"wrote {path}")


@app.command()
def show(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """A short text summary of a run; says whether it is complete ("2 of 3 prompts")."""
    from blockcoupling.store.reader import open_run, run_progress

    try:
        progress = run_progress(run_dir)
        summary = open_run(run_dir).summary()
    except BlockCouplingError as err:
        _fail(err)
        return
    typer.echo(f"status: {progress.describe(run_dir)}")
    typer.echo(summary)


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
    quick: Annotated[bool, typer.Option("--quick", help="A much smaller demo (for tests).")] = False,
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
