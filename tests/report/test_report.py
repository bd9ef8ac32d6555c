"""Figures and the HTML report, on synthetic Measurements (tests/helpers/fixtures_report.py).

Every figure is checked against the stored numbers with an independent float64 computation
written here (plain loops over the table rows), not against the aggregation helpers it uses.
"""

from __future__ import annotations

import base64
import itertools
import os
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report import figures as F
from blockcoupling.report import summaries
from blockcoupling.report.figures.base import layout_problems
from blockcoupling.report.html import (
    Section,
    figure_html,
    report_figures,
    runs_html,
    table_html,
    write_page,
    write_report,
    write_report_from_dirs,
)
from blockcoupling.report.narrative import report_summary
from tests.helpers.browser import CHROMIUM, chromium, probe
from tests.helpers.fixtures_report import (
    KS,
    N_TOKENS,
    WINDOW,
    L,
    make_checkpoints,
    make_run,
    make_runs,
)

SEL = dict(rule=StatisticRule(k=2, variant="coupling", p=1.0, orientation="ujv"))


@pytest.fixture(scope="module")
def runs() -> list[Measurement]:
    return make_runs()


# ---------------------------------------------------------------------- oracles
def depth_oracle(m: Measurement, k: int, variant: str = "coupling",
                 orientation: str = "ujv") -> np.ndarray:
    """(L, L) mean over prompts of the depth rows, by a plain loop."""
    acc: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in m.coupling.itertuples():
        if (r.kind == "depth" and r.k == k and r.variant == variant
                and r.orientation == orientation):
            acc[(r.layer_a, r.layer_b)].append(float(r.value))
    out = np.full((L, L), np.nan)
    for (a, b), vals in acc.items():
        out[a - 1, b - 1] = sum(vals) / len(vals)
    return out


def image_data(ax) -> np.ndarray:
    return np.ma.filled(np.ma.asarray(ax.images[0].get_array(), dtype=float), np.nan)


def data_axes(fig: Figure) -> list:
    """The panels of a figure (colour-bar axes excluded)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


# ---------------------------------------------------------------------- 1. depth heatmap
def test_depth_heatmap_shows_the_depth_matrix(runs: list[Measurement]) -> None:
    fig = F.plot_depth_heatmap(runs, **SEL)
    assert isinstance(fig, Figure)
    axes = data_axes(fig)
    assert len(axes) == 2
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    for ax, m in zip(axes, runs, strict=True):
        got = image_data(ax)
        np.testing.assert_allclose(got, depth_oracle(m, 2), rtol=0, atol=1e-12)
        np.testing.assert_allclose(got, m.depth_matrix(k=2).to_numpy(), rtol=0, atol=1e-12)
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in range(1, L + 1)]
    assert [ax.get_title() for ax in axes] == ["random init", "trained"]
    # one shared colour scale
    assert axes[0].images[0].norm.vmin == axes[1].images[0].norm.vmin


def test_depth_heatmap_selection_and_caption(runs: list[Measurement]) -> None:
    fig = F.plot_depth_heatmap(runs[1], StatisticRule(k=4, variant="miscoupling", orientation="vju"))
    np.testing.assert_allclose(image_data(fig.axes[0]),
                               depth_oracle(runs[1], 4, "miscoupling", "vju"), atol=1e-12)
    cap = F.caption_depth_heatmap(runs, StatisticRule(k=4, variant="miscoupling",
                                                         orientation="vju"))
    for text in ("K=4", "variant=miscoupling", "lower = more coupled", "p=1",
                 "orientation=vju", "token 'last'"):
        assert text in cap, text
    # runs are defined once, in the report's runs table: captions do not repeat them
    for text in ("tiny-gpt2-synthetic", "revision step1", "builtin:capital", "random init"):
        assert text not in cap, text
    # where the runs differ, captions name them by label
    other = make_run(5, label="other K", strength=0.5, kinds=("depth",))
    other.config = other.config.replace(k=(4,))
    cap = F.caption_depth_heatmap([runs[0], other])
    assert "K=2 (random init), 4 (other K)" in cap
    # default K is each run's smallest K; released_norm has no user p
    cap = F.caption_depth_heatmap(runs, StatisticRule(variant="released_norm"))
    assert f"K={min(KS)}" in cap and "p=" not in cap


def test_many_runs_wrap_onto_rows(runs: list[Measurement]) -> None:
    six = [runs[i % 2] for i in range(6)]
    labels = [f"step {i}" for i in range(6)]
    fig = F.plot_depth_heatmap(six, labels=labels, **SEL)
    axes = data_axes(fig)
    assert [ax.get_title() for ax in axes] == labels
    rows = sorted({round(ax.get_position().y0, 3) for ax in axes})
    assert len(rows) == 2  # four panels on the first row, two on the second
    np.testing.assert_allclose(image_data(axes[5]), depth_oracle(runs[1], 2), atol=1e-12)


def test_unknown_variant_and_missing_depth() -> None:
    m = make_run(3, label="x", strength=0.5, kinds=("self",))
    with pytest.raises(F.FigureUnavailable, match="no depth coupling rows"):
        F.plot_depth_heatmap(m)
    with pytest.raises(BlockCouplingError, match="variant"):
        F.plot_depth_heatmap(m, StatisticRule(variant="nope"))
    with pytest.raises(BlockCouplingError, match="labels"):
        F.run_labels([m], ["a", "b"])


# ---------------------------------------------------------------------- 2. |A| grid
def test_coupling_grid_tiles_normalised_abs_A(runs: list[Measurement]) -> None:
    fig = F.plot_coupling_grid(runs, k=3)
    axes = data_axes(fig)
    assert len(axes) == 2
    W = WINDOW[1] - WINDOW[0] + 1
    k, gap = 3, 1
    for ax, m in zip(axes, runs, strict=True):
        img = image_data(ax)
        assert img.shape == (W * k + (W - 1) * gap,) * 2
        A = m.arrays["A/p0/ujv"]
        for i, j in itertools.product(range(W), repeat=2):
            cell = img[i * (k + gap):i * (k + gap) + k, j * (k + gap):j * (k + gap) + k]
            want = np.abs(A[i, j, :k, :k]) / np.abs(A[i, j, :k, :k]).max()
            np.testing.assert_allclose(cell, want, atol=1e-12)
        assert np.isnan(img[k, :]).all()  # the gap row between window rows 0 and 1
        assert [t.get_text() for t in ax.get_yticklabels()] == [
            str(x) for x in range(WINDOW[0], WINDOW[1] + 1)]
    cap = F.caption_coupling_grid(runs, k=3)
    assert "random init: K=3" in cap and "layers 2..5" in cap and "prompt p0" in cap
    assert "orientation=ujv" in cap and "tiny-gpt2-synthetic" not in cap
    # default k = the stored K_max
    pick = F.coupling_grid_data(runs[0])[0]
    assert pick is not None and pick.k == max(KS)


def test_coupling_grid_absent_and_inconsistent_window() -> None:
    m = make_run(0, label="x", strength=0.5, arrays=False)
    with pytest.raises(F.FigureUnavailable, match="figure_window"):
        F.plot_coupling_grid(m)
    m = make_run(0, label="x", strength=0.5)
    m.meta["figure_window"] = [1, 2]
    with pytest.raises(BlockCouplingError, match="inconsistent"):
        F.plot_coupling_grid(m)
    # measured layers 1, 2, 4, 5, 6 with window 2..6: the stored 4 x 4 grid is 2, 4, 5, 6
    m.meta["figure_window"] = [2, 6]
    m.config = m.config.replace(layers=(1, 2, 4, 5, 6))
    pick = F.coupling_grid_data(m)[0]
    assert pick is not None and pick.layers == (2, 4, 5, 6)
    assert "layers 2, 4, 5, 6" in F.caption_coupling_grid(m)
    fig = F.plot_coupling_grid(m)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["2", "4", "5", "6"]


# ---------------------------------------------------------------------- 3. token-wise
def token_oracle(m: Measurement, kind: str, la: int, lb: int, fixed: int | None,
                 pid: str = "p0", k: int = 2) -> np.ndarray:
    out = np.full((N_TOKENS, N_TOKENS), np.nan)
    for r in m.coupling.itertuples():
        if not (r.kind == kind and r.prompt_id == pid and r.layer_a == la and r.layer_b == lb
                and r.k == k and r.variant == "coupling" and r.orientation == "ujv"):
            continue
        if kind == "self":
            out[r.token_out_a, r.token_out_b] = r.value
        elif kind == "fixed_input" and r.token_in_a == r.token_in_b == fixed:
            out[r.token_out_a, r.token_out_b] = r.value
        elif kind == "fixed_output" and r.token_out_a == r.token_out_b == fixed:
            out[r.token_in_a, r.token_in_b] = r.value
    return out


def test_token_heatmap_self(runs: list[Measurement]) -> None:
    fig = F.plot_token_heatmap(runs, "self", **SEL)
    axes = data_axes(fig)
    assert len(axes) == 2
    for ax, m in zip(axes, runs, strict=True):
        # default: the middle same-layer pair of (3, 3), (4, 4) -> (4, 4)
        np.testing.assert_allclose(image_data(ax), token_oracle(m, "self", 4, 4, None),
                                   atol=1e-12)
    fig = F.plot_token_heatmap(runs[1], "self", layers=(2, 5), **SEL)
    np.testing.assert_allclose(image_data(fig.axes[0]),
                               token_oracle(runs[1], "self", 2, 5, None), atol=1e-12)
    cap = F.caption_token_heatmap(runs, "self", layers=(2, 5), **SEL)
    assert "l=2, l'=5" in cap and "K=2" in cap and "variant=coupling" in cap
    assert "trained: prompt p0" in cap and "tiny-gpt2-synthetic" not in cap


def test_token_heatmap_context_kinds(runs: list[Measurement]) -> None:
    fig = F.plot_token_heatmap(runs, "fixed_input", **SEL)
    axes = data_axes(fig)  # the random init did not measure fixed_input: no empty panel
    assert len(axes) == 1 and axes[0].get_title().startswith("trained")
    np.testing.assert_allclose(image_data(axes[0]),
                               token_oracle(runs[1], "fixed_input", 3, 3, 0), atol=1e-12)
    fig = F.plot_token_heatmap(runs[1], "fixed_output", **SEL)
    np.testing.assert_allclose(image_data(fig.axes[0]),
                               token_oracle(runs[1], "fixed_output", 3, 3, N_TOKENS - 1),
                               atol=1e-12)
    fig = F.plot_token_heatmap(runs[1], "fixed_output", fixed_token=2, **SEL)
    got = image_data(fig.axes[0])
    assert got.shape == (3, 3)  # input tokens 0..2 can reach output token 2
    np.testing.assert_allclose(got, token_oracle(runs[1], "fixed_output", 3, 3, 2)[:3, :3],
                               atol=1e-12)
    cap = F.caption_token_heatmap(runs, "fixed_output", fixed_token=2, **SEL)
    assert "fixed output token 2" in cap and "Not measured for random init" in cap
    with pytest.raises(F.FigureUnavailable):
        F.plot_token_heatmap(runs[0], "fixed_output")
    with pytest.raises(BlockCouplingError, match="kind"):
        F.plot_token_heatmap(runs[0], "depthwise")


# ---------------------------------------------------------------------- 4. layer graph
def test_layer_graph_edges_on_a_fixed_scale_against_chance(runs: list[Measurement]) -> None:
    pairs = [(a, b) for a in range(1, L + 1) for b in range(a + 1, L + 1)]

    def edge_values(m: Measurement, variant: str) -> np.ndarray:
        M = depth_oracle(m, 2, variant)
        return np.array([(M[a - 1, b - 1] + M[b - 1, a - 1]) / 2 for a, b in pairs])

    # coupling_vs_null was measured: edges show it, 0 (chance) thinnest, 1 thickest
    fig = F.plot_layer_graph(runs, **SEL)
    widths = []
    for ax, m in zip(fig.axes, runs, strict=True):
        (coll,) = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(coll.get_segments()) == len(pairs) == L * (L - 1) // 2
        s = np.clip(edge_values(m, "coupling_vs_null"), 0.0, 1.0)
        np.testing.assert_allclose(coll.get_linewidths(), 0.3 + 5.0 * s, atol=1e-9)
        np.testing.assert_allclose(coll.get_colors()[:, 3], 0.05 + 0.9 * s, atol=1e-9)
        seg = coll.get_segments()[0]  # edge (1, 2); node i on the unit circle, layer 1 on top
        np.testing.assert_allclose(seg[0], [0.0, 1.0], atol=1e-12)
        widths.append(np.asarray(coll.get_linewidths()))
    # the random init is at chance: every edge is near the thinnest width, whatever its spread
    assert widths[0].max() < 0.3 + 5.0 * 0.05
    assert widths[1].mean() > 0.3 + 5.0 * 0.2
    assert "chance level" in F.caption_layer_graph(runs, **SEL)
    # without a chance level: the variant's own fixed scale; lower-is-coupled flips it
    fig = F.plot_layer_graph(runs[1], StatisticRule(k=2, variant="miscoupling"),
                             against_chance=False)
    coll = next(c for c in fig.axes[0].collections if isinstance(c, LineCollection))
    wm = edge_values(runs[1], "miscoupling")
    np.testing.assert_allclose(coll.get_linewidths(), 0.3 + 5.0 * np.clip(1 - wm, 0, 1),
                               atol=1e-9)
    assert "not the data's range" in F.caption_layer_graph(
        runs[1], StatisticRule(k=2, variant="miscoupling"), against_chance=False)


# ---------------------------------------------------------------------- 5. distance
def test_coupling_by_distance_lines(runs: list[Measurement]) -> None:
    fig = F.plot_coupling_by_distance(runs, **SEL)
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    for line, m in zip(ax.lines, runs, strict=True):
        acc: dict[int, list[float]] = defaultdict(list)
        for r in m.coupling.itertuples():
            if r.kind == "depth" and r.k == 2 and r.variant == "coupling" and \
                    r.orientation == "ujv":
                acc[abs(r.layer_a - r.layer_b)].append(r.value)
        np.testing.assert_array_equal(line.get_xdata(), np.arange(L))
        np.testing.assert_allclose(line.get_ydata(), [np.mean(acc[d]) for d in range(L)],
                                   atol=1e-12)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["random init", "trained"]
    assert "|l - l'|" in F.caption_coupling_by_distance(runs, **SEL)


# ---------------------------------------------------------------------- 6. PCA
def test_pca_trajectories(runs: list[Measurement]) -> None:
    fig = F.plot_pca_trajectories(runs)
    for ax, m in zip(fig.axes, runs, strict=True):
        assert len(ax.lines) == N_TOKENS
        tr = m.trajectory
        for t, line in enumerate(ax.lines):
            rows = tr[(tr.prompt_id == "p0") & (tr.token == t)].sort_values("layer")
            np.testing.assert_allclose(line.get_xdata(), rows.pca_x.to_numpy(), atol=1e-12)
            np.testing.assert_allclose(line.get_ydata(), rows.pca_y.to_numpy(), atol=1e-12)
        assert ax.lines[-1].get_color() == "black"
        assert ax.lines[-1].get_linewidth() > ax.lines[0].get_linewidth()
    cap = F.caption_pca_trajectories(runs, prompt_id="p2")
    assert "prompt p2" in cap and "5 tokens" in cap and "layers 0..6" in cap
    with pytest.raises(F.FigureUnavailable):
        F.plot_pca_trajectories(Measurement())


# ---------------------------------------------------------------------- 7. trajectories
def test_trajectory_metrics(runs: list[Measurement]) -> None:
    fig = F.plot_trajectory_metrics(runs)
    ax_norm, ax_win, ax_lss, ax_ed = fig.axes
    for i, m in enumerate(runs):
        norms, wins = defaultdict(list), defaultdict(list)
        for r in m.trajectory.itertuples():
            norms[r.layer].append(r.norm)
            if not np.isnan(r.lss_window):
                wins[r.layer].append(r.lss_window)
        np.testing.assert_allclose(ax_norm.lines[i].get_ydata(),
                                   [np.median(norms[x]) for x in range(L + 1)], atol=1e-12)
        # one dot per (prompt, token) with a finite value
        dots = ax_lss.collections[i].get_offsets()
        np.testing.assert_allclose(np.sort(np.asarray(dots)[:, 1]),
                                   np.sort(m.token_metrics.lss.to_numpy()), atol=1e-12)
        ed = m.token_metrics.expodistance.to_numpy()
        dots = ax_ed.collections[i].get_offsets()
        np.testing.assert_allclose(np.sort(np.asarray(dots)[:, 1]), np.sort(ed[~np.isnan(ed)]),
                                   atol=1e-12)
    # the random init's window (11) covers its 7-point trajectories: only 'trained' is drawn,
    # and the panel says why
    assert len(ax_win.lines) == 1 and ax_win.lines[0].get_label() == "trained"
    wins = defaultdict(list)
    for r in runs[1].trajectory.itertuples():
        if not np.isnan(r.lss_window):
            wins[r.layer].append(r.lss_window)
    np.testing.assert_allclose(ax_win.lines[0].get_xdata(), range(1, L))
    np.testing.assert_allclose(ax_win.lines[0].get_ydata(),
                               [np.median(wins[x]) for x in range(1, L)], atol=1e-12)
    assert any("random init" in t.get_text() for t in ax_win.texts)
    # expodistance spans decades (one token at 347,420): log axis; NaN counted in the labels
    assert ax_ed.get_yscale() == "log" and ax_lss.get_yscale() == "linear"
    assert [t.get_text() for t in ax_ed.get_xticklabels()] == ["random init (2 NaN)",
                                                                "trained"]
    cap = F.caption_trajectory_metrics(runs)
    assert "window of 3, 11" in cap and "random init (L=6)" in cap
    assert "random init: 2 of 15" in cap and "rounding" in cap


# ---------------------------------------------------------------------- 8. spectra
def test_singular_values_and_inverse_depth_fit(runs: list[Measurement]) -> None:
    fig = F.plot_singular_values(runs)
    ax = fig.axes[0]
    assert len(ax.lines) == 4  # data + fit per run
    for i, m in enumerate(runs):
        data, fit = ax.lines[2 * i], ax.lines[2 * i + 1]
        sig = defaultdict(list)
        for r in m.spectra.itertuples():
            if r.rank == 1 and r.token_in == r.token_out:
                sig[r.layer].append(r.singular_value)
        y = np.array([np.mean(sig[x]) for x in range(1, L + 1)])
        np.testing.assert_allclose(data.get_ydata(), y, atol=1e-12)
        X = np.column_stack([1.0 / np.arange(1, L + 1), np.ones(L)])
        a, b = np.linalg.solve(X.T @ X, X.T @ y)  # normal equations, float64
        xs = fit.get_xdata()
        np.testing.assert_allclose(fit.get_ydata(), a / xs + b, rtol=1e-9)
        assert fit.get_linestyle() == "--"
        assert "R²" in fit.get_label()
    assert ax.get_legend() is None and len(fig.legends) == 1  # outside the axes
    assert "sigma_1" in F.caption_singular_values(runs)


def test_singular_value_fit_drawn_only_where_it_fits() -> None:
    """A fit that goes negative or explains little is listed in the legend, not drawn; values
    spanning decades get a log axis."""
    m = make_run(3, label="rising", strength=0.5)
    sp = m.spectra.copy()
    diag = (sp["token_in"] == sp["token_out"]) & (sp["rank"] == 1)
    sp.loc[diag, "singular_value"] = 10.0 ** (sp.loc[diag, "layer"].to_numpy(float) - 3)
    m.spectra = sp  # sigma_1 = 1e-2 .. 1e3, rising: a / l + b fits badly and goes negative
    t = F.top_singular_values(m)
    fit = summaries.inverse_depth_fit(t)
    assert fit is not None and fit.a < 0 and not fit.describes_data()
    fig = F.plot_singular_values(m)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    drawn = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert drawn == []
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(n.endswith("(not drawn)") for n in names), names


def test_fit_inverse_depth_recovers_exact_law() -> None:
    layers = np.arange(1, 13, dtype=float)
    got = F.fit_inverse_depth(layers, 2.5 / layers + 0.75)
    assert got["a"] == pytest.approx(2.5, abs=1e-10)
    assert got["b"] == pytest.approx(0.75, abs=1e-10)
    assert got["r2"] == pytest.approx(1.0, abs=1e-12)


# ---------------------------------------------------------------------- 9. across runs
def test_across_runs(runs: list[Measurement]) -> None:
    fig = F.plot_across_runs(runs, **SEL)
    ax_c, ax_n, ax_l, ax_e = fig.axes
    want: dict[str, list[float]] = {"coupling": [], "coupling_vs_null": []}
    for m in runs:
        for variant, agg in (("coupling", np.mean), ("coupling_vs_null", np.median)):
            per_prompt = defaultdict(list)
            for r in m.coupling.itertuples():
                if (r.kind == "depth" and r.k == 2 and r.variant == variant
                        and r.orientation == "ujv" and r.layer_a != r.layer_b):
                    per_prompt[r.prompt_id].append(r.value)
            want[variant].append(agg([np.mean(v) for v in per_prompt.values()]))
    np.testing.assert_allclose(ax_c.lines[0].get_ydata(), want["coupling"], atol=1e-12)
    assert "coupling_vs_null" in ax_n.get_title()
    np.testing.assert_allclose(ax_n.lines[0].get_ydata(), want["coupling_vs_null"], atol=1e-12)
    np.testing.assert_allclose(ax_l.lines[0].get_ydata(),
                               [np.median(m.token_metrics.lss) for m in runs], atol=1e-12)
    np.testing.assert_allclose(ax_e.lines[0].get_ydata(),
                               [np.nanmedian(m.token_metrics.expodistance) for m in runs],
                               atol=1e-12)
    assert [t.get_text() for t in ax_c.get_xticklabels()] == ["random init", "trained"]
    assert want["coupling"][1] > want["coupling"][0]
    # without coupling_vs_null rows: three panels
    bare = []
    for m in runs:
        c = m.coupling[m.coupling["variant"] != "coupling_vs_null"]
        bare.append(Measurement(**{**{n: m.table(n) for n in ("trajectory", "token_metrics",
                    "spectra", "influence", "prompts", "diagnostics")}, "coupling": c},
                    arrays=m.arrays, config=m.config, meta=m.meta))
    fig = F.plot_across_runs(bare, **SEL)
    assert len(fig.axes) == 3
    fig = F.plot_across_runs(runs, labels=["init", "final"], **SEL)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["init", "final"]
    # x labels fall back to the revision, then the model
    m = make_run(2, label="", strength=0.5)
    m.meta.pop("label")
    assert F.run_label(m) == "step2"
    m.meta.pop("revision")
    assert F.run_label(m) == "tiny-gpt2-synthetic"


def test_only_checkpoints_of_one_training_run_are_joined(runs: list[Measurement]) -> None:
    """Two unrelated runs are points; checkpoints of one training run (one model, each with a
    step) are joined by one line in step order; the caption says which."""
    fig = F.plot_across_runs(runs, **SEL)
    for ax in fig.axes:
        assert not [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert "no two are checkpoints of one training run" in F.caption_across_runs(runs, **SEL)
    ckpts = make_checkpoints(4)
    mixed = [runs[1], *ckpts[::-1]]  # an unrelated run first, checkpoints in reverse order
    fig = F.plot_across_runs(mixed, **SEL)
    joined = [ln for ln in fig.axes[0].lines if ln.get_linestyle() == "-"]
    assert len(joined) == 1
    np.testing.assert_array_equal(joined[0].get_xdata(), [4, 3, 2, 1])  # by step: 0, 25, ...
    assert "joined by a line" in F.caption_across_runs(mixed, **SEL)


def test_no_empty_panel_and_no_one_token_heatmap(runs: list[Measurement]) -> None:
    """Where no run has a windowed LSS (every window covers its model), the panel is left
    out, not drawn empty; a run measured at one token gets no token-wise panel."""
    covered = [make_run(0, label="a", strength=0.1, kinds=("depth", "self"), lss_window=11),
               make_run(1, label="b", strength=0.5, kinds=("depth",), lss_window=11)]
    fig = F.plot_trajectory_metrics(covered)
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "(a) norms", "(b) LSS of whole trajectories", "(c) expodistance"]
    assert all(ax.lines or ax.collections for ax in fig.axes)  # every panel draws something
    cap = F.caption_trajectory_metrics(covered)
    assert "(b) line-shape score LSS of each whole" in cap and "(no panel)" in cap
    # a [CLS]-only run (one token): its self "heatmap" would be 1 x 1
    one = make_run(3, label="encoder", strength=0.5, kinds=("depth", "self"))
    c = one.coupling
    keep = (c["kind"] != "self") | ((c["token_out_a"] == c["token_out_a"].max())
                                    & (c["token_out_b"] == c["token_out_a"].max()))
    one = Measurement(**{**{n: one.table(n) for n in ("trajectory", "token_metrics", "spectra",
                                                      "prompts")}, "coupling": c[keep]},
                      config=one.config, meta=one.meta)
    with pytest.raises(F.FigureUnavailable, match="one token"):
        F.plot_token_heatmap([one], "self", **SEL)
    fig = F.plot_token_heatmap([one, runs[1]], "self", **SEL)
    assert len(fig.axes) == 2  # the trained run's panel and its colour bar
    assert "Measured at one token only for encoder" in F.caption_token_heatmap(
        [one, runs[1]], "self", **SEL)


def test_local_paths_are_labelled_by_their_folder(runs: list[Measurement]) -> None:
    m = make_run(2, label="", strength=0.5, meta={"model": "/home/me/models/gpt2-small/"})
    m.meta.pop("label")
    m.meta.pop("revision")
    assert F.run_label(m) == "gpt2-small"
    m.meta["model"] = "EleutherAI/pythia-160m"  # a Hub id stays
    assert F.run_label(m) == "EleutherAI/pythia-160m"
    twins = F.run_labels([m, m, m])
    assert twins == ["EleutherAI/pythia-160m #1", "EleutherAI/pythia-160m #2",
                     "EleutherAI/pythia-160m #3"]
    # runs of one folder that differ (--init random beside the pretrained weights; another
    # token rule): labelled by what differs, not #1 / #2
    local = {"model": "/home/me/models/gpt2"}
    pre = replace(m, meta={**local, "init": "pretrained"})
    rnd = replace(m, meta={**local, "init": "random", "init_seed": 0})
    assert F.run_labels([pre, rnd]) == ["gpt2 (init pretrained)", "gpt2 (init random, init_seed 0)"]
    last = replace(m, meta=dict(local), config=m.config.replace(tokens="last"))
    every = replace(m, meta=dict(local), config=m.config.replace(tokens="all"))
    assert F.run_labels([last, every]) == ["gpt2 (tokens last)", "gpt2 (tokens all)"]
    assert F.run_labels([pre, pre, rnd]) == ["gpt2 (init pretrained) #1",
                                             "gpt2 (init pretrained) #2",
                                             "gpt2 (init random, init_seed 0)"]


_LONG = ["/very/long/local/path/to/some/checkpoints/of/a/model/number-one",
         "/another/very/long/local/path/to/a/second/model/checkpoint-final"]


@pytest.mark.parametrize("spec", [s.name for s in report_figures()])
def test_no_title_overlaps_even_with_long_labels(spec: str, runs: list[Measurement]) -> None:
    """Every figure of the report, drawn with two long labels: no title or label leaves the
    figure or runs into another (the FigureLayoutWarning that png_bytes raises is an error
    in the tests: pyproject.toml), and no layout collapses."""
    fig_spec = next(s for s in report_figures(labels=_LONG, **SEL) if s.name == spec)
    if len(runs) < fig_spec.min_runs:
        pytest.skip("needs more runs")
    fig = fig_spec.plot(runs)
    assert layout_problems(fig) == []
    F.png_bytes(fig)


@pytest.mark.parametrize("spec", [s.name for s in report_figures()])
def test_no_overlaps_with_many_runs(spec: str, runs: list[Measurement]) -> None:
    """Every figure of the report with ten runs (as the demo's report has): the labels that
    name runs are turned until they clear each other (`fit_run_ticks`), so the layout check
    finds nothing; before that, the demo's trajectory figure had colliding tick labels."""
    many = [runs[i % len(runs)] for i in range(10)]
    labels = [f"run {i} " + "x" * (2 * i) for i in range(10)]
    fig_spec = next(s for s in report_figures(labels=labels, **SEL) if s.name == spec)
    if len(many) < fig_spec.min_runs:
        pytest.skip("needs more runs")
    try:
        fig = fig_spec.plot(many)
    except F.FigureUnavailable:
        pytest.skip("not drawn for these runs")
    assert layout_problems(fig) == []


def test_the_layout_check_sees_an_overlap() -> None:
    from blockcoupling.report.figures.base import FigureLayoutWarning, new_figure

    fig = new_figure(4.0, 3.0)
    a, b = fig.subplots(1, 2)
    a.set_title("a title far too long for its panel, running over the next one")
    b.set_title("second")
    fig.set_layout_engine("none")
    assert any("overlaps" in p or "leaves" in p for p in layout_problems(fig))
    with pytest.warns(FigureLayoutWarning, match="figure layout"):
        F.png_bytes(fig)
    fig = new_figure(3.0, 2.0)
    ax = fig.subplots()
    ax.set_xticks(range(6), [f"label number {i}" for i in range(6)])
    fig.set_layout_engine("none")
    assert any("tick labels overlap" in p for p in layout_problems(fig))


# ---------------------------------------------------------------------- report
def _strip_data_uris(text: str) -> str:
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)


@pytest.fixture(scope="module")
def report(runs: list[Measurement], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-run report, written once for the module (PNG files only: the SVG and PDF
    writers are exercised by the smaller report below, to keep the tests quick)."""
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert write_report(runs, out, formats=("png",)) == out
    return out


def test_report_contains_every_figure(report: Path) -> None:
    out, tmp_path = report, report.parent
    text = out.read_text(encoding="utf-8")
    names = [spec.name for spec in report_figures()]
    assert len(names) == 16
    imgs = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(imgs) == len(names)  # every figure has its data with two runs
    for b64 in imgs:
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    for i, name in enumerate(names, start=1):
        assert f'id="fig-{name}"' in text
        path = tmp_path / "report_figures" / f"{i:02d}_{name}.png"
        assert path.is_file() and path.stat().st_size > 1000, path
    assert (tmp_path / "report_figures" / "01_depth_heatmap.png").read_bytes() == \
        base64.b64decode(imgs[0])
    stripped = _strip_data_uris(text)
    assert "http" not in stripped and "://" not in text
    assert "<link" not in stripped and "src=\"" not in stripped.replace('src=""', "")
    # the runs, defined once: what they share, then a table of what differs
    for s in ("tiny-gpt2-synthetic", "step0", "step1", "3 from builtin:capital",
              "<dt>K</dt><dd>2, 4</dd>", "blockcoupling 0.1.0", "random init", "trained"):
        assert s in text, s
    assert text.count("tiny-gpt2-synthetic") <= 3  # the shared list and the two JSON dumps
    assert text.count("<figcaption>") == len(names)
    assert "K=2" in text and "variant=coupling" in text
    assert "Skipped" not in text and "None" not in stripped.split("<details>")[0]


def test_report_summary_states_the_numbers(report: Path, runs: list[Measurement]) -> None:
    """The summary at the top is generated from the data: the above-chance values with their
    standard errors, raw and chance coupling, the at-chance run and the NaN tokens, checked against the tables."""
    text = report.read_text(encoding="utf-8")
    top = text[text.index('id="summary"'):text.index('id="runs"')]
    rows = {}
    for m in runs:
        c = m.coupling
        sel = (c.kind == "depth") & (c.k == 2) & (c.orientation == "ujv") & (
            c.layer_a != c.layer_b)
        v = c[sel & (c.variant == "coupling_vs_null")].groupby("prompt_id")["value"].mean()
        raw = c[sel & (c.variant == "coupling")].groupby("prompt_id")["value"].mean()
        rows[m.meta["label"]] = (float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))),
                                 float(raw.mean()))
    for label, (above, se, raw) in rows.items():  # the headline: mean ± se over prompts
        assert f"{summaries.fmt_number(above)} ± {summaries.fmt_number(se)}" in top, (label, above)
        assert summaries.fmt_number(raw) in top, (label, raw)
    assert "0.3" in top  # the trained run's chance level c_null = 0.3 of the fixture
    assert re.search(r"At the chance level[^<]*random init", top)
    assert "trained" not in re.search(r"At the chance level[^<]*", top).group(0)
    assert "2 of 15" in top and "heavy-tailed" in top
    assert "random init vs trained" in top and "do not overlap" in top


def test_summary_is_generated_not_canned(runs: list[Measurement]) -> None:
    """Swap which run is coupled and the sentences follow; an empty run says so."""
    s = report_summary(runs)
    pair = next(x for x in s.comparisons if x.startswith("random init vs trained"))
    assert "random init below trained" in pair
    s = report_summary(runs[::-1])
    pair = next(x for x in s.comparisons if x.startswith("trained vs random init"))
    assert "trained above random init" in pair
    assert "lss_window (3 vs 11)" in pair  # the configurations differ: the text says where
    # training checkpoints: first, last, highest, correlation with the validation loss
    cps = make_checkpoints(4)
    s = report_summary(cps)
    series = next(x for x in s.comparisons if x.startswith("Across 4 training checkpoints"))
    assert "Spearman correlation with the validation loss over the checkpoints: -1" in series
    # two views of one model (an option that changes the numbers, e.g. the post-LN
    # shared-directions removal): compared within each view and across views per revision
    views = []
    for m in runs:
        other = Measurement(**{n: m.table(n) for n in ("coupling", "trajectory",
                            "token_metrics", "spectra", "influence", "prompts", "diagnostics")},
                            arrays=m.arrays, config=m.config.replace(remove_norm_directions=True),
                            meta={**m.meta, "label": m.meta["label"] + ", LN removed"})
        views.append(other)
    s = report_summary(runs + views)
    heads = [x.split(":")[0] for x in s.comparisons]
    assert heads == ["random init vs trained", "random init, LN removed vs trained, LN removed",
                     "random init vs random init, LN removed", "trained vs trained, LN removed"]
    assert "remove_norm_directions (False vs True)" in s.comparisons[2]
    empty = report_summary([Measurement(meta={"label": "nothing"})])
    assert empty.nothing_measured and "Nothing was measured" in empty.measured[0]


def test_report_of_missing_figures_leaves_them_out(tmp_path: Path) -> None:
    m = make_run(0, label="traj only", strength=0.5, kinds=("depth",), arrays=False)
    m.coupling = m.coupling.iloc[0:0]
    m.spectra = m.spectra.iloc[0:0]
    out = write_report([m], tmp_path / "only.html")
    text = out.read_text(encoding="utf-8")
    assert "Skipped" not in text and 'class="note"' not in text
    assert text.count("<img") == 3  # PCA, trajectory metrics, depth profiles
    assert "<h2>1. Token trajectories (PCA)</h2>" in text
    # no coupling measured (a logit-lens or trajectory-only run): the summary describes
    # what its table holds, not the depth-wise coupling it does not have
    summary = re.search(r'<div class="summary">.*?</div>', text, re.S).group(0)
    assert "No depth-wise coupling was measured" in summary
    assert "above chance" not in summary and "m/m_rot" not in summary
    assert "<th>K</th>" not in summary and "LSS median" in summary
    not_shown = re.search(r'id="not-shown".*?</section>', text, re.S).group(0)
    assert "Depth-wise coupling" in not_shown and "Across runs" not in not_shown
    files = sorted(p.name for p in (tmp_path / "only_figures").iterdir())
    assert files == [f"{stem}.{fmt}" for stem in ("01_pca_trajectories", "02_trajectory_metrics",
                                                  "03_depth_profiles")
                     for fmt in ("pdf", "png", "svg")]
    for f in files:
        data = (tmp_path / "only_figures" / f).read_bytes()
        assert len(data) > 1000
        assert data.startswith({"pdf": b"%PDF", "png": b"\x89PNG", "svg": b"<?xml"}[f[-3:]])
    with pytest.raises(BlockCouplingError, match=".html"):
        write_report([m], tmp_path / "x.txt")
    with pytest.raises(BlockCouplingError, match="format"):
        write_report([m], tmp_path / "x.html", formats=("gif",))


def test_report_of_an_empty_run_says_nothing_was_measured(tmp_path: Path) -> None:
    out = write_report([Measurement(meta={"model": "m", "label": "empty"})],
                       tmp_path / "empty.html")
    text = out.read_text(encoding="utf-8")
    assert "Nothing was measured" in text and "<img" not in text
    assert not (tmp_path / "empty_figures").exists()


def test_runs_table_formats_numbers(tmp_path: Path) -> None:
    cps = make_checkpoints(3)
    cps[1].meta["seconds"] = 4.547863006591797
    cps[2].meta["note"] = None
    table = runs_html(cps, [m.meta["label"] for m in cps]).split("<details>")[0]
    assert "4.55" in table and "4.547863" not in table
    assert "None" not in table and "1,600" not in table
    assert '<div class="scroll"><table class="data">' in table
    assert summaries.fmt_number(347_420.0) == "347,420"
    assert summaries.fmt_number(1.5e-5) == "1.5e-05"
    assert summaries.fmt_number(float("nan")) == "-" and summaries.fmt_number(None) == "-"
    assert summaries.fmt_number(0.26113) == "0.261" and summaries.fmt_number(7) == "7"


def test_report_from_dirs_uses_open_run(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from blockcoupling.store import reader

    runs = []
    for seed in (0, 1):  # trajectories only: two figures, quick to draw
        m = make_run(seed, label=f"run{seed}", strength=0.5, kinds=("depth",), arrays=False)
        m.coupling, m.spectra = m.coupling.iloc[0:0], m.spectra.iloc[0:0]
        runs.append(m)
    opened: list[Path] = []

    def open_run(path: Path) -> Measurement:
        opened.append(path)
        return runs[len(opened) - 1]

    monkeypatch.setattr(reader, "open_run", open_run)
    out = write_report_from_dirs([tmp_path / "a", tmp_path / "b"], tmp_path / "r.html",
                                 formats=(), labels=["before", "after"])
    assert opened == [tmp_path / "a", tmp_path / "b"]
    text = out.read_text(encoding="utf-8")
    assert text.count("<img") == 5  # PCA, trajectory metrics, depth profiles, per model, across runs
    assert "<th>before</th><th>after</th>" in text


def test_page_skeleton_is_reusable(tmp_path: Path) -> None:
    """Other report pages build on Section / render_page / table_html / figure_html."""
    fig = F.plot_depth_heatmap(make_run(1, label="x", strength=0.5, kinds=("depth",)),
                               replace(F.REPORT_RULE, k=2))
    body = figure_html(fig, "a caption", title="t", number=1, stem=tmp_path / "f" / "01_x")
    df = pd.DataFrame({"value": [4.547863006591797, float("nan")]}, index=["a", "b"])
    out = write_page(tmp_path / "page.html", "A page", [
        Section("one", "One", body), Section("two", "Two", table_html(df))])
    text = out.read_text(encoding="utf-8")
    assert text.count("<style>") == 1 and '<a href="#two">Two</a>' in text
    assert "4.55" in text and "<td>-</td>" in text and (tmp_path / "f" / "01_x.png").is_file()
    assert "Files: f/01_x.png" in text


def test_summaries_do_not_import_matplotlib() -> None:
    code = ("import sys, blockcoupling.report.summaries, blockcoupling.report.narrative; "
            "print(any(m.split('.')[0] == 'matplotlib' for m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    assert res.stdout.strip() == "False"


def test_summaries_numbers(runs: list[Measurement]) -> None:
    st = summaries.robust_stats([3.0, np.nan, 1.0, 2.0, 100.0, np.inf])
    assert (st.n, st.n_nan, st.median, st.min, st.max) == (4, 2, 2.5, 1.0, 100.0)
    assert st.q25 == pytest.approx(np.quantile([1, 2, 3, 100], 0.25))
    assert summaries.robust_stats([1e-3, 1.0]).spans_decades(2.0) is True
    # c_null is recovered row by row from coupling and coupling_vs_null (fixture: 0.3)
    ch = summaries.chance_coupling_rows(runs[1], replace(summaries.REPORT_RULE, k=2))
    assert ch is not None and len(ch) > 0
    np.testing.assert_allclose(ch["chance_coupling"], 0.3, atol=1e-12)
    np.testing.assert_allclose(summaries.edge_strength([-0.2, 0.4, 1.3], "coupling_vs_null"),
                               [0.0, 0.4, 1.0])
    np.testing.assert_allclose(summaries.edge_strength([0.1], "miscoupling"), [0.9])
    ov = summaries.run_overview(runs)
    assert list(ov["label"]) == ["random init", "trained"]
    assert list(ov["expodistance_nan"]) == [2, 0]
    assert ov.loc[0, "expodistance_max"] == 347_420.0
    assert summaries.window_covers_model(runs[0]) and not summaries.window_covers_model(runs[1])


def test_measurement_summary_is_robust(runs: list[Measurement]) -> None:
    text = runs[0].summary()
    ed = runs[0].token_metrics["expodistance"].dropna()
    assert f"expodistance median {ed.median():.4g}" in text
    assert f"IQR {ed.quantile(0.25):.4g} to {ed.quantile(0.75):.4g}" in text
    assert "NaN for 2 of 15 tokens" in text and "rounding" in text
    assert f"{ed.mean():.4g}" not in text  # the mean (dominated by one token) is not shown
    assert "above chance (coupling_vs_null)" in text
    assert "nothing was measured" in Measurement().summary()


# ---------------------------------------------------------------------- browser
def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return chromium(args, tmp_path)


def _probe(page: Path, width: int, height: int, tmp_path: Path) -> dict:
    found = probe(page, width, height, tmp_path)
    assert all(i["ok"] for i in found["imgs"]), "an image did not decode"
    found["imgs"] = [[i["nw"], i["nh"], i["w"], i["h"], i["left"], i["right"]]
                     for i in found["imgs"]]
    return found


@pytest.fixture(scope="module")
def eight_runs_report(runs: list[Measurement], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight runs: the two of ``runs`` and six training checkpoints (long paths in meta)."""
    out = tmp_path_factory.mktemp("eight") / "eight.html"
    return write_report(runs + make_checkpoints(6), out, formats=())


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless chromium is not installed "
                                             "(apt-get install chromium)")
@pytest.mark.parametrize("width, height", [(1400, 900), (390, 844)])
def test_report_fits_desktop_and_phone(width: int, height: int, report: Path,
                                       eight_runs_report: Path, tmp_path: Path) -> None:
    """At 1400 px and on a phone: nothing overflows the page sideways (wide tables scroll in
    their own box), every figure decodes, fits the page and is drawn large enough to see."""
    for page in (report, eight_runs_report):
        probe = _probe(page, width, height, tmp_path)
        assert probe["sw"] <= probe["vw"], (page.name, probe["wide"][:5])
        assert probe["wide"] == [], probe["wide"][:5]
        assert len(probe["imgs"]) == 16
        for nat_w, nat_h, w, h, left, right in probe["imgs"]:
            assert nat_w > 300 and nat_h > 200  # decoded
            assert 0 <= left and right <= probe["vw"]  # its box is inside the page
            assert w >= min(nat_w, 0.8 * probe["vw"]) - 40  # drawn wide, not a thumbnail
            if width < 500:  # a phone: at least 55 % of the natural size (box scrolls)
                assert w >= 0.55 * nat_w - 2
            assert h > 60
    if width < 500:
        # the eight-run tables are wider than a phone: they scroll inside their boxes
        assert any(sw > cw for sw, cw in probe["boxes"])
        # negative control: the probe does see an element wider than the page
        bad = tmp_path / "bad.html"
        bad.write_text(report.read_text(encoding="utf-8").replace(
            "<body>", '<body><div style="width:2000px">wide</div>'), encoding="utf-8")
        probe = _probe(bad, width, height, tmp_path)
        assert probe["sw"] > probe["vw"] and probe["wide"]


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless chromium is not installed")
def test_report_screenshot_is_not_blank(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    _chromium([f"--screenshot={shot}", "--window-size=1400,3000", report.resolve().as_uri()],
              tmp_path)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == 3000 and pixels.shape[1] == 1400
    assert pixels[..., :3].std() > 0.05  # not a blank page
