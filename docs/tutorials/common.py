"""What the three tutorials share outside the cells their pages show: where a tutorial writes
and how it writes its outputs (figures, Markdown tables) for the pages to include. Everything
a shown cell uses is defined in the cells (tests/project/test_docs_examples.py checks it).
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
