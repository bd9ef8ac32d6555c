"""The ViT study: data, model, schedule, training (idempotent, resumable), grid, figures, CLI.

Everything runs on tiny models (width 16, 2 blocks, 8x8 images: 4 patches + [CLS]) and small
subsets of scikit-learn's digits, with one torch thread.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import blockcoupling as bc
from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.vit.data import load_digits, load_image_data, load_image_folder
from blockcoupling.studies.vit.grid import (
    PAPER_DROP_PATH,
    PAPER_WEIGHT_DECAY,
    collect_epochs,
    collect_runs,
    grid_configs,
    run_grid,
    run_name,
)
from blockcoupling.studies.vit.model import build_vit, load_vit, resolve_shape
from blockcoupling.studies.vit.train import (
    VitTrainConfig,
    is_trained,
    lr_at,
    param_groups,
    read_metrics,
    train_vit,
)
from tests.helpers.threads import one_torch_thread  # noqa: F401 - autouse: one torch thread
from tests.helpers.tiny_runs import TINY_VIT


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny 2-epoch training shared by the tests that read a finished output."""
    out = tmp_path_factory.mktemp("vit") / "run"
    train_vit(VitTrainConfig(epochs=2, drop_path=0.1, **TINY_VIT), out, progress=False)
    return out


# ---------------------------------------------------------------------------- data
def test_digits_split_normalisation_and_upscaling() -> None:
    d = load_digits(16)
    assert d.train_x.shape == (1437, 1, 16, 16) and d.test_x.shape == (360, 1, 16, 16)
    assert d.train_y.dtype == torch.int64 and set(d.train_y.tolist()) == set(range(10))
    # stratified: every class keeps about 20% of its images in the test split
    counts = np.bincount(d.test_y.numpy(), minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    # normalised by the training split's statistics
    assert abs(float(d.train_x.mean())) < 1e-4 and abs(float(d.train_x.std()) - 1) < 1e-3
    # bilinear upscaling of an 8x8 image: the 8x8 version has the same mean (up to borders)
    d8 = load_digits(8)
    raw8 = d8.train_x * d8.std[0] + d8.mean[0]
    raw16 = d.train_x * d.std[0] + d.mean[0]
    np.testing.assert_allclose(raw16.mean((1, 2, 3)), raw8.mean((1, 2, 3)), atol=0.03)
    assert float(raw8.min()) >= -1e-6 and float(raw8.max()) <= 1 + 1e-6
    # deterministic
    assert torch.equal(load_digits(16).train_y, d.train_y)


def test_subsets_are_seeded_and_sized() -> None:
    a = load_image_data("digits", image_size=8, train_limit=50, test_limit=20)
    b = load_image_data("digits", image_size=8, train_limit=50, test_limit=20)
    assert len(a.train_y) == 50 and len(a.test_y) == 20
    assert torch.equal(a.train_x, b.train_x)
    with pytest.raises(BlockCouplingError, match="unknown data set"):
        load_image_data("mnist")
    with pytest.raises(BlockCouplingError, match="drop --data-dir"):
        load_image_data("digits", data_dir="/nonexistent")


def _write_folder(root: Path, sizes: dict[str, int], shape: tuple[int, int] = (6, 6)) -> dict:
    from PIL import Image

    pixels = {}
    for split in ("train", "test"):
        for label, cls in enumerate(sorted(sizes)):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(sizes[cls]):
                arr = np.full((*shape, 3), 20 * label + i, dtype=np.uint8)
                arr[0, 0] = (255, 0, 0)
                Image.fromarray(arr).save(folder / f"{i}.png")
                pixels[(split, cls, i)] = arr
    return pixels


def test_image_folder_layout(tmp_path: Path) -> None:
    _write_folder(tmp_path, {"cat": 2, "airplane": 3})
    d = load_image_folder(tmp_path)
    assert d.classes == ("airplane", "cat")  # sorted folder names
    assert d.train_x.shape == (5, 3, 6, 6)
    assert d.train_y.tolist() == [0, 0, 0, 1, 1]
    # undo the normalisation: the stored pixels come back (RGB order, scaled to [0, 1])
    raw = d.train_x * torch.tensor(d.std)[:, None, None] + torch.tensor(d.mean)[:, None, None]
    np.testing.assert_allclose(raw[3, :, 1, 1].numpy(), [20 / 255] * 3, atol=1e-5)  # cat 0
    np.testing.assert_allclose(raw[0, :, 0, 0].numpy(), [1, 0, 0], atol=1e-5)
    # the cifar10 loader reads the same layout from --data-dir and resizes
    c = load_image_data("cifar10", data_dir=tmp_path, image_size=8)
    assert c.train_x.shape == (5, 3, 8, 8) and c.name == "cifar10"


def test_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(BlockCouplingError, match="does not exist"):
        load_image_folder(tmp_path / "missing")
    from PIL import Image

    (tmp_path / "train" / "a").mkdir(parents=True)
    with pytest.raises(BlockCouplingError, match="no images"):
        load_image_folder(tmp_path)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "train" / "a" / "0.png")
    with pytest.raises(BlockCouplingError, match="no 'test' folder"):
        load_image_folder(tmp_path)
    (tmp_path / "test" / "z").mkdir(parents=True)
    with pytest.raises(BlockCouplingError, match="the train split does not have"):
        load_image_folder(tmp_path)
    other = tmp_path / "mixed"
    _write_folder(other, {"a": 1, "b": 1})
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(other / "train" / "a" / "big.png")
    with pytest.raises(BlockCouplingError, match="different sizes"):
        load_image_folder(other)


def test_cifar10_offline_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'cifar10' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(BlockCouplingError, match="--data-dir DIR") as err:
        load_image_data("cifar10")
    assert "ConnectionError" in str(err.value)


# ---------------------------------------------------------------------------- model
def test_model_is_deit_style_beit() -> None:
    shape = resolve_shape("tiny", hidden_size=16, depth=4, heads=2)
    model = build_vit(shape, image_size=8, num_channels=1, num_labels=10, drop_path=0.3)
    spec = bc.find_blocks(model)
    assert (spec.arch, spec.blocks_path, spec.final_norm_path) == ("beit", "beit.layers",
                                                                    "beit.layernorm")
    assert spec.num_layers == 4 and not spec.causal
    # DeiT's linear drop-path rule: 0 for block 1 up to the rate for the last block
    rates = [getattr(b.drop_path, "drop_prob", 0.0) for b in model.beit.layers]
    np.testing.assert_allclose(rates, [0.0, 0.1, 0.2, 0.3])
    # no LayerScale, learned absolute positions, [CLS] pooling
    assert not any("lambda" in n for n, _ in model.named_parameters())
    assert model.beit.embeddings.position_embeddings.shape == (1, 5, 16)
    assert model.beit.pooler.layernorm is None
    # seeded
    again = build_vit(shape, image_size=8, num_channels=1, num_labels=10, drop_path=0.3)
    for (n, p), (_, q) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    # the classifier reads token 0 ([CLS]) after the final norm
    model.eval()
    x = torch.randn(2, 1, 8, 8)
    out = model(pixel_values=x, output_hidden_states=True)
    cls = model.beit.layernorm(out.hidden_states[-1])[:, 0]
    torch.testing.assert_close(out.logits, model.classifier(cls))


def test_shape_errors() -> None:
    with pytest.raises(BlockCouplingError, match="unknown ViT preset"):
        resolve_shape("huge")
    with pytest.raises(BlockCouplingError, match="not divisible"):
        resolve_shape("tiny", hidden_size=10, heads=3)
    shape = resolve_shape("deit-tiny")
    assert (shape.hidden_size, shape.depth, shape.heads) == (192, 12, 3)
    with pytest.raises(BlockCouplingError, match="multiple of the patch size"):
        build_vit(shape, image_size=10, num_channels=3, num_labels=10, drop_path=0.1)
    with pytest.raises(BlockCouplingError, match=r"in \[0, 1\)"):
        build_vit(shape, image_size=32, num_channels=3, num_labels=10, drop_path=1.0)


def test_load_vit_error(tmp_path: Path) -> None:
    with pytest.raises(BlockCouplingError, match="no trained ViT"):
        load_vit(tmp_path)


# ---------------------------------------------------------------------------- tokens
def test_token_selection_auto_and_cls() -> None:
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.engine.pairs import cls_position, resolve_tokens

    assert MeasureConfig().tokens == "auto"
    assert MeasureConfig.parse(tokens="cls").tokens == "cls"
    assert cls_position("beit", False) == 0 and cls_position("bert", False) == 0
    assert cls_position("gpt2", True) is None and cls_position("custom", False) is None
    assert resolve_tokens("auto", 5, cls=0) == [0] and resolve_tokens("auto", 5) == [4]
    assert resolve_tokens("cls", 5, cls=0) == [0]
    assert resolve_tokens("last", 5, cls=0) == [4]  # explicit choices are kept
    with pytest.raises(BlockCouplingError, match="no \\[CLS\\] token"):
        resolve_tokens("cls", 5)
    with pytest.raises(BlockCouplingError, match="'auto', 'cls', 'last'"):
        MeasureConfig.parse(tokens="first")


def test_default_token_is_cls_for_a_vit_and_last_for_others() -> None:
    shape = resolve_shape("tiny", hidden_size=16, depth=2, heads=2)
    vit = build_vit(shape, image_size=8, num_channels=1, num_labels=10, drop_path=0.1).eval()
    x = {"pixel_values": torch.randn(1, 1, 8, 8)}
    kw = dict(coupling=("depth",), k=(2,), progress=False, trajectory=False, spectra=False)
    auto = bc.measure(vit, None, x, **kw)
    assert set(auto.coupling["token_out_a"]) == {0}  # [CLS], not the last patch (4)
    cls = bc.measure(vit, None, x, tokens="cls", **kw)
    pd.testing.assert_frame_equal(auto.coupling, cls.coupling)
    assert set(bc.measure(vit, None, x, tokens="last", **kw).coupling["token_out_a"]) == {4}

    from tests.helpers.tiny_models import EncoderStack

    net = EncoderStack(2).eval()  # blocks by blocks_path: no [CLS]
    m = bc.measure(net, None, {"x": torch.randn(1, 5, 8)}, blocks_path="layers", **kw)
    assert set(m.coupling["token_out_a"]) == {4}
    with pytest.raises(BlockCouplingError, match="no \\[CLS\\] token"):
        bc.measure(net, None, {"x": torch.randn(1, 5, 8)}, blocks_path="layers", tokens="cls",
                   **kw)


# ---------------------------------------------------------------------------- recipe
def test_lr_schedule_warmup_then_cosine() -> None:
    lrs = [lr_at(s, 100, 10, 1e-3, 1e-5) for s in range(100)]
    np.testing.assert_allclose(lrs[:10], [1e-3 * (i + 1) / 10 for i in range(10)])
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[55] == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lr_at(100, 100, 10, 1e-3, 1e-5) == pytest.approx(1e-5)
    assert lr_at(0, 10, 0, 1e-3, 0.0) == pytest.approx(1e-3)


def test_weight_decay_only_on_matrices() -> None:
    shape = resolve_shape("tiny", hidden_size=16, depth=2, heads=2)
    model = build_vit(shape, image_size=8, num_channels=1, num_labels=10, drop_path=0.0)
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    nd = {names[id(p)] for p in no_decay["params"]}
    assert "beit.embeddings.cls_token" in nd and "beit.embeddings.position_embeddings" in nd
    assert all(p.ndim >= 2 for p in decay["params"])
    assert not any(n.endswith("bias") for n in (names[id(p)] for p in decay["params"]))
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_config_validation() -> None:
    for bad, msg in [(dict(drop_path=1.5), "drop-path"), (dict(epochs=0), "epochs"),
                     (dict(dataset="svhn"), "dataset 'svhn': choose from digits, cifar10"),
                     (dict(weight_decay=-1), "weight-decay"), (dict(k=0), "k must")]:
        with pytest.raises(BlockCouplingError, match=msg):
            VitTrainConfig(**bad)
    with pytest.raises(BlockCouplingError, match="unknown training option"):
        VitTrainConfig.from_dict({"dropout": 0.1})
    c = VitTrainConfig()
    assert VitTrainConfig.from_dict(c.to_dict()) == c and c.key() == VitTrainConfig().key()
    assert c.key() != c.replace(drop_path=0.2).key()
    assert c.mixup_alpha == 0.0 and VitTrainConfig(dataset="cifar10").mixup_alpha == 0.8


# ---------------------------------------------------------------------------- training
def test_training_writes_model_metrics_and_coupling(trained: Path) -> None:
    m = read_metrics(trained)
    assert m["status"] == "complete" and is_trained(trained)
    assert [e["epoch"] for e in m["epochs"]] == [0, 1, 2]
    for e in m["epochs"]:
        for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "coupling"):
            assert math.isfinite(e[key]), key
        assert 0 <= e["test_accuracy"] <= 1 and -1 <= e["coupling"] <= 1
    assert not (trained / "checkpoint.pt").exists()
    # the saved model loads and reproduces the recorded test accuracy
    from blockcoupling.studies.vit.train import evaluate

    model = load_vit(trained)
    data = load_image_data("digits", image_size=8, train_limit=96, test_limit=32)
    loss, acc = evaluate(model, data.test_x, data.test_y)
    assert acc == pytest.approx(m["final"]["test_accuracy"])
    assert loss == pytest.approx(m["final"]["test_loss"], rel=1e-5)
    # coupling runs: one per epoch (monitor) at the [CLS] token, and the final one at [CLS]
    # and the last patch (4 patches + [CLS]) in one measurement
    for name in ("epoch-0000", "epoch-0001", "epoch-0002", "final"):
        run = bc.open_run(trained / "coupling" / name)
        assert set(run.coupling["token_out_a"]) == ({0, 4} if name == "final" else {0})
        assert set(run.coupling["layer_a"]) == {1, 2}
    final = bc.open_run(trained / "coupling" / "final")
    # each token's statistic equals a separate measurement of that token alone
    for token, spec in (("cls", (0,)), ("last", "last")):
        alone = bc.measure(model, None, {"pixel_values": data.test_x[:2]}, coupling=("depth",),
                           k=(2,), tokens=spec, progress=False)
        st = bc.coupling_statistic(alone, k=2).set_index("variant")
        for variant in ("coupling", "coupling_vs_null"):
            assert m["final"][f"{variant}_{token}"] == pytest.approx(
                st.loc[variant, "mean"], abs=1e-6)
            assert m["final"][f"{variant}_se_{token}"] == pytest.approx(
                st.loc[variant, "se"], abs=1e-6)
    assert m["final"]["coupling_cls"] == m["final"]["coupling"]  # the headline is [CLS]
    assert m["final"]["coupling_last"] != m["final"]["coupling_cls"]
    final.coupling = final.coupling[final.coupling["token_out_a"] == 0]  # [CLS] rows
    data_labels = load_image_data("digits", image_size=8, train_limit=96, test_limit=32).test_y
    assert final.prompts["label"].tolist() == [str(int(y)) for y in data_labels[:2]]
    stat = bc.coupling_statistic(final, k=2).set_index("variant")
    assert stat.loc["coupling", "mean"] == pytest.approx(m["final"]["coupling"])
    assert stat.loc["coupling", "se"] == pytest.approx(m["final"]["coupling_se"])
    assert stat.loc["coupling_vs_null", "mean"] == pytest.approx(m["final"]["coupling_vs_null"])
    last = bc.open_run(trained / "coupling" / "epoch-0002")
    assert last.mean_depth_coupling(2) == pytest.approx(m["epochs"][-1]["coupling"])
    # the monitored coupling is the trained model's coupling on those images
    direct = bc.measure(model, None, {"pixel_values": data.test_x[:2]}, coupling=("depth",),
                        k=(2,), tokens=(0,), progress=False)
    assert direct.mean_depth_coupling(2) == pytest.approx(
        m["epochs"][-1]["coupling"], abs=1e-6)


def test_finished_training_is_skipped_and_other_configs_refused(trained: Path) -> None:
    before = (trained / "metrics.json").read_text()
    calls: list[dict] = []
    cfg = VitTrainConfig(epochs=2, drop_path=0.1, **TINY_VIT)
    assert train_vit(cfg, trained, progress=False, on_epoch=calls.append) == trained
    assert calls == [] and (trained / "metrics.json").read_text() == before
    with pytest.raises(BlockCouplingError, match="another config"):
        train_vit(cfg.replace(drop_path=0.2), trained, progress=False)


def test_interrupted_training_resumes_to_the_same_result(tmp_path: Path) -> None:
    cfg = VitTrainConfig(epochs=2, drop_path=0.2, monitor_every=0, mixup=0.8, augment=True, **TINY_VIT)
    train_vit(cfg, tmp_path / "straight", progress=False)

    def stop(row: dict) -> None:
        if row["epoch"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_vit(cfg, tmp_path / "resumed", progress=False, on_epoch=stop)
    assert (tmp_path / "resumed" / "checkpoint.pt").exists()
    assert read_metrics(tmp_path / "resumed")["status"] == "running"
    assert not is_trained(tmp_path / "resumed", cfg)
    train_vit(cfg, tmp_path / "resumed", progress=False)
    a, b = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    for ea, eb in zip(a["epochs"], b["epochs"], strict=True):
        for key in ("train_objective", "train_loss", "test_loss", "test_accuracy"):
            assert ea[key] == eb[key] or (math.isnan(ea[key]) and math.isnan(eb[key])), key
    wa, wb = load_vit(tmp_path / "straight"), load_vit(tmp_path / "resumed")
    for (n, p), (_, q) in zip(wa.named_parameters(), wb.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_training_learns_digits(tmp_path: Path) -> None:
    """Well above chance (10%) after a few seconds of CPU (the full claim is in BENCHMARKS.md)."""
    cfg = VitTrainConfig(epochs=4, drop_path=0.0, preset="tiny", hidden_size=32, depth=2, heads=2,
                      image_size=8, batch_size=32, lr=2e-3, warmup_epochs=0.5, monitor_every=0,
                      final_images=1, k=2, train_limit=600)
    train_vit(cfg, tmp_path, progress=False)
    m = read_metrics(tmp_path)
    assert m["final"]["test_accuracy"] > 0.3
    assert m["epochs"][-1]["train_loss"] < m["epochs"][0]["train_loss"]


# ---------------------------------------------------------------------------- grid
def test_grid_configs_default_to_the_paper() -> None:
    configs = grid_configs(VitTrainConfig())
    assert len(configs) == 64
    assert {c.drop_path for c in configs} == set(PAPER_DROP_PATH)
    assert {c.weight_decay for c in configs} == set(PAPER_WEIGHT_DECAY)
    assert run_name(configs[1]) == "dp0.025-wd0.005-s0"
    with pytest.raises(BlockCouplingError, match="repeats"):
        grid_configs(VitTrainConfig(), drop_paths=(0.1, 0.1), weight_decays=(0.05,))


def test_coupling_figures_draw_the_chance_level() -> None:
    """Every ViT coupling figure draws the chance level of the coupling it plots: the runs'
    c_null for raw c_K (as the figure of the study page shows raw c_K for older runs), 0 for
    a chance-corrected variant; none is invented where no chance level was recorded."""
    from blockcoupling.studies.vit.report import (
        chance_level,
        plot_coupling_epochs,
        plot_coupling_vs_accuracy,
        plot_coupling_vs_drop_path,
    )

    runs = pd.DataFrame({"drop_path": [0.0, 0.1, 0.0, 0.1], "weight_decay": [0.01, 0.01, 0.1, 0.1],
                         "coupling": [0.71, 0.74, 0.72, 0.76], "coupling_chance": [0.68] * 4,
                         "coupling_vs_rotated": [0.05, 0.09, 0.06, 0.1],
                         "test_accuracy": [0.8, 0.85, 0.82, 0.9]})
    epochs = runs.assign(name=["a", "b", "c", "d"], epoch=1)

    def chance(ax: Any, vertical: bool = False) -> float:
        [line] = [ln for ln in ax.get_lines() if ln.get_label().startswith("chance")]
        data = line.get_xdata() if vertical else line.get_ydata()
        assert len(set(map(float, data))) == 1
        return float(data[0])

    assert chance(plot_coupling_vs_drop_path(runs).axes[0]) == pytest.approx(0.68)
    assert chance(plot_coupling_vs_drop_path(runs, column="coupling_vs_rotated").axes[0]) == 0
    assert chance(plot_coupling_vs_accuracy(runs).axes[0], vertical=True) == pytest.approx(0.68)
    assert chance(plot_coupling_epochs(epochs).axes[0]) == pytest.approx(0.68)
    assert chance_level(runs.drop(columns="coupling_chance"), "coupling") is None
    assert chance_level(runs, "coupling_vs_null_cls") == 0.0


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_small_grid_runs_locally_and_figures(tmp_path: Path) -> None:
    base = VitTrainConfig(epochs=1, **{**TINY_VIT, "monitor_images": 1, "final_images": 2})
    seen: list[dict] = []
    runs = run_grid(base, tmp_path / "grid", drop_paths=(0.0, 0.1), weight_decays=(0.01, 0.1),
                    executor="local", progress=False, on_run=seen.append)
    assert len(runs) == 4 and set(runs["status"]) == {"complete"} and len(seen) == 4
    assert set(zip(runs["drop_path"], runs["weight_decay"], strict=True)) == {
        (0.0, 0.01), (0.1, 0.01), (0.0, 0.1), (0.1, 0.1)}
    assert runs["coupling"].notna().all() and runs["test_accuracy"].notna().all()
    # [CLS] (the headline here) and the last patch side by side
    for col in ("coupling_vs_null", "coupling", "coupling_vs_null_se"):
        np.testing.assert_array_equal(runs[col], runs[f"{col}_cls"])
        assert runs[f"{col}_last"].notna().all()
    assert set(runs["tokens"]) == {"cls"}
    grid = bc.open_collection(tmp_path / "grid")  # a collection of kind vit-grid
    assert grid.kind == "vit-grid" and set(grid.catalogue["status"]) == {"done"}
    assert set(grid.catalogue["label"]) == set(runs["name"])
    # a second call skips every run; another base config is refused
    again = run_grid(base, tmp_path / "grid", drop_paths=(0.0, 0.1), weight_decays=(0.01, 0.1),
                     executor="local", progress=False)
    pd.testing.assert_frame_equal(again.drop(columns="message"), runs.drop(columns="message"))
    with pytest.raises(BlockCouplingError, match="another base config"):
        run_grid(base.replace(epochs=2), tmp_path / "grid", drop_paths=(0.0,),
                 weight_decays=(0.01,), executor="local", progress=False)
    epochs = collect_epochs(tmp_path / "grid")
    assert len(epochs) == 8 and set(epochs["epoch"]) == {0, 1}

    from blockcoupling.studies.vit.report import (
        coupling_accuracy_fit,
        plot_coupling_vs_drop_path,
        write_vit_figures,
    )

    fig = plot_coupling_vs_drop_path(runs)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    for wd in (0.01, 0.1):
        sub = runs[runs["weight_decay"] == wd].sort_values("drop_path")
        np.testing.assert_allclose(lines[f"wd {wd:g}"].get_ydata(), sub["coupling"])
    fit = coupling_accuracy_fit(runs)
    from scipy import stats

    ref = stats.linregress(runs["coupling"], runs["test_accuracy"])
    assert fit["r2"] == pytest.approx(ref.rvalue**2) or math.isnan(fit["r2"])
    paths = write_vit_figures(tmp_path / "grid", tmp_path / "fig")
    names = {p.name for p in paths}
    assert {"vit_coupling_vs_drop_path.png", "vit_coupling_vs_accuracy.png",
            "vit_coupling_epochs.png", "vit_runs.csv", "fits.json",
            "vit_conditional_fits.png"} <= names
    # the conditional fits: at each weight decay the line through its 2 drop-path points
    fits = json.loads((tmp_path / "fig" / "fits.json").read_text())
    assert [f["weight_decay"] for f in fits["by_weight_decay"]] == [0.01, 0.1]
    for f in fits["by_weight_decay"]:
        sub = runs[runs["weight_decay"] == f["weight_decay"]].sort_values("drop_path")
        y = sub["coupling_vs_null"].to_numpy()
        assert f["n"] == 2 and f["slope"] == pytest.approx((y[1] - y[0]) / 0.1)
        assert f["p"] is None and "no R^2" in f["note"]  # NaN is written as null
        assert [q["se"] for q in f["points"]] == pytest.approx(
            sub["coupling_vs_null_se"].tolist())
    for f in fits["by_drop_path"]:
        sub = runs[runs["drop_path"] == f["drop_path"]].sort_values("weight_decay")
        y = sub["coupling_vs_null"].to_numpy()
        assert f["slope"] == pytest.approx((y[1] - y[0]) / 1.0)  # log10 0.1 - log10 0.01
    pooled = fits["pooled"]["drop_path"]
    ref = stats.linregress(runs["drop_path"], runs["coupling_vs_null"])
    assert pooled["n"] == 4 and pooled["slope"] == pytest.approx(ref.slope)
    assert pooled["r2"] == pytest.approx(ref.rvalue**2) and pooled["p"] == pytest.approx(ref.pvalue)
    assert len(pd.read_csv(tmp_path / "fig" / "vit_runs.csv")) == 4

    # `blockcoupling report GRID` recognises a folder of vit-train runs and writes the study page
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    res = CliRunner().invoke(app, ["report", str(tmp_path / "grid"), "--out",
                                   str(tmp_path / "vit.html")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "vit.html").read_text()
    assert "Coupling against the stochastic-depth rate" in page
    assert "Coupling against test accuracy" in page and page.count("<tr") >= 5  # 4 runs + header
    assert "Conditional fits" in page and "by_weight_decay" in page
    assert (tmp_path / "vit_figures" / "vit_coupling_vs_drop_path.png").exists()


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_grid_on_ray_matches_this_process(tmp_path: Path, ray_cluster: str) -> None:
    """One Ray task per run; a run is a pure function of its config, wherever it runs."""
    base = VitTrainConfig(epochs=1, **{**TINY_VIT, "monitor_every": 0, "final_images": 1})
    kw = dict(drop_paths=(0.0, 0.2), weight_decays=(0.01,), progress=False)
    on_ray = run_grid(base, tmp_path / "ray", executor="ray", address=ray_cluster, **kw)
    here = run_grid(base, tmp_path / "local", executor="local", **kw)
    assert set(on_ray["status"]) == {"complete"} and len(on_ray) == 2
    cols = ["name", "drop_path", "weight_decay", "test_accuracy", "test_loss", "coupling"]
    pd.testing.assert_frame_equal(on_ray[cols].sort_values("name").reset_index(drop=True),
                                  here[cols].sort_values("name").reset_index(drop=True))


def test_grid_spec_yaml(tmp_path: Path) -> None:
    from blockcoupling.studies.vit.grid import load_grid_spec

    spec = tmp_path / "vit-grid.yaml"
    spec.write_text("drop_path: [0, 0.1]\nweight_decay: 0.05\nseeds: [0, 1]\n"
                    "train: {dataset: digits, epochs: 2, preset: tiny}\nexecutor: local\n")
    base, kw = load_grid_spec(spec)
    assert base == VitTrainConfig(dataset="digits", epochs=2, preset="tiny")
    assert kw == {"drop_paths": [0.0, 0.1], "weight_decays": [0.05], "seeds": [0, 1],
                  "executor": "local"}
    base, kw = load_grid_spec({"train": {"epochs": 1}})
    assert kw["drop_paths"] == list(PAPER_DROP_PATH) and kw["seeds"] == [0]
    for bad, msg in [({"dropout": [0.1]}, "grid spec: unknown key .dropout."),
                     ({"train": {"drop_path": 0.1}}, "set by the grid"),
                     ({"train": {"lr_max": 1}}, "unknown training option"),
                     ({"train": {"augment": "randaugment"}}, "RandAugment is not"),
                     ({"train": {"label_smoothing": -0.1}}, "train.label_smoothing must be a finite number >= 0"),
                     ({"drop_path": ["x"]}, "drop_path must be a finite number")]:
        with pytest.raises(BlockCouplingError, match=msg):
            load_grid_spec(bad)
    with pytest.raises(BlockCouplingError, match="does not exist"):
        load_grid_spec(tmp_path / "missing.yaml")


def test_grid_records_failed_runs(tmp_path: Path) -> None:
    base = VitTrainConfig(epochs=1, **{**TINY_VIT, "k": 17})  # K larger than the width 16
    runs = run_grid(base, tmp_path / "g", drop_paths=(0.0,), weight_decays=(0.01,),
                    executor="local", progress=False)
    assert runs["status"].tolist() == ["failed"] and "exceeds" in runs["message"].iloc[0]


def test_collect_runs_on_empty_folder(tmp_path: Path) -> None:
    assert collect_runs(tmp_path).empty
    from blockcoupling.report.figures import FigureUnavailable
    from blockcoupling.studies.vit.report import write_vit_figures

    with pytest.raises(FigureUnavailable, match="no vit-train outputs"):
        write_vit_figures(tmp_path, tmp_path / "fig")


# ---------------------------------------------------------------------------- CLI
@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_cli_vit_train_and_figures(tmp_path: Path, trained: Path) -> None:
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    runner = CliRunner()
    args = ["vit-train", "--out", str(trained), "--drop-path", "0.1", "--epochs", "2",
            "--hidden-size", "16", "--depth", "2", "--heads", "2", "--image-size", "8",
            "--train-limit", "96", "--test-limit", "32", "--batch-size", "32", "--k", "2",
            "--monitor-images", "2", "--final-images", "2"]
    res = runner.invoke(app, ["-q", *args])  # the same config: the finished run is reused
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "test accuracy" in res.output
    res = runner.invoke(app, ["vit-train", "--out", str(tmp_path / "x"), "--drop-path", "2"])
    assert res.exit_code == 2 and res.output.strip().startswith("error:")  # an option error
    res = runner.invoke(app, ["vit-figures", str(trained), "--out", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "f" / "vit_coupling_epochs.png").exists()
    res = runner.invoke(app, ["vit-figures", str(tmp_path / "empty"), "--out", str(tmp_path)])
    assert res.exit_code == 1 and "error:" in res.output
    res = runner.invoke(app, ["vit-grid", "--out", str(tmp_path / "g"), "--executor", "dask"])
    assert res.exit_code == 2 and "choose from ray, local" in res.output
    spec = tmp_path / "grid.yaml"
    spec.write_text("kind: vit-grid\ndrop_path: [0.1]\nweight_decay: [0.05]\nexecutor: local\n"
                    "train:\n" + "".join(
        f"  {k}: {v}\n" for k, v in {**TINY_VIT, "epochs": 1, "monitor_every": 0,
                                     "final_images": 1}.items()))
    res = runner.invoke(app, ["-q", "vit-grid", "--spec", str(spec), "--out", str(tmp_path / "g2")])
    assert res.exit_code == 0, res.output
    assert collect_runs(tmp_path / "g2")["status"].tolist() == ["complete"]
    # the same grid spec through `blockcoupling sweep` (the study's entry point) gives the same
    # run, with the spec's own executor (local: no --executor given), and sweep's --resume
    # and --retries (issue 40: they were dropped without a word)
    res = runner.invoke(app, ["-q", "sweep", str(spec), "--out", str(tmp_path / "g3")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "g3")])
    assert res.exit_code == 1 and "continue it with --resume" in res.output, res.output
    res = runner.invoke(app, ["-q", "sweep", str(spec), "--out", str(tmp_path / "g3"),
                              "--resume", "--retries", "0"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "g4"), "--retries",
                              "-1"])
    assert res.exit_code == 2 and "retries" in res.output and not (tmp_path / "g4").exists()
    g2, g3 = collect_runs(tmp_path / "g2"), collect_runs(tmp_path / "g3")
    assert g3["status"].tolist() == ["complete"]
    assert g3["coupling"].tolist() == g2["coupling"].tolist()


# ---------------------------------------------------------------------------- issue 19
def test_line_fit_matches_scipy_and_says_when_it_cannot_test() -> None:
    from scipy import stats

    from blockcoupling.studies.vit.fits import line_fit

    x, y = np.array([0.0, 0.1, 0.2, 0.3]), np.array([0.01, 0.03, 0.02, 0.06])
    ref = stats.linregress(x, y)
    f = line_fit(x, y)
    assert (f["n"], f["note"]) == (4, None)
    for key, want in (("slope", ref.slope), ("intercept", ref.intercept), ("r2", ref.rvalue**2),
                      ("p", ref.pvalue), ("slope_stderr", ref.stderr)):
        assert f[key] == pytest.approx(want), key
    assert math.isnan(line_fit([0.1], [0.2])["slope"])
    assert math.isnan(line_fit([0.1, 0.1], [0.2, 0.3])["slope"])  # one distinct x


def test_regularisers() -> None:
    from blockcoupling.studies.vit.augment import crop_flip, mix_batch, random_erase, smooth_targets

    y = torch.tensor([0, 2])
    t = smooth_targets(y, 4, 0.1)
    torch.testing.assert_close(t, torch.tensor([[0.925, 0.025, 0.025, 0.025],
                                                [0.025, 0.025, 0.925, 0.025]]))
    g = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 1 * 8 * 8, dtype=torch.float32).reshape(2, 1, 8, 8)
    assert torch.equal(random_erase(x, g, 0.0), x)
    erased = random_erase(x, g, 1.0)
    assert (erased != x).any(dim=(1, 2, 3)).all() and (erased == x).any()  # a part, each image
    # crop without flip: every output pixel is an input pixel or the zero padding
    c = crop_flip(x, g, flip=False)
    assert c.shape == x.shape and set(c.unique().tolist()) <= set(x.unique().tolist()) | {0.0}
    # CutMix: the targets' weight of the pasted image is the pasted area
    rng = np.random.default_rng(0)
    ones = torch.stack([torch.zeros(1, 8, 8), torch.ones(1, 8, 8)])
    mixed, targets = mix_batch(ones, torch.eye(2), mixup=0.0, cutmix=1.0, g=g, rng=rng)
    for i in range(2):
        pasted = float((mixed[i] != ones[i]).float().mean())
        other = 1 - i
        assert float(targets[i, other]) == pytest.approx(pasted) or pasted == 0.0
        assert float(targets[i].sum()) == pytest.approx(1.0)
    same = mix_batch(ones, torch.eye(2), mixup=0.0, cutmix=0.0, g=g, rng=rng)
    assert same[0] is ones


def test_regulariser_options_and_the_paper_recipe() -> None:
    from blockcoupling.studies.vit.train import estimate_cost

    c = VitTrainConfig(augment=True, label_smoothing=0.1, cutmix=1.0, random_erasing=0.25,
                       lr_scaling="linear", batch_size=128)
    assert c.augment == "crop-flip" and c.lr_scale == 0.25
    assert VitTrainConfig(dataset="cifar10").augmentation == "crop-flip"
    assert VitTrainConfig().augmentation == "none"
    for bad, msg in [(dict(augment="randaugment"), "not RandAugment|RandAugment is not"),
                     (dict(label_smoothing=1.0), "label-smoothing"),
                     (dict(random_erasing=1.5), "random-erasing"), (dict(cutmix=-1), "cutmix"),
                     (dict(lr_scaling="sqrt"), "lr-scaling .sqrt.: choose from none, linear"), (dict(tokens="first"), "token")]:
        with pytest.raises(BlockCouplingError, match=msg):
            VitTrainConfig(**bad)
    paper = VitTrainConfig.from_dict({"preset": "paper", "drop_path": 0.2})
    assert (paper.dataset, paper.preset, paper.epochs, paper.warmup_epochs, paper.mixup_alpha,
            paper.lr, paper.drop_path) == ("cifar10", "deit-tiny", 500, 30.0, 0.8, 5e-4, 0.2)
    assert VitTrainConfig.from_options(preset="paper", epochs=None, dataset=None) == \
        VitTrainConfig.from_dict({"preset": "paper"})
    # the estimate: a measured step time scaled to the epochs (nothing trained, no data read)
    tiny = VitTrainConfig(epochs=7, **{**TINY_VIT, "train_limit": 100, "batch_size": 32})
    e = estimate_cost(tiny, steps=1)
    assert e["steps_per_epoch"] == 4 and e["seconds_per_step"] > 0
    assert e["seconds_total"] == pytest.approx(e["seconds_per_epoch"] * 7)
    assert e["cpu_hours_training"] == pytest.approx(e["cpu_seconds_per_step"] * 4 * 7 / 3600)


def test_cli_tokens_last_regularisers_and_estimate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    runner = CliRunner()
    args = ["vit-train", "--hidden-size", "16", "--depth", "2", "--heads", "2",
            "--image-size", "8", "--train-limit", "64", "--test-limit", "16", "--batch-size",
            "32", "--k", "2", "--monitor-images", "1", "--final-images", "2", "--epochs", "1"]
    out = tmp_path / "last"
    res = runner.invoke(app, [*args, "--out", str(out), "--tokens", "last", "--label-smoothing",
                              "0.1", "--random-erasing", "0.5", "--cutmix", "1", "--mixup", "0.8",
                              "--augment", "crop", "--lr-scaling", "linear"])
    assert res.exit_code == 0, res.output
    assert "last patch" in res.output
    m = read_metrics(out)
    assert m["config"]["tokens"] == "last" and m["model"]["tokens"] == "last patch"
    assert m["final"]["coupling"] == m["final"]["coupling_last"]
    assert set(bc.open_run(out / "coupling" / "epoch-0001").coupling["token_out_a"]) == {4}
    assert m["regularisers"]["lr"] == pytest.approx(5e-4 * 32 / 512)
    rep = m["reproducibility"]
    assert rep["torch_threads"] == 1 and rep["seed"] == 0 and rep["torch"] == torch.__version__
    # bad values: one line, exit 2 (refused as the options are parsed), nothing written
    for bad in (["--augment", "randaugment"], ["--label-smoothing", "2"], ["--tokens", "x"],
                ["--lr-scaling", "sqrt"], ["--preset", "paper2"]):
        res = runner.invoke(app, [*args, "--out", str(tmp_path / "bad"), *bad])
        assert res.exit_code == 2 and res.output.strip().startswith("error:"), res.output
        assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "est"), "--estimate"])
    assert res.exit_code == 0 and "estimated (not run)" in res.output, res.output
    assert not (tmp_path / "est").exists()


def test_cli_paper_preset_is_the_recipe_with_overrides(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from blockcoupling.cli import app
    from blockcoupling.studies.vit import train

    seen: list[VitTrainConfig] = []

    def fake(config: VitTrainConfig, **kw) -> dict:
        seen.append(config)
        return {"seconds_per_step": 1.0, "steps_per_epoch": 782, "eval_images_per_epoch": 1,
                "seconds_per_epoch": 60.0, "epochs": config.epochs, "hours_total": 1.0,
                "threads": 1, "measured_steps": 3, "not_counted": "-",
                "cpu_seconds_per_step": 1.0, "cpu_hours_training": 1.0}

    monkeypatch.setattr(train, "estimate_cost", fake)
    runner = CliRunner()
    out = str(tmp_path / "p")
    assert runner.invoke(app, ["vit-train", "--preset", "paper", "--estimate", "--out", out]
                         ).exit_code == 0
    assert runner.invoke(app, ["vit-train", "--preset", "paper", "--estimate", "--out", out,
                               "--epochs", "3", "--dataset", "digits"]).exit_code == 0
    assert seen[0] == VitTrainConfig.from_dict({"preset": "paper"})
    assert (seen[0].dataset, seen[0].epochs, seen[0].preset) == ("cifar10", 500, "deit-tiny")
    assert (seen[1].dataset, seen[1].epochs, seen[1].warmup_epochs) == ("digits", 3, 30.0)
    # without the preset the defaults are the small digits ones
    assert runner.invoke(app, ["vit-train", "--estimate", "--out", out]).exit_code == 0
    assert (seen[2].dataset, seen[2].epochs, seen[2].preset) == ("digits", 5, "tiny")


# ---------------------------------------------------------------------------- issue 30
def test_label_noise_changes_exactly_that_fraction_to_other_classes() -> None:
    from blockcoupling.studies.vit.data import noisy_labels

    y = torch.arange(200) % 10
    for rate in (0.0, 0.2, 0.4):
        z = noisy_labels(y, rate, 10, seed=3)
        assert int((z != y).sum()) == round(rate * 200)  # every chosen label is wrong
        assert z.min() >= 0 and z.max() <= 9
        assert torch.equal(z, noisy_labels(y, rate, 10, seed=3))  # seeded
    assert not torch.equal(noisy_labels(y, 0.4, 10, seed=3), noisy_labels(y, 0.4, 10, seed=4))
    # the wrong labels are spread over the other 9 classes (uniform: each shift 1..9)
    shift = (noisy_labels(torch.zeros(9000, dtype=torch.long), 0.9, 10, seed=0))
    counts = np.bincount(shift.numpy(), minlength=10)
    assert counts[0] == 900 and counts[1:].min() > 800
    with pytest.raises(BlockCouplingError, match="fraction"):
        noisy_labels(y, 1.0, 10, seed=0)


def test_steps_train_exactly_that_many_steps_and_monitor_at_matched_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = VitTrainConfig(steps=7, epochs=2, monitor_every=3, **{**TINY_VIT, "train_limit": 64})
    # 64 images, batch 32: 2 steps per epoch -> 4 epochs, the last one of 1 step
    assert (cfg.steps_per_epoch(64), cfg.total_steps(64), cfg.epochs_for(64)) == (2, 7, 4)
    assert cfg.warmup_steps(64) == round(7 * 1.0 / 2)  # the fraction warmup_epochs/epochs
    assert cfg.measured_epochs(64) == (0, 2, 3, 4)  # steps 3, 6 end in epochs 2, 3; the last
    # epoch mode is unchanged: every monitor_every-th epoch and the last
    assert VitTrainConfig(epochs=5, monitor_every=2).measured_epochs(1437) == (0, 2, 4, 5)
    seen: list[int] = []
    opt_steps = []
    real_step = torch.optim.AdamW.step

    def count(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        opt_steps.append(1)
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", count)
    train_vit(cfg, tmp_path / "run", progress=False, on_epoch=lambda r: seen.append(r["epoch"]))
    monkeypatch.undo()
    assert len(opt_steps) == 7 and seen == [0, 1, 2, 3, 4]
    m = read_metrics(tmp_path / "run")
    assert m["data"]["steps"] == 7 and m["cpu_seconds_total"] > 0
    assert [e["epoch"] for e in m["epochs"] if not math.isnan(e["coupling"])] == [0, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "run" / "coupling").iterdir()) == [
        "epoch-0000", "epoch-0002", "epoch-0003", "epoch-0004", "final"]


def test_label_noise_training_records_it_and_keeps_the_test_labels(tmp_path: Path) -> None:
    cfg = VitTrainConfig(epochs=1, label_noise=0.25, monitor_every=0, **TINY_VIT)
    data = load_image_data("digits", image_size=8, train_limit=96, test_limit=32)
    before = data.train_y.clone()
    train_vit(cfg, tmp_path, progress=False, data=data)
    assert torch.equal(data.train_y, before)  # a shared data set is not changed
    m = read_metrics(tmp_path)
    assert m["data"]["label_noise"] == 0.25 and m["data"]["wrong_labels"] == 24
    # noise 0 is the default's identity: the same key, the same unit id as before the option
    assert VitTrainConfig(label_noise=0.0).key() == VitTrainConfig().key()
    assert VitTrainConfig(label_noise=0.2).key() != VitTrainConfig().key()


def test_grid_ids_are_unchanged_and_extra_axes_name_the_runs(tmp_path: Path) -> None:
    """The unit ids of the drop-path x weight-decay grids are pinned (resumed unchanged); a
    grid that varies the training-set size and label noise names them in its runs."""
    from blockcoupling.studies.vit.grid import grid_unit

    assert VitTrainConfig().key() == "748982d1a605"
    assert grid_unit(VitTrainConfig()).unit_id == "dp0.1-wd0.05-s0-e560ee225563"
    assert grid_unit(VitTrainConfig(train_limit=96, epochs=2, drop_path=0.1)).unit_id == \
        "dp0.1-wd0.05-s0-d7283756be30"
    configs = grid_configs(VitTrainConfig(), (0.1,), (0.05,), (0, 1), train_limits=(90, 180),
                           label_noises=(0.0, 0.4))
    names = [run_name(c, ("train_limit", "label_noise")) for c in configs]
    assert names[:3] == ["n90-noise0-dp0.1-wd0.05-s0", "n90-noise0-dp0.1-wd0.05-s1",
                         "n90-noise0.4-dp0.1-wd0.05-s0"] and len(set(names)) == 8
    assert {c.label_noise for c in configs} == {None, 0.4}
    with pytest.raises(BlockCouplingError, match="repeats a point"):
        grid_configs(VitTrainConfig(), (0.1,), (0.05,), (0,), train_limits=(90, 90))
    base = VitTrainConfig(epochs=1, monitor_every=0, **{**TINY_VIT, "final_images": 1})
    runs = run_grid(base, tmp_path / "g", drop_paths=(0.1,), weight_decays=(0.05,),
                    train_limits=(48, 96), label_noises=(0.0, 0.5), executor="local",
                    progress=False)
    assert set(runs["status"]) == {"complete"}
    assert sorted(zip(runs["n_train"], runs["label_noise"], strict=True)) == [
        (48, 0.0), (48, 0.5), (96, 0.0), (96, 0.5)]
    manifest = json.loads((tmp_path / "g" / "sweep.json").read_text())["spec"]["vit-grid"]
    assert manifest["train_limits"] == [48, 96] and manifest["label_noises"] == [0, 0.5]
    assert manifest["base"]["train_limit"] is None  # an axis: not part of the base
    spec = tmp_path / "g.yaml"  # the same axes from a grid spec
    spec.write_text("kind: vit-grid\ndrop_path: [0.1]\nweight_decay: [0.05]\n"
                    "train_limit: [48, 96]\nlabel_noise: [0, 0.5]\ntrain: {epochs: 1}\n")
    from blockcoupling.studies.vit.grid import load_grid_spec

    _, kwargs = load_grid_spec(spec)
    assert kwargs["train_limits"] == [48, 96] and kwargs["label_noises"] == [0.0, 0.5]
    with pytest.raises(BlockCouplingError, match="train.train_limit is set by the grid"):
        load_grid_spec({"train_limit": [48], "train": {"train_limit": 10}})


def test_one_headline_for_one_vit_output(tmp_path: Path) -> None:
    """show, report, sweep-status and vit-train state the same headline (value, se, K, the
    number of images) for one ViT output, each with the token rule it used ([CLS] = the
    first measured token), which the final run's meta carries."""
    from typer.testing import CliRunner

    from blockcoupling.cli import app
    from blockcoupling.studies.sweep import open_collection

    base = VitTrainConfig(epochs=1, monitor_every=0, **{**TINY_VIT, "final_images": 3})
    run_grid(base, tmp_path / "g", drop_paths=(0.1,), weight_decays=(0.05,), executor="local",
             progress=False)
    unit = next(p for p in (tmp_path / "g" / "units").iterdir())
    final = unit / "coupling" / "final"
    run = bc.open_run(final)
    assert run.meta["headline_tokens"] == "first" and run.headline_tokens == "first"
    m = read_metrics(unit)["final"]
    st = run.coupling_statistic(n_boot=0).set_index("variant")  # the run's own rule
    assert st.loc["coupling_vs_null", "mean"] == pytest.approx(m["coupling_vs_null"], abs=1e-12)
    assert m["coupling_vs_null"] == m["coupling_vs_null_cls"] != m["coupling_vs_null_last"]
    want = f"{m['coupling_vs_null']:.4f} ± {m['coupling_vs_null_se']:.4f}"
    lead = f"{st.loc['coupling_vs_rotated', 'mean']:.4f} ± {st.loc['coupling_vs_rotated', 'se']:.4f}"
    runner = CliRunner()
    args = ["vit-train", "--out", str(unit), "--drop-path", "0.1", "--weight-decay", "0.05",
            "--epochs", "1", "--monitor-every", "0", "--hidden-size", "16", "--depth", "2",
            "--heads", "2", "--image-size", "8", "--train-limit", "96", "--test-limit", "32",
            "--batch-size", "32", "--k", "2", "--monitor-images", "2", "--final-images", "3"]
    outputs = {"vit-train": runner.invoke(app, args),
               "show": runner.invoke(app, ["show", str(final)]),
               "sweep-status": runner.invoke(app, ["sweep-status", str(tmp_path / "g")])}
    res = runner.invoke(app, ["report", str(final), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    import html

    page = html.unescape((tmp_path / "r.html").read_text())
    rule = "each prompt's first measured token"
    for name, res in outputs.items():
        assert res.exit_code == 0, (name, res.output)
        assert f"above chance (coupling_vs_rotated) {lead}" in res.output, (name, res.output)
        assert f"(coupling_vs_null) {want}" in res.output, (name, res.output)
        assert "K=2, 3 prompts" in res.output, name
        assert rule in res.output and "last measured token" not in res.output, name
    assert f"(coupling_vs_null) {want}" in page and rule in page
    # the JSON readers state the same rule
    js = json.loads(runner.invoke(app, ["show", str(final), "--json"]).output)
    assert {r["tokens"] for r in js["statistic"]} == {"first"}
    js = json.loads(runner.invoke(app, ["sweep-status", str(tmp_path / "g"), "--json"]).output)
    assert js["statistic"]["tokens"] == "first" and rule in js["statistic"]["description"]
    assert open_collection(tmp_path / "g").default_tokens == "first"


def test_a_vit_grid_has_one_token_rule_in_sweep_status_and_correlate(tmp_path: Path) -> None:
    """Issue 33: a collection's token rule (its manifest's, else its kind's: a ViT grid's
    [CLS]) is the one default of every command that reads it: ``sweep-status`` and
    ``correlate`` state the same rule and the same per-model numbers, as the grid wrote it
    ([CLS], "first"), with the manifest's statement removed (the kind's rule), and with the
    manifest stating another rule (the collection's, not the runs' own)."""
    from typer.testing import CliRunner

    from blockcoupling.cli import app
    from blockcoupling.runs import kinds
    from blockcoupling.store import collection as store

    base = VitTrainConfig(epochs=1, monitor_every=0, **{**TINY_VIT, "final_images": 3})
    root = tmp_path / "g"
    run_grid(base, root, drop_paths=(0.0, 0.1, 0.2), weight_decays=(0.05,), executor="local",
             progress=False)
    labels = [run_name(base.replace(drop_path=d, weight_decay=0.05)) for d in (0.0, 0.1, 0.2)]
    scores = tmp_path / "scores.csv"
    pd.DataFrame({"model": labels, "score": [0.1, 0.5, 0.3]}).to_csv(scores, index=False)
    runner = CliRunner()
    variants = ("coupling", "coupling_vs_null", "coupling_vs_rotated")

    def both() -> tuple[str, dict[str, dict[str, float]]]:
        status = runner.invoke(app, ["sweep-status", str(root), "--json"])
        corr = runner.invoke(app, ["correlate", str(root), "--scores", str(scores), "--json",
                                   "--n-boot", "0"])
        assert status.exit_code == 0 and corr.exit_code == 0, (status.output, corr.output)
        st, co = json.loads(status.output), json.loads(corr.output)
        rules = {st["statistic"]["tokens"], *(r["tokens"] for r in co["statistic"].values())}
        assert len(rules) == 1, rules  # one rule, stated by both
        by_label = {r["label"]: r for r in st["summary"]}
        numbers = {}
        for row in co["models"]:
            mine = by_label[row["label"]]
            assert row["k"] == mine["k"]
            for v in variants:
                assert row[f"{v}_mean"] == pytest.approx(mine[f"{v}_mean"], rel=1e-12), v
                assert row[f"{v}_se"] == pytest.approx(mine[f"{v}_se"], rel=1e-12), v
            numbers[row["label"]] = {v: row[f"{v}_mean"] for v in variants}
        assert sorted(numbers) == sorted(labels)
        return rules.pop(), numbers

    written, cls = both()
    assert written == "first" == kinds.get("vit-grid").headline_tokens
    from blockcoupling.studies.vit.grid import headline_tokens  # the grid's --tokens default

    assert headline_tokens({}) == kinds.get("vit-grid").headline_tokens
    manifest = store.load_manifest(root)
    del manifest["headline_tokens"]  # a grid whose manifest states none: its kind's rule
    store.write_json(root / store.MANIFEST, manifest)
    assert both() == ("first", cls)
    manifest["headline_tokens"] = "last"  # the collection's own statement wins everywhere
    store.write_json(root / store.MANIFEST, manifest)
    stated, last = both()
    assert stated == "last" and last != cls  # the rules give other numbers: the test can fail


def test_conditional_accuracy_fits_match_scipy_and_draw_fig12() -> None:
    from scipy import stats

    from blockcoupling.studies.vit.fits import conditional_fits, fits_table
    from blockcoupling.studies.vit.report import plot_accuracy_fits

    rng = np.random.default_rng(0)
    rows = []
    for dp in (0.0, 0.1, 0.3):
        for wd in (0.01, 0.05, 0.1, 0.2):
            c = 0.05 + 0.2 * dp + 0.01 * rng.standard_normal()
            rows.append({"name": f"dp{dp}-wd{wd}", "status": "complete", "drop_path": dp,
                         "weight_decay": wd, "coupling_vs_null": c,
                         "coupling_vs_null_se": 0.001,
                         "test_accuracy": 0.8 + 0.5 * c + 0.01 * rng.standard_normal()})
    runs = pd.DataFrame(rows)
    fits = conditional_fits(runs)
    for fixed, n_groups, n in (("drop_path", 3, 4), ("weight_decay", 4, 3)):
        groups = fits[f"accuracy_by_{fixed}"]
        assert len(groups) == n_groups
        for f in groups:
            sub = runs[runs[fixed] == f[fixed]]
            ref = stats.linregress(sub["coupling_vs_null"], sub["test_accuracy"])
            assert f["n"] == n and f["y"] == "test_accuracy"
            assert f["slope"] == pytest.approx(ref.slope)
            assert f["r2"] == pytest.approx(ref.rvalue ** 2) and f["p"] == pytest.approx(ref.pvalue)
            assert [q["x"] for q in f["points"]] == sub["coupling_vs_null"].tolist()
    table = fits_table(fits)
    assert (table["fit"] == "accuracy_by_weight_decay").sum() == 4
    fig = plot_accuracy_fits(fits, "weight_decay")  # fig. 12: one panel per weight decay
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 4
    for ax, f in zip(panels, fits["accuracy_by_weight_decay"], strict=True):
        assert f"wd {f['weight_decay']:g}" in ax.get_title() and "R$^2$" in ax.get_title()
        line = ax.get_lines()[-1]
        xs = line.get_xdata()
        np.testing.assert_allclose(line.get_ydata(), f["intercept"] + f["slope"] * xs)
    assert len([a for a in plot_accuracy_fits(fits, "drop_path").axes if a.get_visible()]) == 3
