"""Figures and the HTML report, on synthetic Measurements (tests/fixtures_report.py).

Every figure is checked against the stored numbers with an independent float64 computation
written here (plain loops over the table rows), not against the aggregation helpers it uses.
"""

from __future__ import annotations

import base64
import itertools
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from blockcoupling.engine.results import Measurement
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report import figures as F
from blockcoupling.report.html import report_figures, write_report, write_report_from_dirs
from fixtures_report import KS, N_TOKENS, PROMPTS, WINDOW, L, make_run, make_runs

SEL = dict(k=2, variant="coupling", p=1.0, orientation="ujv")


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
    fig = F.plot_depth_heatmap(runs[1], k=4, variant="miscoupling", orientation="vju")
    np.testing.assert_allclose(image_data(fig.axes[0]),
                               depth_oracle(runs[1], 4, "miscoupling", "vju"), atol=1e-12)
    cap = F.caption_depth_heatmap(runs, k=4, variant="miscoupling", orientation="vju")
    for text in ("K=4", "variant=miscoupling", "lower = more coupled", "p=1",
                 "orientation=vju", "token 'last'", "tiny-gpt2-synthetic", "revision step1",
                 f"{len(PROMPTS)} prompts from builtin:capital", "random init", "trained"):
        assert text in cap, text
    # default K is each run's smallest K; released_norm has no user p
    cap = F.caption_depth_heatmap(runs, variant="released_norm")
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
        F.plot_depth_heatmap(m, variant="nope")
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
    assert "K=3" in cap and "layers 2..5" in cap and "prompt p0" in cap
    assert "orientation=ujv" in cap and "tiny-gpt2-synthetic" in cap
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
    assert "prompt p0" in cap and "tiny-gpt2-synthetic" in cap


def test_token_heatmap_context_kinds(runs: list[Measurement]) -> None:
    fig = F.plot_token_heatmap(runs, "fixed_input", **SEL)
    axes = data_axes(fig)
    assert not axes[0].images and "no data" in [t.get_text() for t in axes[0].texts]
    np.testing.assert_allclose(image_data(axes[1]),
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
    assert "fixed output token 2" in cap and "run 1: not measured" in cap
    with pytest.raises(F.FigureUnavailable):
        F.plot_token_heatmap(runs[0], "fixed_output")
    with pytest.raises(BlockCouplingError, match="kind"):
        F.plot_token_heatmap(runs[0], "depthwise")


# ---------------------------------------------------------------------- 4. layer graph
def test_layer_graph_edges_follow_the_coupling(runs: list[Measurement]) -> None:
    fig = F.plot_layer_graph(runs, **SEL)
    mats = [depth_oracle(m, 2) for m in runs]
    pairs = [(a, b) for a in range(1, L + 1) for b in range(a + 1, L + 1)]
    weights = [np.array([(M[a - 1, b - 1] + M[b - 1, a - 1]) / 2 for a, b in pairs])
               for M in mats]
    lo, hi = min(w.min() for w in weights), max(w.max() for w in weights)
    for ax, w in zip(fig.axes, weights, strict=True):
        (coll,) = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(coll.get_segments()) == len(pairs) == L * (L - 1) // 2
        s = (w - lo) / (hi - lo)
        np.testing.assert_allclose(coll.get_linewidths(), 0.3 + 5.0 * s, atol=1e-9)
        np.testing.assert_allclose(coll.get_colors()[:, 3], 0.05 + 0.9 * s, atol=1e-9)
        # node i sits on the unit circle, layer 1 at the top
        seg = coll.get_segments()[0]  # edge (1, 2)
        np.testing.assert_allclose(seg[0], [0.0, 1.0], atol=1e-12)
    # the trained run's edges are heavier on average
    widths = [next(c for c in ax.collections if isinstance(c, LineCollection)).get_linewidths()
              for ax in fig.axes]
    assert np.mean(widths[1]) > np.mean(widths[0])
    # lower-is-coupled variants flip the scale: the strongest coupling is the widest edge
    fig = F.plot_layer_graph(runs[1], k=2, variant="miscoupling")
    coll = next(c for c in fig.axes[0].collections if isinstance(c, LineCollection))
    wm = np.array([(M[a - 1, b - 1] + M[b - 1, a - 1]) / 2 for M in
                   [depth_oracle(runs[1], 2, "miscoupling")] for a, b in pairs])
    assert np.argmax(coll.get_linewidths()) == np.argmin(wm)
    assert "edge width" in F.caption_layer_graph(runs, **SEL)


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
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["random init", "trained"]
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
                                   [np.mean(norms[x]) for x in range(L + 1)], atol=1e-12)
        np.testing.assert_allclose(ax_win.lines[i].get_xdata(), range(1, L))
        np.testing.assert_allclose(ax_win.lines[i].get_ydata(),
                                   [np.mean(wins[x]) for x in range(1, L)], atol=1e-12)
        # one dot per (prompt, token)
        dots = ax_lss.collections[i].get_offsets()
        np.testing.assert_allclose(np.sort(np.asarray(dots)[:, 1]),
                                   np.sort(m.token_metrics.lss.to_numpy()), atol=1e-12)
        dots = ax_ed.collections[i].get_offsets()
        np.testing.assert_allclose(np.sort(np.asarray(dots)[:, 1]),
                                   np.sort(m.token_metrics.expodistance.to_numpy()), atol=1e-12)
    assert [t.get_text() for t in ax_lss.get_xticklabels()] == ["random init", "trained"]
    assert "window of 11" in F.caption_trajectory_metrics(runs)


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
    assert "sigma_1" in F.caption_singular_values(runs)


def test_fit_inverse_depth_recovers_exact_law() -> None:
    layers = np.arange(1, 13, dtype=float)
    got = F.fit_inverse_depth(layers, 2.5 / layers + 0.75)
    assert got["a"] == pytest.approx(2.5, abs=1e-10)
    assert got["b"] == pytest.approx(0.75, abs=1e-10)
    assert got["r2"] == pytest.approx(1.0, abs=1e-12)


# ---------------------------------------------------------------------- 9. across runs
def test_across_runs(runs: list[Measurement]) -> None:
    fig = F.plot_across_runs(runs, **SEL)
    # the synthetic runs have no coupling_vs_null rows: three panels
    ax_c, ax_l, ax_e = fig.axes
    want_c = []
    for m in runs:
        per_prompt = defaultdict(list)
        for r in m.coupling.itertuples():
            if (r.kind == "depth" and r.k == 2 and r.variant == "coupling"
                    and r.orientation == "ujv" and r.layer_a != r.layer_b):
                per_prompt[r.prompt_id].append(r.value)
        want_c.append(np.mean([np.mean(v) for v in per_prompt.values()]))
    np.testing.assert_allclose(ax_c.lines[0].get_ydata(), want_c, atol=1e-12)
    np.testing.assert_allclose(ax_l.lines[0].get_ydata(),
                               [np.median(m.token_metrics.lss) for m in runs], atol=1e-12)
    np.testing.assert_allclose(ax_e.lines[0].get_ydata(),
                               [np.median(m.token_metrics.expodistance) for m in runs], atol=1e-12)
    assert [t.get_text() for t in ax_c.get_xticklabels()] == ["random init", "trained"]
    assert want_c[1] > want_c[0]
    # with coupling_vs_null rows a panel shows it too (here: a copy of the coupling values)
    extra = []
    for m in runs:
        null = m.coupling[m.coupling["variant"] == "coupling"].copy()
        null["variant"] = "coupling_vs_null"
        extra.append(Measurement(**{**{n: m.table(n) for n in ("trajectory", "token_metrics",
                     "spectra", "influence", "prompts", "diagnostics")},
                     "coupling": pd.concat([m.coupling, null], ignore_index=True)},
                     arrays=m.arrays, config=m.config, meta=m.meta))
    fig = F.plot_across_runs(extra, **SEL)
    assert len(fig.axes) == 4 and "coupling_vs_null" in fig.axes[1].get_title()
    np.testing.assert_allclose(fig.axes[1].lines[0].get_ydata(), want_c, atol=1e-12)
    fig = F.plot_across_runs(runs, labels=["init", "final"], **SEL)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["init", "final"]
    # x labels fall back to the revision, then the model
    m = make_run(2, label="", strength=0.5)
    m.meta.pop("label")
    assert F.run_label(m) == "step2"
    m.meta.pop("revision")
    assert F.run_label(m) == "tiny-gpt2-synthetic"


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
    assert len(names) == 11
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
    # header: one column per run with model, revision, prompts, config, versions
    for s in ("tiny-gpt2-synthetic", "step0", "step1", "3 from builtin:capital",
              "K 2, 4", "blockcoupling 0.1.0", "random init", "trained"):
        assert s in text, s
    assert text.count("<figcaption>") == len(names)
    assert "K=2" in text and "variant=coupling" in text
    assert "class=\"note\"" not in text


def test_report_skips_missing_figures_with_a_note(tmp_path: Path) -> None:
    m = make_run(0, label="traj only", strength=0.5, kinds=("depth",), arrays=False)
    m.coupling = m.coupling.iloc[0:0]
    m.spectra = m.spectra.iloc[0:0]
    out = write_report([m], tmp_path / "only.html")
    text = out.read_text(encoding="utf-8")
    notes = re.findall(r'<p class="note">Skipped: ([^<]*)</p>', text)
    assert len(notes) == 9  # 7 coupling figures, singular values, across runs (one run)
    assert any("needs 2 or more runs" in n for n in notes)
    assert text.count("<img") == 2  # PCA and trajectory metrics
    files = sorted(p.name for p in (tmp_path / "only_figures").iterdir())
    assert files == [f"{stem}.{fmt}" for stem in ("08_pca_trajectories", "09_trajectory_metrics")
                     for fmt in ("pdf", "png", "svg")]
    for f in files:
        data = (tmp_path / "only_figures" / f).read_bytes()
        assert len(data) > 1000
        assert data.startswith({"pdf": b"%PDF", "png": b"\x89PNG", "svg": b"<?xml"}[f[-3:]])
    with pytest.raises(BlockCouplingError, match=".html"):
        write_report([m], tmp_path / "x.txt")
    with pytest.raises(BlockCouplingError, match="format"):
        write_report([m], tmp_path / "x.html", formats=("gif",))


def test_report_from_dirs_uses_open_run(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    runs = []
    for seed in (0, 1):  # trajectories only: two figures, quick to draw
        m = make_run(seed, label=f"run{seed}", strength=0.5, kinds=("depth",), arrays=False)
        m.coupling, m.spectra = m.coupling.iloc[0:0], m.spectra.iloc[0:0]
        runs.append(m)
    opened: list[Path] = []
    fake = types.ModuleType("blockcoupling.store.rundir")

    def open_run(path: Path) -> Measurement:
        opened.append(path)
        return runs[len(opened) - 1]

    fake.open_run = open_run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "blockcoupling.store.rundir", fake)
    out = write_report_from_dirs([tmp_path / "a", tmp_path / "b"], tmp_path / "r.html",
                                 formats=(), labels=["before", "after"])
    assert opened == [tmp_path / "a", tmp_path / "b"]
    text = out.read_text(encoding="utf-8")
    assert text.count("<img") == 3  # PCA, trajectory metrics, across runs
    assert "<th>before</th><th>after</th>" in text


# ---------------------------------------------------------------------- browser
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium"
                                        if Path("/usr/bin/chromium").exists() else None)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless chromium is not installed "
                                             "(apt-get install chromium)")
def test_report_renders_in_chromium(report: Path, tmp_path: Path) -> None:
    out = report
    profile = tmp_path / "profile"
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}"]
    url = out.resolve().as_uri()
    shot = tmp_path / "report.png"
    subprocess.run(base + [f"--screenshot={shot}", "--window-size=1400,4000", url],
                   check=True, capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 50_000
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == 4000 and pixels.shape[1] == 1400
    assert pixels[..., :3].std() > 0.05  # not a blank page
    dom = subprocess.run(base + ["--enable-logging=stderr", "--v=0",
                                 "--virtual-time-budget=5000", "--dump-dom", url],
                         check=True, capture_output=True, text=True, timeout=120)
    match = re.search(r'data-images-ok="(\d+)/(\d+)"', dom.stdout)
    assert match, "the inline check script did not run"
    assert match.group(1) == match.group(2) == "11"
    console_errors = [line for line in dom.stderr.splitlines()
                      if "CONSOLE" in line and ("ERROR" in line or "Uncaught" in line)]
    assert not console_errors, console_errors
