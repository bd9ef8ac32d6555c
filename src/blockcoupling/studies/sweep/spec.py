"""Sweep specifications: a YAML file (or a dict) parsed into a validated [`SweepSpec`][blockcoupling.studies.sweep.spec.SweepSpec].

```yaml
models:
  - label: pythia-1b
    model: EleutherAI/pythia-1b            # hub id or local folder
    revisions: [step0, step1000, step143000]
  - label: my-run
    checkpoints: runs/train/checkpoint-*   # local checkpoint folders (HF Trainer layout)
prompts: [builtin:capital, builtin:benchmark_styles]
limit: 100                                  # prompts per set (optional)
measure: {coupling: [depth], k: [10], tokens: last}   # any MeasureConfig field
```

Every key is checked: an unknown key, a wrong type or an empty list is a
[`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] that names the key and says what to write.
Relative paths (local models, checkpoint globs, prompt files) are relative to the spec file's
folder (to the current folder for a dict).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockcoupling import validate
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, check_value, from_mapping, key_names, opt
from blockcoupling.loading import ModelSource
from blockcoupling.store.verified import load_yaml

#: a model entry's loading keys, top-level defaults and per-model values: every field of
#: `ModelSource` but the model (its own key) and the revision (``revisions:`` and ``steps:``
#: name several)
LOADING_KEYS = tuple(f.name for f in dataclasses.fields(ModelSource)
                     if f.name not in ("model", "revision"))
#: the loading keys a `ModelSpec` (and a unit) stores as its own fields, as before
#: `ModelSource` existed; the others are stored in ``loading`` where not at their defaults
_OWN_KEYS = ("dtype", "device", "trust_remote_code", "init", "init_seed")
TOP_KEYS = ("kind", "models", "prompts", "limit", "seed", "measure", "resources", "retries",
            "name", *LOADING_KEYS)
MODEL_KEYS = ("label", "model", "revisions", "steps", "checkpoints", "resources", *LOADING_KEYS)
# MeasureConfig fields a spec may not set: the sweep chooses them itself.
_MEASURE_FORBIDDEN: tuple[str, ...] = ("extra",)


class SpecError(validate.OptionError):
    """The sweep specification is invalid (the message names the key and the fix): refused
    as an option is (the command line's exit 2), before anything is written."""


def _checked(record: Any, prefix: str = "") -> None:
    """The record's field rules (``blockcoupling.fields``), a failure as a `SpecError`."""
    try:
        check_fields(record, prefix=prefix, dashes=False)
    except validate.OptionError as err:
        raise SpecError(str(err)) from err


def _checked_key(rule: validate.Rule, value: Any, key: str) -> None:
    """One key's rule, a failure as a `SpecError`."""
    try:
        rule(value, key)
    except validate.OptionError as err:
        raise SpecError(str(err)) from err


@dataclass(frozen=True)
class Resources:
    """What one unit asks the executor for (Ray: the task's ``num_cpus`` / ``num_gpus``)."""

    num_cpus: float = opt(1.0, "CPUs of the unit's Ray task.", check=(validate.number, {"minimum": 0}))
    num_gpus: float = opt(0.0, "GPUs of the unit's Ray task.", check=(validate.number, {"minimum": 0}))

    def __post_init__(self) -> None:
        _checked(self, "resources.")


RESOURCE_KEYS = tuple(f.name for f in dataclasses.fields(Resources))


@dataclass(frozen=True)
class ModelSpec:
    """One entry of ``models:``: a model and the revisions or checkpoints to measure, loaded
    as its `ModelSource` says (stored in the form sweeps had before that record: the loading
    options of `_OWN_KEYS` as fields, the others in ``loading``)."""

    label: str
    model: str | None = None             # hub id or local folder (None: checkpoints only)
    revisions: tuple[str, ...] = ()      # hub revisions (branches, tags, commits, Pythia stepN)
    checkpoints: str | tuple[str, ...] | None = None  # glob or list of local folders
    dtype: str = "auto"
    device: str = "auto"
    resources: Resources = field(default_factory=Resources)
    trust_remote_code: bool = False
    loading: tuple[tuple[str, Any], ...] = ()  # the other loading options set: (key, value)
    init: str = "pretrained"             # or "random": the same config, seeded random weights
    init_seed: int = 0                   # the seed of init: random


def stored_loading(source: ModelSource) -> dict[str, Any]:
    """``source``'s loading options as a `ModelSpec` and a unit store them: the fields of
    `_OWN_KEYS`, and ``loading``: the other options that differ from their defaults, in the
    record's order (an option added later leaves every earlier spec and unit id as it was)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelSource)}
    loading = tuple((k, getattr(source, k)) for k in LOADING_KEYS if k not in _OWN_KEYS
                    and getattr(source, k) != defaults[k])
    return {**{k: getattr(source, k) for k in _OWN_KEYS}, "loading": loading}


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: models x (revisions | checkpoints) x prompt sets, one config."""

    models: tuple[ModelSpec, ...]
    prompts: tuple[str, ...]             # prompt specs; inline sets are "inline:<name>"
    config: MeasureConfig
    measure: dict[str, Any]              # the user's measure: mapping, as given (normalised)
    limit: int | None = opt(None, "Prompts per set (a seeded subset).",
                            check=validate.COUNT)
    seed: int = opt(0, "Seed of the prompt subsets and randomized SVDs.", check=validate.SEED)
    retries: int = opt(3, "Ray retries of a unit whose worker died.", check=validate.RETRIES)
    name: str = opt("", "The sweep's name.")
    base_dir: str = "."                  # where relative paths are resolved
    inline_prompts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> texts

    def __post_init__(self) -> None:
        _checked(self)
        if not isinstance(self.name, str):
            raise SpecError("name must be a string")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-safe) that `parse_spec` reads back to an equal spec."""
        out = dataclasses.asdict(self)
        out.pop("config")
        for m in out["models"]:
            m["revisions"] = list(m["revisions"])
            if m["init"] == "pretrained":  # as before init existed: a stored spec still matches
                del m["init"], m["init_seed"]
            if isinstance(m["checkpoints"], tuple):
                m["checkpoints"] = list(m["checkpoints"])
        out["prompts"] = list(self.prompts)
        out["inline_prompts"] = {k: list(v) for k, v in self.inline_prompts.items()}
        return out


def _where(ctx: str) -> str:
    return f" (in {ctx})" if ctx else ""


def _check_keys(data: Mapping[str, Any], allowed: Sequence[str], ctx: str) -> None:
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}{_where(ctx)}; allowed keys: "
                        + ", ".join(allowed))


def _str_list(value: Any, key: str, ctx: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not all(isinstance(v, (str, int)) for v in value):
        raise SpecError(f"{key}{_where(ctx)} must be a string or a list of strings, "
                        f"not {value!r}")
    return tuple(str(v) for v in value)


def _resources(value: Any, ctx: str, default: Resources) -> Resources:
    if value is None:
        return default
    if not isinstance(value, Mapping):
        raise SpecError(f"resources{_where(ctx)} must be a mapping such as "
                        "{num_cpus: 1, num_gpus: 1}")
    _check_keys(value, RESOURCE_KEYS, f"{ctx}.resources" if ctx else "resources")
    try:
        return from_mapping(Resources, value, ctx, base=default)
    except BlockCouplingError as err:
        raise SpecError(str(err)) from err


def _resolve(path: str, base: Path) -> str:
    """A local path made absolute against ``base``; hub ids (``org/name``) pass unchanged."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    candidate = base / p
    explicit = path.startswith((".", "~")) or path.endswith(os.sep)
    if explicit or candidate.exists():
        return str(candidate.resolve())
    return path


def parse_measure(data: Any) -> tuple[MeasureConfig, dict[str, Any]]:
    """The ``measure:`` mapping -> (MeasureConfig, the mapping as plain data)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError("measure must be a mapping of MeasureConfig fields, e.g. "
                        "{coupling: [depth], k: [10], tokens: last}")
    known = [f.name for f in dataclasses.fields(MeasureConfig) if f.name not in _MEASURE_FORBIDDEN]
    _check_keys(data, known, "measure")
    plain: dict[str, Any] = {str(k): (list(v) if isinstance(v, (list, tuple)) else v)
                             for k, v in data.items()}
    try:
        cfg = MeasureConfig.parse(**plain)
    except BlockCouplingError as err:
        raise SpecError(f"measure: {err}") from err
    except (TypeError, ValueError) as err:
        raise SpecError(f"measure: a value has the wrong type ({err}); see "
                        "`blockcoupling measure --help` for each option's form") from err
    return cfg, plain


def _model(entry: Any, i: int, base: Path, spec: Mapping[str, Any]) -> ModelSpec:
    ctx = f"models[{i}]"
    if isinstance(entry, str):
        entry = {"model": entry}
    if not isinstance(entry, Mapping):
        raise SpecError(f"{ctx} must be a mapping with label and model (or checkpoints)")
    _check_keys(entry, MODEL_KEYS, ctx)
    given = {k: v for k, v in (*spec.items(), *entry.items()) if k in LOADING_KEYS}
    try:
        with key_names(""):  # a top-level default this entry takes: named where it is written
            for key in [k for k in given if k not in entry]:  # the key's own rule
                check_value(ModelSource, key, given[key], key)
        with key_names(f"{ctx}."):  # top-level defaults, then the entry's own values
            source = from_mapping(ModelSource, {"model": entry.get("model"), **given})
    except BlockCouplingError as err:
        raise SpecError(str(err)) from err
    model, ckpt = source.model, entry.get("checkpoints")
    if model is None and ckpt is None:
        raise SpecError(f"{ctx} needs model: (a hub id or folder) or checkpoints: (a glob of "
                        "local checkpoint folders)")
    revisions = _revisions(entry, ctx)
    if ckpt is not None and (revisions or model is not None):
        raise SpecError(f"{ctx}: give either model (+ revisions) or checkpoints, not both; "
                        "use two entries of models:")
    if ckpt is not None:
        ckpts = _str_list(ckpt, "checkpoints", ctx)
        ckpt = tuple(_resolve(c, base) if not any(ch in c for ch in "*?[") else
                     (c if Path(c).is_absolute() else str(base / c)) for c in ckpts)
        ckpt = ckpt[0] if len(ckpt) == 1 else ckpt
    label = entry.get("label")
    if label is None and model:
        label = Path(model).name
    elif label is None and ckpt is not None:  # named after the checkpoints' folder
        label = Path(str(ckpt if isinstance(ckpt, str) else ckpt[0])).parent.name
    if not isinstance(label, str) or not label.strip():
        raise SpecError(f"{ctx}.label must be a non-empty string")
    default_res = _resources(spec.get("resources"), "", Resources())
    return ModelSpec(
        label=label.strip(), model=_resolve(model, base) if model else None,
        revisions=revisions, checkpoints=ckpt,
        resources=_resources(entry.get("resources"), ctx, default_res),
        **stored_loading(source))


def _revisions(entry: Mapping[str, Any], ctx: str) -> tuple[str, ...]:
    """``revisions:`` and ``steps:`` (Pythia shorthand: ``steps: [0, 1000]`` -> revisions
    step0, step1000) of a model entry."""
    revisions = _str_list(entry.get("revisions", []), "revisions", ctx)
    if "steps" in entry:
        steps = entry["steps"]
        if not isinstance(steps, Sequence) or isinstance(steps, str) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
            raise SpecError(f"{ctx}.steps must be a list of whole numbers >= 0 (Pythia-style "
                            "revisions stepN)")
        revisions += tuple(f"step{s}" for s in steps)
    return revisions


def _prompts(data: Mapping[str, Any], base: Path
             ) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """``prompts:`` -> (the prompt specs, inline ones as ``inline:NAME``; the inline sets'
    texts by name)."""
    if "prompts" not in data:
        raise SpecError("prompts: give one or more prompt sets, e.g. [builtin:capital]")
    raw = data["prompts"]
    raw = [raw] if isinstance(raw, (str, Mapping)) else raw
    if not isinstance(raw, Sequence) or not raw:
        raise SpecError("prompts: give a list of prompt sets (builtin:NAME, a file, hf:DATASET, "
                        "or {name: N, texts: [...]})")
    prompts_l: list[str] = []
    inline: dict[str, tuple[str, ...]] = {}
    for i, p in enumerate(raw):
        if isinstance(p, Mapping):  # an inline set: {name: demo, texts: ["...", "..."]}
            _check_keys(p, ("name", "texts"), f"prompts[{i}]")
            name, texts = p.get("name"), p.get("texts")
            if not isinstance(name, str) or not name.strip():
                raise SpecError(f"prompts[{i}].name must be a non-empty string")
            if (not isinstance(texts, Sequence) or isinstance(texts, str) or not texts
                    or not all(isinstance(t, str) and t.strip() for t in texts)):
                raise SpecError(f"prompts[{i}].texts must be a non-empty list of texts")
            inline[name.strip()] = tuple(texts)
            prompts_l.append(f"inline:{name.strip()}")
        elif isinstance(p, str):
            prompts_l.append(p if p.startswith(("builtin:", "hf:")) else _resolve(p, base))
        else:
            raise SpecError(f"prompts[{i}] must be a prompt spec string or {{name, texts}}, "
                            f"not {p!r}")
    prompts = tuple(prompts_l)
    if len(set(prompts)) != len(prompts):
        raise SpecError("prompts: a prompt set is listed twice; list each once")
    return prompts, inline


def parse_spec(data: Any, *, base_dir: str | os.PathLike[str] | None = None) -> SweepSpec:
    """Validate a spec given as a mapping (e.g. ``yaml.safe_load`` of a file)."""
    if isinstance(data, SweepSpec):
        return data
    if not isinstance(data, Mapping):
        raise SpecError("a sweep spec is a mapping with at least models: and prompts:")
    _check_keys(data, TOP_KEYS, "")
    if data.get("kind", "sweep") != "sweep":
        raise SpecError(f"kind: {data['kind']!r} is not a sweep spec; a {data['kind']} spec runs "
                        "with its own command (kind: vit-grid: blockcoupling vit-grid --spec)")
    base = Path(base_dir if base_dir is not None else data.get("base_dir", ".")).resolve()
    models_raw = data.get("models")
    if not isinstance(models_raw, Sequence) or isinstance(models_raw, str) or not models_raw:
        raise SpecError("models: give a list of models, e.g. [{label: a, model: gpt2}]")
    models = tuple(_model(e, i, base, data) for i, e in enumerate(models_raw))
    labels = [m.label for m in models]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise SpecError(f"model label {dup[0]!r} is used twice; give each entry its own label")
    prompts, inline = _prompts(data, base)
    seed = data.get("seed", 0)
    _checked_key(validate.SEED, seed, "seed")  # named where it is written, not as measure's
    measure = data.get("measure") or {}
    if isinstance(measure, Mapping):  # else parse_measure says what to write
        if "seed" in measure and "seed" in data and measure["seed"] != seed:
            raise SpecError("seed is given twice (top level and under measure:) with "
                            "different values; give it once")
        measure = {"seed": seed, **measure}
    cfg, plain = parse_measure(measure)
    return SweepSpec(models=models, prompts=prompts, config=cfg, measure=plain,
                     limit=data.get("limit"), seed=seed, retries=data.get("retries", 3),
                     name=data.get("name", ""), base_dir=str(base), inline_prompts=inline)


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec) -> SweepSpec:
    """A [`SweepSpec`][blockcoupling.studies.sweep.spec.SweepSpec] from a YAML file path, a mapping or a spec (returned as is)."""
    if isinstance(source, SweepSpec):
        return source
    if isinstance(source, Mapping):
        return parse_spec(source)
    path = Path(source)
    if not path.is_file():
        raise SpecError(f"sweep spec {str(path)!r} not found; give a YAML file (see "
                        "docs/how-to/sweeps.md)")
    data = load_yaml(path, "sweep spec", error=SpecError)
    try:
        return parse_spec(data, base_dir=path.parent)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from err
