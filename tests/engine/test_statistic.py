"""The headline statistic (engine/statistic.py): one rule, checked against an independent
pandas computation, numpy's standard error and a seeded bootstrap, on multi-token runs of
several layers, with and without the diagonal, for both headline variants."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import blockcoupling as bc
from blockcoupling.engine.statistic import StatisticRule, paper_k, statistic_table, summarise
from blockcoupling.errors import BlockCouplingError
from tests.helpers.tiny_models import tiny_inputs, tiny_model


@pytest.fixture(scope="module")
def multi_token() -> bc.Measurement:
    """A tiny GPT-2 (3 blocks), 4 prompts, 3 measured tokens each, float64."""
    model = tiny_model("gpt2", dtype=torch.float64)
    inputs = tiny_inputs("gpt2", n=6, batch=4)
    return bc.measure(model, None, inputs, coupling=("depth",), k=(2, 4), tokens=(1, 3, 5),
                      p=(1, 2), dtype=torch.float64, progress=False)


def oracle(coupling: pd.DataFrame, *, variant: str, k: int, tokens: str, diagonal: bool,
           p: float | None = 1.0) -> pd.Series:
    """Per-prompt values by the stated rule, written independently of the library."""
    df = coupling.query("kind == 'depth' and orientation == 'ujv' and k == @k "
                        "and variant == @variant")
    if variant in ("coupling", "miscoupling"):
        df = df[df["p"] == p]
    if not diagonal:
        df = df[df["layer_a"] != df["layer_b"]]
    out = {}
    for pid, g in df.groupby("prompt_id"):
        if tokens in ("last", "first"):
            end = g["token_out_a"].max() if tokens == "last" else g["token_out_a"].min()
            out[pid] = g[g["token_out_a"] == end]["value"].mean()
        else:
            out[pid] = g.groupby("token_out_a")["value"].mean().mean()
    return pd.Series(out)


@pytest.mark.parametrize("tokens", ["last", "first", "all"])
@pytest.mark.parametrize("diagonal", [False, True])
@pytest.mark.parametrize("variant", ["coupling_vs_null", "coupling"])
def test_statistic_equals_the_stated_rule(multi_token: bc.Measurement, tokens: str,
                                          diagonal: bool, variant: str) -> None:
    m = multi_token
    want = oracle(m.coupling, variant=variant, k=4, tokens=tokens, diagonal=diagonal)
    assert len(want) == 4
    t = bc.coupling_statistic(m, variant=variant, k=4, tokens=tokens, diagonal=diagonal)
    assert len(t) == 1
    row = t.iloc[0]
    assert row["n_prompts"] == 4 and row["k"] == 4 and row["d_model"] == 16
    assert row["mean"] == pytest.approx(want.mean(), abs=1e-15)
    assert row["se"] == pytest.approx(want.std(ddof=1) / math.sqrt(len(want)), abs=1e-15)
    assert row["se"] == pytest.approx(np.std(want.to_numpy(), ddof=1) / 2, abs=1e-15)
    assert m.mean_depth_coupling(4, variant=variant, tokens=tokens, diagonal=diagonal) == \
        row["mean"]
    assert ("l = l' included" in row["rule"]) is diagonal


def test_last_and_all_tokens_differ_on_a_multi_token_run(multi_token: bc.Measurement) -> None:
    last = bc.coupling_statistic(multi_token, variant="coupling", k=2)["mean"].iloc[0]
    every = bc.coupling_statistic(multi_token, variant="coupling", k=2, tokens="all")
    assert every["mean"].iloc[0] != pytest.approx(last, abs=1e-6)  # the rule matters


def test_chance_level_is_the_null_of_the_same_rows(multi_token: bc.Measurement) -> None:
    """chance of raw c_K = mean of c_null; c_null = (c - v) / (1 - v) row by row, and the
    null of a row depends on the measured Jacobian alone."""
    m = multi_token
    t = bc.coupling_statistic(m, k=2, p=2)
    by = t.set_index("variant")
    assert by.loc["coupling_vs_null", "chance"] == 0.0
    keys = ["prompt_id", "layer_a", "layer_b", "token_out_a"]
    d = m.coupling.query("kind == 'depth' and k == 2 and orientation == 'ujv'")
    c = d[(d["variant"] == "coupling") & (d["p"] == 2)].set_index(keys)["value"]
    v = d[d["variant"] == "coupling_vs_null"].set_index(keys)["value"].reindex(c.index)
    c0 = ((c - v) / (1 - v)).reset_index()
    c0 = c0[c0["layer_a"] != c0["layer_b"]]
    # constant across the basis layer (depends on J1 only)
    spread = c0.groupby(["prompt_id", "layer_a", "token_out_a"])["value"].agg(np.ptp)
    assert spread.max() < 1e-9
    last = c0.groupby("prompt_id")["token_out_a"].transform("max")
    per_prompt = c0[c0["token_out_a"] == last].groupby("prompt_id")["value"].mean()
    assert by.loc["coupling", "chance"] == pytest.approx(per_prompt.mean(), abs=1e-12)
    assert by.loc["coupling", "chance"] < by.loc["coupling", "mean"] + 1  # a number, not NaN


def test_bootstrap_is_seeded_and_brackets_the_mean(multi_token: bc.Measurement) -> None:
    kw = dict(k=2, interval="bootstrap")
    a = bc.coupling_statistic(multi_token, seed=3, **kw)
    b = bc.coupling_statistic(multi_token, seed=3, **kw)
    c = bc.coupling_statistic(multi_token, seed=4, **kw)
    pd.testing.assert_frame_equal(a, b)
    assert not a["ci_low"].equals(c["ci_low"])
    assert (a["ci_low"] <= a["mean"]).all() and (a["mean"] <= a["ci_high"]).all()


def test_the_interval_is_a_t_interval(multi_token: bc.Measurement) -> None:
    """The default interval: mean -+ t_{n-1}(0.975) se (scipy.stats.t), whatever n_boot."""
    from scipy import stats

    t = bc.coupling_statistic(multi_token, k=2, n_boot=0)
    for _, row in t.iterrows():
        lo, hi = stats.t.interval(0.95, row["n_prompts"] - 1, loc=row["mean"], scale=row["se"])
        assert (row["ci_low"], row["ci_high"]) == (pytest.approx(lo, abs=1e-14),
                                                   pytest.approx(hi, abs=1e-14))
        assert row["replication"] == "prompts (within model)"


def test_rule_text_states_a_ci_only_where_one_is_computed(multi_token: bc.Measurement) -> None:
    from blockcoupling.engine.statistic import headline_rule

    assert "CI: mean +- t(n-1) se" in bc.coupling_statistic(multi_token)["rule"].iloc[0]
    assert "CI: percentile bootstrap" in bc.coupling_statistic(
        multi_token, interval="bootstrap")["rule"].iloc[0]
    plain = bc.coupling_statistic(multi_token, n_boot=0, interval="bootstrap")["rule"].iloc[0]
    assert "CI" not in plain and "se = sd over prompts" in plain and "within one model" in plain
    assert "coupling_vs_null and coupling" in headline_rule() and "CI" not in headline_rule()
    rule_line = [ln for ln in multi_token.summary().splitlines() if "rule:" in ln][0]
    assert "CI" not in rule_line and "K as on each line" in rule_line


def test_summarise_against_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=37)
    s = summarise(x, n_boot=500, seed=1, interval="bootstrap")
    assert s["mean"] == pytest.approx(x.mean(), abs=1e-15)
    assert s["se"] == pytest.approx(x.std(ddof=1) / math.sqrt(37), abs=1e-15)
    # the resampled means by hand (the draws of scipy.stats.bootstrap from the same seed)
    idx = np.random.default_rng(1).integers(0, 37, size=(500, 37))
    lo, hi = np.quantile(x[idx].mean(axis=1), [0.025, 0.975])
    assert (s["ci_low"], s["ci_high"]) == pytest.approx((lo, hi), rel=1e-12)
    one = summarise(np.array([0.5]))
    assert one["n_prompts"] == 1 and math.isnan(one["se"]) and math.isnan(one["ci_low"])


def _coverage(draw, truth: float, n: int, reps: int, seed: int, **kw) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(reps):
        s = summarise(draw(rng, n), **kw)
        hits += s["ci_low"] <= truth <= s["ci_high"]
    return hits / reps


@pytest.mark.parametrize("n", [4, 8, 16])
def test_interval_covers_95_percent_at_small_n(n: int) -> None:
    """Seeded simulation: 4,000 datasets per n (the Monte Carlo sd of a coverage near 95 % is
    0.34 points, so a 2-point band is 5.8 sd wide for an exact interval: no flakes). Normal
    per-prompt values (where t is exact) and skewed bounded ones (beta(5, 10), skewness 0.3,
    like per-prompt coupling values; its true coverage is 94.5 % at n = 4 by a 200,000-set
    simulation, 1.5 points inside the band): within 2 points of 95 %. The percentile
    bootstrap, the earlier interval, does not get there at small n (80 % at n = 4)."""
    normal = _coverage(lambda r, m: r.normal(0.3, 0.05, m), 0.3, n, 4000, seed=n)
    skewed = _coverage(lambda r, m: r.beta(5.0, 10.0, m), 1 / 3, n, 4000, seed=100 + n)
    assert abs(normal - 0.95) <= 0.02, normal
    assert abs(skewed - 0.95) <= 0.02, skewed
    if n == 4:
        boot = _coverage(lambda r, m: r.normal(0.3, 0.05, m), 0.3, n, 1000, seed=7,
                         interval="bootstrap", n_boot=400)
        assert boot < 0.9, boot


def test_seed_level_uses_runs_as_the_unit_of_replication() -> None:
    """One value per run; the mean over seeds, the sd over seeds / sqrt(n), a t interval
    with n_runs - 1 df (scipy), the within-model se beside it."""
    from scipy import stats

    from blockcoupling.engine.statistic import seed_level

    runs = pd.DataFrame({"config": ["a"] * 3 + ["b"] * 2 + ["c"],
                         "seed": [0, 1, 2, 0, 1, 0],
                         "variant": "coupling_vs_rotated", "k": 8,
                         "mean": [0.10, 0.14, 0.12, 0.3, 0.2, 0.5],
                         "se": [0.01, 0.02, 0.01, 0.03, 0.01, 0.02]})
    out = seed_level(runs, by=("config", "variant", "k")).set_index("config")
    a = runs[runs["config"] == "a"]
    assert out.loc["a", "mean"] == pytest.approx(a["mean"].mean())
    assert out.loc["a", "se"] == pytest.approx(stats.sem(a["mean"]))
    assert out.loc["a", "sd"] == pytest.approx(stats.tstd(a["mean"]))
    lo, hi = stats.t.interval(0.95, 2, loc=a["mean"].mean(), scale=stats.sem(a["mean"]))
    assert out.loc["a", "ci_low"] == pytest.approx(lo) and out.loc["a", "ci_high"] == \
        pytest.approx(hi)
    assert out.loc["a", "within_se"] == pytest.approx(math.sqrt(0.01 ** 2 * 2 + 0.02 ** 2) / 3)
    assert out.loc["a", "n_runs"] == 3 and out.loc["a", "seeds"] == "0,1,2"
    assert (out["replication"] == "runs (seeds)").all()
    assert math.isnan(out.loc["c", "se"]) and math.isnan(out.loc["c", "ci_low"])
    with pytest.raises(BlockCouplingError, match="no column 'seed'"):
        seed_level(runs.drop(columns="seed"))


def test_a_vit_grid_with_seeds_reports_the_seed_level() -> None:
    """vit-grid's printout (cli/vit.py): per grid point with several seeds, the coupling and
    the accuracy with the runs as the unit of replication; a one-seed grid has none."""
    from scipy import stats

    from blockcoupling.cli.vit import _seed_level

    runs = pd.DataFrame({"drop_path": [0.0, 0.0, 0.1, 0.1], "weight_decay": 0.05,
                         "seed": [0, 1, 0, 1], "coupling_vs_null": [0.10, 0.12, 0.2, 0.26],
                         "coupling_vs_null_se": 0.001, "test_accuracy": [0.8, 0.9, 0.7, 0.75]})
    t = _seed_level(runs)
    row = t[(t["drop_path"] == 0.1) & (t["value"] == "coupling_vs_null")].iloc[0]
    assert row["n_runs"] == 2 and row["mean"] == pytest.approx(0.23)
    assert row["se"] == pytest.approx(stats.sem([0.2, 0.26]))
    assert row["within_se"] == pytest.approx(math.sqrt(2) * 0.001 / 2)
    assert _seed_level(runs[runs["seed"] == 0]) is None


def test_k_rules(multi_token: bc.Measurement) -> None:
    assert paper_k(768) == 77 and paper_k(4096) == 410 and paper_k(5) == 1
    t = bc.coupling_statistic(multi_token, variant="coupling", k=[2, 4])
    assert list(t["k"]) == [2, 4]
    assert bc.coupling_statistic(multi_token)["k"].tolist() == [2, 2, 2]  # smallest measured
    assert bc.coupling_statistic(multi_token, k="d/10")["k"].tolist() == [2, 2, 2]  # d = 16
    assert bc.coupling_statistic(multi_token)["variant"].tolist() == [
        "coupling_vs_rotated", "coupling_vs_null", "coupling"]  # the headline's order
    only4 = multi_token.coupling[multi_token.coupling["k"] == 4]
    with pytest.raises(BlockCouplingError, match=r"K = 2; it measured K in \[4\]"):
        statistic_table(only4, StatisticRule(k="d/10"), d_model=16)
    with pytest.raises(BlockCouplingError, match="measured K in \\[2, 4\\].*--k 7"):
        bc.coupling_statistic(multi_token, k=7)


@pytest.mark.parametrize("kwargs, match", [
    ({"variant": "nope"}, "variant 'nope': choose from coupling"),
    ({"tokens": "cls"}, "tokens 'cls': choose from last, first, all"),
    ({"k": 0}, "K must be a positive integer"),
    ({"k": "d/5"}, "K must be a positive integer"),
    ({"orientation": "uvj"}, "orientation 'uvj': choose from ujv, vju"),
    ({"seed": -1}, "seed must be a whole number >= 0"),
    ({"n_boot": -5}, "n_boot must be a whole number >= 0"),
])
def test_bad_rules_say_what_to_use(kwargs: dict, match: str) -> None:
    with pytest.raises(BlockCouplingError, match=match):
        StatisticRule(**kwargs)


def test_missing_variant_says_what_to_measure() -> None:
    model = tiny_model("gpt2", dtype=torch.float64)
    m = bc.measure(model, None, tiny_inputs("gpt2", n=4, batch=2), coupling=("depth",), k=(2,),
                   variants=("coupling",), dtype=torch.float64, progress=False)
    with pytest.raises(BlockCouplingError, match="coupling_vs_rotated was not measured.*"
                                                 "--variant coupling_vs_rotated"):
        bc.coupling_statistic(m)
    # a run measured before coupling_vs_rotated existed is led by coupling_vs_null
    old = bc.measure(model, None, tiny_inputs("gpt2", n=4, batch=2), coupling=("depth",),
                     k=(2,), variants=("coupling", "coupling_vs_null"), dtype=torch.float64,
                     progress=False)
    assert bc.coupling_statistic(old)["variant"].tolist() == ["coupling_vs_null", "coupling"]
    assert "above chance (coupling_vs_null)" in old.summary()
    raw = statistic_table(m.coupling, variants=("coupling",), d_model=16)
    assert math.isnan(raw["chance"].iloc[0])  # no null rows: the chance level is not invented
    assert "chance level not measured" in m.summary()


# ---------------------------------------------------------------------------- every output
@pytest.fixture(scope="module")
def three_models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three tiny GPT-2s (3 blocks, d = 16) saved as hub folders, each measured into a run
    directory with 3 tokens per prompt, and the same three measured by a local sweep."""
    from tests.helpers.tiny_runs import PROMPTS, save_tiny_lm, write_prompts

    root = tmp_path_factory.mktemp("three")
    prompts = write_prompts(root / "prompts.txt", PROMPTS)
    measure = {"coupling": ["depth"], "k": [2, 3], "tokens": "0,2,-1", "p": [1],
               "variants": ["coupling", "coupling_vs_null", "coupling_vs_rotated"],
               "orientations": ["ujv"]}
    runs, models = [], []
    for i in range(3):
        folder = save_tiny_lm(root / f"m{i}")
        import transformers as tf

        model = tf.AutoModel.from_pretrained(folder)
        with torch.no_grad():  # three different models from one saved shape
            for prm in model.parameters():
                prm.mul_(1.0 + 0.3 * i)
        model.save_pretrained(folder)
        tok = tf.AutoTokenizer.from_pretrained(folder)
        run = root / f"run{i}"
        bc.measure_to_dir(model, tok, PROMPTS, run, meta={"label": f"m{i}"}, progress=False,
                          **{k: v for k, v in measure.items()})
        runs.append(run)
        models.append({"label": f"m{i}", "model": str(folder)})
    sweep = bc.run_sweep({"models": models, "prompts": [str(prompts)], "measure": measure},
                         root / "sweep", executor="local", progress=False)
    return {"runs": runs, "sweep": sweep, "root": root}


@pytest.mark.parametrize("diagonal", [False, True])
def test_every_output_states_the_same_value(three_models: dict, diagonal: bool,
                                            tmp_path: Path) -> None:
    """bc.coupling_statistic, Measurement.mean_depth_coupling, the sweep summary and
    correlate --json give the same per-model value, equal to an independent pandas
    computation of the rule, for both headline variants (multi-token, 3 layers)."""
    import json

    from typer.testing import CliRunner

    from blockcoupling.cli import app

    runs, sweep = three_models["runs"], three_models["sweep"]
    scores = tmp_path / "scores.csv"
    scores.write_text("model,score\nm0,10\nm1,25\nm2,17\n")
    js = tmp_path / "c.json"
    args = ["correlate", *map(str, runs), "--scores", str(scores), "--json", str(js),
            "--k", "2", "--n-boot", "0"] + (["--diagonal"] if diagonal else [])
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    corr = {row["label"]: row for row in json.loads(js.read_text())["models"]}
    summ = sweep.summary(k=2, diagonal=diagonal).set_index("label")
    for run in runs:
        m = bc.open_run(run)
        label = m.meta["label"]
        assert m.coupling.groupby("prompt_id")["token_out_a"].nunique().min() == 3
        for variant in ("coupling_vs_rotated", "coupling_vs_null", "coupling"):
            want = oracle(m.coupling, variant=variant, k=2, tokens="last",
                          diagonal=diagonal).mean()
            got = bc.coupling_statistic(run, variant=variant, k=2, diagonal=diagonal)
            assert got["mean"].item() == pytest.approx(want, abs=1e-15)
            value = got["mean"].item()
            assert m.mean_depth_coupling(2, variant=variant, diagonal=diagonal) == value
            assert summ.loc[label, f"{variant}_mean"] == value
            assert corr[label][f"{variant}_mean"] == value
            assert summ.loc[label, f"{variant}_se"] == got["se"].item()
            assert corr[label][f"{variant}_se"] == got["se"].item()


def test_a_sweep_with_mixed_k_is_refused(three_models: dict) -> None:
    sweep = three_models["sweep"]
    t = bc.coupling_statistic(sweep)  # every unit's smallest K is 2: one K
    assert set(t["k"]) == {2} and len(t) == 9  # 3 units x 3 headline variants
    assert list(t.columns[:6]) == ["unit_id", "label", "model", "revision", "step", "prompt_set"]
    with pytest.raises(BlockCouplingError, match="measured K in \\[2, 3\\]"):
        bc.coupling_statistic(sweep, k=5)


# ---------------------------------------------------------------------------- chance floor
def test_chance_floor_equals_scipy_on_the_floor_values(tmp_path: Path) -> None:
    import json

    import scipy.stats as st
    from typer.testing import CliRunner

    from blockcoupling.cli import app
    from blockcoupling.engine.statistic import flat_chance
    from blockcoupling.studies.correlate import paper_scores

    js, page = tmp_path / "f.json", tmp_path / "f.html"
    r = CliRunner().invoke(app, ["chance-floor", "--scores", "paper", "--json", str(js),
                                 "--out", str(page)])
    assert r.exit_code == 0, r.output
    out = json.loads(js.read_text())
    table = paper_scores()
    ok = table["score"].notna() & table["d_model"].notna()
    d = table.loc[ok, "d_model"].astype(int).to_numpy()
    k = np.maximum(1, np.array([round(v / 10) for v in d]))
    floor = 1 - np.sqrt(1 / d + 1 / k)
    np.testing.assert_allclose(floor, flat_chance(d, k), rtol=0, atol=0)
    lr = st.linregress(floor, table.loc[ok, "score"].astype(float))
    assert out["overall"]["n"] == ok.sum()
    assert out["overall"]["slope"] == pytest.approx(lr.slope, rel=1e-12)
    assert out["overall"]["r2"] == pytest.approx(lr.rvalue ** 2, rel=1e-12)
    assert out["overall"]["p"] == pytest.approx(lr.pvalue, rel=1e-9)
    base = ok & (table["group"] == "base")
    lb = st.linregress(1 - np.sqrt(1 / table.loc[base, "d_model"] +
                                   1 / np.maximum(1, (table.loc[base, "d_model"] / 10).round())),
                       table.loc[base, "score"].astype(float))
    assert out["groups"]["base"]["r2"] == pytest.approx(lb.rvalue ** 2, rel=1e-12)
    # the width itself, and the fit without the family it leans on most (issue 30 item 5:
    # log10 d_model R^2 0.44; without the four GPT-2 rows R^2 0.10, p = 0.18)
    sub = table[base]
    lw = st.linregress(np.log10(sub["d_model"].astype(float)), sub["score"].astype(float))
    assert out["groups"]["base"]["width"]["r2"] == pytest.approx(lw.rvalue ** 2, rel=1e-12)
    rest = sub[sub["family"] != "GPT-2"]
    lr2 = st.linregress(1 - np.sqrt(1 / rest["d_model"] +
                                    1 / np.maximum(1, (rest["d_model"] / 10).round())),
                        rest["score"].astype(float))
    without = out["groups"]["base"]["without_family"]["GPT-2"]
    assert without["n"] == len(rest) == 19
    assert without["r2"] == pytest.approx(lr2.rvalue ** 2, rel=1e-12)
    assert without["p"] == pytest.approx(lr2.pvalue, rel=1e-9)
    assert out["groups"]["base"]["most_influential_family"] == "GPT-2"
    assert (round(lw.rvalue ** 2, 2), round(lr2.rvalue ** 2, 2), round(lr2.pvalue, 2)) == \
        (0.44, 0.10, 0.18)
    assert "without GPT-2" in r.output and "log10 d_model" in r.output
    assert len(out["excluded"]) == (~ok).sum()  # listed, never dropped silently
    assert page.read_text().count("data:image/png;base64,") == 1
    assert flat_chance(768, 77) == pytest.approx(0.8805, abs=1e-4)
    assert flat_chance(8192, 819) == pytest.approx(0.9634, abs=1e-4)


@pytest.mark.parametrize("args, match, code", [
    (["--scores", "paper", "--k-rule", "d/5"], "--k-rule 'd/5': give a positive integer", 2),
    (["--scores", "paper", "--k-rule", "0"], "K must be a positive integer", 2),
    (["--scores", "/nonexistent.csv"], "no such file", 1),
])
def test_chance_floor_bad_input_is_one_line(args: list[str], match: str, code: int) -> None:
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    r = CliRunner().invoke(app, ["chance-floor", *args])
    assert r.exit_code == code
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], r.output


def test_one_meaning_of_k_none_and_a_named_resolution(multi_token: bc.Measurement) -> None:
    """``k=None`` is the smallest measured K wherever a rule is read (issue 33); the paper's
    per-model K is stated as ``"d/10"`` and `StatisticRule.resolved` turns either into one
    table's int K. The correlation's rule states "d/10" (its old type read None so)."""
    from blockcoupling.studies.model_units import CORRELATION_RULE

    rule = StatisticRule()
    assert rule.resolved(measured_ks=[4, 2], d_model=48).k == 2  # smallest measured
    assert StatisticRule(k="d/10").resolved(measured_ks=[2, 4, 5], d_model=48).k == 5
    assert StatisticRule(k=4).resolved(measured_ks=[2, 4]).k == 4
    with pytest.raises(BlockCouplingError, match=r"measured K in \[2\]"):
        StatisticRule(k=4).resolved(measured_ks=[2])
    assert CORRELATION_RULE.k == "d/10" and "round(d/10)" in CORRELATION_RULE.describe()
    # the rule passed whole gives the numbers the keywords give
    by_rule = multi_token.statistic(StatisticRule(k=4, p=2.0, tokens="all"),
                                    variants=("coupling",))
    by_words = bc.coupling_statistic(multi_token, variant="coupling", k=4, p=2.0, tokens="all")
    assert by_rule["mean"].tolist() == by_words["mean"].tolist()
    assert by_rule["k"].tolist() == [4]


def test_one_rule_type_in_the_package() -> None:
    """The statistic's rule is one frozen dataclass: no other class in the package declares
    the rule's own fields (variant, K, p, orientation) beside each other (issue 33)."""
    import ast
    import dataclasses

    src = Path(bc.__file__).resolve().parent
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                fields = {t.target.id for t in node.body if isinstance(t, ast.AnnAssign)
                          and isinstance(t.target, ast.Name)}
                if {"k", "p", "orientation"} <= fields:
                    found.append(f"{path.relative_to(src)}:{node.name}")
    assert found == ["engine/statistic.py:StatisticRule"], found
    assert dataclasses.is_dataclass(StatisticRule)
    with pytest.raises(dataclasses.FrozenInstanceError):
        StatisticRule().k = 3  # type: ignore[misc]


#: where the statistic's rule may still arrive as loose keywords (issue 33): the entry points
#: that turn them into one `StatisticRule` at once (the library's documented keywords, the
#: CLI's options), the row selection of a Measurement, the metrics' own orientation argument
#: and the |A| grids (a display k x k block and an orientation, not the statistic's rule)
LOOSE_RULE_KEYWORDS = {
    "cli/correlate.py:correlate", "cli/cross.py:cross",
    "engine/metrics.py:_check_orientation", "engine/metrics.py:coupling_matrix",
    "engine/results.py:select", "engine/results.py:coupling_statistic",
    "engine/results.py:mean_depth_coupling", "engine/results.py:per_prompt_coupling",
    "engine/results.py:_rule", "engine/results.py:coupling_by_distance",
    "engine/results.py:depth_matrix",
    "report/figures/depth.py:plot_coupling_grid", "report/figures/depth.py:caption_coupling_grid",
    "report/figures/mosaics.py:plot_token_grid", "report/figures/mosaics.py:caption_token_grid",
    "report/summaries/common.py:check_variant", "report/summaries/mosaics.py:token_grid_data",
    "report/summaries/tokens.py:coupling_grid_data",
    "studies/correlate.py:correlate", "studies/cross.py:cross_coupling",
    "runs/statistic.py:coupling_statistic", "runs/read.py:coupling_statistic",
    "runs/read.py:summary",
}


def test_the_rule_travels_whole() -> None:
    """Below its entry points the rule is passed as one value: a new function that takes
    ``orientation`` (the mark of a rule given as loose keywords) fails here; take a
    `StatisticRule` instead, or name the new entry point above."""
    import ast

    src = Path(bc.__file__).resolve().parent
    loose = set()
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if "orientation" in args:
                    loose.add(f"{path.relative_to(src).as_posix()}:{node.name}")
    assert loose == LOOSE_RULE_KEYWORDS, (sorted(loose - LOOSE_RULE_KEYWORDS),
                                          sorted(LOOSE_RULE_KEYWORDS - loose))
