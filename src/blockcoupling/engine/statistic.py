"""The headline statistic: mean depth-wise coupling of a model, with its uncertainty.

One rule, written once and stated by every output that says "how coupled is this model"
(docs/conventions.md, "The headline statistic", defines it step by step). Pure pandas/numpy
over a ``coupling`` table; no model access. In short: the depth-wise rows of one variant, K,
orientation (and p where the variant takes one); each prompt's last (``first``, ``all``)
measured token; ordered layer pairs l != l' (``diagonal=True``: every pair); per prompt the
mean over its pairs; ``mean`` over prompts, ``se`` = sd over prompts / sqrt(n) (within one
model), a Student t interval (or the percentile bootstrap), and ``chance``, the same
aggregate of each row's chance level, recovered per measured Jacobian J1 as
``c_null = (c - v) / (1 - v)`` from its ``coupling`` and ``coupling_vs_null`` rows.
`seed_level` makes the runs of one configuration (seeds) the unit of replication.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import pandas as pd

from blockcoupling import validate
from blockcoupling.engine.names import (
    FIXED_P,
    NULL_VARIANTS,
    ORIENTATIONS,
    P_VARIANTS,
    VALID_P,
    VARIANTS,
)
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, opt

__all__ = [
    "DEFAULT_TOKENS",
    "HEADLINE_TOKENS_KEY",
    "HEADLINE_VARIANTS",
    "LEAD_VARIANTS",
    "STATISTIC_COLUMNS",
    "TOKEN_RULES",
    "StatisticRule",
    "FLOOR_NOTE",
    "INTERVALS",
    "REPLICATION_PROMPTS",
    "REPLICATION_SEEDS",
    "bootstrap_ci",
    "flat_chance",
    "headline",
    "headline_rule",
    "headline_tokens",
    "headline_wide",
    "lead_variant",
    "measured_headline_variants",
    "paper_k",
    "per_prompt_values",
    "rule_and_ks",
    "seed_level",
    "statistic_table",
    "summarise",
    "t_interval",
    "wide_statistic",
]

#: how the measured tokens of a prompt enter its value
TOKEN_RULES: tuple[str, ...] = ("last", "first", "all")
#: the token rule of the statistic where nothing states another (the paper's: each prompt's
#: last measured token); the one default of every rule, run and collection kind: a run's
#: ``meta`` or a collection's kind (``runs.kinds.CollectionKind.headline_tokens``, a
#: ViT grid's [CLS] = ``"first"``) states its own, which its readers take (`headline_tokens`)
DEFAULT_TOKENS = "last"
#: the variants a headline states: first the one that leads (against the rotated-basis null:
#: an isotropic Jacobian cannot pass for coupling there; docs/conventions.md, "Which null
#: leads the headline"), then the one against independent bases beside it, then raw c_K
HEADLINE_VARIANTS: tuple[str, ...] = ("coupling_vs_rotated", "coupling_vs_null", "coupling")
#: the chance-corrected headline variants, in the order they lead (a run measured before
#: coupling_vs_rotated existed is led by coupling_vs_null)
LEAD_VARIANTS: tuple[str, ...] = tuple(v for v in HEADLINE_VARIANTS if v in NULL_VARIANTS)
#: the K rule of the paper's correlation: K = max(1, round(d / 10)) per model
PAPER_K = "d/10"
#: the columns of a statistic table after the caller's own (label, step, ...)
STATISTIC_COLUMNS: tuple[str, ...] = (
    "variant", "k", "p", "orientation", "tokens", "diagonal", "d_model", "n_prompts", "mean",
    "se", "ci_low", "ci_high", "chance", "replication", "rule",
)
#: how the interval of the mean is made: Student t (default) or the percentile bootstrap
INTERVALS: tuple[str, ...] = ("t", "bootstrap")
#: the unit of replication of a statistic's se (the ``replication`` column)
REPLICATION_PROMPTS = "prompts (within model)"
REPLICATION_SEEDS = "runs (seeds)"
#: the width floor of raw c_K, said wherever raw c_K is correlated with anything
FLOOR_NOTE = (
    "Raw c_K at K = round(d/10) has a chance level that depends on the width alone: for a flat "
    "spectrum c_null = 1 - sqrt(1/d + 1/K), about 0.88 at d = 768 and 0.96 at d = 8192, so "
    "wider models score higher with no structure at all. coupling_vs_rotated and "
    "coupling_vs_null remove it; the partial correlations control for log10 d_model and "
    "log10 parameters "
    "(`blockcoupling chance-floor` shows how much of a score table the floor alone explains).")
DEFAULT_N_BOOT = 1000
DEFAULT_CI = 0.95

KSpec = int | str | None


def _k_rule(value: Any, name: str) -> Any:
    """A K rule: a positive integer, `PAPER_K` or None (the smallest measured K)."""
    if value == PAPER_K:
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise validate.OptionError(
            f"{name}: K must be a positive integer or {PAPER_K} (round(d/10) per model), not "
            f"{value!r}")
    return value


def _parse_k(name: str, value: Any) -> KSpec:
    """``--k`` of a command that uses one K: ``10``, ``d/10`` (a list of one)."""
    if isinstance(value, str) and value.strip() != PAPER_K:
        k = value.strip()
        if "," not in k and not k.lstrip("-").isdigit():
            raise validate.OptionError(f"{name} {value!r}: give a positive integer K such as "
                                       f"10, or {PAPER_K} (round(d/10) per model)")
        return validate.one_value(value, name, int)
    return cast(KSpec, value)


def _parse_p(name: str, value: Any) -> float | None:
    """``--p`` of a command that uses one p: ``1``, ``2`` or ``inf`` (a list of one)."""
    if isinstance(value, str):
        return validate.one_value(value, name, float)
    return cast("float | None", value)


def flat_chance(d: int | np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """The chance level of raw c_K (p = 1) for a flat spectrum: ``1 - sqrt(1/d + 1/K)``.

    From ``metrics.chance_miscoupling`` with K equal singular values s and ||J||_F^2 = d s^2:
    m_null = sqrt((K/d)^2 d s^2 + K s^2) / (K s) = sqrt(1/d + 1/K)."""
    d_arr, k_arr = np.asarray(d, dtype=np.float64), np.asarray(k, dtype=np.float64)
    return 1.0 - np.sqrt(1.0 / d_arr + 1.0 / k_arr)


def paper_k(d: int) -> int:
    """The paper's K for the correlation with benchmark scores: max(1, round(d / 10))
    (Python's round: half to even)."""
    return max(1, round(int(d) / 10))


@dataclass(frozen=True)
class StatisticRule:
    """Which rows make one value and how they are averaged (module docstring): the one rule
    type of the headline statistic, passed whole from the entry points (``bc.coupling_statistic``,
    ``Measurement``/``Sweep.coupling_statistic``, ``correlate``) to `statistic_table`.

    ``k`` has one meaning of its default everywhere: ``None`` is **the smallest K the table
    measured**; ``"d/10"`` (`PAPER_K`) is max(1, round(d/10)) per model, the paper's K for the
    correlation with benchmark scores (``correlate``'s default rule states it so,
    ``k="d/10"``, not as None); an int is that K. `resolved` turns either into the int K of
    one table."""

    variant: str = opt("coupling_vs_rotated", "The coupling variant.",
                       check=validate.rule(validate.choice, choices=VARIANTS))
    k: KSpec = opt(None, "None: the smallest measured K; 'd/10': paper_k(d_model); or an int.",
                   parse=_parse_k, check=validate.rule(_k_rule))
    p: float | None = opt(1.0, "The norm of the variants that have one: 1, 2 or inf.",
                          parse=_parse_p, check=validate.rule(
                              validate.choice, choices=VALID_P, hint="p = 1, 2 or inf"))
    orientation: str = opt("ujv", "ujv or vju.",
                           check=validate.rule(validate.choice, choices=ORIENTATIONS))
    tokens: str = opt(DEFAULT_TOKENS, "last (each prompt's last measured token, the paper's), "
                      "first (its first measured token: a ViT's [CLS] where position 0 is "
                      "measured) or all (the measured tokens averaged within each prompt).",
                      check=validate.rule(validate.choice, choices=TOKEN_RULES))
    diagonal: bool = opt(False, "Every ordered layer pair, l = l' included.",
                         check=validate.rule(validate.flag))
    n_boot: int = opt(DEFAULT_N_BOOT, "Resamples of interval='bootstrap' (0: no interval).",
                      check=validate.N_BOOT)
    seed: int = opt(0, "Seed of the bootstrap.", check=validate.SEED)
    ci: float = opt(DEFAULT_CI, "The interval's level.",
                    check=validate.rule(validate.number, above=0, below=1))
    interval: str = opt("t", "t (Student) or bootstrap.",
                        check=validate.rule(validate.choice, choices=INTERVALS))

    def __post_init__(self) -> None:
        """Each field's declared rule (`fields.check_fields`, named as the field)."""
        check_fields(self, dashes=False)

    @property
    def uses_p(self) -> bool:
        return self.variant in P_VARIANTS

    @property
    def reported_p(self) -> float | None:
        """The p of the rows: the user's for coupling/miscoupling, fixed otherwise."""
        if self.uses_p:
            return 1.0 if self.p is None else float(self.p)
        return FIXED_P[self.variant]

    def k_label(self) -> str:
        if self.k is None:
            return "the smallest measured K"
        if self.k == PAPER_K:
            return "K = round(d/10)"
        return f"K = {int(self.k)}"

    def describe(self, k: int | None = None, *, variants: Sequence[str] | None = None,
                 k_text: str | None = None, interval: bool = True) -> str:
        """The rule in words (one line), with the resolved K where given; ``variants`` names
        several variants stated by one rule, ``k_text`` replaces the K (e.g. "K as on each
        line"); ``interval=False`` leaves the interval out (for lines that print none)."""
        kk = k_text or (f"K = {k}" if k is not None else self.k_label())
        names = " and ".join(variants) if variants else self.variant
        uses_p = any(v in P_VARIANTS for v in (variants or (self.variant,)))
        p = f", p = {1.0 if self.p is None else float(self.p):g}" if uses_p else ""
        pairs = "every ordered layer pair (l = l' included)" if self.diagonal else \
            "ordered layer pairs l != l'"
        tok = {"last": "each prompt's last measured token",
               "first": "each prompt's first measured token",
               "all": "the measured tokens averaged within each prompt"}[self.tokens]
        return (f"depth-wise {names} ({kk}{p}, orientation {self.orientation}): mean over "
                f"prompts of the per-prompt mean over {pairs}, at {tok}; se = sd over prompts "
                f"/ sqrt(n), within one model" + (self._interval_text() if interval else ""))

    def _interval_text(self) -> str:
        if self.interval == "t":
            return f"; {self.ci:.0%} CI: mean +- t(n-1) se"
        if self.n_boot:
            return (f"; {self.ci:.0%} CI: percentile bootstrap over prompts ({self.n_boot} "
                    f"resamples, seed {self.seed})")
        return ""

    def to_dict(self, k: int | None = None) -> dict[str, Any]:
        """The rule for JSON outputs (``"statistic": {...}``)."""
        return {
            "kind": "depth", "variant": self.variant,
            "k": k if k is not None else (self.k if self.k is not None else "min measured"),
            "k_rule": self.k if self.k is not None else "min measured",
            "p": self.reported_p, "orientation": self.orientation, "tokens": self.tokens,
            "layer_pairs": "all (l = l' included)" if self.diagonal else "l != l'",
            "aggregate": "mean over prompts of the per-prompt mean",
            "se": "sample standard deviation over prompts / sqrt(n): within one model",
            "replication": REPLICATION_PROMPTS,
            "ci": ({"level": self.ci, "method": "Student t, n - 1 degrees of freedom"}
                   if self.interval == "t" else
                   {"level": self.ci, "method": "percentile bootstrap over prompts",
                    "n_boot": self.n_boot, "seed": self.seed}),
            "description": self.describe(k),
        }

    def with_variant(self, variant: str) -> StatisticRule:
        """The same rule for another variant (a table states several under one rule)."""
        return replace(self, variant=variant)

    def resolved(self, *, measured_ks: Sequence[int], d_model: int | None = None,
                 where: str = "run") -> StatisticRule:
        """The rule at the int K it uses on one table that measured ``measured_ks``: None ->
        the smallest of them, ``"d/10"`` -> `paper_k` of ``d_model`` (per model), an int ->
        itself; the K must have been measured (else one error line says what to measure)."""
        return replace(self, k=self.resolve_k(measured_ks, d_model, where))

    def resolve_k(self, measured: Sequence[int], d_model: int | None, where: str) -> int:
        """The K this rule uses on a table that measured ``measured``."""
        have = sorted({int(v) for v in measured})
        if not have:
            raise BlockCouplingError(
                f"{where}: no depth-wise {self.variant} rows; measure with --coupling depth "
                f"--variant {self.variant}")
        if self.k is None:
            return have[0]
        if self.k == PAPER_K:
            if not d_model:
                raise BlockCouplingError(
                    f"{where}: K = round(d/10) needs the model's hidden size, which this run "
                    "does not record; pass a fixed K instead")
            k = paper_k(d_model)
        else:
            k = int(self.k)
        if k not in have:
            raise BlockCouplingError(
                f"{where}: no depth-wise {self.variant} rows at K = {k}; it measured K in "
                f"{have}. Measure with --k {k}, or ask for one of the measured K")
        return k


def _select(coupling: pd.DataFrame, rule: StatisticRule, where: str) -> pd.DataFrame:
    """The depth rows of the rule's variant, orientation and p (every K)."""
    depth = coupling[coupling["kind"] == "depth"]
    if depth.empty:
        raise BlockCouplingError(f"{where}: no depth-wise coupling rows; measure with "
                                 "--coupling depth")
    df = depth[(depth["variant"] == rule.variant) & (depth["orientation"] == rule.orientation)]
    if rule.uses_p:
        df = df[df["p"] == rule.reported_p]
    if df.empty:
        variants = sorted(map(str, depth["variant"].unique()))
        if rule.variant not in variants:
            raise BlockCouplingError(
                f"{where}: variant {rule.variant} was not measured (it has {variants}); "
                f"measure with --variant {rule.variant}" +
                (" (it needs no p: it is the chance-corrected coupling)"
                 if rule.variant in NULL_VARIANTS else ""))
        raise BlockCouplingError(
            f"{where}: no depth-wise {rule.variant} rows with orientation {rule.orientation}"
            + (f" and p = {rule.reported_p:g}" if rule.uses_p else "") +
            f"; it has orientations {sorted(map(str, depth['orientation'].unique()))}" +
            (f" and p {sorted(float(x) for x in depth['p'].dropna().unique())}"
             if rule.uses_p else ""))
    return df


def _chance_rows(coupling: pd.DataFrame, sel: pd.DataFrame, rule: StatisticRule,
                 k: int) -> pd.Series:
    """Each selected row's chance level (aligned with ``sel``); NaN where undefined."""
    if rule.variant in NULL_VARIANTS:  # 0 at its null by construction
        return pd.Series(0.0, index=sel.index)
    if rule.variant not in P_VARIANTS:
        return pd.Series(math.nan, index=sel.index)
    keys = ["prompt_id", "layer_a", "layer_b", "token_in_a", "token_out_a", "token_in_b",
            "token_out_b"]
    base = coupling[(coupling["kind"] == "depth") & (coupling["k"] == k)
                    & (coupling["orientation"] == rule.orientation)]
    v = base[base["variant"] == "coupling_vs_null"].set_index(keys)["value"]
    if v.empty:
        return pd.Series(math.nan, index=sel.index)
    val = sel.set_index(keys)["value"]
    c = val if rule.variant == "coupling" else 1.0 - val
    vv = v.reindex(c.index).to_numpy()
    cc = c.to_numpy()
    frame = c.index.to_frame(index=False)
    # off-diagonal rows only: on l = l' both c and v are 1 up to rounding and the ratio is noise
    off = (frame["layer_a"] != frame["layer_b"]).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        c0 = np.where(off & (vv < 1.0), (cc - vv) / (1.0 - vv), np.nan)
    # c_null depends on J1 alone: one value per measured Jacobian, also for its l = l' rows
    j1 = ["prompt_id", "layer_a", "token_in_a", "token_out_a"]
    frame = frame[j1]
    frame["c0"] = c0
    per_j1 = frame.groupby(j1, sort=False)["c0"].transform("mean").to_numpy()
    chance = per_j1 if rule.variant == "coupling" else 1.0 - per_j1
    return pd.Series(chance, index=sel.index)


def per_prompt_values(coupling: pd.DataFrame, rule: StatisticRule, *, k: int,
                      where: str = "run") -> pd.DataFrame:
    """Per prompt: ``prompt_id, value, chance`` (steps 1-4 of the rule) at a resolved K.

    ``coupling`` is one model's ``coupling`` table."""
    sel = _select(coupling, rule, where)
    sel = sel[sel["k"] == k]
    if sel.empty:
        raise BlockCouplingError(f"{where}: no depth-wise {rule.variant} rows at K = {k}")
    sel = sel.assign(chance=_chance_rows(coupling, sel, rule, k))
    if rule.tokens in ("last", "first"):
        end = sel.groupby("prompt_id", sort=False)["token_out_a"].transform(
            "max" if rule.tokens == "last" else "min")
        sel = sel[sel["token_out_a"] == end]
    if not rule.diagonal:
        sel = sel[sel["layer_a"] != sel["layer_b"]]
        if sel.empty:
            raise BlockCouplingError(
                f"{where}: only one layer measured; coupling across depth needs at least two "
                "layers (or diagonal=True)")
    per_token = sel.groupby(["prompt_id", "token_out_a"], sort=False)[["value", "chance"]].mean()
    per_prompt = per_token.groupby(level="prompt_id", sort=False).mean()
    return per_prompt.reset_index()[["prompt_id", "value", "chance"]]


def bootstrap_ci(values: np.ndarray, *, n_boot: int = DEFAULT_N_BOOT, seed: int = 0,
                 ci: float = DEFAULT_CI) -> tuple[float, float]:
    """Seeded percentile bootstrap CI of the mean of ``values`` (n,) (``scipy.stats.bootstrap``,
    ``n_boot`` resamples from ``numpy.random.default_rng(seed)``); NaN for n < 2."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if x.size < 2 or n_boot < 1:
        return math.nan, math.nan
    res = stats.bootstrap((x,), np.mean, n_resamples=n_boot, confidence_level=ci,
                          method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@functools.lru_cache(maxsize=256)
def _t_quantile(q: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def t_interval(mean: float, se: float, n: int, ci: float = DEFAULT_CI) -> tuple[float, float]:
    """``mean -+ t_{n-1}((1 + ci) / 2) se``: the Student t interval of a mean of n values with
    standard error ``se`` (NaN for n < 2)."""
    if n < 2 or not np.isfinite(se):
        return math.nan, math.nan
    half = _t_quantile(0.5 + float(ci) / 2, int(n) - 1) * se
    return mean - half, mean + half


def summarise(values: np.ndarray, *, n_boot: int = DEFAULT_N_BOOT, seed: int = 0,
              ci: float = DEFAULT_CI, interval: str = "t") -> dict[str, float | int]:
    """``n_prompts, mean, se, ci_low, ci_high`` of per-prompt values (NaNs left out); the
    interval is Student t (``interval="t"``) or the seeded percentile bootstrap."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = int(x.size)
    mean = float(x.mean()) if n else math.nan
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    if interval == "t":
        lo, hi = t_interval(mean, se, n, ci)
    else:
        lo, hi = bootstrap_ci(x, n_boot=n_boot, seed=seed, ci=ci)
    return {"n_prompts": n, "mean": mean, "se": se, "ci_low": lo, "ci_high": hi}


def statistic_table(coupling: pd.DataFrame, rule: StatisticRule | None = None, *,
                    variants: Sequence[str] | None = None, ks: Sequence[int] | None = None,
                    d_model: int | None = None, where: str = "run") -> pd.DataFrame:
    """One model's statistic under ``rule`` (default `StatisticRule()`): one row per
    requested variant and K (``STATISTIC_COLUMNS``).

    ``variants``: None = the headline variants (`HEADLINE_VARIANTS`) the table has
    depth-wise rows of (all of them where it has none, so the error names what to measure);
    a name or a list: exactly those (each row is ``rule.with_variant(v)``: the rule's own
    ``variant`` is not read here). ``ks``: several K at once (each an int), else the
    rule's ``k`` (None: each variant's smallest measured K; ``"d/10"``: needs ``d_model``).
    Raises `BlockCouplingError` naming what to measure when the table lacks the rows the rule
    needs."""
    rule = StatisticRule() if rule is None else rule
    if variants is None:
        variants = measured_headline_variants(coupling)
    if isinstance(variants, str):
        variants = (variants,)
    rules = ([replace(rule, k=int(x)) for x in ks] if ks is not None else [rule])
    rows = []
    for variant in variants:
        for each in rules:
            one = each.with_variant(variant)
            sel = _select(coupling, one, where)
            one = one.resolved(measured_ks=sel["k"].unique(), d_model=d_model, where=where)
            kk = int(cast(int, one.k))
            pp = per_prompt_values(coupling, one, k=kk, where=where)
            stats = summarise(pp["value"].to_numpy(), n_boot=one.n_boot, seed=one.seed,
                              ci=one.ci, interval=one.interval)
            chance = pp["chance"].to_numpy(dtype=np.float64)
            rows.append({
                "variant": variant, "k": kk, "p": one.reported_p, "orientation": one.orientation,
                "tokens": one.tokens, "diagonal": bool(one.diagonal),
                "d_model": int(d_model) if d_model else pd.NA, **stats,
                "chance": float(np.nanmean(chance)) if np.isfinite(chance).any() else math.nan,
                "replication": REPLICATION_PROMPTS,
                "rule": one.describe(kk),
            })
    out = pd.DataFrame(rows, columns=list(STATISTIC_COLUMNS))
    out["k"] = out["k"].astype("int64")
    out["d_model"] = out["d_model"].astype("Int64")
    out["n_prompts"] = out["n_prompts"].astype("int64")
    return out


def rule_and_ks(k: KSpec | Sequence[int] = None, **options: Any
                ) -> tuple[StatisticRule, list[int] | None]:
    """The rule of an entry point's keywords (``k``, ``p``, ``orientation``, ``tokens``,
    ``diagonal``, ``n_boot``, ``seed``, ``ci``, ``interval``: `StatisticRule`'s fields), and
    the list of K where ``k`` is a list (`statistic_table`'s ``ks``): the one place where
    loose keywords become the rule."""
    if isinstance(k, list | tuple):
        ks = [int(x) for x in k]
        return StatisticRule(k=ks[0] if ks else None, **options), ks
    return StatisticRule(k=cast(KSpec, k), **options), None


def measured_headline_variants(coupling: pd.DataFrame) -> tuple[str, ...]:
    """The headline variants a ``coupling`` table has depth-wise rows of, in headline order
    (all of them where it has none of the chance-corrected ones, so that a missing lead is
    named: "measure with --variant coupling_vs_rotated")."""
    have = set(coupling.loc[coupling["kind"] == "depth", "variant"].astype(str).unique())
    out = tuple(v for v in HEADLINE_VARIANTS if v in have)
    return out if lead_variant(out) is not None else HEADLINE_VARIANTS


def seed_level(runs: pd.DataFrame, *, by: Sequence[str] = ("variant", "k"),
               seed: str = "seed", value: str = "mean", within_se: str = "se",
               ci: float = DEFAULT_CI) -> pd.DataFrame:
    """The statistic with runs as the unit of replication: one row per ``by`` group of
    ``runs`` (one row per run, e.g. a statistic table of several trained models with a
    ``seed`` column). ``mean`` = mean over the group's runs of their ``value``; ``sd`` = their
    sd (ddof = 1), the seed-to-seed spread; ``se`` = sd / sqrt(n_runs), the between-seed
    standard error; ``ci_low``, ``ci_high`` = its Student t interval (n_runs - 1 degrees of freedom); ``within_se`` =
    sqrt(sum of the runs' within-model se^2) / n_runs, what the prompts alone would give the
    mean; ``n_runs``, ``seeds`` (sorted, comma-separated) and ``replication`` = "runs
    (seeds)". NaN se and interval for a group of one run."""
    by = [c for c in by if c != seed]
    missing = [c for c in (*by, seed, value) if c not in runs.columns]
    if missing:
        raise BlockCouplingError(f"seed_level: the table has no column {missing[0]!r}")
    rows = []
    groups = runs.groupby(by, sort=False, dropna=False) if by else [((), runs)]
    for key, g in groups:
        x = g[value].to_numpy(dtype=np.float64)
        x = x[np.isfinite(x)]
        n = int(x.size)
        mean = float(x.mean()) if n else math.nan
        sd = float(x.std(ddof=1)) if n > 1 else math.nan
        se = sd / math.sqrt(n) if n > 1 else math.nan
        lo, hi = t_interval(mean, se, n, ci)
        w = (g[within_se].to_numpy(dtype=np.float64) if within_se in g.columns
             else np.full(len(g), np.nan))
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
                     "n_runs": n, "seeds": ",".join(str(s) for s in sorted(g[seed].unique())),
                     "mean": mean, "sd": sd, "se": se, "ci_low": lo, "ci_high": hi,
                     "within_se": float(np.sqrt(np.nansum(w ** 2)) / len(w)) if len(w)
                     and np.isfinite(w).any() else math.nan,
                     "replication": REPLICATION_SEEDS})
    return pd.DataFrame(rows)


def wide_statistic(table: pd.DataFrame, index: Sequence[str] = ()) -> pd.DataFrame:
    """A statistic table as one row per ``index`` group with ``<variant>_mean``, ``_se``,
    ``_ci_low``, ``_ci_high``, ``_chance`` and ``_k`` columns (for summaries and JSON)."""
    index = list(index)
    parts = []
    groups = table.groupby(index, sort=False, dropna=False) if index else [((), table)]
    for key, g in groups:
        row: dict[str, Any] = dict(zip(index, key if isinstance(key, tuple) else (key,),
                                       strict=True))
        row["n_prompts"] = int(g["n_prompts"].max()) if len(g) else 0
        for _, r in g.iterrows():
            v = r["variant"]
            for c in ("mean", "se", "ci_low", "ci_high", "chance", "k"):
                row[f"{v}_{c}"] = r[c]
        parts.append(row)
    return pd.DataFrame(parts)


def _pm(mean: float, se: float) -> str:
    if not np.isfinite(mean):
        return "n/a"
    return f"{mean:.4f} ± {se:.4f}" if np.isfinite(se) else f"{mean:.4f} (one prompt: no se)"


def lead_variant(measured: Sequence[str]) -> str | None:
    """The variant that leads a headline among ``measured``: the first of
    `LEAD_VARIANTS` there (None where no chance-corrected variant was measured)."""
    return next((v for v in LEAD_VARIANTS if v in measured), None)


#: how a headline names a chance-corrected variant that stands beside the leading one
_BESIDE_NAMES = {"coupling_vs_null": "against independent bases (coupling_vs_null)",
                 "coupling_vs_rotated": "against the rotated basis (coupling_vs_rotated)"}
#: what the ± of every headline is
SE_WORDS = "± = one standard error over prompts, within one model"


#: the key under which a run's ``meta`` (or a collection's manifest) states the token rule of
#: its headline (a ViT's [CLS]: ``"first"``); absent: ``default``
HEADLINE_TOKENS_KEY = "headline_tokens"


def headline_tokens(record: Mapping[str, Any] | None, default: str = DEFAULT_TOKENS) -> str:
    """The token rule of the headline of a run (its ``meta``) or a collection (its manifest):
    the rule it states under `HEADLINE_TOKENS_KEY`, else ``default`` (`DEFAULT_TOKENS`, the
    paper's; a collection's: its kind's rule, ``runs.kinds.collection_tokens``)."""
    tokens = str((record or {}).get(HEADLINE_TOKENS_KEY) or default)
    if tokens not in TOKEN_RULES:
        raise BlockCouplingError(f"the stated headline token rule {tokens!r} is not one of "
                                 f"{', '.join(TOKEN_RULES)}; the record is damaged")
    return tokens


def headline_rule(variants: Sequence[str] = HEADLINE_VARIANTS, k: int | None = None,
                  tokens: str = DEFAULT_TOKENS) -> str:
    """The rule of `headline` lines (no interval is printed there), for the one
    ``(rule: ...)`` line under them; ``k=None``: "K as on each line"; ``tokens``: the token
    rule the lines used."""
    rule = StatisticRule(variant=variants[0], n_boot=0, tokens=tokens)
    return rule.describe(k, variants=variants, k_text=None if k is not None else
                         "K as on each line", interval=False)


def headline(table: pd.DataFrame) -> str:
    """The headline in words, from one model's statistic table at one K: the leading
    chance-corrected value first with its se (``coupling_vs_rotated``; ``coupling_vs_null``
    where a run predates it), the other beside it, then raw c_K with its se and its chance
    level, and what the ± is (within one model). Rows of other variants are ignored; a
    missing variant is said, never filled in."""
    by = {str(r["variant"]): r for _, r in table.iterrows()}
    parts = []
    lead = lead_variant(list(by))
    if lead is None:
        parts.append("above chance: not measured (add --variant coupling_vs_rotated)")
    for v in LEAD_VARIANTS:
        if v in by:
            name = f"above chance ({v})" if v == lead else _BESIDE_NAMES[v]
            parts.append(f"{name} {_pm(by[v]['mean'], by[v]['se'])}")
    c = by.get("coupling")
    if c is not None:
        chance = (f"chance {c['chance']:.4f}" if np.isfinite(c["chance"])
                  else "chance level not measured")
        parts.append(f"raw c_K {_pm(c['mean'], c['se'])} ({chance})")
    first = by.get(lead) if lead is not None else c
    head = ""
    if first is not None:
        head = f"K={int(first['k'])}, {int(first['n_prompts'])} prompts: "
    return head + "; ".join(parts) + (f" ({SE_WORDS})" if parts and first is not None else "")


def headline_wide(row: Any, n_prompts: int | None = None) -> str:
    """`headline` of one row of a wide summary (``<variant>_mean``, ``_se``,
    ``coupling_chance``, ``k``, ``n_prompts``; e.g. ``Sweep.summary()``)."""
    rows = []
    for v in HEADLINE_VARIANTS:
        mean = row.get(f"{v}_mean")
        if mean is None or not np.isfinite(float(mean)):
            continue
        rows.append({"variant": v, "mean": float(mean), "se": float(row.get(f"{v}_se")),
                     "chance": float(row.get("coupling_chance", math.nan))
                     if v == "coupling" else 0.0,
                     "k": int(row.get("k")),
                     "n_prompts": int(n_prompts if n_prompts is not None
                                      else row.get("n_prompts"))})
    if not rows:
        return "no depth-wise coupling measured"
    return headline(pd.DataFrame(rows))
