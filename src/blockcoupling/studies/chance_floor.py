"""The width floor of the paper's statistic, diagnosed without measuring any model.

Raw c_K at K = round(d/10) has a chance level set by the width alone (flat spectrum:
``engine.statistic.flat_chance``, c_null = 1 - sqrt(1/d + 1/K)). `chance_floor`
regresses a score table on that floor: if the floor alone explains the scores, a correlation
of raw c_K with them says little about structure. Beside it: the width itself (the scores on
log10 d_model), and how much each model family carries the floor's fit (the fit again
without the family; the one whose removal lowers R^2 most is named). ``blockcoupling
chance-floor`` runs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from blockcoupling.engine.statistic import FLOOR_NOTE, PAPER_K, StatisticRule, flat_chance, paper_k
from blockcoupling.errors import BlockCouplingError
from blockcoupling.jsonsafe import jsonable
from blockcoupling.store.fileio import write_json
from blockcoupling.studies.regression import MIN_MODELS, fit_text, regression
from blockcoupling.studies.scores import check_score_frame, read_scores
from blockcoupling.validate import OptionError

__all__ = ["ChanceFloorResult", "chance_floor", "parse_k_rule"]


def parse_k_rule(value: str | int) -> str | int:
    """``"d/10"`` (the paper's K = round(d/10)) or a fixed positive K: the K of the
    statistic's rule (`StatisticRule.k`, its parser and check), named ``--k-rule``."""
    from blockcoupling.fields import check_value

    k = check_value(StatisticRule, "k", str(value).strip(), "--k-rule")
    if k is None:
        raise OptionError("--k-rule: give d/10 (the paper's K = round(d/10)) or a fixed "
                          "positive K such as 10")
    return cast("str | int", k)


@dataclass
class ChanceFloorResult:
    """The floor of every scored row and the regressions of the scores on it."""

    table: pd.DataFrame  # model, name, group, d_model, k, floor, score
    k_rule: str | int
    scores_source: str
    overall: dict[str, Any]
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    excluded: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        cols = [c for c in ("model", "name", "family", "group", "d_model", "k", "floor", "score")
                if c in self.table.columns]
        rows = self.table[cols].astype(object).where(self.table[cols].notna(), None)
        return jsonable({
            "statistic": {"floor": "flat-spectrum chance level of raw c_K (p = 1): "
                          "1 - sqrt(1/d + 1/K)", "k_rule": self.k_rule},
            "note": FLOOR_NOTE, "scores": self.scores_source, "n_models": len(self.table),
            "overall": self.overall, "groups": self.groups, "models": rows.to_dict("records"),
            "excluded": self.excluded})

    def to_json(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    def summary(self) -> str:
        k = "K = round(d/10)" if self.k_rule == PAPER_K else f"K = {self.k_rule}"
        lines = [f"score against the flat-spectrum chance level of raw c_K ({k}), no model "
                 f"measured; scores: {self.scores_source}"]
        for name, r in [("all", self.overall), *self.groups.items()]:
            lines.append(f"  {name:12s} n={r.get('n', 0):3d} " + fit_text(
                r, "R^2={r2:.3f} p={p:.3g} slope={slope:.4g} (floor {floor_min:.3f} to "
                "{floor_max:.3f})"))
            if "skipped" in r:
                continue
            w = r.get("width")
            if w and "skipped" not in w:
                lines.append(f"  {'':12s} the width alone (score ~ log10 d_model): "
                             f"R^2={w['r2']:.3f} p={w['p']:.3g}")
            lead = r.get("most_influential_family")
            if lead:
                f = r["without_family"][lead]
                lines.append(f"  {'':12s} without {lead} (the family the fit leans on most): "
                             f"n={f['n']} R^2={f['r2']:.3f} p={f['p']:.3g}")
        for e in self.excluded:
            lines.append(f"  excluded {e['model']}: {e['reason']}")
        lines.append("  note: " + FLOOR_NOTE)
        return "\n".join(lines)


_KEEP = ("n", "slope", "intercept", "slope_stderr", "r", "r2", "p", "spearman_rho",
         "spearman_p")


def _regress(x: pd.Series | np.ndarray, y: pd.Series) -> dict[str, Any]:
    if len(y) < MIN_MODELS:
        return {"n": int(len(y)), "skipped": f"fewer than {MIN_MODELS} models with a score"}
    try:
        r = regression(x, y, n_boot=0)
    except BlockCouplingError as err:
        return {"n": int(len(y)), "skipped": str(err)}
    return {k: r[k] for k in _KEEP}


def _fit(sub: pd.DataFrame) -> dict[str, Any]:
    """The scores on the floor; beside it the scores on log10 d_model (``width``) and the
    floor's fit without each model family (``without_family``, where the table has a
    ``family`` column), naming the family whose removal lowers R^2 most."""
    out = _regress(sub["floor"], sub["score"])
    if "skipped" in out:
        return out
    out.update(floor_min=float(sub["floor"].min()), floor_max=float(sub["floor"].max()),
               width=_regress(np.log10(sub["d_model"].astype(float)), sub["score"]))
    if "family" in sub.columns and sub["family"].notna().any():
        without = {}
        for fam in sorted(sub["family"].dropna().astype(str).unique()):
            rest = sub[sub["family"].astype(str) != fam]
            r = _regress(rest["floor"], rest["score"])
            if "skipped" not in r:
                without[fam] = {k: r[k] for k in ("n", "r2", "p", "slope")}
        out["without_family"] = without
        if without:
            out["most_influential_family"] = min(without, key=lambda f: without[f]["r2"])
    return out


def chance_floor(scores: str | Path | pd.DataFrame, *,
                 k_rule: str | int = PAPER_K) -> ChanceFloorResult:
    """Regress the scores on the width floor of raw c_K (``n, slope, R^2, p``), over all rows
    and per ``group`` where the table has one (the paper's table: base / fine-tuned).
    Rows without a score or a d_model are listed in ``excluded``. The table is read as
    `correlate` reads it (``scores.check_score_frame``: one row per model by
    ``studies.joins``'s name rule, in one order), so its rows in another order give the same
    result."""
    rule = parse_k_rule(k_rule)
    if isinstance(scores, pd.DataFrame):  # checked and ordered as a file is
        df, source = check_score_frame(scores, "score table"), "table given in Python"
    else:
        df, source = read_scores(scores)
    if "d_model" not in df.columns:
        raise BlockCouplingError(f"{source}: the score table has no d_model column; add each "
                                 "model's hidden size")
    excluded = []
    for _, row in df.iterrows():
        _check_width(row, rule, source)
        why = [w for w, bad in (("no score", not np.isfinite(_num(row.get("score")))),
                                ("no d_model", math.isnan(_num(row.get("d_model"))))) if bad]
        if why:
            excluded.append({"model": str(row["model"]), "reason": " and ".join(why)})
    ok = df["score"].map(_num).map(np.isfinite) & df["d_model"].map(_num).notna()
    table = df[ok].copy().reset_index(drop=True)
    table["d_model"] = table["d_model"].astype(float).astype(int)
    table["score"] = table["score"].astype(float)
    table["k"] = [paper_k(d) if rule == PAPER_K else int(rule) for d in table["d_model"]]
    table["floor"] = flat_chance(table["d_model"].to_numpy(), table["k"].to_numpy())
    overall = _fit(table)
    groups = {}
    if "group" in table.columns and table["group"].notna().any():
        for g, sub in table.groupby(table["group"].fillna("(none)").astype(str), sort=True):
            groups[str(g)] = _fit(sub)
    return ChanceFloorResult(table=table, k_rule=rule, scores_source=source, overall=overall,
                             groups=groups, excluded=excluded)


#: the widest d_model a score row may give: far above any transformer's (the widest public
#: ones are about 2^15); a larger number is a typo or another unit, never a width
MAX_D_MODEL = 1 << 20


def _check_width(row: pd.Series, rule: str | int, source: str) -> None:
    """A row's d_model, where given, is a whole number in [2, MAX_D_MODEL] and larger than its
    K (a top-K subspace of a d-dimensional Jacobian needs K < d); else one line naming it."""
    d = _num(row.get("d_model"))
    if math.isnan(d):
        return  # blank: the row is listed as excluded
    where = f"{source}: model {row['model']}"
    if not (math.isfinite(d) and d.is_integer() and 2 <= d <= MAX_D_MODEL):
        raise BlockCouplingError(
            f"{where}: d_model {row.get('d_model')!r} is not a width; give the hidden size as "
            f"a whole number between 2 and {MAX_D_MODEL} (or leave it blank to exclude the row)")
    k = paper_k(int(d)) if rule == PAPER_K else int(rule)
    if k >= d:
        raise BlockCouplingError(
            f"{where}: K = {k} is not below d_model {int(d)}; the chance level of a top-K "
            "subspace needs K < d: give a smaller --k-rule (or d/10)")


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
