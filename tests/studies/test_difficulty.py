"""Per-prompt coupling against Easy2Hard difficulty and prompt length (the paper's fig. 10):
the ratings read through ``hf:e2h-arc@FILE`` from a local file in the dataset's row format,
joined with a measured run by prompt id, regressed; checked against a join and a regression
done directly with pandas and scipy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as st

from blockcoupling.errors import BlockCouplingError
from blockcoupling.prompts.sources import load_prompts, load_ratings
from blockcoupling.store import open_run
from blockcoupling.studies.difficulty import difficulty_study
from tests.helpers.tiny_runs import RATINGS, cli, measure_rated, save_tiny_lm


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return measure_rated(tmp_path_factory.mktemp("e2h"))


def test_ratings_join_the_prompts_by_id(run) -> None:
    _, rows = run
    ratings = load_ratings(f"hf:e2h-arc@{rows}")
    assert ratings["rating"].tolist() == RATINGS
    prompts = load_prompts(f"hf:e2h-arc@{rows}", limit=3, seed=1)
    for p in prompts:  # the same ids the prompts get, whatever the subset
        i = int(p.prompt_id.rsplit("-", 1)[1])
        assert ratings.set_index("prompt_id").loc[p.prompt_id, "rating"] == RATINGS[i]
        assert p.text.startswith("Question: ") and p.text.endswith("\nAnswer:")


def test_join_and_regressions_match_a_direct_computation(run) -> None:
    run_dir, rows = run
    res = difficulty_study(run_dir, n_boot=300, seed=2)  # the run's own prompt set
    m = open_run(run_dir)
    c = m.coupling
    depth = c[(c["kind"] == "depth") & (c["variant"] == "coupling") & (c["k"] == 2)
              & (c["p"] == 1.0) & (c["orientation"] == "ujv") & (c["layer_a"] != c["layer_b"])]
    want = depth.groupby("prompt_id")["value"].mean()  # one token (the last) per prompt
    t = res.table.set_index("prompt_id")
    assert len(t) == 6
    np.testing.assert_allclose(t.loc[want.index, "coupling"], want.to_numpy(), rtol=1e-12)
    rated = dict(zip(load_ratings(f"hf:e2h-arc@{rows}")["prompt_id"], RATINGS, strict=True))
    assert t["rating"].to_dict() == {p: rated[p] for p in t.index}
    assert t["n_tokens"].to_dict() == m.prompts.set_index("prompt_id")["n_tokens"].to_dict()
    for name in ("rating", "n_tokens"):
        lr = st.linregress(t[name].astype(float), t["coupling"])
        fit = res.fits["coupling"][name]
        assert fit["slope"] == pytest.approx(lr.slope) and fit["p"] == pytest.approx(lr.pvalue)
        assert fit["spearman_rho"] == pytest.approx(
            st.spearmanr(t[name], t["coupling"]).statistic)
    assert set(res.fits) == {"coupling", "coupling_vs_null"}


def test_cli_page_json_and_bad_input(run, tmp_path: Path) -> None:
    run_dir, rows = run
    r = cli("difficulty", str(run_dir), "--ratings", f"hf:e2h-arc@{rows}", "--n-boot", "50",
            "--out", str(tmp_path / "d.html"), "--json-out", str(tmp_path / "d.json"))
    assert r.exit_code == 0, r.output
    assert "coupling ~ rating" in r.output
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["n_prompts"] == 6 and "rating" in data["fits"]["coupling"]
    assert "against its Easy2Hard difficulty rating" in (tmp_path / "d.html").read_text()
    r = cli("difficulty", str(run_dir), "--ratings", "hf:arc@" + str(rows))
    assert r.exit_code == 1 and "has no difficulty ratings; give one of hf:e2h-arc" in r.output
    other = tmp_path / "other.jsonl"
    pd.read_json(rows, lines=True).head(2).to_json(other, orient="records", lines=True)
    r = cli("difficulty", str(run_dir), "--ratings", f"hf:e2h-arc@{other}")
    assert r.exit_code == 1 and "have no rating" in r.output and "Traceback" not in r.output
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "the cat"}\n')
    with pytest.raises(BlockCouplingError, match="no 'rating' column"):
        load_ratings(f"hf:e2h-arc@{broken}")


def test_a_run_on_unrated_prompts_says_what_to_give(tmp_path: Path) -> None:
    model = save_tiny_lm(tmp_path / "m")
    r = cli("-q", "measure", "--model", str(model), "--prompts", "builtin:capital", "--k", "2",
            "--out", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    r = cli("difficulty", str(tmp_path / "run"))
    assert r.exit_code == 1 and "--ratings hf:e2h-arc" in r.output
