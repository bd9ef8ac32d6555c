"""Coupling against generalisation: the paper's correlation study (its fig. 1a, 8, 9, table 4).

Three steps, each a plain function:

1. **The coupling statistic per model** (:class:`CouplingStatistic`, :func:`model_table`):
   the headline rule of ``engine.statistic`` (mean over prompts of the per-prompt mean over
   layer pairs l != l' at each prompt's last measured token, p = 1, orientation ``ujv``;
   ``docs/conventions.md``) for raw c_K (as the paper) and ``coupling_vs_null`` (chance
   corrected), each with its standard error over prompts, and the chance level of raw c_K,
   with K = round(d / 10) per model (at least 1) unless a fixed K is given. Models measured
   on different prompt sets are refused unless told otherwise (:func:`check_prompt_sets`).
2. **The scores** (:func:`read_scores`): a CSV (``model``, ``score``, optional ``params_b,
   layers, d_model, train_tokens_t, group``), ``"paper"`` (the paper's Table 1 shipped as
   package data with a hub id for every row, :func:`paper_scores`), or an lm-evaluation-harness
   output folder (:func:`read_lmeval_dir`). Models are matched to runs by label, model id,
   ``model@revision`` or run folder name (:func:`match_scores`).
3. **The statistics** (:func:`regression`, :func:`exponential_fit`, :func:`partial_correlation`,
   :func:`analyse`): for coupling and every other predictor present, n, slope, intercept, R^2,
   p, Pearson r with a seeded percentile-bootstrap 95% CI of R^2, Spearman rho and p
   (scipy.stats); the exponential fit score = a exp(b coupling) (scipy.optimize.curve_fit); the
   partial correlation of each coupling predictor with the score controlling for log10
   d_model, log10 parameters and both (statsmodels OLS, :func:`partial_correlations`); with
   ``floor`` what the measured chance level explains (:func:`floor_analysis`); the same per
   ``group``. Every output carries :data:`FLOOR_NOTE`.

scipy and statsmodels are the optional extra ``blockcoupling[study]``; a clear error says so
when they are missing. :func:`correlate` runs all three steps on run directories.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine.statistic import (
    FLOOR_NOTE,
    PAPER_K,
    StatisticRule,
    statistic_table,
)
from blockcoupling.errors import BlockCouplingError

__all__ = [
    "OPTIONAL_COLUMNS",
    "PREDICTORS",
    "CorrelationResult",
    "CouplingStatistic",
    "ModelUnit",
    "analyse",
    "correlate",
    "exponential_fit",
    "load_units",
    "match_scores",
    "check_prompt_sets",
    "floor_analysis",
    "model_table",
    "paper_scores",
    "partial_correlation",
    "partial_correlations",
    "read_lmeval_dir",
    "read_scores",
    "read_scores_csv",
    "regression",
]

#: Predictors regressed against the score, in output order: the headline statistic
#: (coupling_vs_null first, then raw c_K as the paper), then the models' shape. ``log_params`` =
#: log10(params_b * 1e9), ``log_d_model`` = log10(d_model).
COUPLING_PREDICTORS: tuple[str, ...] = ("coupling_vs_null_mean", "coupling_mean")
PREDICTORS: tuple[str, ...] = (*COUPLING_PREDICTORS, "params_b", "layers", "d_model",
                               "train_tokens_t", "log_params", "log_d_model")
#: the controls of the partial correlations, alone and together
CONTROLS: tuple[tuple[str, ...], ...] = (("log_d_model",), ("log_params",),
                                         ("log_d_model", "log_params"))
#: Optional columns of a score table.
OPTIONAL_COLUMNS: tuple[str, ...] = ("params_b", "layers", "d_model", "train_tokens_t", "group")
MIN_MODELS = 3


def _stats() -> tuple[Any, Any]:
    """scipy.stats and statsmodels.api, or a clear error naming the extra to install."""
    try:
        import scipy.stats as st
        import statsmodels.api as sm
    except ImportError as err:
        raise BlockCouplingError(
            f"the correlation study needs scipy and statsmodels ({err.name} is missing): "
            "pip install 'blockcoupling[study]'"
        ) from None
    return st, sm


# ----------------------------------------------------------------------------------------------
# 1. The coupling statistic per model
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CouplingStatistic:
    """How each model's numbers are made: the headline rule of ``engine.statistic`` for every
    variant in ``variants`` (default raw ``coupling``, as the paper, and ``coupling_vs_null``).

    ``k=None`` means K = max(1, round(d / 10)) per model (the paper's choice for the
    correlation). ``p`` applies to ``coupling``/``miscoupling``; ``tokens`` and ``diagonal``
    as in :func:`blockcoupling.coupling_statistic`.
    """

    variants: tuple[str, ...] = ("coupling", "coupling_vs_null")
    p: float | None = 1.0
    orientation: str = "ujv"
    k: int | None = None
    tokens: str = "last"
    diagonal: bool = False

    def __post_init__(self) -> None:
        for v in self.variants:  # the rule checks every name once, here, before any run loads
            StatisticRule(variant=v, k=self.k, p=self.p, orientation=self.orientation,
                          tokens=self.tokens, diagonal=self.diagonal)

    @property
    def k_rule(self) -> int | str:
        return int(self.k) if self.k is not None else PAPER_K

    def describe(self) -> str:
        rule = StatisticRule(variant=self.variants[0], k=self.k_rule, p=self.p,
                             orientation=self.orientation, tokens=self.tokens,
                             diagonal=self.diagonal)
        return (rule.describe().replace(f"depth-wise {self.variants[0]}",
                                        "depth-wise " + " and ".join(self.variants))
                + " (K per model)" * (self.k is None))

    def to_dict(self) -> dict[str, Any]:
        return {v: StatisticRule(variant=v, k=self.k_rule, p=self.p,
                                 orientation=self.orientation, tokens=self.tokens,
                                 diagonal=self.diagonal).to_dict()
                for v in self.variants}


@dataclass
class ModelUnit:
    """One measured model: its names, its shape and its ``coupling`` table."""

    label: str
    model: str
    coupling: pd.DataFrame
    hidden_size: int
    num_layers: int
    revision: str | None = None
    step: int | None = None
    source: str = ""
    keys: tuple[str, ...] = ()  # extra names a score table may use (e.g. the run folder name)
    prompt_set: str = ""  # sha256 of the measured prompts' ids and texts

    def match_keys(self) -> list[str]:
        """Names a score row may use for this unit, most specific first."""
        keys = [self.label, f"{self.model}@{self.revision}" if self.revision else "", self.model,
                *self.keys]
        out: list[str] = []
        for key in keys:
            if key and key not in out:
                out.append(key)
        return out


def _unit_from_run(path: Path) -> ModelUnit:
    from blockcoupling.store.rundir import open_run

    m = open_run(path)
    meta = m.meta
    model = str(meta.get("model") or path.name)
    revision = meta.get("revision")
    label = str(meta.get("label") or (f"{model}@{revision}" if revision else model))
    step = meta.get("step")
    return ModelUnit(label=label, model=model, coupling=m.coupling,
                     hidden_size=int(meta.get("hidden_size") or 0),
                     num_layers=int(meta.get("num_layers") or 0),
                     revision=str(revision) if revision else None,
                     step=int(step) if step is not None else None, source=str(path),
                     keys=(path.name,), prompt_set=prompt_set_of(m.prompts))


def prompt_set_of(prompts: pd.DataFrame) -> str:
    """A run's prompt set: sha256 of its prompts' ids and texts, in id order."""
    import hashlib

    rows = sorted(zip(prompts["prompt_id"].astype(str), prompts["text"].astype(str),
                      strict=True))
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _sweep_reader() -> Any:
    """``blockcoupling.studies.sweep`` if this install has it, else None."""
    try:
        from blockcoupling.studies import sweep
    except ImportError:
        return None
    return sweep


def _units_from_sweep(sweep: Any, path: Path) -> list[ModelUnit]:
    """One unit per done unit of a sweep directory, named by the sweep's catalogue."""
    sw = sweep.open_sweep(path)
    sw.verify()  # a damaged unit: named, with the resume that measures it again
    rows = sw.done().to_dict("records")
    labels = [str(r.get("label") or "") for r in rows]
    prompt_sets = {str(r.get("prompt_set")) for r in rows}
    units = []
    for row, label in zip(rows, labels, strict=True):
        unit = _unit_from_run(Path(sw.run_dir(row["unit_id"])))
        for name in ("model", "revision"):
            if isinstance(row.get(name), str) and row[name]:
                setattr(unit, name, row[name])
        step = row.get("step")
        unit.step = int(step) if step is not None and not pd.isna(step) else None
        if label and labels.count(label) > 1:  # checkpoints of one model: name each one
            label += (f"-step{unit.step}" if unit.step is not None
                      else f"@{unit.revision}" if unit.revision else f"-{row['unit_id']}")
            if len(prompt_sets) > 1:
                label += f"-{Path(str(row['prompt_set'])).stem}"
        unit.label = label or unit.label
        unit.keys = (*unit.keys, str(row["unit_id"]))
        units.append(unit)
    if not units:
        raise BlockCouplingError(f"the sweep {path} has no finished unit yet; run it first")
    return units


def load_units(paths: Iterable[str | Path],
               labels: Sequence[str] | None = None) -> list[ModelUnit]:
    """One :class:`ModelUnit` per run directory; a sweep directory adds one per done unit.
    ``labels`` (one per run directory, no sweeps) name the models instead of their manifests'
    label or model id: the names the score table's ``model`` column uses."""
    from blockcoupling.store.rundir import is_run_dir

    sweep = _sweep_reader()
    units: list[ModelUnit] = []
    paths = list(paths)
    if labels is not None:
        if len(labels) != len(paths):
            raise BlockCouplingError(f"--labels gives {len(labels)} label(s) for {len(paths)} "
                                     "input(s); give one label per run directory")
        if not all(is_run_dir(Path(x)) for x in paths):
            raise BlockCouplingError("--labels names run directories one by one; a sweep's "
                                     "units are named by the sweep (pass the runs instead)")
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise BlockCouplingError(f"{path} does not exist; pass run directories "
                                     "(blockcoupling measure --out DIR) or a sweep directory")
        if is_run_dir(path):
            units.append(_unit_from_run(path))
            continue
        if sweep is not None and sweep.is_sweep_dir(path):
            units += _units_from_sweep(sweep, path)
            continue
        raise BlockCouplingError(f"{path} is not a blockcoupling run directory (no readable "
                                 "manifest.json); pass run directories written by "
                                 "`blockcoupling measure` or a sweep directory")
    if labels is not None:
        for unit, label in zip(units, labels, strict=True):
            unit.label = label
    names = [u.label for u in units]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise BlockCouplingError(f"several runs share the label(s) {', '.join(dup)}; each model "
                                 "must appear once (name them with --labels a,b,c, one per run)")
    return units


def model_table(units: Sequence[ModelUnit], statistic: CouplingStatistic) -> pd.DataFrame:
    """One row per unit: label, model, revision, step, source, d_model_run, layers_run, k,
    n_prompts, prompt_set, and per variant ``<variant>_mean`` and ``<variant>_se`` (the
    headline statistic, ``engine.statistic``), ``coupling_chance`` (the mean chance level of
    raw c_K, where coupling_vs_null was measured too)."""
    rows = []
    for u in units:
        if statistic.k is None and u.hidden_size < 1:
            raise BlockCouplingError(f"{u.source or u.label}: hidden size unknown, so K = d/10 "
                                     "cannot be chosen; pass --k")
        t = statistic_table(u.coupling, variants=statistic.variants, k=statistic.k_rule,
                            p=statistic.p, orientation=statistic.orientation,
                            tokens=statistic.tokens, diagonal=statistic.diagonal,
                            d_model=u.hidden_size or None, n_boot=0,
                            where=u.source or u.label).set_index("variant")
        row: dict[str, Any] = {
            "label": u.label, "model": u.model, "revision": u.revision, "step": u.step,
            "source": u.source, "d_model_run": u.hidden_size, "layers_run": u.num_layers,
            "k": int(t["k"].iloc[0]), "n_prompts": int(t["n_prompts"].min()),
            "prompt_set": u.prompt_set}
        for v in statistic.variants:
            row[f"{v}_mean"], row[f"{v}_se"] = float(t.loc[v, "mean"]), float(t.loc[v, "se"])
        row["coupling_chance"] = (float(t.loc["coupling", "chance"])
                                  if "coupling" in t.index else math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def check_prompt_sets(units: Sequence[ModelUnit], *, allow_mixed: bool = False) -> None:
    """Refuse models measured on different prompt sets (their means are not comparable)
    unless ``allow_mixed``."""
    sets: dict[str, list[str]] = {}
    for u in units:
        sets.setdefault(u.prompt_set, []).append(u.label)
    if len(sets) > 1 and not allow_mixed:
        listed = "; ".join(f"{key[:10]}: {', '.join(labs[:3])}{', ...' if len(labs) > 3 else ''}"
                           for key, labs in sets.items())
        raise BlockCouplingError(
            f"the models were measured on {len(sets)} different prompt sets ({listed}); measure "
            "them on one prompt set, or pass --allow-mixed-prompts to correlate them anyway")


# ----------------------------------------------------------------------------------------------
# 2. Scores
# ----------------------------------------------------------------------------------------------


def _check_score_frame(df: pd.DataFrame, where: str) -> pd.DataFrame:
    missing = [c for c in ("model", "score") if c not in df.columns]
    if missing:
        raise BlockCouplingError(
            f"{where}: missing column(s) {', '.join(missing)} (columns: "
            f"{', '.join(map(str, df.columns)) or 'none'}); a score table needs 'model' and "
            f"'score', optionally {', '.join(OPTIONAL_COLUMNS)}"
        )
    df = df.copy()
    df["model"] = df["model"].astype(str).str.strip()
    if (df["model"] == "").any() or df["model"].isna().any():
        raise BlockCouplingError(f"{where}: a row has an empty 'model'")
    dup = sorted(df.loc[df["model"].duplicated(), "model"].unique())
    if dup:
        raise BlockCouplingError(f"{where}: model(s) listed twice: {', '.join(dup)}")
    for col in ("score", "params_b", "layers", "d_model", "train_tokens_t"):
        if col in df.columns:
            num = pd.to_numeric(df[col], errors="coerce")
            bad = df.loc[num.isna() & df[col].notna() & (df[col].astype(str).str.strip() != ""),
                         "model"]
            if len(bad):
                raise BlockCouplingError(f"{where}: column {col!r} is not a number for "
                                         f"{', '.join(map(str, bad))}")
            df[col] = num.astype(float)
    if "group" in df.columns:
        df["group"] = df["group"].astype("string")
    return df


def read_scores_csv(path: str | Path) -> pd.DataFrame:
    """A score CSV: ``model``, ``score`` and optional ``params_b, layers, d_model,
    train_tokens_t, group`` (other columns are kept)."""
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise BlockCouplingError(f"cannot read the score file {path}: {err}") from None
    return _check_score_frame(df, str(path))


def paper_scores() -> pd.DataFrame:
    """The paper's Table 1 (arXiv v1 appendix A.1) with a hub id for every row.

    Columns: ``model`` (the hub id chosen), ``name`` (as printed: family and size), ``family``,
    ``it_mark``, ``params_b``, ``layers``, ``d_model``, ``train_tokens_t``, ``score`` (Open LLM
    Leaderboard score as printed; NaN where the paper prints none), ``positional_encoding``,
    ``group`` (``base`` / ``fine-tuned``), ``aliases`` (other ids, ``|``-separated) and
    ``note`` (why an id was chosen, oddities of the printed row). See docs/DESIGN.md.
    """
    # one name per joinpath: several are Python 3.11+
    text = resources.files("blockcoupling.studies").joinpath("data").joinpath("paper_table1.csv")
    with text.open("r", encoding="utf-8") as fh:
        df = pd.read_csv(fh, dtype=str, keep_default_na=False, na_values=[""])
    return _check_score_frame(df, "paper table")


def read_lmeval_dir(path: str | Path) -> pd.DataFrame:
    """Scores from lm-evaluation-harness results (a folder or one results file): one row per
    (model, revision), the Open LLM Leaderboard average; see :mod:`.lmeval`."""
    from blockcoupling.studies.lmeval import read_lmeval

    return _check_score_frame(read_lmeval(path), str(path))


def read_scores(source: str | Path) -> tuple[pd.DataFrame, str]:
    """``(scores, description)`` from ``"paper"``, a CSV file or an lm-eval results folder."""
    if str(source) == "paper":
        return paper_scores(), "paper: Table 1 of Aubry et al. (arXiv 2407.07810 v1), shipped"
    path = Path(source)
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".json"):
        return read_lmeval_dir(path), f"lm-evaluation-harness results in {path}"
    if path.is_file():
        return read_scores_csv(path), f"CSV {path}"
    raise BlockCouplingError(f"--scores {source}: no such file or folder; give a CSV file, "
                             "'paper' or an lm-evaluation-harness results folder")


def match_scores(models: pd.DataFrame, units: Sequence[ModelUnit], scores: pd.DataFrame
                 ) -> tuple[pd.DataFrame, list[dict[str, str]]]:
    """Join each unit's row of ``models`` with its score row; returns (table, excluded).

    A unit matches the score row whose ``model`` (or ``name`` / ``aliases`` for the paper
    table) equals, case-insensitively, one of :meth:`ModelUnit.match_keys` (label first), or
    whose hub id ends in ``/<key>`` when that is unique. Units with no matching row raise (all
    listed); units whose row has no score are excluded and returned with the reason.
    """
    index: dict[str, set[int]] = {}
    for i, row in scores.reset_index(drop=True).iterrows():
        names = [row["model"]]
        if "name" in scores.columns and isinstance(row.get("name"), str):
            names.append(row["name"])
        if "aliases" in scores.columns and isinstance(row.get("aliases"), str):
            names += [a for a in row["aliases"].split("|") if a.strip()]
        for name in names:
            index.setdefault(str(name).strip().lower(), set()).add(int(i))
        tail = str(row["model"]).rsplit("/", 1)[-1].strip().lower()
        index.setdefault("*/" + tail, set()).add(int(i))
    scores = scores.reset_index(drop=True)
    chosen: list[int | None] = []
    for u in units:
        hit: int | None = None
        for key in u.match_keys():
            key = key.strip().lower()
            for cand in (key, "*/" + key.rsplit("/", 1)[-1]):
                rows = index.get(cand, set())
                if len(rows) == 1:
                    hit = next(iter(rows))
                    break
            if hit is not None:
                break
        chosen.append(hit)
    unmatched = [u for u, c in zip(units, chosen, strict=True) if c is None]
    if unmatched:
        listed = "; ".join(f"{u.label}" + (f" (model {u.model})" if u.model != u.label else "")
                           for u in unmatched)
        known = ", ".join(map(str, scores["model"].head(8)))
        raise BlockCouplingError(
            f"no score for {len(unmatched)} run(s): {listed}. Add rows whose 'model' is the run's "
            f"label or model id (score table has {len(scores)} models: {known}"
            f"{', ...' if len(scores) > 8 else ''})"
        )
    owners: dict[int, list[str]] = {}
    for u, c in zip(units, chosen, strict=True):
        owners.setdefault(int(c), []).append(u.label)  # type: ignore[arg-type]
    clash = {c: labs for c, labs in owners.items() if len(labs) > 1}
    if clash:
        c, labs = next(iter(clash.items()))
        raise BlockCouplingError(
            f"runs {', '.join(labs)} all match the score row {scores.loc[c, 'model']!r}; give "
            "each run its own label and put the labels in the score table's 'model' column"
        )
    extra = [c for c in scores.columns if c != "model"]
    right = scores.loc[[int(c) for c in chosen], extra].reset_index(drop=True)  # type: ignore[arg-type]
    right = right.rename(columns={c: f"score_{c}" for c in extra if c in models.columns})
    right.insert(0, "score_model", scores.loc[[int(c) for c in chosen], "model"].to_numpy())  # type: ignore[arg-type]
    table = pd.concat([models.reset_index(drop=True), right], axis=1)
    for col, run_col in (("layers", "layers_run"), ("d_model", "d_model_run")):
        if col not in table.columns:
            table[col] = table[run_col].astype(float)
        else:  # the runs know their shape: fill what the score table leaves blank
            table[col] = table[col].fillna(table[run_col].astype(float))
    for col in ("params_b", "train_tokens_t"):
        if col not in table.columns:
            table[col] = np.nan
    table["log_params"] = np.log10(table["params_b"].where(table["params_b"] > 0) * 1e9)
    table["log_d_model"] = np.log10(table["d_model"].where(table["d_model"] > 0))
    unusable = ~np.isfinite(table["score"].astype(float))  # blank, nan or inf: listed, not fitted
    excluded = [{"label": str(r["label"]), "reason": (
        f"no score for {r['score_model']} in the table" if pd.isna(r["score"]) else
        f"the score of {r['score_model']} is {r['score']}, not a finite number")}
        for _, r in table[unusable].iterrows()]
    return table[~unusable].reset_index(drop=True), excluded


# ----------------------------------------------------------------------------------------------
# 3. Statistics
# ----------------------------------------------------------------------------------------------


def _clean_xy(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xa) & np.isfinite(ya)
    return xa[keep], ya[keep]


def regression(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *,
               n_boot: int = 2000, seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """Least-squares line y = slope x + intercept and rank correlation (rows with NaN dropped).

    Returns n, slope, intercept, slope_stderr, r (Pearson), r2, p (two-sided, slope = 0),
    r2_ci (percentile bootstrap over models, ``n_boot`` resamples from
    ``numpy.random.default_rng(seed)``; resamples with a constant x or y are left out and
    counted in ``n_boot_degenerate``), spearman_rho, spearman_p. Needs n >= 3 and non-constant
    x and y (raises otherwise).
    """
    st, _ = _stats()
    xa, ya = _clean_xy(x, y)
    if len(xa) < MIN_MODELS:
        raise BlockCouplingError(f"a regression needs at least {MIN_MODELS} models with values, "
                                 f"got {len(xa)}")
    if np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise BlockCouplingError("a regression needs values that vary; "
                                 f"{'x' if np.ptp(xa) == 0 else 'y'} is constant")
    lr = st.linregress(xa, ya)
    rho = st.spearmanr(xa, ya)
    lo = hi = float("nan")
    degenerate = 0
    if n_boot > 0:
        def r2(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
            return st.pearsonr(a, b, axis=axis).statistic ** 2

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            boot = st.bootstrap((xa, ya), r2, paired=True, vectorized=True, n_resamples=n_boot,
                                method="percentile", confidence_level=confidence,
                                random_state=np.random.default_rng(seed))
        dist = np.asarray(boot.bootstrap_distribution, dtype=float)
        degenerate = int((~np.isfinite(dist)).sum())
        alpha = (1 - confidence) / 2
        if degenerate < len(dist):
            lo, hi = (float(v) for v in np.nanpercentile(dist, [100 * alpha, 100 * (1 - alpha)]))
    return {
        "n": int(len(xa)), "slope": float(lr.slope), "intercept": float(lr.intercept),
        "slope_stderr": float(lr.stderr), "r": float(lr.rvalue), "r2": float(lr.rvalue ** 2),
        "p": float(lr.pvalue), "r2_ci": [lo, hi], "ci_level": confidence, "n_boot": int(n_boot),
        "n_boot_degenerate": degenerate, "seed": int(seed),
        "spearman_rho": float(rho.statistic), "spearman_p": float(rho.pvalue),
    }


def exponential_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """Least-squares fit of y = a exp(b x) (arXiv v1 fig. 8) with scipy.optimize.curve_fit.

    Started from the straight line through log y when every y > 0. Returns n, a, b, their
    standard errors, r2 (1 - SS_res / SS_tot on the y scale, comparable with the linear R^2)
    and ``converged``.
    """
    _stats()
    from scipy.optimize import curve_fit

    xa, ya = _clean_xy(x, y)
    if len(xa) < MIN_MODELS or np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise BlockCouplingError("the exponential fit needs at least 3 models with varying values")
    xc = xa.mean()  # centring keeps a and b well conditioned; a is reported at x = 0

    def f(t: np.ndarray, a: float, b: float) -> np.ndarray:
        return a * np.exp(b * (t - xc))

    if (ya > 0).all():
        b0, la0 = np.polyfit(xa - xc, np.log(ya), 1)
        p0 = [math.exp(la0), b0]
    else:
        p0 = [float(ya.mean()), 0.0]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            (a_c, b), cov = curve_fit(f, xa, ya, p0=p0, maxfev=20000)
        converged = bool(np.isfinite([a_c, b]).all())
    except (RuntimeError, ValueError):
        a_c, b, cov, converged = float("nan"), float("nan"), np.full((2, 2), np.nan), False
    pred = f(xa, a_c, b)
    r2 = 1.0 - float(np.sum((ya - pred) ** 2) / np.sum((ya - ya.mean()) ** 2))
    a = a_c * math.exp(-b * xc) if converged else float("nan")
    se = np.sqrt(np.clip(np.diag(cov), 0, None)) if np.isfinite(cov).all() else [np.nan, np.nan]
    return {"n": int(len(xa)), "model": "score = a * exp(b * coupling)", "a": float(a),
            "b": float(b), "a_stderr": float(se[0] * math.exp(-b * xc)) if converged else float("nan"),
            "b_stderr": float(se[1]), "r2": r2 if converged else float("nan"),
            "converged": converged}


def partial_correlation(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                        covariates: Sequence[float] | Sequence[Sequence[float]]
                        ) -> dict[str, Any]:
    """Partial correlation of x and y controlling for one covariate or several (statsmodels OLS).

    ``covariates``: one sequence (n,) or several (m sequences of n). Fits
    y ~ 1 + x + covariates; the partial r is the correlation of the residuals of x and y on
    (1, covariates), its p-value the t-test of x's coefficient (n - 2 - m degrees of freedom).
    Rows with NaN in any column are dropped; needs n >= m + 3 (and at least 4).
    """
    _, sm = _stats()
    cov = np.asarray(covariates, dtype=float)
    cov = cov[None, :] if cov.ndim == 1 else cov  # (m, n)
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xa) & np.isfinite(ya) & np.isfinite(cov).all(axis=0)
    xa, ya, ca = xa[keep], ya[keep], cov[:, keep].T  # ca (n, m)
    need = max(MIN_MODELS + 1, ca.shape[1] + 3)
    if len(xa) < need:
        raise BlockCouplingError(f"a partial correlation with {ca.shape[1]} control(s) needs at "
                                 f"least {need} models with all values, got {len(xa)}")
    if (np.ptp(ca, axis=0) == 0).any():
        raise BlockCouplingError("a control is constant over the models; nothing to control for")
    c = sm.add_constant(ca, has_constant="add")
    if np.linalg.matrix_rank(c) < c.shape[1]:
        raise BlockCouplingError("the controls are collinear over these models (e.g. log "
                                 "parameters a function of log d_model); use one of them")
    rx = sm.OLS(xa, c).fit().resid
    ry = sm.OLS(ya, c).fit().resid
    if np.allclose(rx, 0) or np.allclose(ry, 0):
        raise BlockCouplingError("after removing the controls nothing varies")
    full = sm.OLS(ya, sm.add_constant(np.column_stack([xa, ca]), has_constant="add")).fit()
    r = float(np.corrcoef(rx, ry)[0, 1])
    return {"n": int(len(xa)), "r": r, "p": float(full.pvalues[1]), "df": int(full.df_resid),
            "coef": float(full.params[1]), "coef_stderr": float(full.bse[1])}


def partial_correlations(table: pd.DataFrame, y: np.ndarray,
                         predictors: Sequence[str] = COUPLING_PREDICTORS,
                         controls: Sequence[Sequence[str]] = CONTROLS) -> list[dict[str, Any]]:
    """Each coupling predictor's partial correlation with the score given each set of controls
    (``log_d_model``, ``log_params``, both): one dict each, ``skipped`` with the reason where
    it cannot be computed."""
    out = []
    for x in predictors:
        if x not in table.columns:
            continue
        for ctrl in controls:
            entry: dict[str, Any] = {"x": x, "y": "score", "controlling_for": list(ctrl)}
            try:
                missing = [c for c in ctrl if c not in table.columns]
                if missing:
                    raise BlockCouplingError(f"no {', '.join(missing)} in the table")
                entry.update(partial_correlation(table[x], y, [table[c] for c in ctrl]))
            except BlockCouplingError as err:
                entry["skipped"] = str(err)
            out.append(entry)
    return out


def floor_analysis(table: pd.DataFrame, y: np.ndarray) -> dict[str, Any]:
    """What the measured chance level of raw c_K explains (``correlate --floor``): the
    regression of the score on ``coupling_chance``, the correlation of raw c_K with the
    score, and its partial correlation given the chance level (what survives the floor)."""
    out: dict[str, Any] = {"x": "coupling_chance", "note": FLOOR_NOTE}
    if "coupling_chance" not in table.columns or table["coupling_chance"].notna().sum() < 3:
        out["skipped"] = ("the chance level was not measured (measure the variant "
                          "coupling_vs_null beside coupling)")
        return out
    for key, fn in (("score_on_chance", lambda: regression(table["coupling_chance"], y,
                                                           n_boot=0)),
                    ("raw_on_score", lambda: regression(table["coupling_mean"], y, n_boot=0)),
                    ("raw_given_chance", lambda: partial_correlation(
                        table["coupling_mean"], y, table["coupling_chance"]))):
        try:
            out[key] = fn()
        except BlockCouplingError as err:
            out[key] = {"skipped": str(err)}
    return out


def analyse(table: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0,
            floor: bool = False) -> dict[str, Any]:
    """All statistics of one table (columns ``score`` and any of :data:`PREDICTORS`).

    Returns ``{"n", "predictors": {name: regression or {"skipped": why}}, "exponential",
    "partial_correlations"}`` (and ``"floor"`` with ``floor``: :func:`floor_analysis`).
    Raises for fewer than 3 models or constant scores.
    """
    y = table["score"].to_numpy(dtype=float)
    if len(table) < MIN_MODELS:
        raise BlockCouplingError(f"the correlation needs at least {MIN_MODELS} models with a "
                                 f"score, got {len(table)}")
    if np.ptp(y[np.isfinite(y)]) == 0:
        raise BlockCouplingError(f"all scores are equal ({y[0]:g}); a correlation needs "
                                 "scores that vary")
    out: dict[str, Any] = {"n": int(len(table)), "predictors": {}}
    for name in PREDICTORS:
        if name not in table.columns:
            continue
        x = table[name].to_numpy(dtype=float)
        ok = np.isfinite(x)
        if ok.sum() < MIN_MODELS:
            out["predictors"][name] = {"skipped": f"{int(ok.sum())} model(s) with a value"}
            continue
        if np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
            out["predictors"][name] = {"skipped": "constant over the models with a value"}
            continue
        out["predictors"][name] = regression(x, y, n_boot=n_boot, seed=seed)
    try:
        out["exponential"] = exponential_fit(table["coupling_mean"], y)
    except (BlockCouplingError, KeyError) as err:
        out["exponential"] = {"skipped": str(err)}
    out["partial_correlations"] = partial_correlations(table, y)
    if floor:
        out["floor"] = floor_analysis(table, y)
    return out


# ----------------------------------------------------------------------------------------------
# The whole study
# ----------------------------------------------------------------------------------------------


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if obj is pd.NA or obj is None:
        return None
    return obj


def write_json(path: str | Path, data: Mapping[str, Any]) -> Path:
    """``data`` (made JSON-safe: NaN -> null) written atomically to ``path``, folders made."""
    from blockcoupling.store.fileio import atomic_write_text

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(_jsonable(data), indent=1, allow_nan=False) + "\n")
    return out


@dataclass
class CorrelationResult:
    """Everything :func:`correlate` found; ``to_dict()`` is the JSON output."""

    table: pd.DataFrame
    statistic: CouplingStatistic
    scores_source: str
    overall: dict[str, Any]
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    excluded: list[dict[str, str]] = field(default_factory=list)
    n_boot: int = 2000
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        cols = [c for c in ("label", "model", "score_model", "revision", "step", "group", "k",
                            "n_prompts", "coupling_vs_null_mean", "coupling_vs_null_se",
                            "coupling_mean", "coupling_se", "coupling_chance", "score",
                            "params_b", "layers", "d_model", "train_tokens_t", "log_params",
                            "log_d_model") if c in self.table.columns]
        models = self.table[cols].astype(object).where(self.table[cols].notna(), None)
        return _jsonable({
            "statistic": self.statistic.to_dict(), "floor_note": FLOOR_NOTE,
            "scores": self.scores_source,
            "n_models": int(len(self.table)), "seed": self.seed, "n_boot": self.n_boot,
            "models": models.to_dict("records"), "excluded": self.excluded,
            **self.overall, "groups": self.groups,
        })

    def to_json(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    def summary(self) -> str:
        """A few lines for humans."""
        lines = [f"{len(self.table)} models; statistic: {self.statistic.describe()}"]
        for name, r in self.overall["predictors"].items():
            if "skipped" in r:
                lines.append(f"  {name:15s} skipped ({r['skipped']})")
                continue
            lo, hi = r["r2_ci"]
            lines.append(f"  {name:15s} n={r['n']:3d} R^2={r['r2']:.3f} [{lo:.2f}, {hi:.2f}] "
                         f"p={r['p']:.3g} slope={r['slope']:.4g} rho={r['spearman_rho']:+.3f}")
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
        lines.append("  note: " + FLOOR_NOTE)
        for label in self.excluded:
            lines.append(f"  excluded {label['label']}: {label['reason']}")
        return "\n".join(lines)


def correlate_table(table: pd.DataFrame, statistic: CouplingStatistic, *, scores_source: str = "",
                    excluded: list[dict[str, str]] | None = None, n_boot: int = 2000,
                    seed: int = 0, floor: bool = False) -> CorrelationResult:
    """The statistics of an already-joined table (one row per model: coupling, score, ...)."""
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
                             n_boot=n_boot, seed=seed)


def correlate(inputs: Sequence[str | Path] | Sequence[ModelUnit], scores: str | Path | pd.DataFrame,
              *, k: int | None = None, variants: Sequence[str] = ("coupling", "coupling_vs_null"),
              p: float | None = 1.0, orientation: str = "ujv", tokens: str = "last",
              diagonal: bool = False, floor: bool = False, allow_mixed_prompts: bool = False,
              n_boot: int = 2000, seed: int = 0,
              labels: Sequence[str] | None = None) -> CorrelationResult:
    """The study on run directories (or :class:`ModelUnit` objects) and a score source.

    ``scores`` is ``"paper"``, a CSV path, an lm-evaluation-harness folder or a DataFrame with
    the CSV's columns. ``labels`` name the run directories (one each) for the matching. Each
    model's numbers are the headline statistic (:class:`CouplingStatistic`) of every variant
    in ``variants``; ``floor`` adds :func:`floor_analysis`; models measured on different
    prompt sets are refused unless ``allow_mixed_prompts``.
    """
    from blockcoupling.validate import whole

    _stats()
    if k is not None and (isinstance(k, bool) or int(k) != k or k < 1):
        raise BlockCouplingError(f"--k must be a positive integer, got {k}")
    n_boot = whole(n_boot, "--n-boot", minimum=0)  # 0: no bootstrap CI
    seed = whole(seed, "--seed", minimum=0)
    statistic = CouplingStatistic(variants=tuple(variants), p=p, orientation=orientation, k=k,
                                  tokens=tokens, diagonal=diagonal)
    units = (list(inputs) if inputs and isinstance(inputs[0], ModelUnit)
             else load_units(inputs, labels))  # type: ignore[arg-type]
    if len(units) < MIN_MODELS:
        raise BlockCouplingError(f"the correlation needs at least {MIN_MODELS} models, got "
                                 f"{len(units)}; pass more run directories")
    check_prompt_sets(units, allow_mixed=allow_mixed_prompts)  # type: ignore[arg-type]
    if isinstance(scores, pd.DataFrame):
        score_df, source = _check_score_frame(scores, "score table"), "table given in Python"
    else:
        score_df, source = read_scores(scores)
    models = model_table(units, statistic)  # type: ignore[arg-type]
    table, excluded = match_scores(models, units, score_df)  # type: ignore[arg-type]
    return correlate_table(table, statistic, scores_source=source, excluded=excluded,
                           n_boot=n_boot, seed=seed, floor=floor)
