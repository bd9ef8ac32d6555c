"""Coupling against generalisation: the paper's correlation study (its fig. 1a, 8, 9, table 4).

Three steps, each a plain function in its own module (their names re-exported here):

1. **The coupling statistic per model** (``studies.model_units``: `CORRELATION_RULE`,
   `model_table`): the headline rule of ``engine.statistic`` for raw c_K, ``coupling_vs_rotated``
   and ``coupling_vs_null``, each with its standard error over prompts, and the chance level of
   raw c_K, at K = round(d / 10) per model unless a fixed K is given.
2. **The scores** (``studies.scores``: `read_scores`, `match_scores`): a CSV, ``"paper"`` (the
   paper's Table 1, [`paper_scores`][blockcoupling.studies.scores.paper_scores]) or an
   lm-evaluation-harness folder, matched to the runs by ``studies.joins``'s rule
   (docs/conventions.md, "Joins by content"): inputs in another order give bit-identical
   results.
3. **The statistics** (``studies.regression``): per predictor n, slope, R^2 with a seeded
   bootstrap interval, p, Pearson r, Spearman rho; the exponential fit; the partial
   correlations given log10 d_model and log10 parameters; with ``floor`` what the measured
   chance level explains; the same per ``group``. Every output carries `FLOOR_NOTE`.

`correlate` runs all three on run directories. scipy and statsmodels are the optional extra
``blockcoupling[study]``; a clear error says so when they are missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pandas as pd

from blockcoupling.engine.statistic import (
    DEFAULT_TOKENS,
    FLOOR_NOTE,
    HEADLINE_VARIANTS,
    PAPER_K,
    KSpec,
    StatisticRule,
)
from blockcoupling.errors import BlockCouplingError
from blockcoupling.jsonsafe import jsonable
from blockcoupling.store.fileio import write_json
from blockcoupling.studies import joins
from blockcoupling.studies.model_units import (
    CORRELATION_RULE,
    TABLE_VARIANTS,
    ModelUnit,
    check_independent,
    check_prompt_sets,
    describe_rule,
    load_units,
    model_table,
    rule_dict,
    token_rule,
)
from blockcoupling.studies.regression import (
    MIN_MODELS,
    PREDICTORS,
    analyse,
    exponential_fit,
    floor_analysis,
    partial_correlation,
    partial_correlations,
    regression,
    stats_modules,
)
from blockcoupling.studies.scores import (
    OPTIONAL_COLUMNS,
    check_score_frame,
    match_scores,
    paper_scores,
    read_lmeval_dir,
    read_scores,
    read_scores_csv,
)

__all__ = [
    "OPTIONAL_COLUMNS",
    "PREDICTORS",
    "CorrelationResult",
    "CORRELATION_RULE",
    "ModelUnit",
    "analyse",
    "check_independent",
    "check_prompt_sets",
    "correlate",
    "correlate_table",
    "exponential_fit",
    "floor_analysis",
    "load_units",
    "match_scores",
    "model_table",
    "paper_scores",
    "partial_correlation",
    "partial_correlations",
    "read_lmeval_dir",
    "read_scores",
    "read_scores_csv",
    "regression",
]


@dataclass
class CorrelationResult:
    """Everything `correlate` found; ``to_dict()`` is the JSON output."""

    table: pd.DataFrame
    #: the rule of every model's numbers (``engine.statistic``), stated for `variants`
    statistic: StatisticRule
    scores_source: str
    overall: dict[str, Any]
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    excluded: list[dict[str, str]] = field(default_factory=list)
    n_boot: int = 2000
    seed: int = 0
    #: training runs whose checkpoints were counted as models (``allow_checkpoints``)
    checkpoints: dict[str, list[str]] = field(default_factory=dict)
    #: the variants each model's numbers were made for (the predictors)
    variants: tuple[str, ...] = TABLE_VARIANTS

    def describe_statistic(self) -> str:
        """The rule of every model's numbers in words, for all of `variants`."""
        return describe_rule(self.statistic, self.variants)

    def to_dict(self) -> dict[str, Any]:
        cols = [c for c in ("label", "model", "score_model", "revision", "step", "group", "k",
                            "n_prompts", "coupling_vs_rotated_mean", "coupling_vs_rotated_se",
                            "coupling_vs_null_mean", "coupling_vs_null_se",
                            "coupling_mean", "coupling_se", "coupling_chance", "score",
                            "params_b", "layers", "d_model", "train_tokens_t", "log_params",
                            "log_d_model") if c in self.table.columns]
        models = self.table[cols].astype(object).where(self.table[cols].notna(), None)
        return jsonable({
            "statistic": rule_dict(self.statistic, self.variants), "floor_note": FLOOR_NOTE,
            "scores": self.scores_source,
            "n_models": int(len(self.table)), "seed": self.seed, "n_boot": self.n_boot,
            "models": models.to_dict("records"), "excluded": self.excluded,
            "checkpoints_counted_as_models": self.checkpoints,
            **self.overall, "groups": self.groups,
        })

    def to_json(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    def notes(self) -> list[str]:
        """What the p-values and intervals are (exact below SMALL_N models, no bootstrap
        interval where it degenerates) and which models are checkpoints of one run."""
        stats = [r for r in self.overall["predictors"].values() if "skipped" not in r]
        out = sorted({f"p-values: {r['p_method']}" for r in stats})
        out += sorted({f"R^2 interval: {r['r2_ci_note']}" for r in stats if r.get("r2_ci_note")})
        for run, labels in self.checkpoints.items():
            out.append(f"{len(labels)} checkpoints of one training run ({run}) counted as "
                       "independent models (allow_checkpoints): the p-values assume they are")
        return out

    def summary(self) -> str:
        """A few lines for humans."""
        lines = [f"{len(self.table)} models; statistic: {self.describe_statistic()}"]
        for name, r in self.overall["predictors"].items():
            if "skipped" in r:
                lines.append(f"  {name:15s} skipped ({r['skipped']})")
                continue
            lo, hi = r["r2_ci"]
            ci = f" [{lo:.2f}, {hi:.2f}]" if lo == lo else ""  # NaN: no interval (see notes)
            lines.append(f"  {name:15s} n={r['n']:3d} R^2={r['r2']:.3f}{ci} "
                         f"p={r['p']:.3g} slope={r['slope']:.4g} rho={r['spearman_rho']:+.3f} "
                         f"(p={r['spearman_p']:.3g})")
        for pc in self.overall.get("partial_correlations", []):
            given = " + ".join(pc["controlling_for"])
            if "r" in pc:
                lines.append(f"  partial r({pc['x']}, score | {given}) = {pc['r']:+.3f} "
                             f"(p={pc['p']:.3g}, n={pc['n']})")
            else:
                lines.append(f"  partial r({pc['x']}, score | {given}): skipped "
                             f"({pc['skipped']})")
        fl = self.overall.get("floor")
        if fl is not None:
            if "skipped" in fl:
                lines.append(f"  floor: skipped ({fl['skipped']})")
            else:
                sc, rg = fl["score_on_chance"], fl["raw_given_chance"]
                lines.append("  floor: score on the measured chance level of raw c_K: " + (
                    f"R^2={sc['r2']:.3f} p={sc['p']:.3g}" if "r2" in sc else sc["skipped"]))
                lines.append("  floor: raw c_K given its chance level: " + (
                    f"partial r={rg['r']:+.3f} p={rg['p']:.3g}" if "r" in rg else rg["skipped"]))
        lines += [f"  note: {n}" for n in self.notes()]
        lines.append("  note: " + FLOOR_NOTE)
        for label in self.excluded:
            lines.append(f"  excluded {label['label']}: {label['reason']}")
        return "\n".join(lines)


def correlate_table(table: pd.DataFrame, statistic: StatisticRule = CORRELATION_RULE, *,
                    variants: Sequence[str] = TABLE_VARIANTS, scores_source: str = "",
                    excluded: list[dict[str, str]] | None = None, n_boot: int = 2000,
                    seed: int = 0, floor: bool = False,
                    checkpoints: dict[str, list[str]] | None = None) -> CorrelationResult:
    """The statistics of an already-joined table (one row per model: coupling, score, ...),
    whose numbers were made under ``statistic`` for ``variants``."""
    overall = analyse(table, n_boot=n_boot, seed=seed, floor=floor)
    groups: dict[str, dict[str, Any]] = {}
    if "group" in table.columns:
        for g, sub in table.groupby(table["group"].fillna("(none)").astype(str), sort=True):
            if len(sub) < MIN_MODELS:
                groups[str(g)] = {"n": int(len(sub)), "skipped": f"fewer than {MIN_MODELS} models"}
                continue
            try:
                groups[str(g)] = analyse(sub, n_boot=n_boot, seed=seed, floor=floor)
            except BlockCouplingError as err:
                groups[str(g)] = {"n": int(len(sub)), "skipped": str(err)}
    return CorrelationResult(table=table, statistic=statistic, scores_source=scores_source,
                             overall=overall, groups=groups, excluded=excluded or [],
                             n_boot=n_boot, seed=seed, checkpoints=checkpoints or {},
                             variants=tuple(variants))


#: the predictors of ``correlate`` by default, the leading variant first (coupling_vs_rotated
#: where every model has it), raw c_K (the paper's) last
DEFAULT_VARIANTS: tuple[str, ...] = HEADLINE_VARIANTS


def correlate(inputs: Sequence[str | Path] | Sequence[ModelUnit], scores: str | Path | pd.DataFrame,
              *, k: KSpec = PAPER_K,
              variants: Sequence[str] | None = None,
              p: float | None = 1.0, orientation: str = "ujv", tokens: str | None = None,
              diagonal: bool = False, floor: bool = False, allow_mixed_prompts: bool = False,
              allow_checkpoints: bool = False, n_boot: int = 2000, seed: int = 0,
              labels: Sequence[str] | None = None,
              any_revision: bool = False) -> CorrelationResult:
    """The study on run directories (or `ModelUnit` objects) and a score source.

    ``scores`` is ``"paper"``, a CSV path, an lm-evaluation-harness folder or a DataFrame with
    the CSV's columns. ``labels`` name the run directories (one each) for the matching. Each
    model's numbers are the headline statistic (`CORRELATION_RULE`: ``k`` is ``"d/10"``,
    round(d/10) per model, the paper's, unless a fixed K is given; ``k=None`` is each
    model's smallest measured K, as everywhere) of every variant
    in ``variants`` (None: raw ``coupling``, ``coupling_vs_null`` and, where every model
    measured it, ``coupling_vs_rotated``); ``floor`` adds `floor_analysis`; models measured
    on different prompt sets are refused unless ``allow_mixed_prompts``; checkpoints of one
    training run (`training_runs`) are refused as independent models unless
    ``allow_checkpoints``. Below ``SMALL_N`` (10) models every p-value is an exact
    permutation p-value and no bootstrap interval is given. ``tokens=None`` takes the runs' own
    headline token rule (`token_rule`: the last token of an LM, [CLS] of a ViT run), which
    they must share.
    A model measured at a revision takes only that revision's score unless ``any_revision``
    (`match_scores`).
    """
    from blockcoupling.validate import whole

    stats_modules()
    n_boot = whole(n_boot, "--n-boot", minimum=0)  # 0: no bootstrap CI
    seed = whole(seed, "--seed", minimum=0)
    rule = replace(CORRELATION_RULE, k=k, p=p, orientation=orientation,
                   tokens=tokens or DEFAULT_TOKENS, diagonal=diagonal)  # checked early
    for v in variants or DEFAULT_VARIANTS:
        rule.with_variant(v)
    units = (list(inputs) if inputs and isinstance(inputs[0], ModelUnit)
             else load_units(inputs, labels))  # type: ignore[arg-type]
    rule = replace(rule, tokens=token_rule(units, tokens))  # type: ignore[arg-type]
    if variants is None:  # runs measured before coupling_vs_rotated existed: the other two
        variants = [v for v in DEFAULT_VARIANTS if v != "coupling_vs_rotated" or all(
            (cast(ModelUnit, u).coupling["variant"] == v).any() for u in units)]
    rule = rule.with_variant(variants[0]) if variants else rule
    if len(units) < MIN_MODELS:
        raise BlockCouplingError(f"the correlation needs at least {MIN_MODELS} models, got "
                                 f"{len(units)}; pass more run directories")
    units = joins.check_models(units, tokens=rule.tokens,  # type: ignore[arg-type]
                               allow_mixed_prompts=allow_mixed_prompts)
    checkpoints = check_independent(units,  # type: ignore[arg-type]
                                    allow_checkpoints=allow_checkpoints)
    if isinstance(scores, pd.DataFrame):
        score_df, source = check_score_frame(scores, "score table"), "table given in Python"
    else:
        score_df, source = read_scores(scores)
    models = model_table(units, rule, variants)  # type: ignore[arg-type]
    table, excluded = match_scores(models, units, score_df,  # type: ignore[arg-type]
                                   any_revision=any_revision)
    return correlate_table(table, rule, variants=variants, scores_source=source,
                           excluded=excluded,
                           n_boot=n_boot, seed=seed, floor=floor, checkpoints=checkpoints)
