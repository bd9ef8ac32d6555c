"""What the three tutorials share: the headline statistic with its standard error, and
writing their outputs (figures, Markdown tables) where the docs pages include them.

``per_prompt`` and ``mean_se`` are the tutorials' one helper for the statistic: per prompt, the
mean depth-wise value over layer pairs l != l' (``Measurement.mean_depth_coupling``, each
prompt's measured token), then the mean over prompts and its standard error, the sample
standard deviation over prompts / sqrt(n).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def out_dir() -> Path:
    """Where a tutorial writes: its first argument, else docs/tutorials/generated/<script>."""
    script = Path(sys.argv[0]).resolve()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else script.parent / "generated" / script.stem
    out.mkdir(parents=True, exist_ok=True)
    return out


def per_prompt(m: Any, k: int, variant: str) -> pd.Series:
    """Per prompt: mean depth-wise ``variant`` over layer pairs l != l' at top-K ``k``
    (p = 1, orientation ``ujv``), from ``Measurement.mean_depth_coupling``."""
    table = m.mean_depth_coupling(k, variant=variant)
    return table.groupby("prompt_id", sort=False)["mean_offdiag"].mean()


def mean_se(values: Any) -> tuple[float, float, int]:
    """Mean, standard error (sample std with ddof = 1, / sqrt(n)) and n of finite values."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    se = float(np.std(v, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return float(np.mean(v)), se, n


def headline(m: Any, k: int) -> dict[str, float]:
    """One model's headline numbers: raw coupling c_K, its chance level c_null and the
    chance-corrected ``coupling_vs_null``, each a mean over prompts with its se."""
    raw = per_prompt(m, k, "coupling")
    vs = per_prompt(m, k, "coupling_vs_null")
    # c_null per pair from coupling_vs_null = (c - c_null) / (1 - c_null)
    sel = m.coupling[(m.coupling["kind"] == "depth") & (m.coupling["k"] == k)
                     & (m.coupling["orientation"] == "ujv")
                     & (m.coupling["layer_a"] != m.coupling["layer_b"])]
    keys = ["prompt_id", "layer_a", "layer_b", "token_out_a"]
    c = sel[(sel["variant"] == "coupling") & (sel["p"] == 1.0)].set_index(keys)["value"]
    v = sel[sel["variant"] == "coupling_vs_null"].set_index(keys)["value"]
    c_null = ((c - v) / (1 - v)).groupby("prompt_id").mean()
    out: dict[str, float] = {}
    for name, series in (("coupling", raw), ("chance", c_null), ("coupling_vs_null", vs)):
        mean, se, n = mean_se(series)
        out[f"{name}_mean"], out[f"{name}_se"] = mean, se
    out["n_prompts"] = n
    return out


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
