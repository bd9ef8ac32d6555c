"""The correlation study: statistics against scipy/statsmodels, the per-model coupling
statistic against a direct computation, the score readers, the CLI and its errors."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as st
from typer.testing import CliRunner

import blockcoupling as bc
from blockcoupling.cli import app
from blockcoupling.studies import correlate as C
from tests.helpers.synthetic_runs import direct_statistic, write_synthetic_run

runner = CliRunner()


# ---------------------------------------------------------------------------- synthetic runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    levels = [0.2, 0.35, 0.5, 0.6, 0.8]
    return [write_synthetic_run(root / f"run{i}", lv, label=f"m{i}", model=f"org/model-{i}",
                                seed=i) for i, lv in enumerate(levels)]


# ---------------------------------------------------------------------------- statistics
def test_regression_matches_scipy_and_recovers_a_known_slope() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, 40)
    y = 2.5 * x + 1.0 + 0.05 * rng.standard_normal(40)
    r = C.regression(x, y, n_boot=500, seed=3)
    lr = st.linregress(x, y)
    assert r["slope"] == pytest.approx(lr.slope) and r["intercept"] == pytest.approx(lr.intercept)
    assert r["slope"] == pytest.approx(2.5, abs=0.1) and r["intercept"] == pytest.approx(1.0, abs=0.1)
    assert r["r2"] == pytest.approx(st.pearsonr(x, y).statistic ** 2)
    assert r["p"] == pytest.approx(lr.pvalue)
    rho = st.spearmanr(x, y)
    assert (r["spearman_rho"], r["spearman_p"]) == pytest.approx((rho.statistic, rho.pvalue))
    boot = st.bootstrap((x, y), lambda a, b, axis=-1: st.pearsonr(a, b, axis=axis).statistic ** 2,
                        paired=True, vectorized=True, n_resamples=500, method="percentile",
                        random_state=np.random.default_rng(3))
    ci = boot.confidence_interval
    assert r["r2_ci"] == pytest.approx([ci.low, ci.high])
    assert ci.low <= r["r2"] <= ci.high
    assert C.regression(x, y, n_boot=500, seed=3) == r  # seeded: reproducible


def test_regression_exact_line_and_negative_slope() -> None:
    x = np.array([1.0, 2.0, 4.0, 7.0])
    r = C.regression(x, 3 - 2 * x, n_boot=0)
    assert r["slope"] == pytest.approx(-2) and r["intercept"] == pytest.approx(3)
    assert r["r2"] == pytest.approx(1) and r["r"] == pytest.approx(-1)
    assert r["spearman_rho"] == pytest.approx(-1)


def test_regression_rejects_too_few_and_constant() -> None:
    with pytest.raises(bc.BlockCouplingError, match="at least 3"):
        C.regression([1, 2], [1, 2])
    with pytest.raises(bc.BlockCouplingError, match="constant"):
        C.regression([1, 2, 3], [4, 4, 4])


def test_exponential_fit_recovers_a_and_b() -> None:
    x = np.linspace(0.1, 0.9, 12)
    ex = C.exponential_fit(x, 5.0 * np.exp(2.0 * x))
    assert ex["converged"]
    assert ex["a"] == pytest.approx(5.0, rel=1e-6) and ex["b"] == pytest.approx(2.0, rel=1e-6)
    assert ex["r2"] == pytest.approx(1.0)
    x2 = np.linspace(-1, 1, 9)  # works with non-positive y too (no log start)
    ex2 = C.exponential_fit(x2, 3.0 * np.exp(-1.5 * x2) - 0.0)
    assert ex2["b"] == pytest.approx(-1.5, rel=1e-5)


def test_partial_correlation_matches_residual_correlation_and_t_test() -> None:
    rng = np.random.default_rng(2)
    n = 25
    c = rng.standard_normal(n)
    x = 0.7 * c + rng.standard_normal(n)
    y = 1.5 * x + 2.0 * c + rng.standard_normal(n)
    got = C.partial_correlation(x, y, c)
    A = np.column_stack([np.ones(n), c])
    rx = x - A @ np.linalg.lstsq(A, x, rcond=None)[0]
    ry = y - A @ np.linalg.lstsq(A, y, rcond=None)[0]
    r = st.pearsonr(rx, ry).statistic
    df = n - 3
    t = r * np.sqrt(df / (1 - r * r))
    assert got["r"] == pytest.approx(r) and got["df"] == df
    assert got["p"] == pytest.approx(2 * st.t.sf(abs(t), df))
    assert got["coef"] == pytest.approx(1.5, abs=0.5)


def test_analyse_skips_constant_predictors_and_rejects_bad_tables() -> None:
    t = pd.DataFrame({"coupling_mean": [0.1, 0.2, 0.3, 0.5], "score": [10, 12, 13, 20],
                      "layers": [4, 4, 4, 4], "params_b": [1, 2, np.nan, 4]})
    t["log_params"] = np.log10(t["params_b"] * 1e9)
    out = C.analyse(t, n_boot=50)
    assert "skipped" in out["predictors"]["layers"]
    assert out["predictors"]["params_b"]["n"] == 3
    assert out["predictors"]["coupling_mean"]["n"] == 4
    with pytest.raises(bc.BlockCouplingError, match="all scores are equal"):
        C.analyse(t.assign(score=7.0), n_boot=0)
    with pytest.raises(bc.BlockCouplingError, match="at least 3 models"):
        C.analyse(t.head(2), n_boot=0)


# ---------------------------------------------------------------------------- the statistic
def test_statistic_equals_direct_computation_from_the_run_tables(runs: list[Path]) -> None:
    for run in runs:
        m = bc.open_run(run)
        for variant, p, orient, k in (("coupling", 1.0, "ujv", 2), ("coupling", 2.0, "vju", 3),
                                      ("coupling_vs_null", 1.0, "ujv", 3)):
            t = bc.coupling_statistic(m, variant=variant, k=k, p=p, orientation=orient)
            assert t["n_prompts"].item() == 2
            assert t["mean"].item() == pytest.approx(
                direct_statistic(m.coupling, k=k, variant=variant, p=p, orientation=orient),
                abs=1e-12)
    # K = round(d / 10): d = 24 -> 2
    units = C.load_units(runs)
    table = C.model_table(units)
    assert (table["k"] == 2).all()
    m0 = bc.open_run(runs[0])
    assert table.loc[0, "coupling_mean"] == pytest.approx(direct_statistic(m0.coupling, k=2))
    assert table.loc[0, "coupling_vs_null_mean"] == pytest.approx(
        direct_statistic(m0.coupling, k=2, variant="coupling_vs_null"))


def test_statistic_on_a_real_tiny_model_matches_mean_depth_coupling(tmp_path: Path) -> None:
    from blockcoupling.studies.demo import build_tokenizer
    from tests.helpers.tiny_models import tiny_model

    model = tiny_model("gpt2")  # d = 16 -> K = 2
    tok = build_tokenizer("abcdefgh ")
    run = tmp_path / "real"
    bc.measure_to_dir(model, tok, ["abc def", "hag bead fed"], run, meta={"label": "tiny"},
                      coupling=("depth",), k=(2,), p=(1,), progress=False)
    m = bc.open_run(run)
    got = C.model_table(C.load_units([run])).loc[0]
    assert got["k"] == 2
    assert got["coupling_mean"] == m.mean_depth_coupling(2)
    assert got["coupling_vs_null_mean"] == m.mean_depth_coupling(2, variant="coupling_vs_null")
    with pytest.raises(bc.BlockCouplingError, match="--k"):
        C.model_table(C.load_units([run]), replace(C.CORRELATION_RULE, k=5))


def test_k_none_is_the_smallest_measured_k_and_d10_is_stated(runs: list[Path]) -> None:
    """The correlation's K = round(d/10) is its stated default (``k="d/10"``); ``k=None``
    means each model's smallest measured K, as everywhere, and models whose smallest K
    differ are refused (issue 33: one meaning of each default)."""
    scores = pd.DataFrame({"model": [f"m{i}" for i in range(5)], "score": [1, 3, 2, 5, 4]})
    units = C.load_units(runs)  # d = 24: round(d/10) = 2 = the smallest measured K
    paper = C.correlate(units, scores, n_boot=0)
    smallest = C.correlate(units, scores, n_boot=0, k=None)
    assert paper.statistic.k == "d/10" and smallest.statistic.k is None
    assert paper.to_dict()["statistic"]["coupling"]["k_rule"] == "d/10"
    assert smallest.to_dict()["statistic"]["coupling"]["k_rule"] == "min measured"
    assert paper.table["coupling_mean"].tolist() == smallest.table["coupling_mean"].tolist()
    assert "(K per model)" in paper.describe_statistic()
    assert "the smallest measured K" in smallest.describe_statistic()
    units[0].coupling = units[0].coupling[units[0].coupling["k"] != 2]  # smallest K: 3
    with pytest.raises(bc.BlockCouplingError, match=r"smallest measured K differ \(\[2, 3\]\)"):
        C.correlate(units, scores, n_boot=0, k=None)
    assert (C.correlate(units, scores, n_boot=0, k=3).table["k"] == 3).all()


# ---------------------------------------------------------------------------- score readers
def test_default_predictors_follow_what_every_run_measured(runs: list[Path]) -> None:
    """coupling_vs_rotated (the headline's lead) is a predictor where every model has it;
    runs measured before it existed keep raw c_K and coupling_vs_null."""
    scores = pd.DataFrame({"model": [f"m{i}" for i in range(5)], "score": [1, 3, 2, 5, 4]})
    units = C.load_units(runs)
    full = C.correlate(units, scores, n_boot=0)
    assert full.variants == ("coupling_vs_rotated", "coupling_vs_null", "coupling")
    assert list(full.overall["predictors"])[0] == "coupling_vs_rotated_mean"  # the lead first
    assert full.statistic.variant == "coupling_vs_rotated"
    for u in units[:2]:
        u.coupling = u.coupling[u.coupling["variant"] != "coupling_vs_rotated"]
    old = C.correlate(units, scores, n_boot=0)
    assert old.variants == ("coupling_vs_null", "coupling")
    assert "coupling_vs_rotated_mean" not in old.overall["predictors"]


def test_csv_reader_and_matching(runs: list[Path], tmp_path: Path) -> None:
    csv = tmp_path / "scores.csv"
    csv.write_text("model,score,params_b,group\nm0,10,1,a\norg/model-1,20,2,a\nm2,25,,b\n"
                   "run3,30,4,b\nm4,41,5,b\nunused,99,1,a\n")
    scores = C.read_scores_csv(csv)  # in one order (by model), whatever the file's
    assert list(scores["model"]) == ["m0", "m2", "m4", "org/model-1", "run3", "unused"]
    assert list(scores["score"]) == [10, 25, 41, 20, 30, 99]
    units = C.load_units(runs)
    table, excluded = C.match_scores(C.model_table(units), units, scores)
    assert list(table["label"]) == ["m0", "m1", "m2", "m3", "m4"]  # label, model id, dir name
    assert list(table["score"]) == [10, 20, 25, 30, 41]
    assert table["layers"].tolist() == [4] * 5  # filled from the runs
    assert np.isnan(table.loc[2, "log_params"]) and table.loc[0, "log_params"] == pytest.approx(9)
    assert excluded == []


def test_unmatched_runs_are_listed(runs: list[Path], tmp_path: Path) -> None:
    csv = tmp_path / "s.csv"
    csv.write_text("model,score\nm0,1\nm1,2\nm2,3\n")
    with pytest.raises(bc.BlockCouplingError, match=r"no score for 2 run\(s\): m3 .*; m4 "):
        C.correlate(runs, csv, n_boot=0)


def test_missing_columns_and_bad_numbers(tmp_path: Path) -> None:
    f = tmp_path / "s.csv"
    f.write_text("name,value\na,1\n")
    with pytest.raises(bc.BlockCouplingError, match="missing column.*model, score"):
        C.read_scores_csv(f)
    f.write_text("model,score\na,high\n")
    with pytest.raises(bc.BlockCouplingError, match="'score' is not a number for a"):
        C.read_scores_csv(f)


def test_paper_table_is_complete_with_hub_ids() -> None:
    p = C.paper_scores()
    assert len(p) == 42 and p["model"].is_unique and p["model"].str.contains("/").all()
    assert p["score"].isna().sum() == 6  # blank in the paper: Llama-3 70B, Falcon IT 7B, ...
    assert set(p["group"]) == {"base", "fine-tuned"}
    row = p.set_index("model").loc["meta-llama/Llama-2-7b-hf"]
    assert (row["score"], row["layers"], row["d_model"], row["params_b"]) == (50.97, 32, 4096, 7)
    assert p.set_index("model").loc["openai-community/gpt2", "aliases"] == "gpt2"
    assert p.set_index("model").loc["microsoft/phi-1_5", "train_tokens_t"] == pytest.approx(0.15)


def test_paper_scores_match_runs_by_hub_id_or_alias(tmp_path: Path) -> None:
    ids = ["gpt2", "openai-community/gpt2-medium", "GPT-2 774M", "meta-llama/Meta-Llama-3-70B"]
    dirs = [write_synthetic_run(tmp_path / f"r{i}", 0.1 * (i + 1), label=m, model=m, seed=i)
            for i, m in enumerate(ids)]
    res = C.correlate(dirs, "paper", n_boot=0)
    assert list(res.table["label"]) == ["GPT-2 774M", "gpt2", "openai-community/gpt2-medium"]
    assert list(res.table["score_model"]) == ["openai-community/gpt2-large",
                                              "openai-community/gpt2",
                                              "openai-community/gpt2-medium"]
    assert res.excluded[0]["label"] == "meta-llama/Meta-Llama-3-70B"  # no score printed
    assert list(res.table["score"]) == [32.07, 28.53, 29.87]


def write_lmeval(root: Path) -> None:
    new = {"results": {
        "arc_challenge": {"alias": "arc", "acc,none": 0.40, "acc_norm,none": 0.44},
        "hellaswag": {"acc,none": 0.5, "acc_norm,none": 0.6},
        "truthfulqa_mc2": {"acc,none": 0.38},
        "gsm8k": {"exact_match,strict-match": 0.1, "exact_match,flexible-extract": 0.2},
        "mmlu_anatomy": {"acc,none": 0.9}, "winogrande": {"acc,none": 0.7}},
        "groups": {"mmlu": {"acc,none": 0.30}},
        "group_subtasks": {"mmlu": ["mmlu_anatomy"], "arc_challenge": []},
        "config": {"model": "hf", "model_args": "pretrained=org/new-model,dtype=float32"},
        "model_name": "org/new-model"}
    old = {"results": {"arc_challenge": {"acc": 0.3, "acc_norm": 0.32},
                       "hendrycksTest-anatomy": {"acc": 0.2, "acc_norm": 0.9},
                       "hendrycksTest-virology": {"acc": 0.4, "acc_norm": 0.9},
                       "truthfulqa_mc": {"mc1": 0.2, "mc2": 0.36}},
           "config": {"model": "hf-causal", "model_args": "pretrained=org/old-model"}}
    (root / "org__new-model").mkdir(parents=True)
    (root / "org__new-model" / "results_2024-01-01T00-00-00.json").write_text(json.dumps(new))
    (root / "old").mkdir()
    (root / "old" / "results.json").write_text(json.dumps(old))


def test_lmeval_reader(tmp_path: Path) -> None:
    write_lmeval(tmp_path / "lm")
    s = C.read_lmeval_dir(tmp_path / "lm").set_index("model")
    want_new = 100 * np.mean([0.44, 0.6, 0.38, 0.1, 0.30, 0.7])
    want_old = 100 * np.mean([0.32, 0.3, 0.36])
    assert s.loc["org/new-model", "score"] == pytest.approx(want_new)
    assert s.loc["org/old-model", "score"] == pytest.approx(want_old)
    assert "gsm8k:exact_match,strict-match" in s.loc["org/new-model", "tasks"]
    with pytest.raises(bc.BlockCouplingError, match="no lm-evaluation-harness"):
        C.read_lmeval_dir(tmp_path / "nothing")


# ---------------------------------------------------------------------------- CLI
def cli(*args: str) -> object:
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_cli_writes_json_and_self_contained_html(runs: list[Path], tmp_path: Path) -> None:
    csv = tmp_path / "scores.csv"
    csv.write_text("model,score,params_b,layers,d_model,train_tokens_t,group\n"
                   "m0,20,1,4,24,0.1,a\nm1,30,2,8,24,0.2,a\nm2,41,3,8,48,0.2,a\n"
                   "m3,45,5,12,64,1,b\nm4,62,9,16,64,2,b\n")
    js, page = tmp_path / "c.json", tmp_path / "c.html"
    r = cli("correlate", *map(str, runs), "--scores", str(csv), "--json", str(js), "--out",
            str(page), "--n-boot", "200")
    assert r.exit_code == 0, r.output
    out = json.loads(js.read_text())
    assert out["n_models"] == 5 and set(out["statistic"]) == {"coupling", "coupling_vs_null",
                                                               "coupling_vs_rotated"}
    assert "round(d/10)" in out["statistic"]["coupling"]["description"]
    assert "width alone" in out["floor_note"]
    assert set(out["predictors"]) == set(C.PREDICTORS)
    assert out["predictors"]["coupling_mean"]["r2"] > 0.9  # levels and scores rise together
    assert set(out["groups"]) == {"a", "b"} and "skipped" in out["groups"]["b"]
    controls = [tuple(pc["controlling_for"]) for pc in out["partial_correlations"]]
    assert controls == [("log_d_model",), ("log_params",), ("log_d_model", "log_params")] * 3
    assert all("coupling_vs_null_se" in row for row in out["models"])
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "src='http" not in html and 'src="http' not in html and "<link" not in html
    r = cli("correlate", *map(str, runs), "--scores", str(csv), "--variant", "coupling_vs_null",
            "--k", "3", "--n-boot", "0", "--json", str(js))
    assert r.exit_code == 0, r.output
    assert json.loads(js.read_text())["statistic"]["coupling_vs_null"]["k"] == 3


@pytest.mark.parametrize("case", ["unmatched", "few", "constant", "columns", "variant"])
def test_cli_bad_input_is_one_line_exit_1(case: str, runs: list[Path], tmp_path: Path) -> None:
    csv = tmp_path / "s.csv"
    args = [str(r) for r in runs]
    if case == "unmatched":
        csv.write_text("model,score\nm0,1\nm1,2\nm2,3\n")
        want = "m3"
    elif case == "few":
        csv.write_text("model,score\nm0,1\nm1,2\n")
        args = args[:2]
        want = "at least 3 models"
    elif case == "constant":
        csv.write_text("model,score\n" + "".join(f"m{i},5\n" for i in range(5)))
        want = "all scores are equal"
    elif case == "columns":
        csv.write_text("model,accuracy\nm0,1\n")
        want = "missing column(s) score"
    else:
        csv.write_text("model,score\n" + "".join(f"m{i},{i}\n" for i in range(5)))
        args += ["--variant", "nope"]
        want = "--variant 'nope': choose from coupling"
    r = runner.invoke(app, ["correlate", *args, "--scores", str(csv), "--n-boot", "0"])
    assert r.exit_code == (2 if case == "variant" else 1)  # an option refused: bad usage
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], r.output


# ---------------------------------------------------------------------------- prompt protocol
def test_paper_protocol_from_a_local_folder(tmp_path: Path) -> None:
    rows = {
        "arc": [{"question": f"Q{i}?", "choices": {}, "answerKey": "A"} for i in range(5)],
        "gsm8k": [{"question": f"G{i}?", "answer": "1"} for i in range(5)],
        "hellaswag": [{"activity_label": "Cook", "ctx_a": f"He cuts {i}.", "ctx_b": "then"}
                      for i in range(5)],
        "mmlu": [{"question": f"M{i}", "subject": "anatomy", "choices": ["a", "b", "c", "d"],
                  "answer": 0} for i in range(5)],
        "truthfulqa": [{"question": f"T{i}?"} for i in range(5)],
        "winogrande": [{"sentence": f"Bob {i} met _.", "option1": "Al", "option2": "Cy",
                        "answer": "1"} for i in range(5)],
    }
    folder = tmp_path / "protocol"
    folder.mkdir()
    for name, rs in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    ps = bc.load_prompts(f"protocol:paper@{folder}", limit=14, seed=1)
    counts = pd.Series([p.label for p in ps]).value_counts()
    assert counts.to_dict() == {"arc": 3, "gsm8k": 3, "hellaswag": 2, "mmlu": 2,
                                "truthfulqa": 2, "winogrande": 2}
    assert [p.label for p in ps][:3] == ["arc"] * 3
    assert ps == bc.load_prompts(f"protocol:paper@{folder}", limit=14, seed=1)  # seeded
    assert len(bc.load_prompts(f"protocol:paper@{folder}")) == 30  # 200 each, capped by size
    (folder / "mmlu.jsonl").unlink()
    with pytest.raises(bc.BlockCouplingError, match="no mmlu.jsonl"):
        bc.load_prompts(f"protocol:paper@{folder}")
    with pytest.raises(bc.BlockCouplingError, match="unknown prompt protocol"):
        bc.load_prompts("protocol:other")


def test_labels_name_runs_that_share_a_model(tmp_path: Path) -> None:
    """Runs of one model (same manifest label) are refused unless --labels names them."""
    same = [write_synthetic_run(tmp_path / f"r{i}", lv, label="same", model="org/same", seed=i)
            for i, lv in enumerate([0.2, 0.5, 0.7])]
    csv = tmp_path / "s.csv"
    csv.write_text("model,score\na,1\nb,2\nc,4\n")
    with pytest.raises(bc.BlockCouplingError, match="--labels"):
        C.correlate(same, csv, n_boot=0)
    res = C.correlate(same, csv, n_boot=0, labels=["a", "b", "c"])
    assert list(res.table["label"]) == ["a", "b", "c"]
    with pytest.raises(bc.BlockCouplingError, match="one label per run"):
        C.correlate(same, csv, n_boot=0, labels=["a", "b"])
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    out = CliRunner().invoke(app, ["correlate", *map(str, same), "--scores", str(csv),
                                   "--labels", "a,b,c", "--n-boot", "0"])
    assert out.exit_code == 0, out.output
    bad = CliRunner().invoke(app, ["correlate", *map(str, same), "--scores", str(csv),
                                   "--orientation", "xyz"])
    assert bad.exit_code == 2 and bad.output.strip().startswith("error:") and "ujv" in bad.output


# ---------------------------------------------------------------------------- small n
def _perm_p(x: np.ndarray, y: np.ndarray) -> float:
    """Oracle: the share of all n! orderings of y whose |r| reaches the observed |r|."""
    r0 = abs(np.corrcoef(x, y)[0, 1])
    rs = [abs(np.corrcoef(x, y[list(p)])[0, 1]) for p in itertools.permutations(range(len(y)))]
    return float(np.mean([r >= r0 - 1e-12 for r in rs]))


def test_small_n_p_values_are_exact_permutation_p_values() -> None:
    x = np.array([0.1, 0.4, 0.35, 0.8, 0.6, 0.9])
    y = np.array([10.0, 14.0, 11.0, 19.0, 20.0, 18.0])
    r = C.regression(x, y, n_boot=500, exact_below=10)
    assert r["p"] == pytest.approx(_perm_p(x, y))
    assert r["spearman_p"] == pytest.approx(_perm_p(st.rankdata(x), st.rankdata(y)))
    assert r["p"] != pytest.approx(st.linregress(x, y).pvalue)  # not the t-test
    assert "exact permutation (720 orderings)" == r["p_method"] == r["spearman_p_method"]
    # below 10 models: no bootstrap interval, and the reason
    assert np.isnan(r["r2_ci"]).all() and "below 10" in r["r2_ci_note"]
    # three perfectly ordered points: the smallest p an exact test can give, 2/3!, not 0
    three = C.regression([1.0, 2.0, 3.0], [5.0, 6.0, 9.0], exact_below=10, n_boot=100)
    assert three["spearman_p"] == pytest.approx(1 / 3) and three["p"] == pytest.approx(1 / 3)
    # Freedman-Lane: y's residuals on the controls permuted, residualised again
    rng = np.random.default_rng(4)
    c = rng.standard_normal(6)
    xx = c + rng.standard_normal(6)
    yy = xx + c + rng.standard_normal(6)
    got = C.partial_correlation(xx, yy, c, exact_below=10)
    A = np.column_stack([np.ones(6), c])
    M = np.eye(6) - A @ np.linalg.pinv(A)
    rx, ry = M @ xx, M @ yy
    r0 = abs(np.corrcoef(rx, ry)[0, 1])
    perms = [abs(np.corrcoef(rx, M @ ry[list(p)])[0, 1])
             for p in itertools.permutations(range(6))]
    assert got["p"] == pytest.approx(np.mean([v >= r0 - 1e-12 for v in perms]))
    assert got["p_method"].startswith("Freedman-Lane")


def test_exact_p_values_hold_their_level_by_simulation() -> None:
    """Under the null (independent x and y), P(p <= 0.1) <= 0.1 for n = 5, where the exact
    test has only 120 orderings; the t-test's p of the same data for comparison."""
    rng = np.random.default_rng(11)
    ps = [C.regression(rng.standard_normal(5), rng.standard_normal(5), n_boot=0,
                       exact_below=10)["p"] for _ in range(300)]
    rate = np.mean(np.array(ps) <= 0.1)
    assert rate <= 0.1 + 2 * np.sqrt(0.1 * 0.9 / 300)  # within two binomial se of the level
    assert rate >= 0.1 - 3 * np.sqrt(0.1 * 0.9 / 300)  # and not vacuously conservative


def test_degenerate_bootstrap_gives_no_interval() -> None:
    x = np.array([0.0] * 11 + [1.0])  # most resamples miss the one x that differs
    y = np.arange(12, dtype=float)
    r = C.regression(x, y, n_boot=200, seed=0)
    assert np.isnan(r["r2_ci"]).all() and "constant x or y" in r["r2_ci_note"]
    ok = C.regression(np.arange(12.0), np.arange(12.0) ** 1.5, n_boot=200)
    assert ok["r2_ci_note"] is None and ok["r2_ci"][0] < ok["r2_ci"][1]


def test_checkpoints_of_one_run_are_refused_unless_allowed(tmp_path: Path) -> None:
    """Three checkpoints of one model (revisions): one line naming --allow-checkpoints; with
    it, exact p-values and no bootstrap interval."""
    dirs = []
    for i, (rev, level) in enumerate((("step0", 0.1), ("step10", 0.4), ("step20", 0.7))):
        dirs.append(write_synthetic_run(tmp_path / rev, level, label=f"pythia@{rev}",
                                        model="org/pythia", seed=i, revision=rev))
    assert C.load_units(dirs)[0].revision == "step0"
    csv = tmp_path / "s.csv"
    csv.write_text("model,score\npythia@step0,1\npythia@step10,2\npythia@step20,4\n")
    r = runner.invoke(app, ["correlate", *map(str, dirs), "--scores", str(csv)])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--allow-checkpoints" in lines[0], r.output
    assert "3 of the 3 models are checkpoints of one training run (org/pythia" in lines[0]
    r = runner.invoke(app, ["correlate", *map(str, dirs), "--scores", str(csv),
                            "--allow-checkpoints"])
    assert r.exit_code == 0, r.output
    assert "p=0.333" in r.output and "p=0 " not in r.output and "[1.00, 1.00]" not in r.output
    assert "exact permutation (6 orderings)" in r.output
    assert "3 checkpoints of one training run (org/pythia) counted as independent" in r.output
    res = C.correlate(dirs, csv, allow_checkpoints=True)
    coupling = res.overall["predictors"]["coupling_mean"]
    assert coupling["spearman_p"] == pytest.approx(1 / 3) and np.isnan(coupling["r2_ci"]).all()
    assert res.to_dict()["checkpoints_counted_as_models"] == {
        "org/pythia": ["pythia@step0", "pythia@step10", "pythia@step20"]}


def test_the_token_rule_is_the_runs_own_and_must_be_shared(tmp_path: Path) -> None:
    """Issue 33: correlate's token default is the runs' own headline rule (a ViT run's [CLS]
    is "first"), as sweep-status and show state it, not "last" for every run; runs whose
    rules differ are refused in one line unless --tokens says which to use."""
    levels = [0.2, 0.35, 0.5, 0.6, 0.8]
    scores = pd.DataFrame({"model": [f"m{i}" for i in range(5)],
                           "score": [20.0, 30, 41, 45, 62]})
    vit = [write_synthetic_run(tmp_path / f"v{i}", lv, label=f"m{i}", model=f"org/v-{i}",
                               seed=i, headline="first") for i, lv in enumerate(levels)]
    from blockcoupling.errors import BlockCouplingError

    own = C.correlate(vit, scores, n_boot=0, k=2)
    first = C.correlate(vit, scores, n_boot=0, k=2, tokens="first")
    last = C.correlate(vit, scores, n_boot=0, k=2, tokens="last")
    col = "coupling_mean"
    assert own.table[col].tolist() == first.table[col].tolist()
    assert own.table[col].tolist() != last.table[col].tolist()
    assert "each prompt's first measured token" in own.statistic.describe()
    mixed = vit[:3] + [write_synthetic_run(tmp_path / f"l{i}", lv, label=f"m{i}",
                                           model=f"org/l-{i}", seed=i)
                       for i, lv in list(enumerate(levels))[3:]]
    with pytest.raises(BlockCouplingError, match="the runs' own token rules differ: first "
                                                 r"\(3 runs, e.g. m0\), last \(2 runs"):
        C.correlate(mixed, scores, n_boot=0, k=2)
    assert len(C.correlate(mixed, scores, n_boot=0, k=2, tokens="last").table) == 5
