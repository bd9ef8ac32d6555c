"""What the three tutorials share: the headline statistic laid out for a table, and writing
their outputs (figures, Markdown tables) where the docs pages include them.

The numbers themselves come from ``bc.coupling_statistic`` (mean over prompts of the per-prompt
mean over layer pairs l != l', its standard error = sample std over prompts / sqrt(n) within
one model, a Student t interval, and the chance level c_null of the same rows).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd


def out_dir() -> Path:
    """Where a tutorial writes: its first argument, else docs/tutorials/generated/<script>."""
    script = Path(sys.argv[0]).resolve()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else script.parent / "generated" / script.stem
    out.mkdir(parents=True, exist_ok=True)
    return out


def wide(stat: pd.DataFrame, keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """``bc.coupling_statistic`` rows (one per variant) as one row per run: ``<variant>_mean``,
    ``<variant>_se`` of each variant, ``chance``, ``n_prompts`` (+ ``keys``)."""
    rows = []
    for key, group in stat.groupby(list(keys), sort=False) if keys else [((), stat)]:
        row: dict[str, Any] = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        for r in group.itertuples():
            row[f"{r.variant}_mean"], row[f"{r.variant}_se"] = r.mean, r.se
            if r.variant == "coupling":
                row["chance"] = r.chance
            row["n_prompts"], row["k"] = r.n_prompts, r.k
        rows.append(row)
    return pd.DataFrame(rows)


def fmt(mean: float, se: float, digits: int = 3) -> str:
    """``0.252 ± 0.013``."""
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def write_table(df: pd.DataFrame, path: Path) -> Path:
    """A DataFrame as a Markdown table (what the docs page includes) and as CSV beside it."""
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(str(x) for x in row) + " |" for row in df.itertuples(index=False)]
    path.write_text("\n".join([head, rule, *rows]) + "\n", encoding="utf-8")
    df.to_csv(path.with_suffix(".csv"), index=False)
    return path


def save_figure(fig: Any, path: Path) -> Path:
    """A matplotlib figure as PNG (what the docs page shows), closed afterwards."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
