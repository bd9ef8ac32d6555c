"""The scores of the correlation study: a CSV, the paper's Table 1 shipped with the package,
or lm-evaluation-harness results (`read_scores`), checked into one table
(`check_score_frame`: ``model``, ``score`` and the optional `OPTIONAL_COLUMNS`, one row per
model, in one order), and matched to the measured models by the identity a row names: label,
model id, ``model@revision``, run folder name (`match_scores`, by ``studies.joins``'s rule).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import joins
from blockcoupling.studies.model_units import ModelUnit

__all__ = [
    "OPTIONAL_COLUMNS",
    "check_score_frame",
    "match_scores",
    "paper_scores",
    "read_lmeval_dir",
    "read_scores",
    "read_scores_csv",
]

#: Optional columns of a score table.
OPTIONAL_COLUMNS: tuple[str, ...] = ("params_b", "layers", "d_model", "train_tokens_t", "group")
#: columns that must be positive and finite where given (their logarithms are predictors)
POSITIVE_COLUMNS: tuple[str, ...] = ("params_b", "train_tokens_t")


def check_score_frame(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """A score table checked: ``model`` and ``score`` present, one row per model
    (``joins.check_unique_names``), numbers where numbers belong (a blank, or a score that is
    NaN or infinite, is kept: `match_scores` lists its model as excluded), ``params_b`` and
    ``train_tokens_t`` positive; the rows in one order (``joins.canonical_order`` by model),
    so a file in another order is the same table."""
    if not isinstance(df, pd.DataFrame):
        raise BlockCouplingError(f"{where}: a score table is a DataFrame with columns 'model' "
                                 f"and 'score', not a {type(df).__name__}")
    missing = [c for c in ("model", "score") if c not in df.columns]
    if missing:
        raise BlockCouplingError(
            f"{where}: missing column(s) {', '.join(missing)} (columns: "
            f"{', '.join(map(str, df.columns)) or 'none'}); a score table needs 'model' and "
            f"'score', optionally {', '.join(OPTIONAL_COLUMNS)}"
        )
    df = df.copy()
    if df["model"].isna().any() or not df["model"].map(
            lambda v: isinstance(v, str | int) and not isinstance(v, bool)).all():
        raise BlockCouplingError(f"{where}: a row has an empty 'model' or one that is not a "
                                 "name; give every row its model's name")
    df["model"] = df["model"].astype(str).str.strip()
    if (df["model"] == "").any():
        raise BlockCouplingError(f"{where}: a row has an empty 'model'")
    joins.check_unique_names(list(df["model"]), where)
    for col in ("score", "params_b", "layers", "d_model", "train_tokens_t"):
        if col in df.columns:
            num = pd.to_numeric(df[col].map(lambda v: None if isinstance(v, bool) else v),
                                errors="coerce")
            bad = df.loc[num.isna() & df[col].notna() & (df[col].astype(str).str.strip() != ""),
                         "model"]
            if len(bad):
                raise BlockCouplingError(f"{where}: column {col!r} is not a number for "
                                         f"{', '.join(map(str, bad))}")
            df[col] = num.astype(float)
            if col in POSITIVE_COLUMNS:
                given = df[col].notna()
                bad = df.loc[given & ~(np.isfinite(df[col]) & (df[col] > 0)), "model"]
                if len(bad):
                    raise BlockCouplingError(
                        f"{where}: column {col!r} is not a positive finite number for "
                        f"{', '.join(map(str, bad))}; give it, or leave it blank")
    if "group" in df.columns:
        df["group"] = df["group"].astype("string")
    order = joins.canonical_order(range(len(df)), key=lambda i: (
        joins.name_key(df["model"].iloc[i]), df["model"].iloc[i]))
    return df.iloc[order].reset_index(drop=True)


def read_scores_csv(path: str | Path) -> pd.DataFrame:
    """A score CSV: ``model``, ``score`` and optional ``params_b, layers, d_model,
    train_tokens_t, group`` (other columns are kept)."""
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise BlockCouplingError(f"cannot read the score file {path}: {err}") from None
    return check_score_frame(df, str(path))


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
    return check_score_frame(df, "paper table")


def read_lmeval_dir(path: str | Path) -> pd.DataFrame:
    """Scores from lm-evaluation-harness results (a folder or one results file): one row per
    (model, revision), the Open LLM Leaderboard average; see `lmeval`."""
    from blockcoupling.studies.lmeval import read_lmeval

    return check_score_frame(read_lmeval(path), str(path))


def read_scores(source: str | Path) -> tuple[pd.DataFrame, str]:
    """``(scores, description)`` from ``"paper"``, a CSV file or an lm-eval results folder."""
    if not isinstance(source, str | os.PathLike):
        raise BlockCouplingError(f"--scores: give a CSV file, 'paper', an lm-evaluation-harness "
                                 f"results folder or a DataFrame, not a {type(source).__name__}")
    if str(source) == "paper":
        return paper_scores(), "paper: Table 1 of Aubry et al. (arXiv 2407.07810 v1), shipped"
    path = Path(source)
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".json"):
        return read_lmeval_dir(path), f"lm-evaluation-harness results in {path}"
    if path.is_file():
        return read_scores_csv(path), f"CSV {path}"
    raise BlockCouplingError(f"--scores {source}: no such file or folder; give a CSV file, "
                             "'paper' or an lm-evaluation-harness results folder")


def _row_names(scores: pd.DataFrame) -> list[list[str]]:
    """Each score row's names: its ``model``, its ``name`` and its ``aliases`` (``|``-separated)."""
    names: list[list[str]] = []
    for _, row in scores.iterrows():
        row_names = [str(row["model"])]
        if "name" in scores.columns and isinstance(row.get("name"), str):
            row_names.append(row["name"])
        if "aliases" in scores.columns and isinstance(row.get("aliases"), str):
            row_names += [a for a in row["aliases"].split("|") if a.strip()]
        names.append(row_names)
    return names


def _no_score(unmatched: Sequence[ModelUnit], scores: pd.DataFrame,
              any_revision: bool) -> BlockCouplingError:
    """The one line for units no score row names: all of them, the table's first models."""
    listed = "; ".join(f"{u.label}" + (f" (model {u.model})" if u.model != u.label else "")
                       for u in unmatched)
    known = ", ".join(map(str, scores["model"].head(8)))
    revs = [u for u in unmatched if u.revision]
    hint = (f"; a run measured at a revision matches only that revision's row (e.g. "
            f"{revs[0].model}@{revs[0].revision}) unless --any-revision"
            if revs and not any_revision else "")
    return BlockCouplingError(
        f"no score for {len(unmatched)} run(s): {listed}. Add rows whose 'model' is the run's "
        f"label or model id (score table has {len(scores)} models: {known}"
        f"{', ...' if len(scores) > 8 else ''}){hint}")


def _measured_shape(table: pd.DataFrame) -> list[str]:
    """``layers`` and ``d_model`` as the runs measured them (in place), the score table's
    values filling only what a run does not know (kept as ``*_scores``); a note for each
    value the two disagree on."""
    notes = []
    for col, run_col in (("layers", "layers_run"), ("d_model", "d_model_run")):
        measured = table[run_col].astype(float).where(table[run_col].astype(float) > 0)
        if col in table.columns:
            listed = table[col].astype(float)
            differ = measured.notna() & listed.notna() & (listed != measured)
            notes += [f"{r['label']}: the score table gives {col} {listed[i]:g}, the run "
                      f"measured {measured[i]:g} (the measured value is used)"
                      for i, r in table[differ].iterrows()]
            table[f"{col}_scores"] = listed
            table[col] = measured.fillna(listed)
        else:
            table[col] = measured
    return notes


def match_scores(models: pd.DataFrame, units: Sequence[ModelUnit], scores: pd.DataFrame, *,
                 any_revision: bool = False) -> tuple[pd.DataFrame, list[dict[str, str]]]:
    """Join each unit's row of ``models`` with its score row; returns (table, excluded).

    The join is ``joins.match_names``: a unit matches the score row whose ``model`` (or
    ``name`` / ``aliases`` for the paper table) is, compared without case and blanks, one of
    its exact names (`ModelUnit.match_keys`: label, ``model@revision`` or model id, folder
    name), else its fallbacks (a hub id ending in ``/<name>``; with ``any_revision`` the bare
    model id of a unit measured at a revision, with a warning naming the row taken). A unit
    two rows name, a name two rows list or a row two units take is one line; units with no
    matching row raise (all listed); units whose row has no finite score are excluded and
    returned with the reason.

    ``d_model`` and ``layers`` are the measured model's; the score table's fill only what a
    run does not know, kept as ``d_model_scores`` / ``layers_scores`` (a warning where they differ).
    """
    scores = scores.reset_index(drop=True)
    picked = joins.match_names({u.label: u.match_keys(any_revision=any_revision)
                                for u in units}, _row_names(scores))
    chosen = [picked[u.label] for u in units]
    unmatched = [u for u, c in zip(units, chosen, strict=True) if c is None]
    if unmatched:
        raise _no_score(unmatched, scores, any_revision)
    extra = [c for c in scores.columns if c != "model"]
    right = scores.loc[[int(c) for c in chosen], extra].reset_index(drop=True)  # type: ignore[arg-type]
    right = right.rename(columns={c: f"score_{c}" for c in extra if c in models.columns})
    right.insert(0, "score_model", scores.loc[[int(c) for c in chosen], "model"].to_numpy())  # type: ignore[arg-type]
    table = pd.concat([models.reset_index(drop=True), right], axis=1)
    notes = []
    for u, c in zip(units, chosen, strict=True):
        row_model = str(scores.loc[int(c), "model"])  # type: ignore[arg-type]
        if u.revision and f"@{u.revision}".lower() not in row_model.lower() \
                and u.label.lower() != row_model.lower():
            notes.append(f"{u.label} (measured at revision {u.revision}) takes the score of "
                         f"{row_model!r} (--any-revision)")
    notes += _measured_shape(table)
    for col in ("params_b", "train_tokens_t"):
        if col not in table.columns:
            table[col] = np.nan
    table["log_params"] = np.log10(table["params_b"].where(table["params_b"] > 0) * 1e9)
    table["log_d_model"] = np.log10(table["d_model"].where(table["d_model"] > 0))
    if notes:
        warnings.warn("score table: " + "; ".join(notes), UserWarning, stacklevel=2)
    unusable = ~np.isfinite(table["score"].astype(float))  # blank, nan or inf: listed, not fitted
    excluded = [{"label": str(r["label"]), "reason": (
        f"no score for {r['score_model']} in the table" if pd.isna(r["score"]) else
        f"the score of {r['score_model']} is {r['score']}, not a finite number")}
        for _, r in table[unusable].iterrows()]
    return table[~unusable].reset_index(drop=True), excluded
