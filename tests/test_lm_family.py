"""The laptop version of the correlation study: a tiny-LM family trained, scored, measured and
correlated end to end (the quick family: 4 models, seconds on a quiet machine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import blockcoupling as bc
from blockcoupling.studies.lm_family import evaluate_checkpoint, quick_family, run_lm_family


def test_quick_family_end_to_end(tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    res = run_lm_family(out, quick=True, cache_dir=cache, progress=False, n_boot=100)
    scores = pd.read_csv(out / "scores.csv")
    assert len(scores) == 4 and scores["model"].is_unique
    assert ((scores["score"] >= 0) & (scores["score"] <= 100)).all()
    assert (scores["val_loss"] > 0).all()
    # measured by a sweep: one done unit per checkpoint; every coupling value is the
    # statistic of its unit's run directory
    assert (bc.open_sweep(res.sweep_dir).units["status"] == "done").sum() == 4
    for row in res.accuracy.table.itertuples():
        m = bc.open_run(Path(row.source))
        k = max(1, round(row.d_model / 10))
        assert row.coupling_mean == m.mean_depth_coupling(k)
        assert row.coupling_vs_null_mean == m.mean_depth_coupling(k, variant="coupling_vs_null")
    data = json.loads((out / "correlation.json").read_text())
    assert set(data) == {"accuracy", "neg_loss"}
    assert set(data["accuracy"]["statistic"]) == {"coupling", "coupling_vs_null"}
    assert data["accuracy"]["n_models"] == 4
    assert {"coupling_mean", "coupling_vs_null_mean"} <= set(data["accuracy"]["predictors"])
    neg = res.loss.table.set_index("label")["score"]
    assert np.allclose(neg.to_numpy(), -scores.set_index("model").loc[neg.index, "val_loss"])
    assert (out / "correlation.html").read_text().count("data:image/png;base64,") == 2
    # the held-out score of a checkpoint is reproducible
    member = quick_family()[0]
    path = next(p for p in (cache).rglob("step-000012") if member.config.cache_key() in str(p))
    again = evaluate_checkpoint(path, member.config)
    first = scores.set_index("model").loc[f"{member.name}-step12"]
    assert again["score"] == pytest.approx(first["score"])
    assert again["val_loss"] == pytest.approx(first["val_loss"], rel=1e-6)
