"""The emergence page (``blockcoupling report COLLECTION``) renders for every collection kind
and every combination of stored parts: a training loss or none; the chance-corrected
statistic, raw c_K, both or no depth-wise coupling; trajectory metrics or none; units with
and without steps; failed units; no unit done. (A real HF Trainer and Lightning run are
rendered in tests/studies/test_monitor.py.)"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import blockcoupling as bc
from blockcoupling.cli import app
from blockcoupling.report.emergence import LOSS_FILE
from tests.helpers.monitored import PROMPTS, dropout_gpt2, word_tokenizer

#: measurement configurations of the monitors (each measured at steps 0, 2, 4)
CONFIGS = {
    "both": {"variants": ("coupling", "coupling_vs_null")},
    "raw-no-trajectory": {"variants": ("coupling",), "trajectory": False, "spectra": False},
    "null-only": {"variants": ("coupling_vs_null",)},
    "no-depth": {"coupling": ("self",), "tokens": "all", "variants": ("coupling",)},
}


@pytest.fixture(scope="module")
def monitors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("monitors")
    tok, out = word_tokenizer(), {}
    for name, options in CONFIGS.items():
        model = dropout_gpt2(1).eval()
        with bc.CouplingMonitor(tok, PROMPTS, every=2, out=root / name, k=(2,),
                                orientations=("ujv",), **options) as mon:
            for step in range(5):
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.01)
                mon.step(model, step)
        out[name] = root / name
    return out


def _report(collection: Path, out: Path) -> str:
    r = CliRunner().invoke(app, ["--quiet", "report", str(collection), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"wrote {out}"
    return out.read_text(encoding="utf-8")


def _figures(page: str) -> list[str]:
    return re.findall(r'<section id="([a-z_]+)"><h2>[^<]*</h2><figure>', page)


@pytest.mark.parametrize("loss", [False, True], ids=["no-loss", "loss"])
@pytest.mark.parametrize("config", [c if c == "both" else pytest.param(c, marks=pytest.mark.slow)
                                    for c in CONFIGS])  # CI: every config
def test_monitor_page_every_part(config: str, loss: bool, monitors: dict[str, Path],
                                 tmp_path: Path) -> None:
    mon = tmp_path / "mon"
    shutil.copytree(monitors[config], mon)
    if loss:
        (mon / LOSS_FILE).write_text("".join(json.dumps({"step": s, "loss": 3.0 - 0.1 * s})
                                             + "\n" for s in range(1, 6)))
    page = _report(mon, tmp_path / "em.html")
    figs = _figures(page)
    depth = config != "no-depth"
    assert ("coupling_vs_step" in figs) == depth
    assert ("trajectory_vs_step" in figs) == (config != "raw-no-trajectory")
    assert ("loss_vs_step" in figs) == loss
    assert ("layer_graphs" in figs) == depth and ("depth_heatmaps" in figs) == depth
    if loss and depth:  # the loss figure's second axis: the run's headline statistic
        assert ("coupling above chance" if config != "raw-no-trajectory" else "raw c_K") in page
    # what is not drawn is said, once, with the reason
    assert ("Not drawn" in page) == (not depth or config == "raw-no-trajectory" or not loss)
    assert page.count("<img") == len(figs)


def test_sweep_page_steps_plain_models_and_failures(tmp_path: Path) -> None:
    """A sweep (not a monitor): checkpoints with steps, a model without steps, a failed unit."""
    from tests.helpers.sweeps import MEASURE, save_model
    from tests.helpers.sweeps import PROMPTS as SWEEP_PROMPTS

    save_model(tmp_path / "models" / "plain", "gpt2", 0)
    for step, seed in ((0, 1), (10, 2), (100, 3)):
        save_model(tmp_path / "runs" / f"checkpoint-{step}", "gpt2", seed)
    broken = save_model(tmp_path / "broken" / "checkpoint-5", "gpt2", 4)
    for f in broken.glob("*.safetensors"):
        f.unlink()
    (tmp_path / "prompts.txt").write_text("\n".join(SWEEP_PROMPTS[:2]) + "\n")
    spec = {"models": [{"label": "plain", "model": str(tmp_path / "models" / "plain")},
                       {"label": "run", "checkpoints": str(tmp_path / "runs" / "checkpoint-*")},
                       {"label": "broken",
                        "checkpoints": str(tmp_path / "broken" / "checkpoint-*")}],
            "prompts": [str(tmp_path / "prompts.txt")], "measure": MEASURE}
    bc.run_sweep(spec, tmp_path / "sweep", executor="local", progress=False)
    page = _report(tmp_path / "sweep", tmp_path / "sw.html")
    figs = _figures(page)
    assert figs == ["coupling_vs_step", "trajectory_vs_step", "windowed_lss", "layer_graphs",
                    "depth_heatmaps"]
    assert "1 failed" in page and "Not drawn" not in page


def test_page_with_no_unit_done(tmp_path: Path) -> None:
    """Every measured step failed: the page lists the units and says what was not drawn."""
    with bc.CouplingMonitor(word_tokenizer(), PROMPTS, every=1, out=tmp_path / "m", k=(64,),
                            on_error="warn") as mon, pytest.warns(UserWarning, match="hidden"):
        mon.step(dropout_gpt2().eval(), 1, loss=2.5)
    page = _report(tmp_path / "m", tmp_path / "none.html")
    assert _figures(page) == ["loss_vs_step"]
    assert "no unit of the sweep is done" in page and "1 failed" in page


def test_the_loss_twin_axis_leads_with_coupling_vs_rotated() -> None:
    """The monitor's loss figure draws the leading variant on its twin axis where the units
    measured it, coupling_vs_null for units measured before it existed, raw c_K last."""
    import pandas as pd

    from blockcoupling.report.emergence import headline_column, plot_loss_vs_step

    summ = pd.DataFrame({"label": ["a", "a"], "step": [1, 2], "coupling_mean": [0.7, 0.8],
                         "coupling_vs_null_mean": [0.1, 0.2], "coupling_vs_null_se": [0.01] * 2,
                         "coupling_vs_rotated_mean": [0.05, 0.15],
                         "coupling_vs_rotated_se": [0.01] * 2})
    assert headline_column(summ)[0] == "coupling_vs_rotated"
    assert headline_column(summ.drop(columns=["coupling_vs_rotated_mean"]))[0] == \
        "coupling_vs_null"
    assert headline_column(summ[["label", "step", "coupling_mean"]])[0] == "coupling"
    fig = plot_loss_vs_step(pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.0]}), summ)
    assert fig.axes[1].get_ylabel() == "coupling above chance\n(coupling_vs_rotated)"
