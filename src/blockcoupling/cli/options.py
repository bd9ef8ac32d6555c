"""Options checked where they are declared: a record's fields made into a command's options,
and a command's own options given their rule.

``measure`` takes one option per exposed [`MeasureConfig`][blockcoupling.engine.config.MeasureConfig]
field and one per [`ModelSource`][blockcoupling.loading.ModelSource] field (its loading
options; ``perturb`` a part of them), ``vit-train`` and ``vit-grid`` one per
[`VitTrainConfig`][blockcoupling.studies.vit.train.VitTrainConfig] field: the flag, the help,
the default and the check come from the record, never restated here.

Every option is checked as click parses it, before the command's body runs (so before
anything is read, loaded or written): a generated option by its field's parser and rule
(`fields.check_value`), a command's own option by the `validate.Rule` it declares
(`checked`); then the records are built from the options given (`Record.build`: the rules
between a record's fields, ``requires``) and the command's exclusive options are compared
(`record_command`'s ``exclusive``). A refusal is one line, ``error: ...``, and exit 2
(`cli.app.UsageLine`), as click's own usage errors; ``--dry-run`` goes through the same
parsing, so it refuses what the run refuses.

The options are added the first time a command's parameters are needed (parsing its
arguments or printing its help), not at import: the records' modules import torch, and
``blockcoupling --help`` or another command must not pay for it. The values given reach the
command through the click context: `given_options` (field -> value, options not given
left out) and `given_record` (the record built from them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from blockcoupling import validate
from blockcoupling.cli.app import ADDRESS_HELP, CLUSTER_CPUS_HELP, JSON_HELP, UsageLine
from blockcoupling.errors import BlockCouplingError

_KEY = "blockcoupling.config_options"
_RECORDS = "blockcoupling.records"
_SEP = "__"  # click parameter names of generated options: GROUP__FIELD (a field may share a
#             command's name, or another record's: MeasureConfig's and ModelSource's dtype)


def _refuse(err: BlockCouplingError, ctx: Any) -> UsageLine:
    return UsageLine(str(err), ctx)


def _callback(check_one: Callable[[Any, str], Any], resolve: Callable[[], Any]
              ) -> Callable[..., Any]:
    """A click callback that runs ``check_one(value, flag)`` on the value given (each item
    of a list option) as it is parsed; the value passes on as given. ``resolve()`` returns
    the option's `validate.Rule` (kept on the callback for what reads the options: the
    option test)."""
    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is None:
            return value
        try:
            for v in value if isinstance(value, (list, tuple)) else [value]:
                check_one(v, param.opts[0])
        except BlockCouplingError as err:
            raise _refuse(err, ctx) from None
        return value

    check.resolve = resolve  # type: ignore[attr-defined]
    return check


def checked(rule: Any) -> Callable[..., Any]:
    """The click callback of a command's own option that applies ``rule`` (a
    `validate.Rule`: ``validate.SEED``, ``validate.COUNT``, ...; or a function of no
    argument that returns one, where its module would be slow to import at start-up) to its
    value as it is parsed, named by the option's flag."""
    def resolve() -> Any:
        return rule if isinstance(rule, validate.Rule) else rule()

    return _callback(lambda value, flag: resolve()(value, flag), resolve)


#: options several commands share, declared once (typer copies an ``Annotated`` option per use)
JsonFlag = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
ModelOption = Annotated[str, typer.Option("--model", "-m", help="Hub id or local model folder.")]
PromptsOption = Annotated[str, typer.Option("--prompts", help="File (.txt/.jsonl/.csv), builtin:NAME, hf:DATASET or protocol:paper[@DIR].")]
LimitOption = Annotated[int | None, typer.Option(help="Use at most this many prompts (seeded subset).", callback=checked(validate.COUNT))]
AddressOption = Annotated[str | None, typer.Option(help=ADDRESS_HELP)]
ClusterCpusOption = Annotated[int | None, typer.Option(help=CLUSTER_CPUS_HELP, callback=checked(validate.COUNT))]
NBootOption = Annotated[int, typer.Option("--n-boot", help="Bootstrap resamples for the CI of R^2 (0: no interval).", callback=checked(validate.N_BOOT))]
BootSeedOption = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap.", callback=checked(validate.SEED))]

def checked_field(where: Callable[[], tuple[Any, str]], *, listed: bool = False
                  ) -> Callable[..., Any]:
    """The click callback of a command's own option that is a record's field (``where()``:
    ``(record class, field name)``, imported when first used): the field's parser and rule
    (`fields.check_value`) on the value as it is parsed, named by the option's flag;
    ``listed``: the option takes comma-separated values of the field, each checked."""
    def check_one(value: Any, flag: str) -> Any:
        from blockcoupling.fields import check_value

        cls, name = where()
        items = [v.strip() for v in str(value).split(",") if v.strip()] if listed else [value]
        return [check_value(cls, name, v, flag) for v in items]

    def resolve() -> Any:
        import dataclasses

        cls, name = where()
        return {f.name: f for f in dataclasses.fields(cls)}[name].metadata.get("check")

    return _callback(check_one, resolve)


def _field_callback(option: Any) -> Callable[..., Any]:
    """The click callback of a generated option: its field's parser and rule
    (``OptionSpec.check``) on the value as given; the value passes on as given (the record
    is built from it)."""
    def check_one(value: Any, flag: str) -> Any:
        return option.check(value) if option.check is not None else value

    check = _callback(check_one, lambda: option.rule)
    check.requires = option.requires  # type: ignore[attr-defined]
    return check


def option_parameters(options: list[Any]) -> list[inspect.Parameter]:
    """typer-annotated keyword parameters (default None) for ``options``
    (``fields.OptionSpec``): a generated signature that ``typer`` turns into click options,
    each checked as it is parsed (`_field_callback`)."""
    params = []
    for o in options:
        if o.is_flag:
            info = typer.Option(f"{o.flag}/--no-{o.flag.removeprefix('--')}", help=o.help)
        else:
            info = typer.Option(o.flag, help=o.help, metavar=o.metavar,
                                callback=_field_callback(o))
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[o.annotation | None, info]))
    return params


@dataclass(frozen=True)
class Record:
    """A record's options in a command: ``options()`` (its fields' ``OptionSpec`` list) and
    ``build(params, given)``, the record made from the command's parameters and the options
    given (field -> value), before the command's body runs (`given_record` reads it)."""

    options: Callable[[], list[Any]]
    build: Callable[[Mapping[str, Any], dict[str, Any]], Any] | None = None


def _given(ctx: Any, name: str, given: Mapping[str, dict[str, Any]]) -> bool:
    """Whether the user gave the command's parameter ``name`` (or, for a record group, any
    of its options)."""
    if name in given:
        return bool(given[name])
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _flag(ctx: Any, name: str, given: Mapping[str, dict[str, Any]]) -> str:
    """How the user writes the parameter ``name`` (``--spec``; a group: the first of its
    options given, ``--epochs``)."""
    wanted = f"{name}{_SEP}{next(iter(given[name]))}" if given.get(name) else name
    for p in ctx.command.get_params(ctx):
        if p.name == wanted:
            return str(p.opts[0])
    return name


def record_command(load: Callable[[], list[Any]] | Record | None = None, *,
                   exclusive: Mapping[str, tuple[str, ...]] | None = None,
                   requires: Mapping[str, tuple[str, Any]] | None = None,
                   base: type[TyperCommand] = TyperCommand,
                   **groups: Callable[[], list[Any]] | Record) -> type[TyperCommand]:
    """A command class (on ``base``) that adds the options of ``load`` (the group
    ``config``) and of each of ``groups`` (group name -> its options: a loader of
    ``fields.OptionSpec`` or a `Record`, e.g. ``source=`` a `ModelSource`'s) to the
    command's own, in that order. ``exclusive``: parameter -> the parameters (or groups) it
    excludes (``{"spec": ("quick",)}``: a design file or the built-in quick one, not both);
    ``requires``: parameter -> ``(other, value)``, the parameter applies only where the
    other has that value or none was given (``{"address": ("executor", "ray")}``: a Ray
    cluster's address means nothing to ``--executor local``). Rules between options declared
    with the command, never a silent drop."""
    loads = {group: g if isinstance(g, Record) else Record(g) for group, g in
             (dict(groups) | ({"config": load} if load is not None else {})).items()}
    rules = dict(exclusive or {})
    needs = dict(requires or {})

    class RecordCommand(base):  # type: ignore[misc, valid-type]
        _added = False
        #: the rules between the command's options (read by the option test)
        exclusive = rules
        requires = needs

        def _load(self) -> None:
            if self._added or not loads:
                return
            params = [p.replace(name=f"{group}{_SEP}{p.name}")
                      for group, rec in loads.items() for p in option_parameters(rec.options())]

            def options() -> None:  # typer builds the click options from this signature
                return None

            options.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
            options.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
            scratch = typer.Typer(add_completion=False)
            scratch.command()(options)
            self.params.extend(typer.main.get_command(scratch).params)
            self._added = True

        def get_params(self, ctx: Any) -> list[Any]:
            self._load()
            return super().get_params(ctx)

        def invoke(self, ctx: Any) -> Any:
            self._load()
            given: dict[str, dict[str, Any]] = {group: {} for group in loads}
            for k in [k for k in ctx.params if _SEP in k and k.partition(_SEP)[0] in loads]:
                group, _, name = k.partition(_SEP)
                value = ctx.params.pop(k)
                if value is not None:
                    given[group][name] = value
            for name, others in rules.items():
                clash = [o for o in others if _given(ctx, o, given)]
                if _given(ctx, name, given) and clash:
                    raise UsageLine(f"{_flag(ctx, name, given)} and "
                                    f"{_flag(ctx, clash[0], given)} exclude each other: give "
                                    "one of them", ctx)
            for name, (other, wanted) in needs.items():
                value = ctx.params.get(other)
                if _given(ctx, name, given) and value is not None and value != wanted:
                    flag, by = _flag(ctx, name, given), _flag(ctx, other, given)
                    raise UsageLine(f"{flag} applies with {by} {wanted} only (not {by} "
                                    f"{value}); give {by} {wanted}, or drop {flag}", ctx)
            ctx.meta[_KEY] = given
            records = {}
            for group, rec in loads.items():
                if rec.build is not None:
                    try:
                        records[group] = rec.build(ctx.params, given[group])
                    except BlockCouplingError as err:
                        raise _refuse(err, ctx) from None
            ctx.meta[_RECORDS] = records
            return super().invoke(ctx)

    return RecordCommand


def given_options(ctx: typer.Context, group: str = "config") -> dict[str, Any]:
    """The generated options of ``group`` the user gave: field name -> value (``None``: not
    given, left out)."""
    return dict(ctx.meta.get(_KEY, {}).get(group, {}))


def given_record(ctx: typer.Context, group: str = "config") -> Any:
    """The record of ``group`` built from the options given (`Record.build`), checked
    before the command's body ran."""
    return ctx.meta[_RECORDS][group]
