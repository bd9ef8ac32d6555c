"""Depth-wise coupling: the matrices over layer pairs, coupling against layer distance, the layer graph, the chance level and the headline columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import HEADLINE_VARIANTS, LEAD_VARIANTS, StatisticRule
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries.common import (
    HIGHER_IS_COUPLED,
    REPORT_RULE,
    NoData,
    Runs,
    as_runs,
    at_run_k,
    resolve_k,
)


# ====================================================================== depth-wise coupling
def depth_rows(m: Measurement, rule: StatisticRule) -> pd.DataFrame | None:
    """The run's depth-wise rows of the rule's variant, K (`resolve_k`), p and orientation,
    or None where none were measured."""
    try:
        return m.select("depth", resolve_k(m, rule.k), rule.variant, rule.p, rule.orientation)
    except KeyError:
        return None


def why_no_depth(m: Measurement, rule: StatisticRule) -> str:
    """The message of the failed selection (says what was measured)."""
    try:
        m.select("depth", resolve_k(m, rule.k), rule.variant, rule.p, rule.orientation)
    except KeyError as err:
        return str(err.args[0]) if err.args else "no depth-wise coupling rows"
    return "no depth-wise coupling rows for this selection"


def depth_matrix(m: Measurement, rule: StatisticRule = REPORT_RULE, *,
                 token: int | None = None) -> pd.DataFrame | None:
    """L x L mean depth-wise matrix of one run (rows = measured layer_a, columns = basis
    layer_b, mean over prompts and tokens), or None where not measured."""
    if depth_rows(m, rule) is None:
        return None
    mat = m.depth_matrix(token=token, k=resolve_k(m, rule.k), variant=rule.variant, p=rule.p,
                         orientation=rule.orientation)
    return None if mat.empty else mat


def depth_matrices(runs: Runs, rule: StatisticRule = REPORT_RULE, *,
                   token: int | None = None) -> list[pd.DataFrame | None]:
    """Per run: `depth_matrix` (None where absent); `NoData` if no run has it."""
    ms = as_runs(runs)
    mats = [depth_matrix(m, rule, token=token) for m in ms]
    if all(x is None for x in mats):
        raise NoData(why_no_depth(ms[0], rule))
    return mats


def has_variant(m: Measurement, variant: str, kind: str = "depth") -> bool:
    """True when the run has rows of ``variant`` for ``kind``."""
    c = m.coupling
    return bool(((c["kind"] == kind) & (c["variant"] == variant)).any())


def chance_coupling_rows(m: Measurement, rule: StatisticRule = REPORT_RULE
                         ) -> pd.DataFrame | None:
    """Depth-wise off-diagonal rows with the raw coupling ``c``, ``coupling_vs_null`` ``v``
    and the chance coupling ``c_null`` of the same Jacobian pair (at the rule's K, p and
    orientation; its variant is not read).

    From v = 1 - m / m_null and m = 1 - c: ``c_null = 1 - (1 - c) / (1 - v)``. Rows with
    v = 1 (perfect coupling, c_null undefined) are dropped. None when either variant is
    missing. Columns: prompt_id, token, layer_a, layer_b, coupling, coupling_vs_null,
    chance_coupling."""
    raw = depth_rows(m, rule.with_variant("coupling"))
    rel = depth_rows(m, rule.with_variant("coupling_vs_null"))
    if raw is None or rel is None:
        return None
    keys = ["prompt_id", "token_out_a", "layer_a", "layer_b"]
    both = raw[keys + ["value"]].merge(rel[keys + ["value"]], on=keys,
                                       suffixes=("_c", "_v"))
    both = both[(both["layer_a"] != both["layer_b"]) & (both["value_v"] < 1.0)]
    out = both.rename(columns={"token_out_a": "token", "value_c": "coupling",
                               "value_v": "coupling_vs_null"})
    out["chance_coupling"] = 1.0 - (1.0 - out["coupling"]) / (1.0 - out["coupling_vs_null"])
    return out.reset_index(drop=True)


def coupling_by_distance(runs: Runs, rule: StatisticRule = REPORT_RULE
                         ) -> list[pd.DataFrame | None]:
    """Locality per run: the depth-wise value against layer distance |l - l'|.

    One frame per run (None where absent) with columns distance, mean, std, median, q25, q75,
    count, over every (prompt, token, layer pair) at that distance."""
    ms = as_runs(runs)
    out: list[pd.DataFrame | None] = []
    for m in ms:
        rows = depth_rows(m, rule)
        if rows is None:
            out.append(None)
            continue
        dist = (rows["layer_a"] - rows["layer_b"]).abs().rename("distance")
        g = rows["value"].groupby(dist)
        out.append(pd.DataFrame({
            "mean": g.mean(), "std": g.std(), "median": g.median(),
            "q25": g.quantile(0.25), "q75": g.quantile(0.75), "count": g.size(),
        }).reset_index())
    if all(t is None for t in out):
        raise NoData(why_no_depth(ms[0], rule))
    return out


def layer_graph_weights(matrix: pd.DataFrame) -> dict[tuple[int, int], float]:
    """Edge value for each pair of layers l < l': the mean of M[l, l'] and M[l', l]
    (coupling is not symmetric; the graph is), over the entries that were measured."""
    layers = sorted(set(matrix.index) | set(matrix.columns))
    out: dict[tuple[int, int], float] = {}
    for i, a in enumerate(layers):
        for b in layers[i + 1:]:
            vals = [float(matrix.loc[x, y]) for x, y in ((a, b), (b, a))
                    if x in matrix.index and y in matrix.columns
                    and not pd.isna(matrix.loc[x, y])]
            if vals:
                out[(int(a), int(b))] = float(np.mean(vals))
    return out


def edge_strength(values: np.ndarray | Sequence[float], variant: str) -> np.ndarray:
    """Map edge values to [0, 1] on a FIXED scale, never the data's range, so that a model at
    the chance level looks unstructured whatever its spread.

    ``coupling_vs_null``: 0 = the chance level, 1 = perfect coupling (clipped). ``coupling``:
    the value itself (0 = no coupling, 1 = perfect; chance is above 0). Lower-is-coupled
    variants (``miscoupling``, ``released_*``, ``offdiag_ratio``): 1 - value."""
    v = np.asarray(values, dtype=float)
    s = v if HIGHER_IS_COUPLED[variant] else 1.0 - v
    return np.clip(s, 0.0, 1.0)


def headline_columns(m: Measurement, rule: StatisticRule = REPORT_RULE) -> dict[str, Any]:
    """The headline statistic of a run in wide form (NaN for a variant it did not measure,
    and for every variant where the rule's K is None on a run that measured no K):
    ``<variant>_mean, <variant>_se`` for every headline variant (``coupling_vs_rotated``,
    ``coupling_vs_null``, ``coupling``), ``coupling_chance``, ``statistic_rule``; the
    rule's own variant is not read."""
    nan = float("nan")
    out: dict[str, Any] = {}
    for variant in HEADLINE_VARIANTS:
        out[f"{variant}_mean"], out[f"{variant}_se"] = nan, nan
    out.update(coupling_chance=nan, statistic_rule="")
    if not m.config.k:
        return out
    rule = replace(at_run_k(m, rule), n_boot=0)
    for variant in HEADLINE_VARIANTS:
        if depth_rows(m, rule.with_variant(variant)) is None:
            continue
        try:
            t = m.statistic(replace(rule, tokens=m.headline_tokens), variants=(variant,))
        except BlockCouplingError:
            continue
        r = t.iloc[0]
        out[f"{variant}_mean"], out[f"{variant}_se"] = float(r["mean"]), float(r["se"])
        if variant == "coupling":
            out["coupling_chance"] = float(r["chance"])
        out["statistic_rule"] = out["statistic_rule"] or str(r["rule"])
    return out


def lead_of(runs: Sequence[Measurement], rule: StatisticRule = REPORT_RULE) -> str | None:
    """The chance-corrected variant that leads a page about ``runs`` (at the rule's K, p and
    orientation): the first of ``engine.statistic.LEAD_VARIANTS`` that every run with
    depth-wise rows measured (so runs are compared on one null; ``coupling_vs_null`` where
    some run predates ``coupling_vs_rotated``), else the first any run measured; None if
    none did."""
    with_depth = [m for m in runs if (m.coupling["kind"] == "depth").any()]
    for variant in LEAD_VARIANTS:
        if with_depth and all(depth_rows(m, rule.with_variant(variant)) is not None
                              for m in with_depth):
            return variant
    for variant in LEAD_VARIANTS:
        if any(depth_rows(m, rule.with_variant(variant)) is not None for m in with_depth):
            return variant
    return None


def per_prompt_vs_null(m: Measurement, rule: StatisticRule) -> pd.Series | None:
    """The per-prompt values of the rule's chance-corrected variant by the headline rule, at
    the run's own token rule (None if absent)."""
    if depth_rows(m, rule) is None:
        return None
    return m.per_prompt_coupling(resolve_k(m, rule.k), variant=rule.variant, p=rule.p,
                                 orientation=rule.orientation)["value"].dropna()
