"""``correlate --k 2,3``: the correlation at several K in one output (the paper's
alignment_vary_k); each K's statistics are exactly those of ``correlate --k K``, and the
regression at each K is checked against scipy on the per-model statistic computed directly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as st

from blockcoupling.studies.vary_k import correlate_vary_k
from tests.helpers.synthetic_runs import direct_statistic, write_synthetic_run
from tests.helpers.tiny_runs import cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    root = tmp_path_factory.mktemp("vary")
    levels = [0.2, 0.35, 0.5, 0.6, 0.8]
    paths = [write_synthetic_run(root / f"run{i}", lv, label=f"m{i}", model=f"org/model-{i}",
                                 seed=i) for i, lv in enumerate(levels)]
    scores = root / "scores.csv"
    pd.DataFrame({"model": [f"m{i}" for i in range(5)],
                  "score": [30.0, 41.0, 44.0, 52.0, 60.0]}).to_csv(scores, index=False)
    return paths, scores


def test_each_k_is_the_correlation_at_that_k(runs) -> None:
    paths, scores = runs
    res = correlate_vary_k(paths, str(scores), [3, 2], n_boot=200, seed=1)
    assert res.ks == [2, 3]
    t = res.table()
    # raw c_K and both chance-corrected forms (the synthetic runs store coupling_vs_rotated)
    assert set(t["predictor"]) == {"coupling_mean", "coupling_vs_null_mean",
                                   "coupling_vs_rotated_mean"}
    from blockcoupling.store import open_run

    y = np.array([30.0, 41.0, 44.0, 52.0, 60.0])
    for k in (2, 3):
        x = np.array([direct_statistic(open_run(p).coupling, k=k) for p in paths])
        row = t[(t["k"] == k) & (t["predictor"] == "coupling_mean")].iloc[0]
        lr = st.linregress(x, y)
        assert row["r2"] == pytest.approx(lr.rvalue ** 2)
        # 5 models (below 10): the exact permutation p of |Pearson's r| over all 5! orderings
        # (the share of orderings at least as extreme in either direction), and no bootstrap
        # interval of R^2
        exact = st.permutation_test((y,), lambda v, x=x: abs(st.pearsonr(x, v).statistic),
                                    permutation_type="pairings", n_resamples=np.inf,
                                    alternative="greater")
        assert row["p"] == pytest.approx(exact.pvalue)
        assert np.isnan(row["r2_lo"]) and np.isnan(row["r2_hi"])
    assert "K=2" in res.summary() and "K=3" in res.summary()


def test_cli_writes_one_json_and_one_page(runs, tmp_path: Path) -> None:
    paths, scores = runs
    r = cli("correlate", *map(str, paths), "--scores", str(scores), "--k", "2,3",
            "--n-boot", "50", "--json-out", str(tmp_path / "v.json"),
            "--out", str(tmp_path / "v.html"))
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["ks"] == [2, 3] and set(data["by_k"]) == {"2", "3"}
    one = cli("correlate", *map(str, paths), "--scores", str(scores), "--k", "3",
              "--n-boot", "50", "--json")
    single = json.loads(one.output)
    assert single["predictors"]["coupling_mean"]["r2"] == pytest.approx(
        data["by_k"]["3"]["predictors"]["coupling_mean"]["r2"])
    page = (tmp_path / "v.html").read_text()
    assert "R^2 against K" in page and "alignment_vary_k" in page


@pytest.mark.parametrize("k, match", [("2,5", "not measured at every K: m0 (K=5)"),
                                      ("2,x", "--k 'x': give a positive integer K"),
                                      ("2,2", "at least two different K")])
def test_bad_k_lists_are_one_line(runs, k: str, match: str) -> None:
    paths, scores = runs
    r = cli("correlate", *map(str, paths), "--scores", str(scores), "--k", k, "--n-boot", "0")
    assert r.exit_code in (1, 2) and match in r.output and "Traceback" not in r.output
