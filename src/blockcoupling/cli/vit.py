"""The ViT study's commands: ``vit-train``, ``vit-grid``, ``vit-figures``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import (
    CLUSTER_CPUS_HELP,
    JSON_HELP,
    app,
    echo_json,
    guarded,
    one_value,
    user_errors,
)
from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.errors import BlockCouplingError

_Dataset = Annotated[str | None, typer.Option(help="digits (offline, scikit-learn; the default) or cifar10.")]
_Epochs = Annotated[int | None, typer.Option(help="Training epochs, per run in a grid (default 5; the paper: 500).")]
_Preset = Annotated[str, typer.Option(help="Model shape: tiny, small, deit-tiny (192 wide, 12 deep, 3 heads); or the recipe 'paper' (DeiT-Tiny, CIFAR-10, 500 epochs, 30 warm-up, AdamW 5e-4 cosine, mixup 0.8, crop-flip; other options override it).")]
_HiddenSize = Annotated[int | None, typer.Option(help="Override the preset's width.")]
_Depth = Annotated[int | None, typer.Option(help="Override the preset's depth (the ICLR text: 24).")]
_Heads = Annotated[int | None, typer.Option(help="Override the preset's heads.")]
_ImageSize = Annotated[int | None, typer.Option(help="Image side in pixels (default 16 digits, 32 CIFAR-10).")]
_Lr = Annotated[float | None, typer.Option(help="Peak learning rate (default 5e-4).")]
_BatchSize = Annotated[int, typer.Option(help="Images per step.")]
_WarmupEpochs = Annotated[float | None, typer.Option(help="Linear warm-up length in epochs (default 1; the paper: 30).")]
_Mixup = Annotated[float | None, typer.Option(help="Mixup alpha (default 0.8 on CIFAR-10, 0 on digits).")]
_DataDir = Annotated[Path | None, typer.Option(help="CIFAR-10 folder: DIR/train/<class>/*.png, DIR/test/<class>/*.png.")]
_TrainLimit = Annotated[int | None, typer.Option(help="Use a seeded subset of the training split.")]
_TestLimit = Annotated[int | None, typer.Option(help="Use a seeded subset of the test split.")]
_MonitorImages = Annotated[int, typer.Option(help="Test images measured during training.")]
_MonitorEvery = Annotated[int | None, typer.Option(help="Measure every N epochs (0: only at the end; default 1, the paper 10).")]
_FinalImages = Annotated[int, typer.Option(help="Test images measured on the trained model.")]
_Tokens = Annotated[str, typer.Option(help="Headline token of the coupling: cls ([CLS], default), last (the last patch, the authors' released code), all. The final measurement also reports [CLS] and last.")]
_Augment = Annotated[str | None, typer.Option(help="none, crop (pad 4, random crop) or crop-flip (and a horizontal flip); tensor operations, NOT RandAugment. Default: crop-flip on CIFAR-10, none on digits.")]
_Cutmix = Annotated[float, typer.Option(help="CutMix Beta alpha (0 = off; DeiT: 1.0; with --mixup too, one of them per batch).")]
_Smoothing = Annotated[float, typer.Option(help="Label smoothing epsilon (DeiT: 0.1).")]
_Erasing = Annotated[float, typer.Option(help="Random-erasing probability per image (DeiT: 0.25).")]
_LrScaling = Annotated[str, typer.Option(help="none, or linear: lr and min lr times batch-size/512 (DeiT's rule).")]
_K = Annotated[str, typer.Option("--k", help="Top-K of the coupling: one value (the option takes a comma-separated list in every command; here a list of one).")]


def _floats(value: str, what: str) -> list[float]:
    try:
        return [float(v) for v in value.split(",") if v.strip()]
    except ValueError as err:
        raise BlockCouplingError(f"{what}={value!r}: give comma-separated numbers") from err


def _train_config(**kw: Any) -> Any:
    """The config of the given options (None: unset; ``preset=paper`` starts from the recipe)."""
    from blockcoupling.studies.vit.train import VitTrainConfig

    return VitTrainConfig.from_options(**kw)


def _common(dataset: str | None, epochs: int | None, preset: str, hidden_size: int | None,
            depth: int | None, heads: int | None, image_size: int | None, lr: float | None,
            batch_size: int, warmup_epochs: float | None, mixup: float | None, seed: int,
            data_dir: Path | None, train_limit: int | None, test_limit: int | None,
            monitor_images: int, monitor_every: int | None, final_images: int, k: str,
            **regularisers: Any) -> dict[str, Any]:
    return dict(dataset=dataset, epochs=epochs, preset=preset, hidden_size=hidden_size,
                depth=depth, heads=heads, image_size=image_size, lr=lr, batch_size=batch_size,
                warmup_epochs=warmup_epochs, mixup=mixup, seed=seed,
                data_dir=str(data_dir) if data_dir is not None else None,
                train_limit=train_limit, test_limit=test_limit, monitor_images=monitor_images,
                monitor_every=monitor_every, final_images=final_images,
                k=one_value(k, "--k", int), **regularisers)


@app.command("vit-train")
def vit_train(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (model/, metrics.json, coupling/).")],
    dataset: _Dataset = None,
    drop_path: Annotated[float, typer.Option(help="Stochastic-depth rate (linear over blocks, as DeiT).")] = 0.1,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.05,
    epochs: _Epochs = None,
    preset: _Preset = "tiny",
    hidden_size: _HiddenSize = None,
    depth: _Depth = None,
    heads: _Heads = None,
    image_size: _ImageSize = None,
    lr: _Lr = None,
    batch_size: _BatchSize = 64,
    warmup_epochs: _WarmupEpochs = None,
    mixup: _Mixup = None,
    cutmix: _Cutmix = 0.0,
    augment: _Augment = None,
    label_smoothing: _Smoothing = 0.0,
    random_erasing: _Erasing = 0.0,
    lr_scaling: _LrScaling = "none",
    tokens: _Tokens = "cls",
    seed: Annotated[int, typer.Option(help="Seed of the initialisation, order and augmentation.")] = 0,
    data_dir: _DataDir = None,
    train_limit: _TrainLimit = None,
    test_limit: _TestLimit = None,
    monitor_images: _MonitorImages = 4,
    monitor_every: _MonitorEvery = None,
    final_images: _FinalImages = 16,
    k: _K = "10",
    threads: Annotated[int | None, typer.Option(help="torch threads (default: torch's).")] = None,
    estimate: Annotated[bool, typer.Option("--estimate", help="Time a few training steps of this config on random images and print the estimated cost of the whole training; train nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Train a DeiT-style ViT with stochastic depth and measure its coupling as it trains."""
    from blockcoupling.studies.vit.train import estimate_cost, read_metrics, train_vit

    with guarded(saved=f"finished epochs are saved in {out}"):
        cfg = _train_config(drop_path=drop_path, weight_decay=weight_decay, **_common(
            dataset, epochs, preset, hidden_size, depth, heads, image_size, lr, batch_size,
            warmup_epochs, mixup, seed, data_dir, train_limit, test_limit, monitor_images,
            monitor_every, final_images, k, cutmix=cutmix, augment=augment,
                label_smoothing=label_smoothing, random_erasing=random_erasing,
                lr_scaling=lr_scaling, tokens=tokens))
        if estimate:
            e = estimate_cost(cfg, threads=threads)
            if as_json:
                echo_json(e)
                return
            typer.echo(f"estimated (not run): {e['seconds_per_step']:.2f} s per step x "
                       f"{e['steps_per_epoch']} steps + eval of {e['eval_images_per_epoch']} "
                       f"images = {e['seconds_per_epoch'] / 60:.1f} min per epoch; "
                       f"{e['epochs']} epochs = {e['hours_total']:.1f} h on {e['threads']} "
                       f"thread(s) (from {e['measured_steps']} timed steps; not counted: "
                       f"{e['not_counted']}); CPU time {e['cpu_seconds_per_step']:.2f} s per "
                       f"step, {e['cpu_hours_training']:.1f} h of training steps (the wall "
                       "time on an idle machine)")
            return
        path = train_vit(cfg, out, progress=not _STATE["quiet"], threads=threads)
        m = read_metrics(path)
    if as_json:
        echo_json({"out": str(path), **m})
    else:  # -q hides progress and chatter, never results
        f = m["final"]
        typer.echo(f"test accuracy {f['test_accuracy']:.3f}, train accuracy "
                   f"{f['train_accuracy']:.3f}, depth-wise coupling ({cfg.tokens}, K={cfg.k}, "
                   f"{f['images']} test images): coupling_vs_null {f['coupling_vs_null']:.4f} "
                   f"+- {f['coupling_vs_null_se']:.4f}, raw {f['coupling']:.4f} "
                   f"+- {f['coupling_se']:.4f}; [CLS] {f['coupling_vs_null_cls']:.4f} "
                   f"+- {f['coupling_vs_null_se_cls']:.4f}, last patch "
                   f"{f['coupling_vs_null_last']:.4f} +- {f['coupling_vs_null_se_last']:.4f}")
        typer.echo(f"wrote {path}")


@app.command("vit-grid")
def vit_grid(
    out: Annotated[Path, typer.Option("--out", "-o", help="Grid folder: a vit-grid collection (sweep.json, status/, units/<id>/).")],
    spec: Annotated[Path | None, typer.Option("--spec", help="YAML grid spec (drop_path, weight_decay, seeds, train: {...}); replaces the other options.")] = None,
    drop_paths: Annotated[str, typer.Option("--drop-path", help="Comma-separated rates (default: the paper's 8).")] = "0,0.025,0.05,0.075,0.1,0.15,0.2,0.3",
    weight_decays: Annotated[str, typer.Option("--weight-decay", help="Comma-separated decays (default: the paper's 8).")] = "0.005,0.01,0.02,0.04,0.06,0.08,0.1,0.2",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0",
    executor: Annotated[str, typer.Option(help="ray (one task per run) or local.")] = "ray",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: start a local one).")] = None,
    cpus_per_run: Annotated[int, typer.Option(help="CPUs of each run's Ray task.")] = 1,
    cluster_cpus: Annotated[int | None, typer.Option(help=CLUSTER_CPUS_HELP)] = None,
    dataset: _Dataset = None,
    epochs: _Epochs = None,
    preset: _Preset = "tiny",
    hidden_size: _HiddenSize = None,
    depth: _Depth = None,
    heads: _Heads = None,
    image_size: _ImageSize = None,
    lr: _Lr = None,
    batch_size: _BatchSize = 64,
    warmup_epochs: _WarmupEpochs = None,
    mixup: _Mixup = None,
    cutmix: _Cutmix = 0.0,
    augment: _Augment = None,
    label_smoothing: _Smoothing = 0.0,
    random_erasing: _Erasing = 0.0,
    lr_scaling: _LrScaling = "none",
    tokens: _Tokens = "cls",
    data_dir: _DataDir = None,
    train_limit: _TrainLimit = None,
    test_limit: _TestLimit = None,
    monitor_images: _MonitorImages = 4,
    monitor_every: _MonitorEvery = None,
    final_images: _FinalImages = 16,
    k: _K = "10",
    threads: Annotated[int, typer.Option(help="torch threads per run.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Train the drop-path x weight-decay grid (one run per point; finished runs are skipped)."""
    from blockcoupling.studies.vit.grid import load_grid_spec, run_grid

    with guarded(saved=f"finished runs are saved in {out}"):
        if spec is not None:
            base, kwargs = load_grid_spec(spec)
        else:
            base = _train_config(**_common(
                dataset, epochs, preset, hidden_size, depth, heads, image_size, lr, batch_size,
                warmup_epochs, mixup, 0, data_dir, train_limit, test_limit, monitor_images,
                monitor_every, final_images, k, cutmix=cutmix, augment=augment,
                label_smoothing=label_smoothing, random_erasing=random_erasing,
                lr_scaling=lr_scaling, tokens=tokens))
            kwargs = dict(drop_paths=_floats(drop_paths, "--drop-path"),
                          weight_decays=_floats(weight_decays, "--weight-decay"),
                          seeds=_floats(seeds, "seeds"), executor=executor,
                          address=address, num_cpus=cpus_per_run, threads=threads,
                          cluster_cpus=cluster_cpus)
        runs = run_grid(base, out, progress=not _STATE["quiet"], **kwargs)
    report_grid(runs, out, as_json=as_json)


def report_grid(runs: Any, out: Path, *, as_json: bool = False) -> None:
    """Print a finished grid's runs (test accuracy, coupling above chance with its se, raw
    coupling and its chance level; ``as_json``: every column as JSON); exit 1 if any did not
    finish. Shared by ``vit-grid`` and ``sweep`` on a grid spec."""
    failed = runs[runs["status"] != "complete"]
    if as_json:
        echo_json({"grid_dir": str(out), "complete": len(runs) - len(failed),
                   "failed": len(failed), "runs": runs})
    else:  # -q hides progress and chatter, never results
        cols = ["name", "test_accuracy", "coupling_vs_null", "coupling_vs_null_se", "coupling",
                "coupling_chance", "coupling_vs_null_cls", "coupling_vs_null_last"]
        typer.echo(runs[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        typer.echo(f"{len(runs) - len(failed)} of {len(runs)} training runs complete; wrote {out}")
    if len(failed):
        typer.echo(f"error: {len(failed)} run(s) did not finish; see `blockcoupling "
                   f"sweep-status {out}`", err=True)
        raise typer.Exit(1)


@app.command("vit-figures")
def vit_figures(
    root: Annotated[Path, typer.Argument(help="A vit-grid collection, or any folder of vit-train outputs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the figures and tables.")] = Path("vit_figures"),
) -> None:
    """Coupling vs drop-path rate, vs test accuracy, across epochs, and the pooled and
    conditional fits (PNG + CSV + fits.json)."""
    from blockcoupling.studies.vit.report import write_vit_figures

    with user_errors("cannot read the runs or write the figures"):
        paths = write_vit_figures(root, out)
    if not _STATE["quiet"]:
        for p in paths:
            typer.echo(f"wrote {p}")
