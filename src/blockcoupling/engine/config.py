"""MeasureConfig: every option of `blockcoupling.engine.measure`, as one typed record.

Two steps, kept apart:

* [`MeasureConfig.parse`][blockcoupling.engine.config.MeasureConfig.parse] (and `parse_config`) turns *user input* into a record:
  CLI strings such as ``"10,30,50"``, ``"1,2,inf"``, ``"last"``, ``"0,5,-1"``, ``"9..16"``,
  ``"none"``, or Python keyword values (``k=10``, ``p=(1, 2, "inf")``, ``dtype="float64"``).
* ``MeasureConfig(...)`` itself is strict: every field must already have its declared type
  (``k: tuple[int, ...]``, ``p: tuple[float, ...]``, ``dtype: torch.dtype``, ...; an ``int``
  is accepted where a ``float`` is declared, as in the typing rules). A string where a tuple
  is declared is an error that points to ``parse``. The record only canonicalises order
  (``k`` sorted and de-duplicated, ``p`` as floats) and validates the values.

Each field is declared once with ``blockcoupling.fields.opt``: help text, CLI flag, parser and
whether it is hashed; the ``measure`` command builds its options from that metadata
(`measure_options`), a sweep spec's ``measure:`` keys are the field names, and the raw
values go to [`MeasureConfig.parse`][blockcoupling.engine.config.MeasureConfig.parse], so there is no second list of options to keep in step.

[`MeasureConfig.config_hash`][blockcoupling.engine.config.MeasureConfig.config_hash] is the record's identity: a sha256 over a canonical JSON of
every field that can change a stored number (which fields are in, and why, is in
``docs/conventions.md``, "Configuration identity").

The keyword names are the public contract of DEFINITIONS.md (``coupling``, ``k``, ``tokens``,
``p``, ``dtype``, ...). A record round-trips through JSON (``to_dict`` / ``from_dict``) so a run
directory's manifest can rebuild it.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch

from blockcoupling import validate
from blockcoupling.engine.names import (
    HASHED_VARIANTS,
    KINDS,
    METHODS,
    ORIENTATIONS,
    VALID_P,
    VARIANTS,
)
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import OptionSpec, check_fields, cli_options, identity, opt, parse_given
from blockcoupling.hashing import canonical_hash
from blockcoupling.validate import OptionError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
HASH_VERSION = "measure-config-v1"

TokenSpec = Literal["auto", "cls", "last", "all"] | tuple[int, ...]
LayerSpec = tuple[int, ...] | None


# ---------------------------------------------------------------------------- parsers
def _bad(name: str, value: Any, hint: str) -> OptionError:
    return OptionError(f"{name}={value!r}: {hint}")


def _items(name: str, value: Any) -> tuple[Any, ...]:
    """A comma-separated string, a scalar or an iterable -> a tuple of raw items (not empty)."""
    if isinstance(value, str):
        out: tuple[Any, ...] = tuple(v.strip() for v in value.split(",") if v.strip())
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        out = tuple(value)
    else:
        out = (value,)
    if not out:
        raise _bad(name, value, "the list is empty; give at least one value")
    return out


def _int(name: str, v: Any, whole: Any) -> int:
    """One whole number from an int, an integral float or a numeric string (not 4.7, not 'abc')."""
    if isinstance(v, bool):
        raise _bad(name, whole, "give whole numbers, not True/False")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
    raise _bad(name, whole, f"{v!r} is not a whole number; give integers such as 10,30,50")


def parse_ints(name: str, value: Any) -> tuple[int, ...]:
    return tuple(_int(name, v, value) for v in _items(name, value))


def parse_strs(name: str, value: Any) -> tuple[str, ...]:
    out = []
    for v in _items(name, value):
        if not isinstance(v, str):
            raise _bad(name, value, f"{v!r} is not a name")
        out.append(v.strip())
    return tuple(out)


def parse_kinds(name: str, value: Any) -> tuple[str, ...]:
    """Coupling kinds; ``"none"`` or an empty string/sequence = no coupling (trajectories only)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return ()
    if isinstance(value, (tuple, list)) and not value:
        return ()
    return parse_strs(name, value)


def parse_p(name: str, value: Any) -> tuple[float, ...]:
    out = []
    for v in _items(name, value):
        if isinstance(v, str) and v.strip().lower() in ("inf", "infinity", "max"):
            out.append(math.inf)
            continue
        if isinstance(v, bool):
            raise _bad(name, value, "the normalising norm is p = 1, 2 or inf")
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            raise _bad(name, value, "the normalising norm is p = 1, 2 or inf") from None
    return tuple(out)


def parse_layers(spec: Any, name: str = "layers") -> LayerSpec:
    """``None``/``"all"`` (all layers), ``"9..16"`` (inclusive, 1-based), ``"3,5,7"`` or ints."""
    if spec is None or (isinstance(spec, str) and spec.strip() in ("", "all")):
        return None
    if isinstance(spec, str) and ".." in spec:
        lo, _, hi = spec.strip().partition("..")
        try:
            a, b = int(lo), int(hi)
        except ValueError:
            raise _bad(name, spec, "write a range as A..B with whole numbers, e.g. 9..16") from None
        if b < a:
            raise _bad(name, spec, "the range is empty (B < A)")
        return tuple(range(a, b + 1))
    return parse_ints(name, spec)


def parse_tokens(spec: Any, name: str = "tokens") -> TokenSpec:
    """``"auto"`` ([CLS] where the model has one, else the last token), ``"cls"``, ``"last"``,
    ``"all"``, or explicit 0-based positions (negative counts from the end)."""
    if isinstance(spec, str) and spec.strip() in ("auto", "cls", "last", "all"):
        return spec.strip()  # type: ignore[return-value]
    try:
        return parse_ints(name, spec)
    except BlockCouplingError:
        raise _bad(name, spec, "use 'auto', 'cls', 'last', 'all' or comma-separated positions "
                               "such as 0,3,-1") from None


def parse_dtype(name: str, value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    key = str(value).strip().removeprefix("torch.")
    if key not in DTYPES:
        raise _bad(name, value, "the analysis runs in float32 or float64")
    return DTYPES[key]


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise _bad(name, value, "give true or false")


def parse_int(name: str, value: Any) -> int:
    return _int(name, value, value)


def parse_opt_int(name: str, value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    return _int(name, value, value)


def parse_opt_float(name: str, value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, bool):
        raise _bad(name, value, "give a number or none")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _bad(name, value, "give a number or none") from None


def parse_opt_str(name: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if not isinstance(value, str):  # a mapping or a list is not a name (never its str())
        raise _bad(name, value, "give a name (text) or none")
    return value.strip()


def parse_opt_bool(name: str, value: Any) -> bool | None:
    """``None`` / ``"auto"`` (discovered from the model), else a boolean."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "auto")):
        return None
    return parse_bool(name, value)


def parse_method(name: str, value: Any) -> str:
    return str(value).strip().replace("-", "_")


def parse_window(name: str, value: Any) -> tuple[int, int] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    layers = parse_layers(value, name) if isinstance(value, str) else parse_ints(name, value)
    if layers is None or len(layers) < 2:
        raise _bad(name, value, "give the figure window as A..B")
    return (layers[0], layers[-1])


def _opt(default: Any, help: str, parse: Callable[[str, Any], Any], *, cli: str | None = None,
         hashed: bool | str = True, check: validate.Rule | None = None) -> Any:
    """A config field (`blockcoupling.fields.opt`): its default, help text, parser, CLI
    flag (None = not on the CLI), its check (a `validate.Rule`, each item of a tuple) and
    whether it enters [`MeasureConfig.config_hash`][blockcoupling.engine.config.MeasureConfig.config_hash]
    (``"if_set"``: only when not None, so that adding the field kept every earlier hash)."""
    return opt(default, help, parse=parse, cli=cli, hashed=hashed, check=check)


def _layer(value: Any, name: str) -> int:
    """A layer number: 1-based (layer l = block l)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} {value!r}: layers are numbered from 1 (layer l = block l)")
    return value


def _odd_window(value: Any, name: str) -> int:
    """The line-shape-score window: centred, so odd, and at least 3."""
    width = validate.whole(value, name, minimum=3)
    if width % 2 == 0:
        raise OptionError(f"{name}={width}: the window is centred, so give an odd width >= 3 "
                          "(the paper uses 11)")
    return width


def _analysis_device(value: Any, name: str) -> str:
    """Where the Jacobian work runs: a device this torch has (`validate.device_name`); not
    ``auto`` (leave the option out: the work then runs with each block)."""
    if value == "auto":
        raise OptionError(f"{name} auto: leave it out (the analysis then runs with each "
                          "block) or name a device such as cpu or cuda")
    return validate.device_name(value, name)


def _choose(choices: Iterable[Any], hint: str = "") -> validate.Rule:
    return validate.rule(validate.choice, choices=tuple(choices), hint=hint)


# ---------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class MeasureConfig:
    """What to measure and how. See DEFINITIONS.md for the mathematics of each option."""

    coupling: tuple[str, ...] = _opt(
        ("depth",), "Coupling kinds: depth,self,fixed_input,fixed_output (or none).",
        parse_kinds, cli="coupling", check=_choose(KINDS))
    k: tuple[int, ...] = _opt((10, 30, 50), "Top-K sizes, e.g. 10,30,50.", parse_ints, cli="k",
                              check=validate.COUNT)
    tokens: TokenSpec = _opt("auto", "auto ([CLS] for ViTs and BERT-style encoders, last for "
                             "the rest), cls, last, all, or positions such as 0,5,-1.",
                             lambda n, v: parse_tokens(v, n), cli="tokens")
    p: tuple[float, ...] = _opt((1.0,), "Norms for miscoupling: 1,2,inf.", parse_p, cli="p",
                                check=_choose(VALID_P, "the normalising norm is p = 1, 2 or inf"))
    dtype: torch.dtype = _opt(torch.float32, "Precision of the analysis: float32 or float64.",
                              parse_dtype, cli="analysis-dtype",
                              check=_choose(DTYPES.values(), "the analysis runs in float32 or "
                                            "float64"))
    variants: tuple[str, ...] = _opt(VARIANTS, "Variants to store (default: all).", parse_strs,
                                     cli="variant", check=_choose(VARIANTS))
    orientations: tuple[str, ...] = _opt(ORIENTATIONS, "Orientations: ujv,vju.", parse_strs,
                                         cli="orientation", check=_choose(ORIENTATIONS))
    layers: LayerSpec = _opt(None, "Layer window A..B or a list (1-based; default all).",
                             lambda n, v: parse_layers(v, n), cli="layers",
                             check=validate.rule(_layer))
    layer_pairs: str = _opt(
        "same", "Token-wise kinds: same (l = l') or all.", lambda n, v: str(v).strip(),
        cli="layer-pairs", check=_choose(("same", "all"), "same: l = l'"))
    final_norm: bool = _opt(False, "Fold the final norm into the last block.", parse_bool,
                            cli="final-norm")
    remove_norm_directions: bool = _opt(
        False, "Post-LN blocks: project the output LayerNorm's two directions (ones, normalised "
        "state) out of every Jacobian before the SVD (docs/conventions.md, Post-LN blocks).",
        parse_bool, cli="remove-norm-directions")
    method: str = _opt("auto", "auto, dense or matrix-free.", parse_method, cli="method",
                       check=_choose(METHODS))
    fast_path: bool = _opt(True, "Decode-step Jacobians J^l_tt for causal models (fastpath.py).",
                           parse_bool)
    analysis_device: str | None = _opt(
        None, "Where the Jacobian work runs (default: with each block). A model that does not "
        "fit the GPU: --device cpu --analysis-device cuda streams one block at a time.",
        parse_opt_str, cli="analysis-device", check=validate.rule(_analysis_device))
    trajectory: bool = _opt(True, "Trajectory metrics.", parse_bool)
    spectra: bool = _opt(True, "Singular-value spectra of J^l_tt (--no-spectra: no Jacobian "
                         "work when no coupling kind needs it either).", parse_bool,
                         cli="spectra")
    influence: bool = _opt(False, "Cross-token influence on the last token.", parse_bool,
                           cli="influence")
    lss_window: int = _opt(11, "Width of the centred line-shape-score window (odd).", parse_int,
                           check=validate.rule(_odd_window))
    logit_lens: bool = _opt(
        False, "Logit lens (paper fig. 24): the entropy of softmax(W_U N(x^l)) at every layer "
        "and token, in the trajectory table's logit_entropy column; needs a causal LM with "
        "its head (the CLI loads it under this option).", parse_bool, cli="logit-lens",
        hashed="if_changed")
    batch_size: int = _opt(8, "Prompts per forward pass.", parse_int, cli="batch-size",
                           check=validate.COUNT)
    seed: int = _opt(0, "Seed for prompt subsets and randomized SVDs.", parse_int, cli="seed",
                     check=validate.SEED)
    blocks_path: str | None = _opt(None, "Dotted path to the list of blocks (custom models).",
                                   parse_opt_str, cli="blocks")
    causal: bool | None = _opt(
        None, "Causal attention: true, false or auto (from the config, a TransformerLens cfg, "
        "the attention mask, or a probe of J).", parse_opt_bool, cli="causal", hashed="if_set")
    hidden_size: int | None = _opt(
        None, "Hidden size d (default: from the config or the first block input).",
        parse_opt_int, cli="hidden-size", hashed="if_set", check=validate.COUNT)
    svd_oversample: int = _opt(10, "Randomized SVD oversampling.", parse_int,
                               check=validate.COUNT0)
    svd_iters: int = _opt(4, "Randomized SVD power iterations.", parse_int,
                          check=validate.COUNT0)
    svd_tol: float | None = _opt(1e-3, "Residual above which auto falls back to dense.",
                                 parse_opt_float,  # nan would switch the fallback off
                                 check=validate.rule(validate.number, above=0))
    figure_window: tuple[int, int] | None = _opt(
        None, "Layers of the stored K x K figure matrices (A..B).", parse_window, hashed=False,
        check=validate.rule(_layer))
    figure_prompts: int = _opt(1, "Prompts whose K x K matrices are stored.", parse_int,
                               hashed=False, check=validate.COUNT0)
    chunk_size: int | None = _opt(None, "Jacobian rows per vmap chunk (default: automatic).",
                                  parse_opt_int, check=validate.COUNT)
    save_bases: bool = _opt(
        False, "Store the top-K U, S, V of every measured Jacobian in the run directory "
        "(read back with open_run(d).bases(...)); the size is printed first.", parse_bool,
        cli="save-bases", hashed=False)
    save_jacobians: bool = _opt(
        False, "Store every measured Jacobian J (d x d; small models: refused above "
        "2 GiB unless --force-size); read back with open_run(d).jacobian(...).", parse_bool,
        cli="save-jacobians", hashed=False)
    force_size: bool = _opt(False, "Store the Jacobians even above the size limit.", parse_bool,
                            cli="force-size", hashed=False)

    # ------------------------------------------------------------------ construction
    def __post_init__(self) -> None:
        hints = _hints()
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), hints[f.name])
        check_fields(self, dashes=False)  # each field's declared rule
        set_ = object.__setattr__
        set_(self, "k", tuple(sorted(set(self.k))))
        set_(self, "p", tuple(float(v) for v in self.p))
        if self.svd_tol is not None:
            set_(self, "svd_tol", float(self.svd_tol))
        self._validate()

    @classmethod
    def parse(cls, base: MeasureConfig | None = None, **user_values: Any) -> MeasureConfig:
        """A record from user input (CLI strings or Python values), on top of ``base``.

        Every key must be a field name; each value goes through its field's parser.
        """
        return parse_config(base, **user_values)

    def replace(self, **changes: Any) -> MeasureConfig:
        """A copy with ``changes`` parsed like user input (``cfg.replace(k="2,4")``)."""
        return parse_config(self, **changes)

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        """The rules between fields, and the empty lists a typed record may hold (each
        field's own rule is its declaration's, `check_fields`)."""
        def bad(msg: str) -> None:
            raise OptionError(msg)

        if not self.k:
            bad("k=(): give one or more positive top-K sizes, e.g. 10,30,50")
        if not self.p:
            bad("p=(): give one or more norms for miscoupling, e.g. 1,2,inf")
        if isinstance(self.tokens, tuple) and not self.tokens:
            bad("tokens=(): give 'auto', 'cls', 'last', 'all' or one or more positions such as "
                "0,3,-1")
        if self.logit_lens and not self.trajectory:
            bad("logit_lens adds a column to the trajectory table; keep trajectory=True")
        if self.save_jacobians and self.method == "matrix_free":
            bad("save_jacobians stores dense Jacobians, which method='matrix_free' never forms; "
                "use method='dense' or 'auto'")
        if self.layers is not None and not self.layers:
            bad("layers=(): give a window such as 9..16, or none for every layer")

    def check_model(self, num_layers: int, hidden_size: int) -> None:
        """Checks that depend on the model: K <= d (where a coupling kind or the spectra use
        K) and layers within 1..L."""
        if max(self.k) > hidden_size and (self.coupling or self.spectra):
            raise BlockCouplingError(
                f"k={max(self.k)} is larger than the model's hidden size d={hidden_size}; "
                f"choose K <= {hidden_size} (the paper uses K = d/10 = {max(1, round(hidden_size / 10))})"
            )
        if self.layers is not None and max(self.layers) > num_layers:
            raise BlockCouplingError(
                f"layers={self.layers[0]}..{self.layers[-1]} goes past the model's {num_layers} "
                f"blocks; layers are numbered 1..{num_layers}"
            )

    def selected_layers(self, num_layers: int) -> tuple[int, ...]:
        return self.layers if self.layers is not None else tuple(range(1, num_layers + 1))

    @property
    def k_max(self) -> int:
        return max(self.k)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values: tuples as lists, ``dtype`` as ``"float32"``, ``p = inf`` as ``"inf"``."""
        return {f.name: _jsonable(f.name, getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasureConfig:
        """The inverse of [`to_dict`][blockcoupling.engine.config.MeasureConfig.to_dict] (unknown keys, e.g. of older versions, are ignored)."""
        known = {f.name for f in fields(cls)}
        return parse_config(None, **{k: v for k, v in data.items() if k in known})

    def config_hash(self) -> str:
        """sha256 hex digest of the canonical JSON of every field that can change a number.

        The same on every process and machine for equal records (no Python ``hash``, sorted
        keys, fixed separators, floats by their shortest ``repr``). Fields marked
        ``hashed=False`` (``figure_window``, ``figure_prompts``: which already computed K x K
        matrices are kept for figures) are left out, and so are the variants added after
        this hash was first pinned (``Variant.hashed``: they add rows and change no number,
        so every earlier identity stays); see ``docs/conventions.md``.
        """
        plain = self.to_dict()
        plain["variants"] = [v for v in plain["variants"] if v in HASHED_VARIANTS]
        return canonical_hash({"version": HASH_VERSION, **identity(self, plain)})


# ---------------------------------------------------------------------------- helpers
def parse_config(base: MeasureConfig | None = None, **user_values: Any) -> MeasureConfig:
    """Parse user values (CLI strings, Python values) field by field onto ``base`` (or the
    defaults). Unknown keys are an error that lists the known ones. A record with nothing
    given on top is returned as it is (it was validated when it was made: every entry point,
    ``measure``, ``measure_to_dir``, ``plan_run``, the monitor, parses once)."""
    if base is not None and not user_values:
        return base
    by_name = {f.name: f for f in fields(MeasureConfig)}
    unknown = sorted(set(user_values) - set(by_name))
    if unknown:
        raise OptionError(
            f"unknown measure option(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    parsed = parse_given(MeasureConfig, user_values)
    return replace(base, **parsed) if base is not None else MeasureConfig(**parsed)


def cli_fields() -> list[tuple[str, Any, str, bool, str]]:
    """``(field name, default, help, is_flag, --flag)`` of every field exposed on the CLI."""
    return [(f.name, f.default, f.metadata["help"], isinstance(f.default, bool),
             "--" + f.metadata["cli"]) for f in fields(MeasureConfig) if f.metadata.get("cli")]


def measure_options() -> list[OptionSpec]:
    """The ``measure`` command's options of this record (raw strings, parsed by
    `parse_config`; flags for the bool fields), defaults shown as CLI strings."""
    return cli_options(MeasureConfig, render=render_default)


def render_default(name: str, value: Any) -> str:
    """A field's default as the CLI string that parses back to it (``10,30,50``, ``inf``)."""
    v = _jsonable(name, value)
    if v is None:
        return {"causal": "auto", "layers": "all"}.get(name, "none")
    if isinstance(v, list):
        return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) if v else "none"
    return str(v)


def _jsonable(name: str, value: Any) -> Any:
    if name == "dtype":
        return str(value).removeprefix("torch.")
    if name == "p":
        return ["inf" if math.isinf(v) else float(v) for v in value]
    if isinstance(value, tuple):
        return list(value)
    return value


_HINTS: dict[str, Any] = {}


def _hints() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(MeasureConfig))
    return _HINTS


def _matches(value: Any, tp: Any) -> bool:
    """Does ``value`` have the declared type ``tp`` (int accepted for float, bool not for int)?"""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(args) == len(value) and all(_matches(v, a) for v, a in zip(value, args, strict=True))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _check_type(name: str, value: Any, tp: Any) -> None:
    if not _matches(value, tp):
        shown = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        raise OptionError(
            f"{name}={value!r} is not of type {shown}; MeasureConfig is a typed record: pass "
            f"user input through MeasureConfig.parse({name}=...) (it accepts strings such as "
            "'10,30,50', '1,2,inf', 'last', '9..16')")


__all__ = ["DTYPES", "KINDS", "METHODS", "ORIENTATIONS", "VARIANTS", "MeasureConfig",
           "cli_fields", "measure_options", "parse_config", "parse_layers", "parse_tokens", "render_default"]
