"""The models of the correlation study: what one measured model is (`ModelUnit`), how it is
read from run and sweep directories (`load_units`), and its row of numbers under one rule
(`CORRELATION_RULE`, `model_table`: the headline statistic for raw c_K, ``coupling_vs_null``
and ``coupling_vs_rotated`` with their standard errors, and the chance level of raw c_K).
How models are joined is ``studies.joins``'s rule (`check_prompt_sets` and `token_rule` are
its checks as the correlation states them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.engine.statistic import (
    DEFAULT_TOKENS,
    PAPER_K,
    StatisticRule,
    statistic_table,
)
from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.folder import RUN_DIRECTORY, another_kind
from blockcoupling.studies import joins

__all__ = [
    "CORRELATION_RULE",
    "TABLE_VARIANTS",
    "ModelUnit",
    "check_independent",
    "check_prompt_sets",
    "load_units",
    "model_table",
    "prompt_set_of",
    "rule_dict",
    "describe_rule",
    "token_rule",
    "training_runs",
]


#: the correlation's rule: the headline rule of ``engine.statistic`` at the paper's K for the
#: correlation with benchmark scores, max(1, round(d / 10)) per model, stated as such
#: (``k="d/10"``; ``k=None`` would be each model's smallest measured K, as everywhere)
CORRELATION_RULE = StatisticRule(variant="coupling", k=PAPER_K)
#: the variants of `model_table` by default: raw ``coupling`` (as the paper) and
#: ``coupling_vs_null`` (``correlate`` adds ``coupling_vs_rotated``, which leads the headline,
#: where every model measured it)
TABLE_VARIANTS: tuple[str, ...] = ("coupling", "coupling_vs_null")


def describe_rule(rule: StatisticRule, variants: Sequence[str]) -> str:
    """``rule`` in words for every variant of ``variants`` (one line; "K per model" where its
    K is the per-model ``"d/10"``)."""
    first = rule.with_variant(variants[0])
    return (first.describe().replace(f"depth-wise {first.variant}",
                                     "depth-wise " + " and ".join(variants))
            + " (K per model)" * (rule.k == PAPER_K))


def rule_dict(rule: StatisticRule, variants: Sequence[str]) -> dict[str, Any]:
    """``rule.to_dict()`` of every variant of ``variants`` (JSON outputs)."""
    return {v: rule.with_variant(v).to_dict() for v in variants}


@dataclass
class ModelUnit:
    """One measured model: its names, its shape and its ``coupling`` table."""

    label: str
    model: str
    coupling: pd.DataFrame
    hidden_size: int
    num_layers: int
    revision: str | None = None
    step: int | None = None
    source: str = ""
    keys: tuple[str, ...] = ()  # extra names a score table may use (e.g. the run folder name)
    prompt_set: str = ""  # the measured prompts' content (``joins.prompt_set_key``)
    #: the training run this model is a checkpoint of (a step or revision of one model or
    #: of one collection entry), None for a model on its own: see `training_runs`
    run: str | None = None
    #: the token rule of its headline: a run's own (``engine.statistic.headline_tokens`` of
    #: its meta: a ViT run's [CLS] is ``"first"``), a collection unit's its collection's
    #: (``Sweep.default_tokens``: the rule of its kind), else ``DEFAULT_TOKENS``
    headline_tokens: str = DEFAULT_TOKENS
    #: its prompts table (``prompt_id``, ``text``, ``n_tokens``): what it measured, for the
    #: join by content (``joins.check_models``); None for a unit built without it
    prompts: pd.DataFrame | None = None
    #: the weights hash its run records (``store.fingerprint.weights_hash``): what it loaded
    weights_hash: str | None = None

    def match_keys(self, *, any_revision: bool = False) -> tuple[list[str], list[str]]:
        """The names a score row may use for this unit (``joins.match_names``): its exact
        names (label, ``model@revision`` or model id, run folder name, collection unit id) and
        its fallbacks, tried only where no row lists an exact name. A unit measured at a
        revision is named with it (``model@revision``): its bare model id (a score of another
        revision, e.g. the main branch's) is a fallback only with ``any_revision``, last, and
        a label that is just that model id or its last part names nothing."""
        bare = {self.model, self.model.rsplit("/", 1)[-1]} if self.revision else set()
        keys = [self.label if self.label not in bare else "",
                f"{self.model}@{self.revision}" if self.revision else "",
                self.model if not self.revision else "",
                *(k for k in self.keys if k not in bare)]
        exact = list(dict.fromkeys(k for k in keys if k))
        return exact, exact + ([self.model] if self.revision and any_revision else [])


def _unit_from_run(path: Path, declared_revision: object = None) -> ModelUnit:
    """The unit of one run directory; its revision is the one the run loaded
    (``joins.loaded``, checked against ``declared_revision``, a catalogue's)."""
    from blockcoupling.store.reader import open_run

    m = open_run(path)
    meta = m.meta
    model = str(meta.get("model") or path.name)
    revision = joins.loaded(meta, declared_revision, where=str(path))
    label = str(meta.get("label") or (f"{model}@{revision}" if revision else model))
    step = meta.get("step")
    weights = meta.get("weights_hash")
    return ModelUnit(label=label, model=model, coupling=m.coupling,
                     hidden_size=int(meta.get("hidden_size") or 0),
                     num_layers=int(meta.get("num_layers") or 0),
                     revision=revision,
                     step=int(step) if step is not None else None, source=str(path),
                     keys=(path.name,), prompt_set=prompt_set_of(m.prompts),
                     run=model if revision or step is not None else None,
                     headline_tokens=m.headline_tokens, prompts=m.prompts,
                     weights_hash=str(weights) if weights else None)


def token_rule(units: Sequence[ModelUnit], tokens: str | None) -> str:
    """The token rule of a statistic over ``units``: ``tokens`` where given, else the units'
    own headline rule (`ModelUnit.headline_tokens`), which they must share (an LM's last
    token and a ViT's [CLS] are not one statistic): one line naming them otherwise."""
    if tokens is not None:
        return tokens
    rules = sorted({u.headline_tokens for u in units})
    if len(rules) > 1:
        which = ", ".join(f"{r} ({sum(u.headline_tokens == r for u in units)} runs, e.g. "
                          f"{next(u.label for u in units if u.headline_tokens == r)})"
                          for r in rules)
        raise BlockCouplingError(
            f"the runs' own token rules differ: {which}; give --tokens to use one for all")
    return rules[0] if rules else DEFAULT_TOKENS


def prompt_set_of(prompts: pd.DataFrame) -> str:
    """A run's prompt set by its content (``joins.prompt_set_key``)."""
    return joins.prompt_set_key(prompts)


def _sweep_reader() -> Any:
    """``blockcoupling.studies.sweep`` if this install has it, else None."""
    try:
        from blockcoupling.studies import sweep
    except ImportError:
        return None
    return sweep


def _units_from_sweep(sweep: Any, path: Path) -> list[ModelUnit]:
    """One unit per done unit of a collection, named by its catalogue; each takes the
    collection's token rule (``Sweep.default_tokens``, its kind's), the one ``sweep-status``
    and ``report`` state for it."""
    sw = sweep.open_collection(path)
    sw.verify()  # a damaged unit: named, with the resume that measures it again
    rows = sw.done().to_dict("records")
    labels = [str(r.get("label") or "") for r in rows]
    prompt_sets = {str(r.get("prompt_set")) for r in rows}
    units = []
    for row, label in zip(rows, labels, strict=True):
        unit = _unit_from_run(Path(sw.run_dir(row["unit_id"])), row.get("revision"))
        unit.headline_tokens = sw.default_tokens
        if isinstance(row.get("model"), str) and row["model"]:
            unit.model = row["model"]  # the name the collection gives it (a score table's)
        step = row.get("step")
        unit.step = int(step) if step is not None and not pd.isna(step) else None
        checkpoint = unit.step is not None or bool(unit.revision)
        unit.run = f"{label or unit.model} in {path}" if checkpoint else None
        if label and labels.count(label) > 1:  # checkpoints of one model: name each one
            label += (f"-step{unit.step}" if unit.step is not None
                      else f"@{unit.revision}" if unit.revision else f"-{row['unit_id']}")
            if len(prompt_sets) > 1:
                label += f"-{Path(str(row['prompt_set'])).stem}"
        unit.label = label or unit.label
        unit.keys = (*unit.keys, str(row["unit_id"]))
        units.append(unit)
    if not units:
        raise BlockCouplingError(f"the sweep {path} has no finished unit yet; run it first")
    return units


def load_units(paths: Iterable[str | Path],
               labels: Sequence[str] | None = None) -> list[ModelUnit]:
    """One `ModelUnit` per run directory; a collection (sweep, monitor, vit-grid)
    adds one per done unit, read by ``open_collection``.
    ``labels`` (one per run directory, no sweeps) name the models instead of their manifests'
    label or model id: the names the score table's ``model`` column uses."""
    from blockcoupling.store.reader import is_run_dir

    sweep = _sweep_reader()
    units: list[ModelUnit] = []
    paths = list(paths)
    if labels is not None:
        if len(labels) != len(paths):
            raise BlockCouplingError(f"--labels gives {len(labels)} label(s) for {len(paths)} "
                                     "input(s); give one label per run directory")
        if not all(is_run_dir(Path(x)) for x in paths):
            raise BlockCouplingError("--labels names run directories one by one; a sweep's "
                                     "units are named by the sweep (pass the runs instead)")
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise BlockCouplingError(f"{path} does not exist; pass run directories "
                                     "(blockcoupling measure --out DIR) or a sweep directory")
        if is_run_dir(path):
            units.append(_unit_from_run(path))
            continue
        if sweep is not None and sweep.is_collection_dir(path):  # any kind, by its manifest
            units += _units_from_sweep(sweep, path)
            continue
        if (other := another_kind(path, RUN_DIRECTORY, fix="pass run directories or a "
                                  "sweep directory")) is not None:
            raise other
        raise BlockCouplingError(f"{path} is not a blockcoupling run directory (no readable "
                                 "manifest.json); pass run directories written by "
                                 "`blockcoupling measure` or a sweep directory")
    if labels is not None:
        for unit, label in zip(units, labels, strict=True):
            unit.label = label
    names = [u.label for u in units]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise BlockCouplingError(f"several runs share the label(s) {', '.join(dup)}; each model "
                                 "must appear once (name them with --labels a,b,c, one per run)")
    return units


def training_runs(units: Sequence[ModelUnit]) -> dict[str, list[str]]:
    """The training runs with two or more checkpoints among ``units`` (steps or revisions of
    one model id, or of one collection entry): run -> the checkpoints' labels. Checkpoints
    of one run are not independent models."""
    runs: dict[str, list[str]] = {}
    for u in units:
        if u.run is not None:
            runs.setdefault(u.run, []).append(u.label)
    return {run: labels for run, labels in runs.items() if len(labels) > 1}


def check_independent(units: Sequence[ModelUnit], *, allow_checkpoints: bool = False
                      ) -> dict[str, list[str]]:
    """Refuse checkpoints of one training run as independent models (one line naming
    ``--allow-checkpoints``) unless ``allow_checkpoints``; returns `training_runs`."""
    runs = training_runs(units)
    if runs and not allow_checkpoints:
        run, labels = next(iter(runs.items()))
        n = sum(len(v) for v in runs.values())
        shown = ", ".join(labels[:4]) + (", ..." if len(labels) > 4 else "")
        raise BlockCouplingError(
            f"{n} of the {len(units)} models are checkpoints of one training run ({run}: "
            f"{shown}), not independent models, so a p-value over them would be wrong; pass "
            "--allow-checkpoints (Python: allow_checkpoints=True) to correlate them anyway")
    return runs


def model_table(units: Sequence[ModelUnit], rule: StatisticRule = CORRELATION_RULE,
                variants: Sequence[str] = TABLE_VARIANTS) -> pd.DataFrame:
    """One row per unit: label, model, revision, step, source, d_model_run, layers_run, k,
    n_prompts, prompt_set, and per variant of ``variants`` ``<variant>_mean`` and
    ``<variant>_se`` (the headline statistic under ``rule``, ``engine.statistic``; default
    the correlation's rule, K = round(d/10) per model), ``coupling_chance`` (the mean chance
    level of raw c_K, where coupling_vs_null was measured too)."""
    rows = []
    for u in units:
        if rule.k == PAPER_K and u.hidden_size < 1:
            raise BlockCouplingError(f"{u.source or u.label}: hidden size unknown, so K = d/10 "
                                     "cannot be chosen; pass --k")
        t = statistic_table(u.coupling, replace(rule, n_boot=0), variants=variants,
                            d_model=u.hidden_size or None,
                            where=u.source or u.label).set_index("variant")
        row: dict[str, Any] = {
            "label": u.label, "model": u.model, "revision": u.revision, "step": u.step,
            "source": u.source, "d_model_run": u.hidden_size, "layers_run": u.num_layers,
            "k": int(t["k"].iloc[0]), "n_prompts": int(t["n_prompts"].min()),
            "prompt_set": u.prompt_set}
        for v in variants:
            row[f"{v}_mean"], row[f"{v}_se"] = float(t.loc[v, "mean"]), float(t.loc[v, "se"])
        row["coupling_chance"] = (float(t.loc["coupling", "chance"])
                                  if "coupling" in t.index else math.nan)
        rows.append(row)
    out = pd.DataFrame(rows)
    if rule.k is None and len(out) and out["k"].nunique() > 1:  # as a collection refuses them
        raise BlockCouplingError(
            f"the models' smallest measured K differ ({sorted(int(x) for x in out['k'].unique())}"
            "); pass one K every model measured (--k), or k='d/10' for the paper's per-model "
            "rule (the correlation's default)")
    return out


def check_prompt_sets(units: Sequence[ModelUnit], *, allow_mixed: bool = False) -> None:
    """Refuse models measured on different prompt contents (their means are not comparable)
    unless ``allow_mixed`` (``joins.check_prompt_sets``)."""
    joins.check_prompt_sets({u.label: u.prompt_set for u in units}, allow_mixed=allow_mixed)
