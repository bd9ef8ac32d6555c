"""The report's summary in words, generated from the data (no canned claims): `report_summary`
states what was measured, the headline numbers against the chance level (the leading
chance-corrected variant, `summaries.lead_of`), the comparisons the runs allow (runs of one
model side by side, training checkpoints in order) and what the numbers do not show. A
sentence whose condition does not hold is left out. No matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.report.summaries import (
    CHANCE_BAND,
    EXPODISTANCE_NAN_REASON,
    REPORT_RULE,
    as_runs,
    config_differences,
    fmt_number,
    per_prompt_vs_null,
    run_labels,
    run_overview,
)

__all__ = ["ReportSummary", "report_summary"]


@dataclass
class ReportSummary:
    """Plain-text paragraphs of the summary, by purpose (each a list of sentences)."""

    measured: list[str] = field(default_factory=list)  # what was measured
    headline: list[str] = field(default_factory=list)  # one line per run
    comparisons: list[str] = field(default_factory=list)  # runs against each other
    caveats: list[str] = field(default_factory=list)  # what the numbers do not show
    nothing_measured: bool = False
    #: the headline numbers, one row per run (index = label), display-ready values
    table: pd.DataFrame | None = None

    def lines(self) -> list[str]:
        return self.measured + self.headline + self.comparisons + self.caveats


def _f(x: Any) -> str:
    return fmt_number(x, 3)


def _kinds_text(kinds: set[str]) -> str:
    names = {"depth": "depth-wise (J^l_tt against J^l'_tt)",
             "self": "token-wise (J^l_tt against J^l'_t't')",
             "fixed_input": "context, fixed input token", "fixed_output":
             "context, fixed output token"}
    return "; ".join(names.get(k, k) for k in sorted(kinds))


def _group_by_model(ov: pd.DataFrame) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, model in enumerate(ov["model"]):
        groups.setdefault(str(model) or f"run {i + 1}", []).append(i)
    return groups


def _show(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_show(v) for v in value)
    return fmt_number(value) if isinstance(value, float) else str(value)


def _pm(mean: Any, se: Any) -> str:
    """``mean ± se`` (the se left out where there is none)."""
    return f"{_f(mean)} ± {_f(se)}" if np.isfinite(se) else _f(mean)


def _lead(ov: pd.DataFrame) -> str:
    """The chance-corrected variant the page leads with (the same for every run)."""
    leads = [x for x in ov["lead"] if isinstance(x, str)] if "lead" in ov else []
    return leads[0] if leads else "coupling_vs_null"


def headline_table(ov: pd.DataFrame) -> pd.DataFrame:
    """The headline numbers of `run_overview` as a display table (index = label).
    Columns without any value (e.g. no coupling_vs_null measured) are left out."""
    t = pd.DataFrame(index=pd.Index(ov["label"], name="run"))
    t["K"] = ov["k"].to_numpy()
    t["prompts"] = ov["n_prompts"].to_numpy()
    lead = _lead(ov)
    t[f"above chance ({lead})"] = ov["lead_mean"].to_numpy()
    t["± se"] = ov["lead_se"].to_numpy()
    if (ov["lead_n"] > 1).any():  # a range needs two or more prompts
        t["above chance: min prompt"] = ov["lead_min"].to_numpy()
        t["above chance: max prompt"] = ov["lead_max"].to_numpy()
    if lead == "coupling_vs_rotated":  # the other null beside it
        t["vs independent bases (coupling_vs_null)"] = ov["coupling_vs_null_mean"].to_numpy()
        t["± se "] = ov["coupling_vs_null_se"].to_numpy()
    t["raw c_K"] = ov["coupling_mean"].to_numpy()
    t["raw ± se"] = ov["coupling_se"].to_numpy()
    t["chance c_K"] = ov["coupling_chance"].to_numpy()
    t["LSS median"] = ov["lss_median"].to_numpy()
    t["expodistance median"] = ov["expodistance_median"].to_numpy()
    t["expodistance q25"] = ov["expodistance_q25"].to_numpy()
    t["expodistance q75"] = ov["expodistance_q75"].to_numpy()
    t["expodistance NaN tokens"] = [
        f"{int(n)} of {int(tot)}" if tot else np.nan
        for n, tot in zip(ov["expodistance_nan"], ov["n_tokens"], strict=True)]
    t = t.loc[:, [c for c in t.columns if t[c].notna().any()]]
    if not any(str(c).startswith(("above chance", "raw c_K")) for c in t.columns):
        t = t.drop(columns=["K"], errors="ignore")  # no coupling: K describes nothing here
    return t


def _overlap(a: pd.Series | None, b: pd.Series | None) -> bool | None:
    """Do the per-prompt ranges overlap? None when either has fewer than 2 values."""
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    return bool(a.min() <= b.max() and b.min() <= a.max())


#: options that choose what is measured or how it is computed, not what a value means: runs
#: that differ only in these are one "view" of a model
_EXTENT_OPTIONS = frozenset({"coupling", "lss_window", "trajectory", "spectra", "influence",
                             "layer_pairs", "variants", "orientations", "method", "fast_path",
                             "svd_oversample", "svd_iters", "svd_tol", "k"})


def _pairs(ms: Sequence[Measurement], idx: list[int]) -> list[tuple[int, int]]:
    """Which runs of one model to compare: within each view (runs with the same
    number-changing configuration) consecutive runs (e.g. pretrained vs random init); across
    views the runs of the same revision (e.g. as measured vs with an option switched on)."""
    views: dict[str, list[int]] = {}
    for i in idx:
        diff = config_differences(ms[idx[0]], ms[i])
        key = repr(sorted((k, v) for k, v in diff.items() if k not in _EXTENT_OPTIONS))
        views.setdefault(key, []).append(i)
    pairs = [(a, b) for members in views.values() for a, b in zip(members, members[1:],
                                                                    strict=False)]
    groups = list(views.values())
    for g, members in enumerate(groups):
        for a in members:
            for other in groups[g + 1:]:
                pairs += [(a, b) for b in other
                          if ms[a].meta.get("revision") == ms[b].meta.get("revision")
                          and ms[a].meta.get("revision") is not None]
    return pairs


def _series_text(ms: Sequence[Measurement], ov: pd.DataFrame, labs: list[str],
                 idx: list[int], model: str) -> str:
    """Training checkpoints in step order: first, last, highest, correlation with val_loss."""
    order = sorted(idx, key=lambda i: float(ms[i].meta["step"]))
    vals = [float(ov.loc[i, "lead_mean"]) for i in order]
    best = order[int(np.nanargmax(vals))]
    first, last = order[0], order[-1]
    text = (f"Across {len(order)} training checkpoints of {model}: above chance "
            f"{_f(vals[0])} at {labs[first]}, {_f(vals[-1])} at {labs[last]}; highest "
            f"{_f(np.nanmax(vals))} at {labs[best]}")
    if best not in (first, last):
        text += " (it does not rise monotonically with the training step)"
    losses = [ms[i].meta.get("val_loss") for i in order]
    if len(order) >= 3 and all(isinstance(v, int | float) and not isinstance(v, bool)
                               for v in losses):
        from scipy.stats import spearmanr

        rho = float(spearmanr(vals, losses).statistic)
        text += (f". Spearman correlation with the validation loss over the checkpoints: "
                 f"{_f(rho)} (negative = coupling rises as the loss falls)")
    return text + "."


def _pair_text(ms: Sequence[Measurement], ov: pd.DataFrame, labs: list[str],
               vs: dict[int, pd.Series | None], a: int, b: int) -> str:
    """Two runs of one model: above chance, raw order, overlap, configuration differences."""
    va, vb = float(ov.loc[a, "lead_mean"]), float(ov.loc[b, "lead_mean"])
    word = "above" if va > vb else "below" if va < vb else "equal to"
    text = (f"{labs[a]} vs {labs[b]}: depth coupling above chance {_f(va)} vs {_f(vb)} "
            f"({labs[a]} {word} {labs[b]}")
    ca, cb = float(ov.loc[a, "coupling_mean"]), float(ov.loc[b, "coupling_mean"])
    if not np.isnan(ca - cb) and np.sign(ca - cb) != np.sign(va - vb):
        text += (f"; the raw c_K {_f(ca)} vs {_f(cb)} ranks them the other way: raw values "
                 "include the chance level, which differs between them")
    text += ")"
    ovl = _overlap(vs[a], vs[b])
    if ovl is True:
        text += ("; their per-prompt values overlap, so the difference is within the "
                 "prompt-to-prompt spread")
    elif ovl is False:
        text += "; their per-prompt values do not overlap"
    diff = config_differences(ms[a], ms[b])
    if diff:
        text += "; the configuration differs in " + "; ".join(
            f"{name} ({_show(x)} vs {_show(y)})" for name, (x, y) in diff.items())
    return text + "."


def _ranking_text(ov: pd.DataFrame, labs: list[str], idx: list[int], what: str) -> str:
    order = sorted(idx, key=lambda i: -float(ov.loc[i, "lead_mean"]))
    return (f"{what} ranked by depth coupling above chance ({_lead(ov)}): "
            + " > ".join(f"{labs[i]} ({_f(ov.loc[i, 'lead_mean'])})" for i in order) + ".")


def report_summary(runs: Measurement | Sequence[Measurement],
                   labels: Sequence[str] | None = None,
                   rule: StatisticRule = REPORT_RULE) -> ReportSummary:
    """The summary of ``runs`` (see the module docstring) under ``rule`` (its K, p and
    orientation; the headline variants are stated, whatever its variant)."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    ov = run_overview(ms, labs, rule)
    out = ReportSummary(table=headline_table(ov[ov["measured"]]))
    if not ov["measured"].any():
        out.nothing_measured = True
        out.measured.append(
            "Nothing was measured: " + ", ".join(labs) + (" has" if len(ms) == 1 else " have")
            + " no rows in any result table (coupling, trajectory, token metrics, spectra, "
            "influence). Re-run the measurement (e.g. `blockcoupling measure ... --resume`).")
        return out
    out.measured = _measured(ms, labs, ov)
    if len(ms) <= 3:  # many runs: the table says it
        lead = _lead(ov)
        out.headline = [line for _, r in ov.iterrows() if r["measured"]
                        for line in _headline(r, lead)]
    out.comparisons = _comparisons(ms, labs, ov, rule)
    out.caveats = _caveats(ov)
    return out


def _kinds(ov: pd.DataFrame) -> set[str]:
    """The coupling kinds any run measured."""
    return {k_ for s in ov["kinds"] for k_ in s.split(", ") if k_}


def _measured(ms: Sequence[Measurement], labs: list[str], ov: pd.DataFrame) -> list[str]:
    """What was measured, and for which runs nothing was."""
    kinds = _kinds(ov)
    n_models = len(_group_by_model(ov))
    prompts = sorted(set(ov["n_prompts"]))
    ks = sorted({int(x) for x in ov["k"].dropna()})
    parts = [f"{len(ms)} run{'s' if len(ms) > 1 else ''} of {n_models} "
             f"model{'s' if n_models > 1 else ''}"]
    parts.append(f"{'/'.join(map(str, prompts))} prompt{'s' if prompts != [1] else ''} per run")
    if kinds:
        parts.append(f"coupling of the block Jacobians ({_kinds_text(kinds)}) at K = "
                     + ", ".join(map(str, ks)))
    if (ov["n_tokens"] > 0).any():
        parts.append("hidden-state trajectories (norms, LSS, expodistance)")
    if any(not m.spectra.empty for m in ms):
        parts.append("top singular values per layer")
    out = ["Measured: " + "; ".join(parts) + "."]
    empty = [lab for lab, ok in zip(labs, ov["measured"], strict=True) if not ok]
    if empty:
        out.append(f"Nothing was measured for {', '.join(empty)}.")
    return out


def _headline(r: pd.Series, lead: str) -> list[str]:
    """A measured run's headline: its coupling against chance, its trajectories."""
    out = []
    if r["lead_n"] > 0:
        spread = (f" over {int(r['lead_n'])} prompts (per-prompt range "
                  f"{_f(r['lead_min'])} to {_f(r['lead_max'])})"
                  if r["lead_n"] > 1 else " (one prompt: no standard error)")
        beside = (f"; against independent bases (coupling_vs_null) "
                  f"{_pm(r['coupling_vs_null_mean'], r['coupling_vs_null_se'])}"
                  if lead == "coupling_vs_rotated"
                  and np.isfinite(r["coupling_vs_null_mean"]) else "")
        out.append(
            f"{r['label']}: depth coupling above chance ({lead}) "
            f"{_pm(r['lead_mean'], r['lead_se'])}{spread}{beside}; "
            f"raw c_K {_pm(r['coupling_mean'], r['coupling_se'])} against a chance level "
            f"of {_f(r['coupling_chance'])} (K={r['k']}; ± is one standard error over "
            f"prompts, within one model; rule: {r['statistic_rule']}).")
    elif not np.isnan(r["coupling_mean"]):
        out.append(
            f"{r['label']}: mean off-diagonal depth coupling c_K "
            f"{_pm(r['coupling_mean'], r['coupling_se'])} "
            f"(K={r['k']}); the chance level was not measured (variant coupling_vs_null), "
            f"for a flat spectrum it is about 1 - 1/sqrt(K) = "
            f"{_f(1 - 1 / np.sqrt(r['k']))}.")
    if r["n_tokens"] > 0:
        ed_nan = int(r["expodistance_nan"])
        ed = (f"expodistance median {_f(r['expodistance_median'])} (IQR "
              f"{_f(r['expodistance_q25'])} to {_f(r['expodistance_q75'])})"
              if r["n_tokens"] > ed_nan else "no finite expodistance")
        line = f"{r['label']} trajectories: LSS median {_f(r['lss_median'])}; {ed}"
        if ed_nan:
            line += f"; {ed_nan} of {int(r['n_tokens'])} tokens NaN"
        out.append(line + ".")
    return out


def _comparisons(ms: Sequence[Measurement], labs: list[str], ov: pd.DataFrame,
                 rule: StatisticRule) -> list[str]:
    """Checkpoints of one model in order, its other runs side by side (ranked when many),
    one run per model ranked."""
    out = []
    has_null = ov["lead_n"] > 0
    vs = {i: per_prompt_vs_null(ms[i], rule.with_variant(_lead(ov))) for i in range(len(ms))}
    for model, idx in _group_by_model(ov).items():
        idx = [i for i in idx if has_null[i]]
        stepped = [i for i in idx if isinstance(ms[i].meta.get("step"), int | float)
                   and not isinstance(ms[i].meta.get("step"), bool)]
        if len({ms[i].meta["step"] for i in stepped}) != len(stepped):
            stepped = []
        if len(stepped) >= 2:
            out.append(_series_text(ms, ov, labs, stepped, model))
        rest = [i for i in idx if i not in stepped]
        if len(rest) > 6:
            out.append(_ranking_text(ov, labs, rest, f"Runs of {model}"))
            continue
        for a, b in _pairs(ms, rest):
            out.append(_pair_text(ms, ov, labs, vs, a, b))
    groups = [[i for i in idx if has_null[i]] for idx in _group_by_model(ov).values()]
    if len(groups) > 1 and all(len(g) == 1 for g in groups):  # one run per model: rank them
        out.append(_ranking_text(ov, labs, [g[0] for g in groups], "Models"))
    return out


def _caveats(ov: pd.DataFrame) -> list[str]:
    """What the numbers do not show."""
    out = []
    lead = _lead(ov)
    at_chance = [r["label"] for _, r in ov.iterrows()
                 if r["lead_n"] > 0 and abs(r["lead_mean"]) < CHANCE_BAND]
    if at_chance:
        out.append(
            f"At the chance level (|mean {lead}| < {CHANCE_BAND}): {', '.join(at_chance)}: "
            "their raw coupling is what bases without alignment to the Jacobian give, not "
            "structure.")
    iso = [r["label"] for _, r in ov.iterrows() if lead == "coupling_vs_rotated"
           and r["lead_n"] > 0 and r["coupling_vs_null_mean"] - r["lead_mean"] > 0.1]
    if iso:
        out.append(
            f"For {', '.join(iso)} coupling_vs_null exceeds coupling_vs_rotated by more "
            "than 0.1: part of what independent random bases count as coupling is the "
            "Jacobians' isotropic part (tr(J)/d times the identity) seen through bases "
            "whose left and right vectors are related; the diagnostics table's "
            "trace_over_d, isotropic_share and uv_overlap say how much.")
    few = [r["label"] for _, r in ov.iterrows() if r["measured"] and r["n_prompts"] < 5]
    if few:
        who = ("every run" if len(few) == int(ov["measured"].sum()) else ", ".join(few))
        out.append(
            f"Fewer than 5 prompts in {who}: the numbers describe these prompts, not a "
            "population of inputs.")
    if (n_models := len(_group_by_model(ov))) < 3:
        out.append(
            f"{n_models} model{'s' if n_models > 1 else ''}: the runs cannot show a relation "
            "between coupling and generalisation (the paper's claim is a regression across "
            "many models with benchmark scores).")
    nan_runs = [(r["label"], int(r["expodistance_nan"]), int(r["n_tokens"]))
                for _, r in ov.iterrows() if r["expodistance_nan"] > 0]
    if nan_runs:
        out.append(
            "Expodistance is NaN for " + "; ".join(f"{n} of {t} tokens of {lab}"
                                                   for lab, n, t in nan_runs)
            + f": {EXPODISTANCE_NAN_REASON}.")
    wide = [r["label"] for _, r in ov.iterrows()
            if r["n_tokens"] > 0 and r["expodistance_q25"] > 0
            and r["expodistance_max"] / max(r["expodistance_q75"], 1e-300) > 100]
    if wide:
        out.append(
            f"Expodistance is heavy-tailed for {', '.join(wide)} (single tokens more than "
            "100 times the upper quartile): read medians, not means.")
    if not (ov["lead_n"] > 0).any() and _kinds(ov):
        out.append("The chance level was not measured (variant coupling_vs_null): raw "
                   "c_K values of different K or different spectra are not comparable.")
    return out
