"""The report's paper figures added for issue 32: token-wise |A| mosaics (fig. 4, context
coupling) against float64 oracle Jacobians, depth profiles with the logit lens (fig. 24), the
per-model metrics in a chosen order (fig. 23, 37, lss-all, expo-all), ``report --sort`` and the
windowed LSS across checkpoints on the emergence page (fig. 25 right)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import blockcoupling as bc
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report import emergence as E
from blockcoupling.report import figures as F
from blockcoupling.report.html import write_report
from blockcoupling.report.summaries.mosaics import token_grid_data
from blockcoupling.report.summaries.profiles import (
    PROFILE_COLUMNS,
    depth_profiles,
    metric_by_run,
    run_order,
    sort_values,
)
from tests.helpers.oracles import oracle_jacobians
from tests.helpers.tiny_models import tiny_inputs, tiny_model
from tests.helpers.tiny_runs import cli, save_tiny_lm, write_prompts

KINDS = ("self", "fixed_input", "fixed_output")


@pytest.fixture(scope="module", params=["gpt2", "bert"])
def measured(request: pytest.FixtureRequest) -> tuple[str, bc.Measurement, list[np.ndarray]]:
    arch = request.param
    model = tiny_model(arch, dtype=torch.float64)
    inputs = tiny_inputs(arch, n=4)
    m = bc.measure(model, None, inputs, coupling=("depth",) + KINDS, k=(3,), tokens="all",
                   dtype=torch.float64, progress=False)
    return arch, m, oracle_jacobians(model, inputs)[0]


def _oracle_A(Ja: np.ndarray, Jb: np.ndarray, k: int) -> np.ndarray:
    U, _, Vt = np.linalg.svd(Jb)
    return U[:, :k].T @ Ja @ Vt[:k].T  # (k, k): U_b^T J_a V_b


def _key(kind: str, layer: int, fixed: int, t: int) -> tuple[int, int, int]:
    if kind == "self":
        return layer, t, t
    return (layer, fixed, t) if kind == "fixed_input" else (layer, t, fixed)


def test_token_mosaics_are_the_oracles_coupling_matrices(measured) -> None:
    arch, m, Js = measured
    pid = str(m.prompts["prompt_id"].iloc[0])
    L = len(Js)
    for kind in KINDS:
        A = m.arrays[f"A_{kind}/{pid}/ujv"]
        toks = [int(t) for t in m.arrays[f"A_{kind}/{pid}/tokens"]]
        layer, fixed = (int(v) for v in m.arrays[f"A_{kind}/{pid}/where"])
        assert L == 3 and layer == 2  # the middle selected layer, the pair (l, l)
        # the axis: every token (self), the outputs >= the first input (fixed_input, causal),
        # the inputs <= the last output (fixed_output): the token heatmap's defaults
        want_axis = {"self": [0, 1, 2, 3], "fixed_input": [0, 1, 2, 3],
                     "fixed_output": [0, 1, 2, 3]}[kind]
        assert toks == want_axis and fixed == {"self": -1, "fixed_input": 0, "fixed_output": 3}[kind]
        assert A.shape == (4, 4, 3, 3)
        for i, ta in enumerate(toks):
            for j, tb in enumerate(toks):
                la, ia, oa = _key(kind, layer, fixed, ta)
                _, ib, ob = _key(kind, layer, fixed, tb)
                want = _oracle_A(Js[la - 1][oa, ia], Js[la - 1][ob, ib], 3)
                np.testing.assert_allclose(np.abs(A[i, j]), np.abs(want), atol=1e-6,
                                           err_msg=f"{arch} {kind} {ta} {tb}")
        pick = token_grid_data(m, kind, k=2)[0]
        assert pick is not None and pick.tokens == tuple(toks) and pick.layer == layer
        cell = np.abs(A[1, 2, :2, :2])
        r, c = 1 * (2 + pick.gap), 2 * (2 + pick.gap)
        np.testing.assert_allclose(pick.mosaic[r:r + 2, c:c + 2], cell / cell.max(), rtol=1e-6)


def test_mosaic_missing_kind_and_the_report_pages(measured, tmp_path: Path) -> None:
    _, m, _ = measured
    depth_only = bc.measure(tiny_model("gpt2"), None, tiny_inputs("gpt2", n=4), k=2,
                            progress=False)
    with pytest.raises(F.FigureUnavailable, match="kind 'self'"):
        token_grid_data(depth_only, "self")
    out = write_report([m, depth_only], tmp_path / "r.html", labels=["tok", "depth"],
                       formats=("png",))
    page = out.read_text()
    for title in ("Coupling matrices |A| across tokens", "fixed input token",
                  "Norm, windowed LSS, step length and logit entropy", "Trajectory metrics "
                  "per model"):
        assert title in page, title
    assert "Not stored for depth" in page


def test_depth_profiles_and_metrics_by_run_against_pandas(measured) -> None:
    _, m, _ = measured
    prof = depth_profiles(m)
    tr = m.trajectory
    for layer in (0, 2):
        rows = tr[tr["layer"] == layer]
        row = prof[prof["layer"] == layer].iloc[0]
        assert row["norm_median"] == pytest.approx(float(np.median(rows["norm"])))
        assert row["step_norm_q75"] == pytest.approx(
            float(np.quantile(rows["step_norm"].dropna(), 0.75))) if layer else \
            row["step_norm_n"] == 0
        assert row["logit_entropy_n"] == 0  # measured without the lens
    by = metric_by_run([m, m], "lss")
    assert by["median"].tolist() == [pytest.approx(float(m.token_metrics["lss"].median()))] * 2
    fig = F.plot_depth_profiles(m)  # no empty row: the lens row is left out, the caption says why
    assert [ax.get_ylabel() for ax in fig.axes][-1] != PROFILE_COLUMNS["logit_entropy"]
    assert len(fig.axes) == len(PROFILE_COLUMNS) - 1
    assert "measured without --logit-lens" in F.caption_depth_profiles(m)
    with pytest.raises(BlockCouplingError, match="choose from"):
        metric_by_run(m, "norm")


def test_sort_values_and_order() -> None:
    runs = [SimpleNamespace(meta={"num_parameters": p, "num_layers": L, "hidden_size": d})
            for p, L, d in ((300, 4, 32), (100, 8, 16), (200, 2, 64))]
    labs = ["a", "b", "c"]
    assert run_order(sort_values(runs, "params", labs), labs, "params") == ([1, 2, 0], [])
    assert run_order(sort_values(runs, "layers", labs), labs, "layers") == ([2, 0, 1], [])
    assert run_order(sort_values(runs, "d_model", labs), labs, "d_model") == ([1, 0, 2], [])
    assert run_order(sort_values(runs, "given", labs), labs, "given") == ([0, 1, 2], [])
    assert run_order([2.0, 1.0, 2.0], labs, "score") == ([1, 0, 2], [])  # ties keep the given order
    runs[1].meta.pop("num_parameters")
    with pytest.raises(BlockCouplingError, match="meta of b has no num_parameters"):
        sort_values(runs, "params", labs)
    # a run without a value (no score for it) goes last, and is named
    assert run_order([None, 2.0, 1.0], labs, "score") == ([2, 1, 0], ["a"])
    with pytest.raises(BlockCouplingError, match="no run has a value"):
        run_order([None, float("nan"), None], labs, "score")
    with pytest.raises(BlockCouplingError, match="sort key 'size'"):
        sort_values(runs, "size", labs)


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_report_sort_on_the_command_line(tmp_path: Path) -> None:
    """Two tiny LMs of different sizes measured, the report sorted by parameters and by a
    score table: the per-model figure's order follows."""
    import transformers as tf

    small = save_tiny_lm(tmp_path / "m-small")
    big = save_tiny_lm(tmp_path / "m-big")
    torch.manual_seed(0)
    tf.GPT2Model(tf.GPT2Config(n_layer=4, n_embd=16, n_head=2, vocab_size=64,
                               n_positions=32)).save_pretrained(big)
    prompts = write_prompts(tmp_path / "p.txt")
    for name, path in (("big", big), ("small", small)):
        r = cli("-q", "measure", "--model", str(path), "--prompts", str(prompts), "--k", "2",
                "--coupling", "none", "--out", str(tmp_path / name))
        assert r.exit_code == 0, r.output
    runs = [str(tmp_path / "big"), str(tmp_path / "small")]
    r = cli("report", *runs, "--sort", "params", "--out", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    assert "by parameter count" in page
    from blockcoupling.store import open_run
    from blockcoupling.studies.ordering import order_runs

    ms = [open_run(r_) for r_ in runs]
    assert ms[0].meta["num_parameters"] > ms[1].meta["num_parameters"]
    assert order_runs(ms, ["big", "small"], "params") == ([1, 0], "by parameter count")
    assert page.index("m-small") < page.index("m-big")  # the runs table follows the order
    scores = tmp_path / "s.csv"
    pd.DataFrame({"model": ["big", "small"], "score": [10.0, 20.0]}).to_csv(scores, index=False)
    r = cli("report", *runs, "--sort", "score", "--scores", str(scores), "--labels",
            "big,small", "--out", str(tmp_path / "s.html"))
    assert r.exit_code == 0, r.output
    assert "by benchmark score" in (tmp_path / "s.html").read_text()
    assert order_runs(ms, ["big", "small"], "score", run_dirs=runs, scores=str(scores)
                      )[0] == [0, 1]
    r = cli("report", *runs, "--sort", "score", "--out", str(tmp_path / "x.html"))
    assert r.exit_code == 1 and "--sort score needs --scores" in r.output
    r = cli("report", *runs, "--sort", "size", "--out", str(tmp_path / "x.html"))
    assert r.exit_code == 2 and "--sort 'size'" in r.output  # an option error


def test_windowed_lss_across_checkpoints(measured) -> None:
    _, m, _ = measured
    prof = E.windowed_lss_by_layer(m)
    tr = m.trajectory.dropna(subset=["lss_window"])
    want = tr.groupby("layer")["lss_window"].mean()
    np.testing.assert_allclose(prof.set_index("layer")["lss_window"], want)

    class Fake:  # a collection of two checkpoints of one model
        catalogue = pd.DataFrame({"unit_id": ["u0", "u1"], "label": ["tiny", "tiny"],
                                  "step": [0, 10]})

        def open_unit(self, uid: str) -> bc.Measurement:
            return m

    fig = E.plot_windowed_lss(Fake(), ["u0", "u1"])
    lines = fig.axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["tiny step 0", "tiny step 10"]
    np.testing.assert_allclose(lines[1].get_ydata(), want.to_numpy())
