"""The leading variant leads every output (docs/concepts.md: "It leads every headline"):
the ViT training's metrics.json and the vit-grid table with its seed-level block,
vit-figures' fits.json, difficulty (fig. 10), correlate's predictors and the monitor's loss
twin axis all put ``coupling_vs_rotated`` first (``coupling_vs_null`` for runs measured
before it existed), by the one order ``engine.statistic.HEADLINE_VARIANTS``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from blockcoupling.engine.statistic import HEADLINE_VARIANTS, LEAD_VARIANTS

LEAD = HEADLINE_VARIANTS[0]


def _runs(with_lead: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for dp in (0.0, 0.1, 0.2):
        for s in (0, 1):
            row = {"name": f"dp{dp}-s{s}", "status": "complete", "drop_path": dp,
                   "weight_decay": 0.05, "seed": s, "test_accuracy": 0.9 + 0.01 * rng.random(),
                   "coupling": 0.7, "coupling_chance": 0.66, "coupling_se": 0.001,
                   "coupling_vs_null": 0.05 + dp, "coupling_vs_null_se": 0.001}
            if with_lead:
                row |= {"coupling_vs_rotated": 0.04 + dp, "coupling_vs_rotated_se": 0.001}
            rows.append(row)
    return pd.DataFrame(rows)


def test_every_output_puts_the_leading_variant_first() -> None:
    from blockcoupling.cli.vit import _seed_level
    from blockcoupling.report.emergence import headline_column
    from blockcoupling.studies.correlate import DEFAULT_VARIANTS
    from blockcoupling.studies.difficulty import DIFFICULTY_VARIANTS
    from blockcoupling.studies.vit.fits import conditional_fits, leading_column
    from blockcoupling.studies.vit.train import COUPLING_METRICS

    assert LEAD == "coupling_vs_rotated" == LEAD_VARIANTS[0]
    assert COUPLING_METRICS[0] == LEAD  # metrics.json, the vit-grid table
    assert DEFAULT_VARIANTS[0] == LEAD and DIFFICULTY_VARIANTS[0] == LEAD
    runs = _runs()
    assert leading_column(runs) == LEAD and conditional_fits(runs)["column"] == LEAD
    assert leading_column(_runs(with_lead=False)) == "coupling_vs_null"  # older runs
    assert _seed_level(runs)["value"].iloc[0] == LEAD
    summ = runs.rename(columns={"coupling_vs_rotated": "coupling_vs_rotated_mean",
                                "coupling_vs_null": "coupling_vs_null_mean"})
    assert headline_column(summ)[0] == LEAD
    concepts = (Path(__file__).resolve().parents[2] / "docs" / "concepts.md").read_text()
    assert "leads every headline" in " ".join(concepts.split())
