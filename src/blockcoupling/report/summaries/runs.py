"""Across runs: the headline statistic per run side by side, and the runs overview table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.report.summaries.common import (
    REPORT_RULE,
    NoData,
    Runs,
    as_runs,
    at_run_k,
    is_empty,
    n_layers,
    n_prompts,
    resolve_k,
    robust_stats,
    run_labels,
    token_metric_stats,
)
from blockcoupling.report.summaries.depth import depth_rows, headline_columns, lead_of


# ====================================================================== across runs
def across_runs_data(runs: Runs, rule: StatisticRule = REPORT_RULE) -> pd.DataFrame:
    """One row per run (in order) with, over prompts and tokens:

    - ``coupling_*``: the depth-wise value of ``variant`` (mean, std, median, q25, q75 of the
      per-prompt values of the headline rule, ``engine.statistic``) of the rule's variant;
    - ``null_*``: the same for the leading chance-corrected variant (``null_variant``:
      ``coupling_vs_rotated``, or ``coupling_vs_null`` where a run predates it; NaN where
      not measured);
    - ``lss_*`` and ``expodistance_*``: mean, std, median, q25, q75 and ``_nan`` (count of
      tokens without a value) of the per-token metrics.

    Expodistance is heavy-tailed where norms barely grow (post-LN models): read medians."""
    rows = []
    ms = as_runs(runs)
    lead = lead_of(ms, rule) or "coupling_vs_null"
    for m in ms:
        row: dict[str, Any] = {"null_variant": lead}
        for name, var in (("coupling", rule.variant), ("null", lead)):
            vals: pd.Series | None = None
            if depth_rows(m, rule.with_variant(var)) is not None:
                vals = m.per_prompt_coupling(resolve_k(m, rule.k), variant=var, p=rule.p,
                                             orientation=rule.orientation)["value"]
            st = robust_stats([] if vals is None else vals)
            row[f"{name}_mean"] = st.mean
            row[f"{name}_std"] = float(vals.std(ddof=0)) if vals is not None and len(vals) \
                else float("nan")
            row[f"{name}_median"], row[f"{name}_q25"], row[f"{name}_q75"] = (
                st.median, st.q25, st.q75)
        for col in ("lss", "expodistance"):
            v = m.token_metrics[col]
            st = robust_stats(v)
            row[f"{col}_mean"] = st.mean
            row[f"{col}_std"] = float(v.dropna().std(ddof=0)) if st.n else float("nan")
            row[f"{col}_median"], row[f"{col}_q25"], row[f"{col}_q75"] = (
                st.median, st.q25, st.q75)
            row[f"{col}_nan"] = float(st.n_nan)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out[["coupling_mean", "lss_mean", "expodistance_mean"]].isna().all().all():
        raise NoData("no depth-wise coupling and no trajectory metrics to compare")
    return out


def run_overview(runs: Runs, labels: Sequence[str] | None = None,
                 rule: StatisticRule = REPORT_RULE) -> pd.DataFrame:
    """One row per run: what was measured and the headline numbers (the report's summary).

    Columns: label, model, n_prompts, n_layers, k, measured (False: no table has a row),
    kinds (comma-separated coupling kinds present), the headline statistic
    (``engine.statistic``: ``<variant>_mean``, ``<variant>_se`` of ``coupling_vs_rotated``,
    ``coupling_vs_null`` and ``coupling``, ``coupling_chance``, ``statistic_rule``), ``lead``
    (the chance-corrected variant that leads, the same for every run:
    ``summaries.lead_of``), lead_mean, lead_se, lead_median / lead_q25 / lead_q75 /
    lead_min / lead_max (of its per-prompt values), lead_n (how many prompts), lss_median,
    expodistance_median, expodistance_q25, expodistance_q75, expodistance_nan, n_tokens
    (rows of token_metrics). NaN where not measured."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    lead = lead_of(ms, rule)
    rows: list[dict[str, Any]] = []
    for m, lab in zip(ms, labs, strict=True):
        kk = resolve_k(m, rule.k) if m.config.k else None
        row: dict[str, Any] = {
            "label": lab, "model": str(m.meta.get("model", "")), "n_prompts": n_prompts(m),
            "n_layers": n_layers(m), "k": kk, "measured": not is_empty(m),
            "kinds": ", ".join(sorted(set(m.coupling["kind"].dropna().astype(str)))),
        }
        row.update(headline_columns(m, rule))
        row["lead"] = lead
        row["lead_mean"] = row.get(f"{lead}_mean", float("nan")) if lead else float("nan")
        row["lead_se"] = row.get(f"{lead}_se", float("nan")) if lead else float("nan")
        rel = None
        if lead and kk is not None and depth_rows(m, at_run_k(m, rule).with_variant(lead)
                                                  ) is not None:
            rel = m.per_prompt_coupling(kk, variant=lead, p=rule.p,
                                        orientation=rule.orientation)["value"]
        st = robust_stats([] if rel is None else rel)
        row.update(lead_median=st.median, lead_q25=st.q25, lead_q75=st.q75,
                   lead_min=st.min, lead_max=st.max, lead_n=st.n)
        lss = token_metric_stats(m, "lss")
        ed = token_metric_stats(m, "expodistance")
        row.update(lss_median=lss.median, expodistance_median=ed.median,
                   expodistance_q25=ed.q25, expodistance_q75=ed.q75,
                   expodistance_max=ed.max, expodistance_nan=ed.n_nan,
                   n_tokens=len(m.token_metrics))
        rows.append(row)
    return pd.DataFrame(rows)
