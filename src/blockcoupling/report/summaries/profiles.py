"""Depth profiles [paper fig. 24] and per-model trajectory metrics in a chosen order [fig. 23,
37, and the paper's lss-all and expo-all panels]: `depth_profiles` (per layer: the norm, the
windowed LSS, the step length and the logit-lens entropy), `metric_by_run` (per run: a
per-token metric's median and quartiles) and the models' order (`sort_values`, `run_order`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from blockcoupling.engine.results import Measurement
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries.common import NoData, Runs, as_runs, robust_stats

#: the four rows of the paper's fig. 24: trajectory column -> what it is
PROFILE_COLUMNS: dict[str, str] = {
    "norm": "norm ||x^l||",
    "lss_window": "windowed LSS",
    "step_norm": "step length ||x^l - x^(l-1)||",
    "logit_entropy": "logit-lens entropy (nats)",
}

#: per-token metrics a per-model panel can show
RUN_METRICS: tuple[str, ...] = ("lss", "expodistance", "equidistance_cv")

#: sort keys of `sort_values` read from a run's meta (``score`` comes from the caller)
SORT_KEYS: dict[str, str] = {"given": "", "params": "num_parameters", "layers": "num_layers",
                             "d_model": "hidden_size", "score": ""}


def depth_profiles(m: Measurement, token: int | None = None) -> pd.DataFrame:
    """One row per layer: ``layer`` and, for each of `PROFILE_COLUMNS`, ``<col>_median``,
    ``<col>_q25``, ``<col>_q75`` and ``<col>_n`` (values that are not NaN) over prompts and
    tokens (``token``: that position only)."""
    tr = m.trajectory if token is None else m.trajectory[m.trajectory["token"] == token]
    cols = ["layer"] + [f"{c}_{s}" for c in PROFILE_COLUMNS for s in ("median", "q25", "q75", "n")]
    if tr.empty:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    g = tr.groupby("layer")
    out = pd.DataFrame(index=g.size().index)
    for c in PROFILE_COLUMNS:
        out[f"{c}_median"] = g[c].median()
        out[f"{c}_q25"] = g[c].quantile(0.25)
        out[f"{c}_q75"] = g[c].quantile(0.75)
        out[f"{c}_n"] = g[c].count()
    return out.reset_index()[cols]


def metric_by_run(runs: Runs, metric: str) -> pd.DataFrame:
    """One row per run, in order: ``median``, ``q25``, ``q75``, ``n`` and ``n_nan`` of the
    per-(prompt, token) ``metric`` of `RUN_METRICS`."""
    if metric not in RUN_METRICS:
        raise BlockCouplingError(f"metric {metric!r}: choose from {', '.join(RUN_METRICS)}")
    rows = []
    for m in as_runs(runs):
        st = robust_stats(m.token_metrics[metric])
        rows.append({"median": st.median, "q25": st.q25, "q75": st.q75, "n": st.n,
                     "n_nan": st.n_nan})
    out = pd.DataFrame(rows)
    if out.empty or out["n"].sum() == 0:
        raise NoData(f"no {metric} values; measure with trajectory=True")
    return out


def sort_values(runs: Runs, key: str, labels: Sequence[str]) -> list[float]:
    """The value each run is sorted by under ``key`` (`SORT_KEYS`, not ``score``): its
    position (``given``) or the count in its meta; a run without it is one error naming it."""
    if key not in SORT_KEYS or key == "score":
        raise BlockCouplingError(
            f"sort key {key!r}: choose {', '.join(k for k in SORT_KEYS if k != 'score')} "
            "(or score, with a score table)")
    ms = as_runs(runs)
    if key == "given":
        return [float(i) for i in range(len(ms))]
    field = SORT_KEYS[key]
    values = [m.meta.get(field) for m in ms]
    missing = [lab for lab, v in zip(labels, values, strict=True) if v is None]
    if missing:
        raise BlockCouplingError(
            f"sort by {key}: the meta of {', '.join(missing)} has no {field} (measured by an "
            "older version); sort by layers or d_model, or measure again")
    return [float(v) for v in values]  # type: ignore[arg-type]


def run_order(values: Sequence[float | None], labels: Sequence[str], key: str
              ) -> tuple[list[int], list[str]]:
    """Indices of the runs in increasing ``values`` (ties keep the given order), the runs
    without a value (None or NaN: e.g. a model the score table has no score for) last in the
    given order; and the labels of those. Every run without a value is one error."""
    missing = [i for i, v in enumerate(values)
               if v is None or (isinstance(v, float) and math.isnan(v))]
    if len(missing) == len(values):
        raise BlockCouplingError(f"sort by {key}: no run has a value")
    have = [i for i in range(len(values)) if i not in missing]
    order = sorted(have, key=lambda i: float(values[i]))  # type: ignore[arg-type]  # stable
    return order + missing, [labels[i] for i in missing]


__all__ = ["PROFILE_COLUMNS", "RUN_METRICS", "SORT_KEYS", "depth_profiles", "metric_by_run",
           "run_order", "sort_values"]
