"""``coupling_statistic``: the headline statistic (`blockcoupling.engine.statistic`) of a
[`Measurement`][blockcoupling.engine.results.Measurement], a run directory, a collection
directory or an open [`Sweep`][blockcoupling.runs.read.Sweep]: this module finds the tables and
puts each run's or unit's names (label, model, revision, step; unit_id) in front of its rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import (
    DEFAULT_CI,
    DEFAULT_N_BOOT,
    KSpec,
    StatisticRule,
    rule_and_ks,
)
from blockcoupling.errors import BlockCouplingError

__all__ = ["RUN_COLUMNS", "coupling_statistic"]

#: the names put in front of a single run's statistic rows
RUN_COLUMNS: tuple[str, ...] = ("label", "model", "revision", "step")


def run_names(meta: dict[str, Any], fallback: str = "") -> dict[str, Any]:
    """``label, model, revision, step`` of a run from its ``meta``."""
    model = str(meta.get("model") or fallback or "run")
    revision = meta.get("revision")
    label = str(meta.get("label") or (f"{model}@{revision}" if revision else model))
    step = meta.get("step")
    return {"label": label, "model": model, "revision": str(revision) if revision else None,
            "step": int(step) if step is not None else None}


def _variants(variant: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if variant is None:
        return None  # the headline variants each run measured (engine.statistic)
    return (variant,) if isinstance(variant, str) else tuple(variant)


def coupling_statistic(source: Measurement | str | os.PathLike[str] | Any, *,
                       variant: str | Sequence[str] | None = None,
                       k: KSpec | Sequence[int] = None, p: float | None = 1.0,
                       orientation: str = "ujv", tokens: str | None = None, diagonal: bool = False,
                       n_boot: int = DEFAULT_N_BOOT, seed: int = 0, ci: float = DEFAULT_CI,
                       include_duplicates: bool = False, interval: str = "t") -> pd.DataFrame:
    """The headline statistic, one row per run or collection unit and per variant and K.

    ``source``: a `Measurement`, a run directory, a sweep or monitor directory, or an
    open `blockcoupling.studies.sweep.Sweep`. ``variant``: one name or a list (default:
    the headline variants measured: ``coupling_vs_rotated``, ``coupling_vs_null``, then
    ``coupling``); ``k``: None (the smallest measured K, the same for
    every unit of a collection), ``"d/10"`` (round(d/10) per model, the paper's), an int or a
    list; ``tokens``: ``"last"`` (the paper's), ``"first"`` or ``"all"`` (None: the rule
    the run states, e.g. a ViT training's [CLS], or the collection's, its kind's: a ViT
    grid's [CLS]; else ``"last"``);
    ``diagonal=True`` includes l = l'; ``interval``: ``"t"`` (Student t, the default) or
    ``"bootstrap"`` (percentile, ``n_boot`` resamples, ``seed``).
    Columns: the names of the run/unit, then ``variant, k, p, orientation, tokens, diagonal,
    d_model, n_prompts, mean, se, ci_low, ci_high, chance, rule`` (docs/conventions.md)."""
    def rule(own_tokens: str) -> tuple[StatisticRule, list[int] | None]:
        # the one rule of this call, at the token rule the source states unless told
        return rule_and_ks(k, p=p, orientation=orientation, tokens=tokens or own_tokens,
                           diagonal=diagonal, n_boot=n_boot, seed=seed, ci=ci,
                           interval=interval)

    variants = _variants(variant)
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        from blockcoupling.store.reader import is_run_dir, open_run

        if is_run_dir(path):
            m = open_run(path)
            r, ks = rule(m.headline_tokens)
            return _with_names(m.statistic(r, variants=variants, ks=ks),
                               run_names(m.meta, path.name))
        from blockcoupling.runs.read import open_collection
        from blockcoupling.store.collection import is_collection_dir

        if not is_collection_dir(path):
            raise BlockCouplingError(
                f"{path} is neither a run directory nor a collection (sweep, monitor or "
                "vit-grid directory): give the folder `blockcoupling measure --out`, "
                "`blockcoupling sweep --out` or `blockcoupling vit-grid --out` wrote")
        source = open_collection(path)  # any kind: sweep, monitor, vit-grid
    if isinstance(source, Measurement):
        r, ks = rule(source.headline_tokens)
        return _with_names(source.statistic(r, variants=variants, ks=ks),
                           run_names(source.meta))
    if hasattr(source, "statistic") and hasattr(source, "catalogue"):
        r, ks = rule(source.default_tokens)
        return source.statistic(r, variants=variants, ks=ks,
                                include_duplicates=include_duplicates)
    raise BlockCouplingError(
        f"coupling_statistic takes a Measurement, a run directory, a sweep directory or a "
        f"Sweep, not {type(source).__name__}")


def _with_names(table: pd.DataFrame, names: dict[str, Any]) -> pd.DataFrame:
    front = pd.DataFrame({c: [names.get(c)] * len(table) for c in RUN_COLUMNS})
    front["step"] = front["step"].astype("Int64")
    return pd.concat([front, table.reset_index(drop=True)], axis=1)
