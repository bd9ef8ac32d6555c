"""The typer application and what every command shares (state, the error exit)."""

from __future__ import annotations

import contextlib
import signal
import warnings
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from blockcoupling.errors import BlockCouplingError
from blockcoupling.jsonsafe import dumps
from blockcoupling.validate import OptionError, one_value

__all__ = ["ADDRESS_HELP", "JSON_HELP", "STATE", "Group", "app", "deprecated", "echo_json", "fail",
           "guarded", "one_value", "plain_arguments", "print_plan", "user_errors"]

T = TypeVar("T")
#: CPUs of a local Ray cluster started by the command (sweep, vit-grid); a Ray task's own CPUs
#: are --cpus-per-run (vit-grid) or the spec's resources (sweep)
CLUSTER_CPUS_HELP = ("CPUs of the local Ray cluster started when there is none to connect to "
                     "(default: all); an existing cluster keeps its own.")
#: the Ray cluster of every command that runs on Ray (sweep, vit-grid, study generalization):
#: one rule, ``executor.connect_ray``
ADDRESS_HELP = ("Ray cluster to use: host:port, or ray://head:10001 (Ray Client). Default: as "
                "ray.init() does, RAY_ADDRESS, else the cluster `ray start` left on this node, "
                "else a new local one.")
#: the options of every command, accepted before or after the command's name
GLOBAL_FLAGS = ("-q", "--quiet", "-v", "--verbose")


#: click's usage error, whichever click typer uses (its own from typer 0.22, click before)
_UsageError: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class UsageLine(_UsageError):
    """Bad usage said in one line (``error: ...``, exit 2), as every other error is said:
    click's own (a missing option, a value that is not an int, an unknown option) and an
    option's check (`cli.options.checked`, a record's field) alike."""

    def show(self, file: Any = None) -> None:
        typer.echo(f"error: {self.format_message()}", err=True)


@contextlib.contextmanager
def _usage_in_one_line() -> Iterator[None]:
    """click's usage errors (usage, a hint and the message over four lines) as a `UsageLine`
    that names the command's help; the help printed for a bare group stays as it is."""
    try:
        yield
    except UsageLine:
        raise
    except _UsageError as err:
        if type(err).__name__ == "NoArgsIsHelpError":
            raise
        ctx = getattr(err, "ctx", None)
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        raise UsageLine(err.format_message() + where, ctx) from None


class _PlainArgument(TyperArgument):
    """A positional argument as a user reads it: its name in capitals (``RUN_DIRS...``,
    ``SPEC``; optional ones in brackets), without typer's ``{run_dirs}`` placeholder in the
    usage line nor the Python type (``<list[Path]>``) in the help; a missing one is named
    the same way."""

    def _label(self) -> str:
        return (self.metavar or self.name or "").upper()

    def _usage_display_name(self) -> str:
        label = self._label() if self.required else f"[{self._label()}]"
        return label + ("..." if self.nargs != 1 else "")

    def _rich_display_name(self) -> str:
        return self._label() + ("..." if self.nargs != 1 else "")

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    @property
    def display_name_raw(self) -> str:
        return self._label()


def plain_arguments(command: Any) -> Any:
    """``command`` with its positional arguments shown as `_PlainArgument` (in place; an
    argument has no state of its own beyond typer's, so its class is swapped)."""
    for param in getattr(command, "params", None) or ():
        if type(param) is TyperArgument:
            param.__class__ = _PlainArgument
    return command


class Group(TyperGroup):
    """The command group: ``-q`` / ``-v`` given after a command (``blockcoupling measure ...
    -q``) are taken as the global flags, as if given before it; the commands' arguments read
    as `_PlainArgument` (sub-groups too: give them ``cls=Group``); a usage error is one
    line (`UsageLine`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        flags = [a for a in args[:end] if _global_flags(a)]
        rest = [a for a in args[:end] if not _global_flags(a)]
        with _usage_in_one_line():
            return super().parse_args(ctx, flags + rest + args[end:])

    def invoke(self, ctx: Any) -> Any:
        with _usage_in_one_line():  # the command's own parsing, and a group's under it
            return super().invoke(ctx)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return plain_arguments(super().get_command(ctx, cmd_name))


def _global_flags(arg: str) -> bool:
    """Whether ``arg`` is global flags only: ``-q``, ``--verbose``, or short ones combined as
    click combines them before the command (``-qv``)."""
    short = {f[1] for f in GLOBAL_FLAGS if len(f) == 2}
    return arg in GLOBAL_FLAGS or (len(arg) > 2 and arg[0] == "-" and arg[1] != "-"
                                   and set(arg[1:]) <= short)


app = typer.Typer(
    cls=Group,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, ...)
    no_args_is_help=True,
    help="Measure transformer block coupling, trajectories and spectra (Aubry et al., ICLR 2025).",
    pretty_exceptions_enable=False,
    # plain click help: flags read "--final-norm / --no-final-norm" (rich shows them as
    # "<bool>", which invites "--final-norm true"), and rich is not imported at start-up
    rich_markup_mode=None,
)

STATE = {"verbose": False, "quiet": False}

#: kind -> the command-line run of a spec of that kind given to ``blockcoupling sweep``
#: (``runner(spec, out, *, executor, address, as_json, cluster_cpus)``), registered by the
#: kind's own command module (`spec_runner`); a kind without one is run by its registered
#: ``CollectionKind.run`` and ``sweep`` prints the collection's units
SPEC_RUNNERS: dict[str, Callable[..., None]] = {}


def spec_runner(kind: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register the decorated function as the command-line run of ``kind``'s specs."""
    def add(fn: Callable[..., None]) -> Callable[..., None]:
        SPEC_RUNNERS[kind] = fn
        return fn
    return add


def fail(err: BaseException) -> None:
    """Print ``error: ...`` and exit 1, or 2 for an option or a spec key that is refused
    (an `OptionError`: bad usage, as click's own); ``--verbose``: re-raise, for the
    traceback."""
    if STATE["verbose"]:
        raise err
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2 if isinstance(err, OptionError) else 1)


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
    """The body of every command: a [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] or an `OSError` (said
    as ``what: path: reason``) becomes one ``error:`` line and exit 1."""
    try:
        yield
    except BlockCouplingError as err:
        fail(err)
    except OSError as err:
        fail(os_error(err, what))


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"blockcoupling {version('blockcoupling')}")
        raise typer.Exit()


@contextlib.contextmanager
def guarded(*, saved: str, again: str = "run the same command again to continue",
            what: str = "cannot read or write a file") -> Iterator[None]:
    """The body of a command that does long work: `user_errors`, and Ctrl-C / SIGTERM
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
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More output (transformers' and Ray's info messages); tracebacks on errors. Also accepted after the command.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars and no library chatter (model loading, Ray); results and errors are still printed. Also accepted after the command.")] = False,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version, help="Print the version and exit.")] = False,
) -> None:
    from blockcoupling.progress import interactive
    from blockcoupling.verbosity import set_verbosity

    STATE["verbose"], STATE["quiet"] = verbose, quiet
    set_verbosity(quiet=quiet, verbose=verbose, terminal=interactive())
    if not verbose:  # a warning is one line, like an error (-v: Python's own, with the source)
        from blockcoupling.verbosity import warning_line

        warnings.showwarning = warning_line


#: ``--json`` on every command that prints results: the same flag, the same meaning
JSON_HELP = "Print the results as JSON on stdout instead of text (errors stay one line on stderr)."


def echo_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout (``--json``): the one dialect of every JSON
    output (``jsonsafe.dumps``; missing values null)."""
    typer.echo(dumps(obj))


def print_plan(plan: Any, as_json: bool) -> None:
    """A plan (``--dry-run`` of measure's sweeps and the studies): its ``to_dict()`` as JSON,
    or its ``describe()``."""
    if as_json:
        echo_json(plan.to_dict())
    else:
        typer.echo(plan.describe())


def deprecated(old: str, old_value: T | None, new: str, new_value: T | None) -> T | None:
    """The value of option ``new``, or of its deprecated alias ``old`` (with a warning on
    stderr); both given is a usage error."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise typer.BadParameter(f"{old} is the old name of {new}; give only {new}")
    typer.echo(f"warning: {old} is deprecated; use {new}", err=True)
    return old_value


class OldJsonForm(TyperCommand):
    """``--json FILE.json`` (before ``--json`` was the flag every command has) still writes
    FILE.json: it is read as ``--json-out FILE.json``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        args = list(args)
        for i, a in enumerate(args[:-1]):
            if a == "--json" and not args[i + 1].startswith("-") \
                    and args[i + 1].lower().endswith(".json"):
                args[i] = "--json-out"
        return super().parse_args(ctx, args)
