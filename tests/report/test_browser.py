"""What a reader sees, in headless Chromium: the built documentation site (its index, a
tutorial, the concepts page, the Python API page) and one page of each report kind (the run
report, a collection's emergence page, correlate, chance-floor, cross-coupling, the ViT study).
A page fails on raw TeX, a literal reST role, an image that does not load, a figure whose
title overlaps (the report's ``data-layout-problems``) or whose caption covers it, and on
anything fetched from the network. CI installs Chromium (.ci/run); elsewhere these skip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import blockcoupling as bc
from tests.helpers.browser import CHROMIUM, SKIP_REASON, probe, reader_problems

pytestmark = [pytest.mark.browser, pytest.mark.slow,  # headless chromium: CI runs them
              pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)]


def test_the_checks_see_what_a_reader_would(tmp_path: Path) -> None:
    """Negative control: each fault on a page is found."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>the mean \\(c_K\\) and \\frac{a}{b}</p>"
        "<p>see :func:`measure`</p><code>\\(in code: fine\\)</code>"
        '<img src="missing.png" alt="x">'
        '<img data-layout-problems="panel 1 title overlaps panel 2" src="data:image/png;base64,'
        'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==">'
        "</body></html>")
    problems = " | ".join(reader_problems(probe(page, 1000, 800, tmp_path)))
    for fault in ("raw TeX", "a literal role", "image not loaded: missing.png",
                  "figure layout: panel 1 title overlaps"):
        assert fault in problems, problems
    assert "in code" not in problems
    good = tmp_path / "good.html"
    good.write_text('<!DOCTYPE html><html><body><p>fine</p><math><mi>x</mi></math></body></html>')
    found = probe(good, 1000, 800, tmp_path)
    assert reader_problems(found) == [] and found["math"] == 1


# ---------------------------------------------------------------------- the site
SITE_PAGES = {"index.html": 0, "tutorials/above-chance/index.html": 1,
              "concepts/index.html": 10, "reference/api/index.html": 0,
              "how-to/results/index.html": 0}


@pytest.mark.docs
@pytest.mark.slow  # the built site (conftest.built_site, 3-4 min): CI runs it
@pytest.mark.parametrize("page", list(SITE_PAGES))
def test_site_page_reads_right(page: str, built_site: Path, tmp_path: Path) -> None:
    found = probe(built_site / page, 1400, 900, tmp_path)
    assert reader_problems(found) == [], page
    assert found["math"] >= SITE_PAGES[page], f"{page}: the mathematics is not MathML"
    if page.startswith("tutorials"):
        assert len(found["imgs"]) >= 1 and all(i["nw"] > 300 for i in found["imgs"])
    if page.startswith("reference/api"):
        assert "coupling_statistic" in found["text"]


# ---------------------------------------------------------------------- the report pages
@pytest.fixture(scope="module")
def report_pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One page of each kind, on the one report template (report/page.py)."""
    from blockcoupling.report.correlation import write_chance_floor_html, write_correlation_html
    from blockcoupling.report.cross import write_cross_report
    from blockcoupling.runs.collection import write_collection_report
    from blockcoupling.studies.chance_floor import chance_floor
    from blockcoupling.studies.correlate import correlate
    from blockcoupling.studies.cross import cross_coupling
    from blockcoupling.studies.vit.grid import run_grid
    from blockcoupling.studies.vit.report import write_vit_report
    from blockcoupling.studies.vit.train import VitTrainConfig
    from tests.helpers.fixtures_report import make_checkpoints, make_runs
    from tests.helpers.monitored import PROMPTS, dropout_gpt2, word_tokenizer
    from tests.helpers.synthetic_runs import write_synthetic_run
    from tests.helpers.tiny_models import tiny_inputs, tiny_model
    from tests.helpers.tiny_runs import TINY_VIT

    root = tmp_path_factory.mktemp("pages")
    pages = {"run report": bc.write_report(make_runs() + make_checkpoints(3),
                                           root / "run.html", formats=())}
    model = dropout_gpt2(1).eval()
    with bc.CouplingMonitor(word_tokenizer(), PROMPTS, every=2, out=root / "monitor", k=(2,),
                            orientations=("ujv",)) as mon:
        for step in range(5):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.01)
            mon.step(model, step, loss=3.0 - 0.1 * step)
    pages["emergence"] = write_collection_report(bc.open_collection(root / "monitor"),
                                                 root / "emergence.html")
    dirs = [write_synthetic_run(root / "runs" / f"r{i}", lv, label=f"m{i}",
                                model=f"org/model-{i}", seed=i)
            for i, lv in enumerate([0.2, 0.35, 0.5, 0.6, 0.8])]
    scores = pd.DataFrame({"model": [f"m{i}" for i in range(5)],
                           "score": [20.0, 30, 41, 45, 62]})
    pages["correlate"] = write_correlation_html(correlate(dirs, scores, n_boot=0),
                                                root / "correlate.html")
    pages["chance-floor"] = write_chance_floor_html(chance_floor("paper"), root / "floor.html")
    inputs = tiny_inputs("gpt2", n=4, batch=2)
    for seed in (0, 1):
        bc.measure_to_dir(tiny_model("gpt2", seed), None, inputs, root / f"ckpt{seed}",
                          save_bases=True, save_jacobians=True, coupling=("depth",), k=(2,),
                          tokens="0,-1", progress=False)
    pages["cross"] = write_cross_report(cross_coupling(root / "ckpt0", root / "ckpt1"),
                                        root / "cross.html")
    base = VitTrainConfig(epochs=1, **{**TINY_VIT, "monitor_images": 1, "final_images": 2})
    run_grid(base, root / "grid", drop_paths=(0.0, 0.1), weight_decays=(0.01,),
             executor="local", progress=False)
    pages["vit study"] = write_vit_report(root / "grid", root / "vit.html")
    pages.update(_paper_command_pages(root, dirs))
    return {k: Path(v) for k, v in pages.items()}


def _paper_command_pages(root: Path, dirs: list[Path]) -> dict[str, Path]:
    """The pages of the paper's commands, written by the CLI as a user writes them (perturb,
    difficulty, correlate --k), and the generalization study's page of the shipped full run."""
    from blockcoupling.studies.generalization import full_spec
    from blockcoupling.studies.generalization.analysis import analyse
    from blockcoupling.studies.generalization.design import PLANNING, control_direction
    from blockcoupling.studies.generalization.page import write_study_page
    from blockcoupling.studies.generalization.result import GeneralizationResult
    from blockcoupling.studies.generalization.statement import statement
    from tests.helpers.tiny_runs import cli, e2h_arc_rows, save_tiny_lm, write_prompts

    model = save_tiny_lm(root / "lm")
    pages = {}
    r = cli("-q", "perturb", "--model", str(model), "--prompts",
            str(write_prompts(root / "p.txt")), "--out", str(root / "pert"), "--levels",
            "0.1,1", "--draws", "2")
    assert r.exit_code == 0, r.output
    pages["perturb"] = root / "pert" / "perturbation.html"
    rows = e2h_arc_rows(root / "e2h.jsonl")
    r = cli("-q", "measure", "--model", str(model), "--prompts", f"hf:e2h-arc@{rows}",
            "--limit", "6", "--k", "2", "--out", str(root / "e2h_run"))
    assert r.exit_code == 0, r.output
    r = cli("-q", "difficulty", str(root / "e2h_run"), "--ratings", f"hf:e2h-arc@{rows}",
            "--n-boot", "50", "--out", str(root / "difficulty.html"))
    assert r.exit_code == 0, r.output
    pages["difficulty"] = root / "difficulty.html"
    scores = root / "scores.csv"
    pd.DataFrame({"model": [f"m{i}" for i in range(5)],
                  "score": [20.0, 30, 41, 45, 62]}).to_csv(scores, index=False)
    r = cli("-q", "correlate", *map(str, dirs), "--scores", str(scores), "--k", "2,3",
            "--n-boot", "0", "--out", str(root / "vary_k.html"))
    assert r.exit_code == 0, r.output
    pages["correlate --k"] = root / "vary_k.html"
    shipped = Path(__file__).resolve().parents[2] / "docs" / "results" / "generalization"
    spec = full_spec()
    runs, control = pd.read_csv(shipped / "runs.csv"), pd.read_csv(shipped / "control.csv")
    a = analyse(runs, spec.variants, alpha=spec.alpha, bound=spec.bound,
                within_bound=PLANNING["across_slope"], control=control,
                control_direction=control_direction(spec))
    powers = json.loads((shipped / "study.json").read_text())["design"]["power_simulated"]
    result = GeneralizationResult(spec=spec, runs=a["runs"], final=runs, cells=a["cells"],
                                  analysis=a, powers=powers, control=control,
                                  statement=statement(spec, a, powers), reproducibility={})
    pages["generalization study"] = write_study_page(result, root / "generalization.html")
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    r = CliRunner().invoke(app, ["-q", "study", "lm-family", "--quick", "--out",
                                 str(root / "lm_study")],
                           env={"BLOCKCOUPLING_CACHE": str(root / "lm_cache")})
    assert r.exit_code == 0, r.output
    pages["lm-family study"] = root / "lm_study" / "study.html"
    return pages


REPORT_KINDS = ["run report", "emergence", "correlate", "chance-floor", "cross", "vit study",
                "perturb", "difficulty", "correlate --k", "generalization study",
                "lm-family study"]


@pytest.mark.parametrize("kind", REPORT_KINDS)
def test_report_page_reads_right(kind: str, report_pages: dict[str, Path],
                                 tmp_path: Path) -> None:
    page = report_pages[kind]
    text = page.read_text(encoding="utf-8")
    assert "<style>" in text and "data-images-ok" in text  # the one template
    found = probe(page, 1400, 900, tmp_path)
    assert reader_problems(found) == [], kind
    assert found["imgs"] and all(i["nw"] > 200 for i in found["imgs"])
    assert found["sw"] <= found["vw"], (kind, found["wide"][:5])  # nothing overflows sideways


def test_every_report_page_uses_the_one_stylesheet(report_pages: dict[str, Path]) -> None:
    from blockcoupling.report.page import CSS

    for kind, page in report_pages.items():
        text = page.read_text(encoding="utf-8")
        assert text.count("<style>") == 1 and CSS in text, kind
        assert np.char.count(text, "<h1>") == 1
