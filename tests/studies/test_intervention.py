"""``study intervention``: its statistics against scipy (paired t-tests, Spearman, TOST), its
design checks (one line), the coupling term (strength 0 trains exactly as without it; the
sign of the strength moves the alignment), and ``--quick`` end to end (its tests recomputed
with scipy from its own runs, the page, a rerun reuses every run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.intervention import parse_spec, quick_spec
from blockcoupling.studies.intervention.analysis import analyse, arm_table
from tests.helpers.threads import one_torch_thread  # noqa: F401 - autouse: one torch thread


def _runs(seed: int = 0, effect: float = 0.0, seeds: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(seeds):
        base = 0.9 + 0.03 * rng.standard_normal()
        for k in (-1.0, -0.1, 0.0, 0.1, 1.0):
            rows.append({"seed": s, "strength": k, "test_accuracy": base + effect * k
                         + 0.01 * rng.standard_normal(),
                         "coupling_vs_rotated": 0.09 + 0.4 * k + 0.01 * rng.standard_normal(),
                         "weight_norm": 25 + 0.1 * k + 0.01 * rng.standard_normal(),
                         "train_ce": 0.3 + 0.05 * abs(k) + 0.01 * rng.standard_normal()})
    return pd.DataFrame(rows)


def test_analysis_equals_scipy_on_its_values() -> None:
    """H1 pairs, H2/H3 = scipy.stats.ttest_rel (one-sided) of the arms' seeds; Spearman =
    scipy's; E2/E3 = the two one-sided tests; the arms' se = scipy's sem."""
    runs = _runs(seed=1, effect=0.02)
    a = analyse(runs, "coupling_vs_rotated", alpha=0.05, bound=0.04)

    def arm(k: float, c: str) -> np.ndarray:
        return runs[runs["strength"] == k].sort_values("seed")[c].to_numpy()

    h1 = a["tests"]["H1"]
    for pair, (lo, hi) in zip(h1["pairs"], [(-1, -0.1), (-0.1, 0), (0, 0.1), (0.1, 1)],
                              strict=True):
        ref = stats.ttest_rel(arm(hi, "coupling_vs_rotated"), arm(lo, "coupling_vs_rotated"),
                              alternative="greater")
        assert pair["p"] == pytest.approx(ref.pvalue) and pair["t"] == pytest.approx(
            ref.statistic)
    assert h1["monotone"]
    rho = stats.spearmanr(runs["strength"], runs["coupling_vs_rotated"], alternative="greater")
    assert h1["spearman"]["rho"] == pytest.approx(rho.statistic)
    for key, k, alt in (("H2_E2", 1.0, "greater"), ("H3_E3", -1.0, "less")):
        t = a["tests"][key]
        d = arm(k, "test_accuracy") - arm(0.0, "test_accuracy")
        ref = stats.ttest_rel(arm(k, "test_accuracy"), arm(0.0, "test_accuracy"),
                              alternative=alt)
        assert t["p"] == pytest.approx(ref.pvalue) and t["difference"] == pytest.approx(d.mean())
        lo = stats.ttest_1samp(d, -0.04, alternative="greater").pvalue
        hi = stats.ttest_1samp(d, 0.04, alternative="less").pvalue
        assert t["p_tost"] == pytest.approx(max(lo, hi))
    assert a["tests"]["H2_E2"]["p"] < 0.05 and a["tests"]["H3_E3"]["p"] < 0.05
    arms = a["arms"].set_index("strength")
    assert arms.loc[1.0, "test_accuracy_se"] == pytest.approx(stats.sem(arm(1.0, "test_accuracy")))
    wn = a["tests"]["other_metrics"]["weight_norm"]["+1"]
    assert wn["difference"] == pytest.approx(
        (arm(1.0, "weight_norm") - arm(0.0, "weight_norm")).mean())
    null = analyse(_runs(seed=2, effect=0.0, seeds=12), "coupling_vs_rotated", bound=0.04)
    assert null["tests"]["H2_E2"]["p_tost"] < 0.05  # an effect of 0, precisely measured
    flipped = _runs(seed=3).assign(coupling_vs_rotated=lambda r: -r["coupling_vs_rotated"])
    assert not analyse(flipped, "coupling_vs_rotated")["tests"]["H1"]["monotone"]
    assert list(arm_table(runs, ["test_accuracy"])["n_seeds"]) == [6] * 5


@pytest.mark.parametrize("data, message", [
    ({"strengths": [0.0, 1.0]}, "0 and at least one positive and one negative"),
    ({"strengths": [-1.0, 1.0]}, "0 and at least one positive and one negative"),
    ({"seeds": [0, 1]}, "at least 3"),
    ({"train": {"seed": 2}}, "train.seed is set by the design"),
    ({"train": {"tokens": "all"}}, "one token"),
    ({"variant": "coupling_vs_nothing"}, "not a coupling variant"),
    ({"strengths": [-1, 0, 0, 1]}, "repeats a value"),
    ({"bogus": 1}, "unknown key 'bogus'"),
])
def test_bad_designs_are_one_line(data: dict, message: str) -> None:
    with pytest.raises(BlockCouplingError, match=message) as err:
        parse_spec(data)
    assert "\n" not in str(err.value)


def test_strength_zero_trains_as_without_the_term_and_the_sign_moves_the_alignment(
        tmp_path: Path) -> None:
    """Strength 0 records the term but adds nothing: the same trained weights and accuracy as
    a run without it (the term draws no random numbers of the training's); strength +1 ends
    with a higher exact alignment than strength -1, and both record the objective's parts
    and the weight norm each epoch."""
    import torch

    from blockcoupling.studies.vit.model import load_vit
    from blockcoupling.studies.vit.train import VitTrainConfig, read_metrics, train_vit

    base = quick_spec().train.replace(steps=8, epochs=1, monitor_every=0)
    outs = {}
    for name, term in (("plain", None), ("zero", 0.0), ("up", 1.0), ("down", -1.0)):
        cfg = VitTrainConfig.from_dict({**base.to_dict(), "coupling_term": term})
        outs[name] = train_vit(cfg, tmp_path / name, progress=False, threads=1)
    plain, zero = load_vit(outs["plain"]), load_vit(outs["zero"])
    for (n, p), (_, q) in zip(plain.state_dict().items(), zero.state_dict().items(),
                              strict=True):
        assert torch.equal(p, q), n
    mp, mz = read_metrics(outs["plain"]), read_metrics(outs["zero"])
    assert mp["final"]["test_accuracy"] == mz["final"]["test_accuracy"]
    assert "alignment" not in mp["epochs"][-1] and "weight_norm" in mz["epochs"][-1]
    up, down = read_metrics(outs["up"]), read_metrics(outs["down"])
    assert up["final"]["alignment"] > mz["final"]["alignment"] > down["final"]["alignment"]
    assert np.isfinite(up["epochs"][-1]["train_ce"]) and np.isfinite(up["epochs"][-1][
        "coupling_term"])


@pytest.mark.slow  # trains 9 tiny ViTs (about a minute quietly)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_quick_study_end_to_end(tmp_path: Path) -> None:
    """``--quick``: study.json's per-arm coupling and accuracy, seeds, manipulation check and
    power; its paired tests equal scipy recomputed from its own runs; the page; a rerun
    trains nothing and states the same result."""
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    out = tmp_path / "study"
    res = CliRunner().invoke(app, ["study", "intervention", "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "study.json").read_text())
    assert doc["design"]["arms"] == [-1.0, 0.0, 1.0] and doc["design"]["seeds"] == [0, 1, 2]
    assert {"H1_pair", "H2", "H3", "E2_at_0"} <= set(doc["design"]["power"])
    arms = pd.DataFrame(doc["arms"]).set_index("strength")
    runs = pd.DataFrame(doc["runs"])
    v = doc["tests"]["variant"]
    assert v == "coupling_vs_rotated"
    for k, g in runs.groupby("strength"):
        assert arms.loc[k, f"{v}_mean"] == pytest.approx(g[v].mean())
        assert arms.loc[k, "test_accuracy_mean"] == pytest.approx(g["test_accuracy"].mean())
    wide = runs.pivot(index="seed", columns="strength", values=v)
    ref = stats.ttest_rel(wide[1.0], wide[0.0], alternative="greater")
    assert doc["manipulation_check"]["pairs"][1]["p"] == pytest.approx(ref.pvalue)
    assert arms.loc[1.0, f"{v}_mean"] > arms.loc[0.0, f"{v}_mean"] > arms.loc[-1.0, f"{v}_mean"]
    import blockcoupling as bc

    row = runs.iloc[0]
    st = bc.open_run(row["run_dir"]).coupling_statistic(n_boot=0).set_index("variant")
    assert st.loc[v, "mean"] == pytest.approx(row[v])
    assert (out / "study.html").read_text().count("<figure") >= 1
    again = CliRunner().invoke(app, ["study", "intervention", "--quick", "--out", str(out)])
    assert again.exit_code == 0 and "reused" in again.output
    redo = json.loads((out / "study.json").read_text())
    assert redo["statement"] == doc["statement"]


def test_a_grid_written_before_a_training_option_existed_continues() -> None:
    """A grid's stored base config without a field added later (its default meant), or
    stored with its first point's values, is the same base (its identity with what the
    points set left out), so the grid continues; another value of a shared option is
    another base."""
    from blockcoupling.studies.vit.grid import _same_base
    from blockcoupling.studies.vit.train import VitTrainConfig

    new = VitTrainConfig(steps=30, drop_path=0.0, weight_decay=0.0).to_dict()
    old = {k: v for k, v in VitTrainConfig(steps=30, drop_path=0.1, seed=2).to_dict().items()
           if k not in ("coupling_term", "coupling_term_images", "coupling_term_directions",
                        "subset_per_seed")}

    def same(stored: object, base: dict, axes: tuple[str, ...] = ()) -> bool:
        return _same_base(base, axes)({"spec": {"vit-grid": {"base": stored}}}) == []

    assert same(old, new)
    assert not same({**old, "steps": 31}, new)
    assert not same(new, {**new, "subset_per_seed": True})
    assert same({**old, "train_limit": 90}, new, ("train_limit",))
    assert not same({**old, "train_limit": 90}, new)
    assert not same(None, new) and not same({"bogus": 1}, new)


def test_the_shipped_full_run_is_what_the_docs_quote() -> None:
    """The full design's run of 2026-11-29, shipped in docs/results/intervention: the study's
    own tests re-derive from the shipped runs.csv with today's code; every number the README
    quotes is computed here from the same table with scipy directly (paired t-tests, their
    intervals, TOST as two one-sided paired t-tests, Spearman); the how-to page quotes the
    study's statement."""
    from blockcoupling.studies.intervention import full_spec

    root = Path(__file__).resolve().parents[2]
    shipped = root / "docs" / "results" / "intervention"
    study = json.loads((shipped / "study.json").read_text())
    runs = pd.read_csv(shipped / "runs.csv")
    spec = full_spec()
    assert len(runs) == spec.n_runs and sorted(runs["strength"].unique()) == list(spec.arms)
    v = spec.variant
    a = analyse(runs, v, alpha=spec.alpha, bound=spec.bound)
    for key in ("H2_E2", "H3_E3"):
        for k in ("difference", "p", "p_tost"):
            assert a["tests"][key][k] == pytest.approx(study["tests"][key][k], rel=1e-9), k

    def arm(k: float, c: str) -> np.ndarray:
        return runs[runs["strength"] == k].sort_values("seed")[c].to_numpy()

    means = {k: arm(k, v).mean() for k in spec.arms}
    steps = [stats.ttest_rel(arm(hi, v), arm(lo, v), alternative="greater").pvalue
             for lo, hi in zip(spec.arms[:-1], spec.arms[1:], strict=True)]
    quoted = [f"moves coupling from {means[-1.0]:+.2f} to {means[1.0]:+.2f}",
              f"({means[0.0]:.2f} without)"]
    assert max(steps) < spec.alpha  # every step of the manipulation check rejects
    power = study["design"]["power"]
    for name, k, alt in (("H2", 1.0, "greater"), ("H3", -1.0, "less")):
        d = arm(k, "test_accuracy") - arm(0.0, "test_accuracy")
        t = stats.ttest_rel(arm(k, "test_accuracy"), arm(0.0, "test_accuracy"),
                            alternative=alt)
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        tost = max(stats.ttest_1samp(d, -spec.bound, alternative="greater").pvalue,
                   stats.ttest_1samp(d, spec.bound, alternative="less").pvalue)
        assert tost < spec.alpha and t.pvalue > spec.alpha  # the stated verdicts
        quoted += [f"{d.mean():+.3f} (95 % CI {ci.low:+.3f} to {ci.high:+.3f})",
                   f"{t.pvalue:.2f}", f"{tost:.2g}", f"power {power[name]['power']:.2f}"]
    readme = " ".join((root / "README.md").read_text().split())
    bullet = readme[readme.index("`study intervention`"):]
    bullet = bullet[:bullet.index("docs/how-to/")]
    for piece in quoted:
        assert piece in bullet, piece
    page = " ".join((root / "docs" / "how-to" / "intervention.md").read_text().split())
    for line in study["statement"]:
        assert " ".join(line.split()) in page, line
    rho = stats.spearmanr(runs["strength"], runs[v])
    assert study["tests"]["H1"]["spearman"]["rho"] == pytest.approx(rho.statistic)
