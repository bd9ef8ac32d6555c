"""Measurement: the result of `blockcoupling.engine.measure` and of [`open_run`][blockcoupling.store.reader.open_run].

Long ("tidy") tables, one value per row, with the column names of DEFINITIONS.md ("Result
tables"). Layers are 1-based (layer l = block l; layer 0 in ``trajectory`` is the input of
block 1), tokens 0-based. Per-token trajectory metrics (``lss``, ``expodistance``,
``equidistance_cv``, ``linearisation_cosine``) live in their own table ``token_metrics``
rather than as rows with an empty layer: one row per (prompt, token), no sentinel values.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.fastrecord import describe as describe_fast_path
from blockcoupling.engine.fastrecord import fast_path_layers
from blockcoupling.engine.names import P_VARIANTS
from blockcoupling.engine.statistic import (
    DEFAULT_CI,
    DEFAULT_N_BOOT,
    HEADLINE_VARIANTS,
    KSpec,
    StatisticRule,
    headline,
    headline_rule,
    headline_tokens,
    per_prompt_values,
    rule_and_ks,
    statistic_table,
)
from blockcoupling.errors import BlockCouplingError

if TYPE_CHECKING:
    from torch import Tensor

    from blockcoupling.engine.bases import BasisKey, BasisSource

# name -> (column, pandas dtype). The order is the column order of the tables.
SCHEMAS: dict[str, dict[str, str]] = {
    "coupling": {
        "prompt_id": "string",
        "kind": "string",
        "layer_a": "int32",
        "layer_b": "int32",
        "token_in_a": "int32",
        "token_out_a": "int32",
        "token_in_b": "int32",
        "token_out_b": "int32",
        "k": "int32",
        "variant": "string",
        "p": "float64",  # NaN where the variant has no p
        "orientation": "string",
        "value": "float64",
    },
    "trajectory": {
        "prompt_id": "string",
        "token": "int32",
        "layer": "int32",
        "norm": "float64",
        "step_norm": "float64",  # NaN at layer 0
        "pca_x": "float64",
        "pca_y": "float64",
        "lss_window": "float64",
        "logit_entropy": "float64",  # NaN unless measured with logit_lens (engine/lens.py)
    },
    "token_metrics": {
        "prompt_id": "string",
        "token": "int32",
        "lss": "float64",
        "expodistance": "float64",
        "equidistance_cv": "float64",
        "linearisation_cosine": "float64",  # NaN unless depth Jacobians were computed
    },
    "spectra": {
        "prompt_id": "string",
        "layer": "int32",
        "token_in": "int32",
        "token_out": "int32",
        "rank": "int32",
        "singular_value": "float64",
    },
    "influence": {
        "prompt_id": "string",
        "layer": "int32",
        "token_in": "int32",
        "token_out": "int32",
        "metric": "string",
        "value": "float64",
    },
    "prompts": {
        "prompt_id": "string",
        "text": "string",
        "n_tokens": "int32",
        "label": "string",
    },
    "diagnostics": {
        "prompt_id": "string",
        "layer": "int32",
        "token_in": "int32",
        "token_out": "int32",
        "method": "string",
        "residual": "float64",
        "seconds": "float64",
        "trace_over_d": "float64",  # NaN in runs made before these columns
        "isotropic_share": "float64",
        "uv_overlap": "float64",
    },
}
"""The public result tables: table name -> column -> pandas dtype (the data contract)."""
TABLES = tuple(SCHEMAS)

#: Columns added to a table after runs were stored without them: a stored file may lack them
#: (read as NaN); every new file has them.
LATER_COLUMNS: dict[str, frozenset[str]] = {"trajectory": frozenset({"logit_entropy"})}


@functools.cache
def _empty(name: str) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in SCHEMAS[name].items()})


def empty_table(name: str) -> pd.DataFrame:
    """An empty table with the right columns and dtypes."""
    return _empty(name).copy()


def conform(name: str, frame: pd.DataFrame | Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Order and type the columns of ``frame`` as the schema says (extra columns are kept)."""
    df = frame if isinstance(frame, pd.DataFrame) else pd.DataFrame(list(frame))
    if df.empty and not len(df.columns):
        return empty_table(name)
    schema = SCHEMAS[name]
    for col, dtype in schema.items():
        if col not in df.columns:
            df[col] = pd.Series([pd.NA if dtype == "string" else np.nan] * len(df),
                                dtype=dtype if dtype != "int32" else "float64")
        if str(df[col].dtype) == dtype:  # exact: pandas 3 "str" compares equal to "string"
            continue
        if dtype == "int32" and df[col].isna().any():
            raise ValueError(f"table {name!r}: column {col!r} has missing values")
        df[col] = df[col].astype(dtype)
    extra = [c for c in df.columns if c not in schema]
    return df[list(schema) + extra].reset_index(drop=True)


@dataclass
class Measurement:
    """Everything one measurement produced. Tables are pandas DataFrames (see ``SCHEMAS``)."""

    coupling: pd.DataFrame = field(default_factory=lambda: empty_table("coupling"))
    trajectory: pd.DataFrame = field(default_factory=lambda: empty_table("trajectory"))
    token_metrics: pd.DataFrame = field(default_factory=lambda: empty_table("token_metrics"))
    spectra: pd.DataFrame = field(default_factory=lambda: empty_table("spectra"))
    influence: pd.DataFrame = field(default_factory=lambda: empty_table("influence"))
    prompts: pd.DataFrame = field(default_factory=lambda: empty_table("prompts"))
    diagnostics: pd.DataFrame = field(default_factory=lambda: empty_table("diagnostics"))
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    config: MeasureConfig = field(default_factory=MeasureConfig)
    meta: dict[str, Any] = field(default_factory=dict)
    # save_bases: the top-K U, S, V of every measured Jacobian (engine/bases.py), in memory
    # or read lazily from a run directory; None when not stored
    basis_store: BasisSource | None = field(default=None, repr=False)

    def bases(self, prompt_id: str, layer: int, token_in: int | None = None,
              token_out: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(U (d, K), S (K,), V (d, K))`` of J^layer_{token_in token_out} of a prompt
        (``save_bases=True``); tokens default to the layer's one measured J_tt."""
        from blockcoupling.engine import bases as _bases

        n = self.prompts.loc[self.prompts["prompt_id"] == prompt_id, "n_tokens"]
        key = _bases.select(self.basis_store, prompt_id, layer, token_in, token_out,
                            int(n.iloc[0]) if len(n) else None)
        U, S, V = _bases.factors(self.basis_store, key, _bases.PARTS)
        return U, S, V

    def jacobian(self, prompt_id: str, layer: int, token_in: int | None = None,
                 token_out: int | None = None) -> Tensor:
        """The stored Jacobian J^layer_{token_in token_out} (d, d), rows = output coordinates
        (``save_jacobians=True``)."""
        from blockcoupling.engine import bases as _bases

        n = self.prompts.loc[self.prompts["prompt_id"] == prompt_id, "n_tokens"]
        key = _bases.select(self.basis_store, prompt_id, layer, token_in, token_out,
                            int(n.iloc[0]) if len(n) else None)
        return _bases.factors(self.basis_store, key, (_bases.JACOBIAN,))[0]

    def iter_bases(self) -> Iterator[tuple[BasisKey, tuple[Tensor, ...]]]:
        """Every stored ``((prompt_id, layer, token_in, token_out), (U, S, V))``, prompt by
        prompt (a run directory's files are read and verified one at a time)."""
        from blockcoupling.engine import bases as _bases

        return _bases.iterate(self.basis_store, self.prompts["prompt_id"].astype(str).tolist())

    def table(self, name: str) -> pd.DataFrame:
        if name not in SCHEMAS:
            raise KeyError(f"unknown table {name!r}; tables are {', '.join(TABLES)}")
        return getattr(self, name)

    # ------------------------------------------------------------------ combining
    @classmethod
    def concat(cls, parts: list[Measurement], *, config: MeasureConfig | None = None,
               meta: dict[str, Any] | None = None) -> Measurement:
        """Stack the tables of several measurements (e.g. one per prompt batch)."""
        if not parts:
            return cls(config=config or MeasureConfig(), meta=meta or {})
        tables = {
            name: conform(name, pd.concat([p.table(name) for p in parts], ignore_index=True))
            for name in TABLES
        }
        arrays: dict[str, np.ndarray] = {}
        for p in parts:
            arrays.update(p.arrays)
        from blockcoupling.engine.bases import InMemoryBases

        return cls(**tables, arrays=arrays, config=config or parts[0].config,
                   meta=meta if meta is not None else dict(parts[0].meta),
                   basis_store=InMemoryBases.merge([p.basis_store for p in parts]))

    # ------------------------------------------------------------------ aggregates
    def select(self, kind: str, k: int | None, variant: str, p: float | None,
                orientation: str) -> pd.DataFrame:
        df = self.coupling
        k = k if k is not None else min(self.config.k)
        sel = (df["kind"] == kind) & (df["k"] == k) & (df["variant"] == variant) & (
            df["orientation"] == orientation
        )
        if p is not None and variant in P_VARIANTS:  # the others have one fixed p
            sel &= df["p"] == float(p)
        out = df[sel]
        if out.empty:
            raise KeyError(
                f"no {kind} coupling rows for k={k}, variant={variant}, p={p}, "
                f"orientation={orientation}; measured k={self.config.k}, "
                f"variants={self.config.variants}, kinds={self.config.coupling}"
            )
        return out

    def coupling_statistic(self, *, variants: Sequence[str] | None = None,
                           k: KSpec | Sequence[int] = None, p: float | None = 1.0,
                           orientation: str = "ujv", tokens: str | None = None,
                           diagonal: bool = False, n_boot: int = DEFAULT_N_BOOT, seed: int = 0,
                           ci: float = DEFAULT_CI, interval: str = "t") -> pd.DataFrame:
        """The headline statistic of this run (``engine.statistic``): one row per variant and
        K with ``mean, se, ci_low, ci_high, n_prompts, k, d_model, chance, replication,
        rule`` (``se`` and the interval are within this model: over prompts). ``variants``
        None: the headline variants this run measured (``engine.statistic``);
        ``tokens=None``: the run's own rule (`headline_tokens`). The keywords are the fields
        of `StatisticRule` (``k`` may be a list); `statistic` takes the rule whole."""
        rule, ks = rule_and_ks(k, p=p, orientation=orientation,
                               tokens=tokens or self.headline_tokens, diagonal=diagonal,
                               n_boot=n_boot, seed=seed, ci=ci, interval=interval)
        return self.statistic(rule, variants=variants, ks=ks)

    def statistic(self, rule: StatisticRule, *, variants: Sequence[str] | None = None,
                  ks: Sequence[int] | None = None) -> pd.DataFrame:
        """`coupling_statistic` under one `StatisticRule` (`engine.statistic.statistic_table`
        on this run's ``coupling`` table, its hidden size and its name)."""
        return statistic_table(self.coupling, rule, variants=variants, ks=ks,
                               d_model=self.d_model, where=self.where)

    @property
    def where(self) -> str:
        """This run's name in error lines (its model, else ``run``)."""
        return str(self.meta.get("model") or "run")

    @property
    def fast_path(self) -> dict[int, bool | str]:
        """Per measured layer: ``True`` where ``J^l_tt`` came from the decode-step fast path,
        else why not (``meta["fast_path"]``, engine/fastrecord.py); empty where nothing was
        recorded."""
        return fast_path_layers(self.meta)

    @property
    def headline_tokens(self) -> str:
        """The token rule of this run's headline, as its ``meta`` states it
        (``headline_tokens``: a ViT training's final and epoch runs write theirs, [CLS] =
        ``"first"``), else ``"last"`` (the paper's)."""
        return headline_tokens(self.meta)

    @property
    def d_model(self) -> int | None:
        """The model's hidden size as recorded in ``meta`` (None if unknown)."""
        d = self.meta.get("hidden_size")
        return int(d) if d else None

    def mean_depth_coupling(self, k: KSpec = None, *, variant: str = "coupling",
                            p: float | None = 1.0, orientation: str = "ujv",
                            tokens: str | None = None, diagonal: bool = False) -> float:
        """The run's mean depth-wise ``variant`` by the one rule of ``engine.statistic``
        (mean over prompts of the per-prompt mean over layer pairs l != l', at each prompt's
        token of the run's rule (`headline_tokens`, the last measured one unless the
        run states another) unless ``tokens`` says; ``diagonal=True`` includes l = l').
        `coupling_statistic` gives it with its standard error and chance level."""
        row = self.statistic(self._rule(k, variant, p, orientation, tokens, diagonal, n_boot=0),
                             variants=(variant,))
        return float(row["mean"].iloc[0])

    def per_prompt_coupling(self, k: KSpec = None, *, variant: str = "coupling",
                            p: float | None = 1.0, orientation: str = "ujv",
                            tokens: str | None = None, diagonal: bool = False) -> pd.DataFrame:
        """Per prompt: ``prompt_id, value, chance``, the values the statistic averages
        (``tokens=None``: the run's own rule)."""
        rule = self._rule(k, variant, p, orientation, tokens, diagonal)
        sel = self.coupling[(self.coupling["kind"] == "depth")
                            & (self.coupling["variant"] == variant)]
        one = rule.resolved(measured_ks=sel["k"].unique(), d_model=self.d_model, where=self.where)
        return per_prompt_values(self.coupling, one, k=int(cast(int, one.k)), where=self.where)

    def _rule(self, k: KSpec, variant: str, p: float | None, orientation: str,
              tokens: str | None, diagonal: bool, **more: Any) -> StatisticRule:
        """The `StatisticRule` of one variant's keywords (``tokens=None``: the run's own)."""
        return StatisticRule(variant=variant, k=k, p=p, orientation=orientation,
                             tokens=tokens or self.headline_tokens, diagonal=diagonal, **more)

    def coupling_by_distance(self, k: int | None = None, *, variant: str = "coupling",
                             p: float | None = 1.0, orientation: str = "ujv") -> pd.DataFrame:
        """Locality: mean depth-wise value as a function of layer distance |l - l'|."""
        df = self.select("depth", k, variant, p, orientation).copy()
        df["distance"] = (df["layer_a"] - df["layer_b"]).abs()
        g = df.groupby("distance")["value"]
        return pd.DataFrame({"mean": g.mean(), "std": g.std(), "count": g.size()}).reset_index()

    def depth_matrix(self, prompt_id: str | None = None, *, token: int | None = None,
                     k: int | None = None, variant: str = "coupling", p: float | None = 1.0,
                     orientation: str = "ujv") -> pd.DataFrame:
        """L x L matrix (rows = measured layer_a, columns = basis layer_b); mean over prompts
        and tokens unless ``prompt_id`` / ``token`` pick one."""
        df = self.select("depth", k, variant, p, orientation)
        if prompt_id is not None:
            df = df[df["prompt_id"] == prompt_id]
        if token is not None:
            df = df[df["token_out_a"] == token]
        return df.pivot_table(index="layer_a", columns="layer_b", values="value", aggfunc="mean")

    def summary(self) -> str:
        """A few lines for humans (``blockcoupling show``): table sizes, the mean depth-wise
        coupling per K (and against its chance level, ``coupling_vs_null``, when measured),
        and robust trajectory summaries (median and inter-quartile range: expodistance is
        heavy-tailed) with the number of tokens whose expodistance is NaN and why."""
        cfg = self.config
        lines = [
            f"model: {self.meta.get('model', '?')}  prompts: {len(self.prompts)}  "
            f"kinds: {', '.join(cfg.coupling) or '-'}  k: {', '.join(map(str, cfg.k))}",
        ]
        for name in TABLES:
            lines.append(f"  {name:14s} {len(self.table(name)):>10,d} rows")
        fast = describe_fast_path(self.meta)
        if fast:
            lines.append(f"  {fast}")
        if all(self.table(n).empty for n in TABLES if n not in ("prompts", "diagnostics")):
            lines.append("  nothing was measured (no result rows)")
        if "depth" in cfg.coupling and not self.coupling.empty:
            variants = [v for v in HEADLINE_VARIANTS if v in cfg.variants]
            stated = False
            for k in cfg.k:
                try:
                    stat = self.coupling_statistic(variants=variants, k=k, n_boot=0)
                except (BlockCouplingError, ValueError):
                    continue
                lines.append(f"  depth-wise coupling, {headline(stat)}")
                stated = True
            if stated:
                rule = headline_rule(variants, tokens=self.headline_tokens)
                lines.append(f"    (rule: {rule})")
        if not self.token_metrics.empty:
            tm = self.token_metrics
            parts = []
            for col in ("lss", "expodistance"):
                v = tm[col].dropna()
                if len(v):
                    q25, med, q75 = v.quantile([0.25, 0.5, 0.75])
                    parts.append(f"{col} median {med:.4g} (IQR {q25:.4g} to {q75:.4g})")
                else:
                    parts.append(f"{col} -")
            lines.append(f"  trajectories ({len(tm)} tokens): " + "; ".join(parts))
            n_nan = int(tm["expodistance"].isna().sum())
            if n_nan:
                lines.append(
                    f"  expodistance is NaN for {n_nan} of {len(tm)} tokens: their norms do not "
                    "change beyond the rounding of the stored hidden states (no growth rate)")
        return "\n".join(lines)
