"""Config records declared once: each field's help, CLI flag, check and identity, in one place.

A config record (``MeasureConfig``, ``VitTrainConfig``, ``StudySpec``, ...) is a frozen
dataclass whose fields are made with `opt`. The field's metadata says

* ``help``: the text of its CLI option (and of the docs' reference page);
* ``cli``: its flag without the dashes (``"analysis-dtype"``), ``True`` for the field name with
  dashes, ``None``/``False`` when the field is not on the command line;
* ``parse``: ``parse(name, value) -> value`` for user input (a CLI string such as
  ``"10,30,50"``, a YAML value); a field without one takes its typed value as given;
* ``check``: a `validate.Rule` (``(validate.whole | validate.number | validate.choice | ...,
  bounds)``): the field's type and range, applied by `check_fields` (every record's
  ``__post_init__``; to each item of a tuple) and, on the command line, by click as the
  option is parsed (`check_value`); the message names the option;
* ``requires``: ``(other field, value)``: the field may be given only where ``other`` has
  that value (``init_seed`` needs ``init="random"``; `GIVEN`: any value but None,
  ``max_memory`` needs a ``device_map``): a rule between options, checked where the
  options given are known (`check_given`: the command line, `from_mapping` of a spec, a
  record's own fields that differ from their defaults), never dropped without a word;
* ``hashed``: whether the field enters the record's identity (`identity`): ``True``,
  ``False``, ``"if_set"`` (only when not ``None``: a field added later keeps every earlier
  hash) or ``"if_changed"`` (only when it differs from its default: a switch added later,
  such as a bool that is off by default, keeps every earlier hash).

From that one declaration come the CLI options (`cli_options`, made into click options by
``cli/options.py``), the YAML keys and their errors (`from_mapping`: an unknown key or
a bad value is one line naming the key and where it was), the validation
(`check_fields`) and the identity (`identity`, the payload of
``hashing.canonical_hash``). Pure functions; nothing of click or typer.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from blockcoupling import validate
from blockcoupling.errors import BlockCouplingError

__all__ = ["GIVEN", "FieldDoc", "OptionSpec", "changed", "check_fields", "check_given",
           "check_value", "cli_options", "field_docs", "from_mapping", "from_options",
           "identity", "is_record", "key_names", "opt", "option_name",
           "parse_given"]

_MISSING: Any = dataclasses.MISSING


class _Given:
    """`GIVEN`: the value of a ``requires`` that any value but None meets."""

    def __repr__(self) -> str:
        return "GIVEN"


#: ``requires=(field, GIVEN)``: the field may be given only where ``field`` is given too
GIVEN: Any = _Given()


def opt(default: Any = _MISSING, help: str = "", *, parse: Callable[[str, Any], Any] | None = None,
        cli: str | bool | None = None, hashed: bool | str = True,
        check: tuple[Callable[..., Any], dict[str, Any]] | None = None,
        requires: tuple[str, Any] | None = None,
        default_factory: Callable[[], Any] | None = None, **extra: Any) -> Any:
    """A dataclass field of a config record with its metadata (see the module docstring;
    ``extra`` keys are kept in the metadata for the record's own use)."""
    meta = {"help": help, "parse": parse, "cli": cli, "hashed": hashed, "check": check,
            "requires": requires, **extra}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _fields(cls: Any) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


#: set inside `key_names`: the prefix that names a field as a YAML key (``"models[0]."``)
_KEY_PREFIX: contextvars.ContextVar[str | None] = contextvars.ContextVar("key_prefix",
                                                                         default=None)


@contextlib.contextmanager
def key_names(prefix: str) -> Iterator[None]:
    """Inside: `check_fields` and `option_name` name a field as a YAML key, ``prefix`` +
    the field (``models[0].init_seed``), whatever naming the record asks for (a record
    that a CLI and a YAML file both make names its options as the one that made it)."""
    token = _KEY_PREFIX.set(prefix)
    try:
        yield
    finally:
        _KEY_PREFIX.reset(token)


def option_name(name: str, *, prefix: str = "", dashes: bool = True) -> str:
    """How a message names the field ``name``: ``prefix`` + the field with dashes
    (``--init-seed``) or as is (``dashes=False``); inside `key_names`, as its YAML key."""
    keyed = _KEY_PREFIX.get()
    if keyed is not None:
        return keyed + name
    return prefix + (name.replace("_", "-") if dashes else name)


def _apply(rule: tuple[Callable[..., Any], dict[str, Any]], value: Any, name: str) -> Any:
    """``rule`` applied to ``value`` (to each item of a tuple or a list: ``k=(10, 30)``)."""
    fn, bounds = rule
    if isinstance(value, (tuple, list)):
        return type(value)(validate.optional(fn, v, name, **bounds) for v in value)
    return validate.optional(fn, value, name, **bounds)


def check_fields(record: Any, *, prefix: str = "", dashes: bool = True) -> None:
    """Apply every field's ``check`` (None passes; a tuple item by item); whole numbers
    written as floats (``5.0``) become ints. The message names the option with dashes
    (``train-limit``, a CLI flag) or, ``dashes=False``, as the field (``num_cpus``, a YAML
    key), after ``prefix`` (`option_name`: inside `key_names`, as a YAML key)."""
    for f in _fields(record):
        rule = f.metadata.get("check")
        if rule is None:
            continue
        value = _apply(rule, getattr(record, f.name),
                       option_name(f.name, prefix=prefix, dashes=dashes))
        if rule[0] is validate.whole:
            object.__setattr__(record, f.name, value)


def check_value(cls: Any, name: str, raw: Any, label: str) -> Any:
    """The user's value ``raw`` of field ``name`` of ``cls`` (a CLI string, a YAML value)
    parsed by the field's parser and checked by its rule, alone (the rules between fields
    are the record's); a refusal is an `validate.OptionError` naming ``label`` (``--seed``):
    what the command line runs as it parses each option."""
    f = {f.name: f for f in _fields(cls)}[name]
    parser, rule = f.metadata.get("parse"), f.metadata.get("check")
    try:
        value = parser(label, raw) if parser is not None else raw
    except validate.OptionError:
        raise
    except BlockCouplingError as err:  # a parser's refusal is the option's
        raise validate.OptionError(str(err)) from err
    return _apply(rule, value, label) if rule is not None else value


def check_given(cls: Any, given: Mapping[str, Any], values: Mapping[str, Any], *,
                prefix: str = "", dashes: bool = True) -> None:
    """The rules between options of ``cls`` that depend on what the user gave (``given``:
    field -> value, what a command line or a spec file named): a field with ``requires``
    given where its other field has another value (``values``: the record's) is an
    `validate.OptionError` naming both as the user wrote them (`option_name`)."""
    for f in _fields(cls):
        need = f.metadata.get("requires")
        if need is None or f.name not in given:
            continue
        other, wanted = need
        met = values.get(other) is not None if wanted is GIVEN else values.get(other) == wanted
        if not met:
            def name(field: str) -> str:
                return option_name(field, prefix=prefix, dashes=dashes)

            is_key = _KEY_PREFIX.get() is not None or not dashes  # a spec's key: "init: random"
            need_ = name(other) if wanted is GIVEN else \
                f"{name(other)}{': ' if is_key else ' '}{wanted}"
            raise validate.OptionError(f"{name(f.name)} applies with {need_} only; give "
                                       f"{need_} too, or drop {name(f.name)}")


def changed(record: Any) -> dict[str, Any]:
    """The fields of ``record`` that differ from their defaults (what a record made in
    Python was given, for `check_given`)."""
    out = {}
    for f in _fields(record):
        factory: Any = f.default_factory
        default = f.default if f.default is not _MISSING else (
            factory() if factory is not _MISSING else _MISSING)
        if getattr(record, f.name) != default:
            out[f.name] = getattr(record, f.name)
    return out


def from_mapping(cls: Any, data: Any, where: str = "", *, base: Any = None,
                 parse: bool = True, skip: tuple[str, ...] = ()) -> Any:
    """A record of ``cls`` from a mapping (a YAML section, keyword values), on top of
    ``base`` (default: the field defaults). Unknown keys, a value its field's parser refuses,
    and a record that does not validate are one [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] line that names
    the key and ``where`` it was (``"measure"``, ``"runs[2]"``); ``parse=False`` takes the
    values as typed; the rules between the keys given are checked (`check_given`)."""
    pre = f"{where}: " if where else ""
    if not isinstance(data, Mapping):
        raise validate.OptionError(f"{pre}give a mapping of {_names(cls, skip)}, not {data!r}")
    names = [f.name for f in _fields(cls) if f.name not in skip]
    unknown = [str(k) for k in data if k not in names]
    if unknown:
        raise validate.OptionError(f"{pre}unknown key {unknown[0]!r}; known: {', '.join(names)}")
    if base is None:
        missing = [f.name for f in _fields(cls) if f.name not in skip and f.name not in data
                   and f.default is _MISSING and f.default_factory is _MISSING]
        if missing:
            raise validate.OptionError(f"{pre}missing key{'s' * (len(missing) > 1)} "
                                       f"{', '.join(missing)}; known: {', '.join(names)}")
    try:
        values = parse_given(cls, data) if parse else dict(data)
        record = dataclasses.replace(base, **values) if base is not None else cls(**values)
        check_given(cls, data, {f.name: getattr(record, f.name) for f in _fields(cls)},
                    dashes=False)
        return record
    except BlockCouplingError as err:  # a spec's key: refused as an option is
        kind = type(err) if isinstance(err, validate.OptionError) else validate.OptionError
        if not pre and kind is type(err):
            raise
        raise kind(f"{pre}{err}") from err
    except TypeError as err:  # a missing required field
        raise validate.OptionError(f"{pre}{err}; known keys: {', '.join(names)}") from err


def from_options(cls: Any, given: Mapping[str, Any], **fixed: Any) -> Any:
    """The record of the command-line options ``given`` (field -> value as typed, parsed by
    the fields' parsers) and the ``fixed`` values the command sets itself, with the rules
    between options that depend on what was given (`check_given`, named as flags)."""
    record = cls(**parse_given(cls, given), **fixed)
    check_given(cls, given, {f.name: getattr(record, f.name) for f in _fields(cls)},
                prefix="--")
    return record


def parse_given(cls: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (field -> user input, e.g. a CLI's raw strings) with each value of a field
    that has a parser parsed by it; the others as given."""
    by_name = {f.name: f for f in _fields(cls)}
    out = {}
    for key, value in values.items():
        parser = by_name[key].metadata.get("parse") if key in by_name else None
        out[key] = parser(key, value) if parser is not None else value
    return out


def _names(cls: Any, skip: tuple[str, ...]) -> str:
    return ", ".join(f.name for f in _fields(cls) if f.name not in skip)


def identity(record: Any, plain: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fields of ``record`` that enter its identity hash, by name, as plain data
    (``plain``: the record's own JSON form, e.g. ``to_dict()``; default ``asdict``)."""
    data = dict(plain) if plain is not None else dataclasses.asdict(record)
    out = {}
    for f in _fields(record):
        hashed = f.metadata.get("hashed", True)
        if hashed is True or (hashed == "if_set" and data[f.name] is not None) or (
                hashed == "if_changed" and data[f.name] != f.default):
            out[f.name] = data[f.name]
    return out


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One generated CLI option: the field, its flag, its help, and how it is typed."""

    name: str            # the record's field (and the command's parameter name)
    flag: str            # "--analysis-dtype"
    help: str
    annotation: Any      # bool | None (a --x/--no-x flag), str | None (raw, parsed), int | None ...
    is_flag: bool
    metavar: str | None = None  # how the help names the value (``<int>`` for a parsed int)
    #: the field's own check of one value as the user gave it (`check_value`, named by the
    #: flag): the command line runs it as it parses the option
    check: Callable[[Any], Any] | None = None
    #: the field's range rule (``(fn, bounds)``), for what reads the options (tests, docs)
    rule: tuple[Callable[..., Any], dict[str, Any]] | None = None
    #: ``(other field, value)``: the option applies only where that field has that value
    requires: tuple[str, Any] | None = None


def _plain_type(tp: Any) -> Any:
    """``int | None`` -> int; ``str | bool | None`` -> str; a tuple or anything else -> str."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] \
        if typing.get_origin(tp) in (typing.Union, types.UnionType) else [tp]
    for candidate in (str, float, int, bool):
        if candidate in args and (candidate is not bool or len(args) == 1):
            return candidate
    return str


def cli_options(cls: Any, *, exclude: tuple[str, ...] = (),
                render: Callable[[str, Any], str] | None = None,
                help_overrides: Mapping[str, str] | None = None) -> list[OptionSpec]:
    """The CLI options of every field of ``cls`` with a ``cli`` flag (not in ``exclude``).

    A field with a parser takes a raw string (``None`` = not given); any other takes its
    type (``int``, ``float``, ``str``; a bool is ``--x/--no-x``). Every option defaults to
    ``None`` so that an option not given leaves the record's default (or a recipe's value);
    the record's default is shown in the help as ``[default: X]`` (``render(name, value)``
    writes it, ``None`` included; without ``render`` a default of ``None`` is not shown)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in _fields(cls):
        cli = f.metadata.get("cli")
        if not cli or f.name in exclude:
            continue
        flag = _flag(f)
        help_ = (help_overrides or {}).get(f.name, f.metadata.get("help", ""))
        plain = _plain_type(hints[f.name])
        is_flag = plain is bool and f.metadata.get("parse") is None or isinstance(f.default, bool)
        metavar = None
        if f.metadata.get("parse") is not None and not is_flag:
            # a raw string for the field's parser; the help names the field's own type
            metavar = f"<{plain.__name__}>" if plain in (int, float) else None
            plain = str
        default = f.default if f.default is not _MISSING else None
        if not is_flag and (default is not None or render is not None):
            shown = render(f.name, default) if render else str(default)
            help_ = f"{help_} [default: {shown}]"
        check = None if is_flag else functools.partial(check_value, cls, f.name, label=flag)
        out.append(OptionSpec(f.name, flag, help_, bool if is_flag else plain, is_flag,
                              metavar, check, f.metadata.get("check"),
                              f.metadata.get("requires")))
    return out


def _flag(f: dataclasses.Field[Any]) -> str:
    """A field's CLI flag (``--analysis-dtype``); the field has a ``cli`` entry."""
    cli = f.metadata.get("cli")
    return "--" + (f.name.replace("_", "-") if cli is True else str(cli))


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """What a user reads of one field of a config record (the API reference's table)."""

    name: str
    type: str      # as annotated, ``X | None`` written ``X or None``
    default: str | None  # Python, as written (``(10, 30, 50)``, ``torch.float32``); None: required
    help: str
    flag: str | None  # its CLI flag, None when it is not on the command line


def is_record(cls: Any) -> bool:
    """Whether ``cls`` is a config record (a dataclass with fields made by `opt`)."""
    return (isinstance(cls, type) and dataclasses.is_dataclass(cls)
            and any("hashed" in f.metadata for f in _fields(cls)))


def _written(value: Any) -> str:
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value)  # torch.float32
    if isinstance(value, float) and value == float("inf"):
        return 'float("inf")'
    return repr(value)


def field_docs(cls: Any) -> list[FieldDoc]:
    """Each field of the record ``cls``: its name, type, default, help and CLI flag."""
    out = []
    for f in _fields(cls):
        tp = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        default: str | None = None  # required
        if f.default_factory is not _MISSING:
            default = _written(f.default_factory())  # type: ignore[operator]
        elif f.default is not _MISSING:
            default = _written(f.default)
        out.append(FieldDoc(f.name, tp.replace(" | ", " or "), default,
                            str(f.metadata.get("help", "")),
                            _flag(f) if f.metadata.get("cli") else None))
    return out
