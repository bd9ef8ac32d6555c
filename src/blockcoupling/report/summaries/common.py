"""What every summary shares: the run list and its labels, sizes, K and variant checks, robust statistics and number formatting."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine import names
from blockcoupling.engine.results import TABLES, Measurement
from blockcoupling.engine.statistic import PAPER_K, StatisticRule, paper_k
from blockcoupling.errors import BlockCouplingError

Runs = Measurement | Sequence[Measurement]

#: variants whose normaliser takes a user-chosen p (the others store p empty or fixed):
#: the engine's one list (coupling_vs_null and coupling_vs_rotated do not depend on p and are
#: stored with p empty)
P_VARIANTS: tuple[str, ...] = names.P_VARIANTS
#: variants where a larger value means more coupled (for the others, smaller is more coupled):
#: each variant's record (engine/variants.py)
HIGHER_IS_COUPLED: dict[str, bool] = names.HIGHER_IS_COUPLED
TOKEN_KINDS: tuple[str, ...] = ("self", "fixed_input", "fixed_output")
#: why ``expodistance`` is NaN for a token (docs/conventions.md, "Trajectories")
EXPODISTANCE_NAN_REASON = ("its norms ||x^l|| do not change beyond the rounding of the stored "
                           "hidden states (e.g. a post-LN block's LayerNorm fixes them), so "
                           "there is no growth rate")
#: a median |coupling_vs_null| below this counts as "at the chance level" in the report text
CHANCE_BAND = 0.05


class NoData(BlockCouplingError):
    """The data a summary or figure needs was not measured (e.g. no ``self`` coupling rows)."""


# ====================================================================== runs and labels
def as_runs(runs: Runs) -> list[Measurement]:
    """One Measurement or a sequence of them -> a non-empty list."""
    out = [runs] if isinstance(runs, Measurement) else list(runs)
    if not out:
        raise BlockCouplingError("no measurement given: pass one Measurement or a list of them")
    return out


def short_name(name: str) -> str:
    """How a model or run is named on a page: a local path becomes its folder name (the
    last part), a Hub id (``org/name``) and any other name stay as they are. A path is a
    name that starts with ``/``, ``./``, ``../`` or ``~``, holds a backslash or more than
    one ``/``, or is an existing folder."""
    text = str(name).strip()
    stripped = text.rstrip("/\\")
    path_like = (text.startswith(("/", "./", "../", "~")) or "\\" in text
                 or stripped.count("/") > 1
                 or ("/" in stripped and os.path.isdir(os.path.expanduser(stripped))))
    if not path_like:
        return text
    last = stripped.replace("\\", "/").rsplit("/", 1)[-1]
    return last or text


def run_label(m: Measurement, index: int = 0) -> str:
    """A short name for a run: meta ``label``, else ``revision``, else the model id, as
    `short_name` shows it (a local path: its folder name)."""
    for key in ("label", "revision", "model"):
        value = m.meta.get(key)
        if value not in (None, ""):
            return short_name(str(value))
    return f"run {index + 1}"


#: what a run is (``meta``), in the order that tells runs of one name apart
_WHAT_A_RUN_IS = ("init", "init_seed", "revision", "step", "remove_norm_directions", "dtype",
                  "quantize", "device_map")


def _apart(group: Sequence[Measurement]) -> list[str]:
    """Per run of ``group`` (runs that share a name) what differs between them, as
    ``key value`` words: the `_WHAT_A_RUN_IS` entries of ``meta`` whose values differ, else
    the measure options that differ (``tokens last``); empty words where nothing does."""
    def differ(values: list[Any]) -> bool:
        return len({repr(v) for v in values}) > 1

    keys = [k for k in _WHAT_A_RUN_IS if differ([m.meta.get(k) for m in group])]
    values = [[m.meta.get(k) for k in keys] for m in group]
    if not keys:
        configs = [m.config.to_dict() for m in group]
        keys = [k for k in configs[0] if differ([c.get(k) for c in configs])][:2]
        values = [[c.get(k) for k in keys] for c in configs]
    return [", ".join(f"{k} {_word(v)}" for k, v in zip(keys, row, strict=True) if v is not None)
            for row in values]


def _word(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def run_labels(ms: Sequence[Measurement], labels: Sequence[str] | None = None) -> list[str]:
    """Labels for several runs; explicit ``labels`` win. Runs that would share a label are
    told apart by what differs between them (``gpt2 (init random, init_seed 0)`` beside
    ``gpt2 (init pretrained)``); where nothing does, or that is not enough, by a suffix #i."""
    if labels is not None:
        if len(labels) != len(ms):
            raise BlockCouplingError(
                f"{len(labels)} labels for {len(ms)} runs: give one label per run"
            )
        return _numbered([str(x) for x in labels])
    out = [run_label(m, i) for i, m in enumerate(ms)]
    for lab in {lab for lab in out if out.count(lab) > 1}:
        idx = [i for i, x in enumerate(out) if x == lab]
        for i, words in zip(idx, _apart([ms[i] for i in idx]), strict=True):
            if words:
                out[i] = f"{lab} ({words})"
    return _numbered(out)


def _numbered(labels: list[str]) -> list[str]:
    """Labels still shared by several runs get a suffix #i."""
    out = list(labels)
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):
        if labels.count(lab) > 1:
            seen[lab] = seen.get(lab, 0) + 1
            out[i] = f"{lab} #{seen[lab]}"
    return out


def n_prompts(m: Measurement) -> int:
    """Number of prompts of a run (prompts table, else distinct prompt ids in any table)."""
    if len(m.prompts):
        return int(m.prompts["prompt_id"].nunique())
    ids: set[str] = set()
    for name in ("coupling", "trajectory", "token_metrics", "spectra"):
        ids.update(str(v) for v in m.table(name)["prompt_id"].dropna().unique())
    return len(ids)


def is_empty(m: Measurement) -> bool:
    """True when no result table of the run has a row (nothing was measured)."""
    return all(m.table(name).empty for name in TABLES if name not in ("prompts", "diagnostics"))


def n_layers(m: Measurement) -> int | None:
    """Number of blocks L seen in the run's tables (trajectory layers 0..L, else coupling)."""
    if not m.trajectory.empty:
        return int(m.trajectory["layer"].max())
    if not m.coupling.empty:
        return int(max(m.coupling["layer_a"].max(), m.coupling["layer_b"].max()))
    if not m.spectra.empty:
        return int(m.spectra["layer"].max())
    return None


def resolve_k(m: Measurement, k: int | str | None) -> int:
    """The K a summary uses for run ``m``: ``k``, the run's smallest measured K (None) or
    round(d/10) of its width (``"d/10"``)."""
    if k is None:
        return int(min(m.config.k))
    if k == PAPER_K:
        if not m.d_model:
            raise BlockCouplingError("K = round(d/10) needs the model's hidden size, which "
                                     "this run does not record; pass a fixed K instead")
        return paper_k(m.d_model)
    return int(k)


#: the rule a report figure or summary selects its rows by where none is given: raw c_K (the
#: paper's figures) at each run's smallest measured K, p = 1, orientation ujv (the figures
#: read the rule's variant, K, p and orientation; which tokens each shows its caption says)
REPORT_RULE = StatisticRule(variant="coupling")


def at_run_k(m: Measurement, rule: StatisticRule) -> StatisticRule:
    """``rule`` at the K it selects on run ``m`` (`resolve_k`)."""
    return replace(rule, k=resolve_k(m, rule.k))


def check_variant(variant: str, orientation: str) -> None:
    """Raise a clear error for an unknown variant or orientation."""
    if variant not in HIGHER_IS_COUPLED:
        raise BlockCouplingError(
            f"variant {variant!r} is unknown; choose from {', '.join(HIGHER_IS_COUPLED)}"
        )
    if orientation not in ("ujv", "vju"):
        raise BlockCouplingError(f"orientation {orientation!r} is unknown; choose ujv or vju")


# ====================================================================== robust statistics
@dataclass(frozen=True)
class RobustStats:
    """Summary of one sample: counts, quartiles, mean and range (NaN values counted apart)."""

    n: int  # finite values
    n_nan: int  # NaN values (not measured or undefined)
    median: float
    q25: float
    q75: float
    mean: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.q75 - self.q25

    def spans_decades(self, decades: float = 2.0) -> bool:
        """True when the positive values span more than ``decades`` powers of ten."""
        return self.min > 0 and self.max / self.min > 10.0 ** decades


def robust_stats(values: Sequence[float] | np.ndarray | pd.Series) -> RobustStats:
    """`RobustStats` of ``values`` (NaN and +-inf are counted in ``n_nan``)."""
    v = np.asarray(values, dtype=float).ravel()
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        nan = float("nan")
        return RobustStats(0, int(v.size), nan, nan, nan, nan, nan, nan)
    q25, med, q75 = np.quantile(finite, [0.25, 0.5, 0.75])
    return RobustStats(int(finite.size), int(v.size - finite.size), float(med), float(q25),
                       float(q75), float(finite.mean()), float(finite.min()),
                       float(finite.max()))


def token_metric_stats(m: Measurement, column: str, token: int | None = None) -> RobustStats:
    """`RobustStats` over (prompt, token) of a ``token_metrics`` column (``lss``,
    ``expodistance``, ``equidistance_cv``, ``linearisation_cosine``)."""
    tm = m.token_metrics if token is None else m.token_metrics[m.token_metrics["token"] == token]
    return robust_stats(tm[column])


def fmt_number(value: Any, digits: int = 3) -> str:
    """A number for people: ``digits`` significant digits, thousands separators for large
    values, scientific notation for tiny or huge ones, '-' for None / NaN, 'inf' for inf."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if isinstance(value, float | np.floating):
        v = float(value)
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == 0:
            return "0"
        if abs(v) >= 1e6 or abs(v) < 1e-3:
            return f"{v:.{digits}g}"
        if abs(v) >= 10 ** digits:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(value)


def config_differences(a: Measurement, b: Measurement) -> dict[str, tuple[Any, Any]]:
    """Configuration fields (and scalar ``extra`` entries) whose values differ between two
    runs: name -> (value in a, value in b). Lets the report say what separates two views of
    one model (e.g. ``final_norm``) without knowing the option's name in advance."""
    da, db = a.config.to_dict(), b.config.to_dict()
    ea, eb = da.pop("extra", {}) or {}, db.pop("extra", {}) or {}
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(da) | set(db)):
        if key in ("batch_size", "chunk_size", "analysis_device", "figure_prompts",
                   "figure_window", "seed"):
            continue  # do not change a number
        if da.get(key) != db.get(key):
            out[key] = (da.get(key), db.get(key))
    for key in sorted(set(ea) | set(eb)):
        if ea.get(key) != eb.get(key):
            out[f"extra.{key}"] = (ea.get(key), eb.get(key))
    return out
