"""The typer application and what every command shares (state, the error exit)."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure transformer block coupling, trajectories and spectra (Aubry et al., ICLR 2025).",
    pretty_exceptions_enable=False,
    # plain click help: flags read "--final-norm / --no-final-norm" (rich shows them as
    # "<bool>", which invites "--final-norm true"), and rich is not imported at start-up
    rich_markup_mode=None,
)

STATE = {"verbose": False, "quiet": False}


def fail(err: BaseException) -> None:
    """Print ``error: ...`` and exit 1 (``--verbose``: re-raise, for the traceback)."""
    if STATE["verbose"]:
        raise err
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(1)


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More output; tracebacks on errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    STATE["verbose"], STATE["quiet"] = verbose, quiet
