"""The typer application and what every command shares (state, the error exit)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Annotated

import typer

from blockcoupling.errors import BlockCouplingError

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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the work is, so that it unwinds like Ctrl-C."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill PID``, a batch scheduler's stop) ends a command like Ctrl-C: what is
    finished stays, locks are released, and the user is told how to continue."""
    def handler(signum: int, frame: object) -> None:
        raise Terminated

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. a test runner's worker): leave it
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def os_error(err: OSError, what: str) -> BlockCouplingError:
    """An operating-system error (a file or folder) as one line that says what to check."""
    where = f" {err.filename}" if err.filename else ""
    return BlockCouplingError(f"{what}:{where}: {err.strerror or err}; check the path and try again")


@contextlib.contextmanager
def user_errors(what: str = "cannot read or write a file") -> Iterator[None]:
    """The body of every command: a :class:`BlockCouplingError` or an :class:`OSError` (said
    as ``what: path: reason``) becomes one ``error:`` line and exit 1."""
    try:
        yield
    except BlockCouplingError as err:
        fail(err)
    except OSError as err:
        fail(os_error(err, what))


@contextlib.contextmanager
def guarded(*, saved: str, again: str = "run the same command again to continue",
            what: str = "cannot read or write a file") -> Iterator[None]:
    """The body of a command that does long work: :func:`user_errors`, and Ctrl-C / SIGTERM
    say what is ``saved`` and how to continue (``again``) and exit 130 / 143 (128 + the
    signal)."""
    try:
        with user_errors(what), sigterm_as_interrupt():
            yield
    except KeyboardInterrupt as stop:
        typer.echo(f"\ninterrupted: {saved}; {again}", err=True)
        raise typer.Exit(143 if isinstance(stop, Terminated) else 130) from None


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More output; tracebacks on errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    STATE["verbose"], STATE["quiet"] = verbose, quiet
