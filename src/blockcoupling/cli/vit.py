"""The ViT study's commands: ``vit-train``, ``vit-grid``, ``vit-figures``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import CLUSTER_CPUS_HELP, JSON_HELP, app, echo_json, guarded, one_value
from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import fail as _fail
from blockcoupling.errors import BlockCouplingError

_Dataset = Annotated[str, typer.Option(help="digits (offline, scikit-learn) or cifar10.")]
_Epochs = Annotated[int, typer.Option(help="Training epochs (per run in a grid; the paper: 500).")]
_Preset = Annotated[str, typer.Option(help="Model shape: tiny, small, deit-tiny (192 wide, 12 deep, 3 heads).")]
_HiddenSize = Annotated[int | None, typer.Option(help="Override the preset's width.")]
_Depth = Annotated[int | None, typer.Option(help="Override the preset's depth (the ICLR text: 24).")]
_Heads = Annotated[int | None, typer.Option(help="Override the preset's heads.")]
_ImageSize = Annotated[int | None, typer.Option(help="Image side in pixels (default 16 digits, 32 CIFAR-10).")]
_Lr = Annotated[float, typer.Option(help="Peak learning rate.")]
_BatchSize = Annotated[int, typer.Option(help="Images per step.")]
_WarmupEpochs = Annotated[float, typer.Option(help="Linear warm-up length in epochs.")]
_Mixup = Annotated[float | None, typer.Option(help="Mixup alpha (default 0.8 on CIFAR-10, 0 on digits).")]
_DataDir = Annotated[Path | None, typer.Option(help="CIFAR-10 folder: DIR/train/<class>/*.png, DIR/test/<class>/*.png.")]
_TrainLimit = Annotated[int | None, typer.Option(help="Use a seeded subset of the training split.")]
_TestLimit = Annotated[int | None, typer.Option(help="Use a seeded subset of the test split.")]
_MonitorImages = Annotated[int, typer.Option(help="Test images measured during training.")]
_MonitorEvery = Annotated[int, typer.Option(help="Measure every N epochs (0: only at the end).")]
_FinalImages = Annotated[int, typer.Option(help="Test images measured on the trained model.")]
_K = Annotated[str, typer.Option("--k", help="Top-K of the coupling: one value (the option takes a comma-separated list in every command; here a list of one).")]


def _floats(value: str, what: str) -> list[float]:
    try:
        return [float(v) for v in value.split(",") if v.strip()]
    except ValueError as err:
        raise BlockCouplingError(f"{what}={value!r}: give comma-separated numbers") from err


def _train_config(**kw: Any) -> Any:
    from blockcoupling.studies.vit.train import VitTrainConfig

    return VitTrainConfig(**kw)


def _common(dataset: str, epochs: int, preset: str, hidden_size: int | None, depth: int | None,
            heads: int | None, image_size: int | None, lr: float, batch_size: int,
            warmup_epochs: float, mixup: float | None, seed: int, data_dir: Path | None,
            train_limit: int | None, test_limit: int | None, monitor_images: int,
            monitor_every: int, final_images: int, k: str) -> dict[str, Any]:
    return dict(dataset=dataset, epochs=epochs, preset=preset, hidden_size=hidden_size,
                depth=depth, heads=heads, image_size=image_size, lr=lr, batch_size=batch_size,
                warmup_epochs=warmup_epochs, mixup=mixup, seed=seed,
                data_dir=str(data_dir) if data_dir is not None else None,
                train_limit=train_limit, test_limit=test_limit, monitor_images=monitor_images,
                monitor_every=monitor_every, final_images=final_images,
                k=one_value(k, "--k", int))


@app.command("vit-train")
def vit_train(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (model/, metrics.json, coupling/).")],
    dataset: _Dataset = "digits",
    drop_path: Annotated[float, typer.Option(help="Stochastic-depth rate (linear over blocks, as DeiT).")] = 0.1,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.05,
    epochs: _Epochs = 5,
    preset: _Preset = "tiny",
    hidden_size: _HiddenSize = None,
    depth: _Depth = None,
    heads: _Heads = None,
    image_size: _ImageSize = None,
    lr: _Lr = 5e-4,
    batch_size: _BatchSize = 64,
    warmup_epochs: _WarmupEpochs = 1.0,
    mixup: _Mixup = None,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation, order and augmentation.")] = 0,
    data_dir: _DataDir = None,
    train_limit: _TrainLimit = None,
    test_limit: _TestLimit = None,
    monitor_images: _MonitorImages = 4,
    monitor_every: _MonitorEvery = 1,
    final_images: _FinalImages = 16,
    k: _K = "10",
    threads: Annotated[int | None, typer.Option(help="torch threads (default: torch's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Train a DeiT-style ViT with stochastic depth and measure its coupling as it trains."""
    from blockcoupling.studies.vit.train import read_metrics, train_vit

    with guarded(saved=f"finished epochs are saved in {out}"):
        cfg = _train_config(drop_path=drop_path, weight_decay=weight_decay, **_common(
            dataset, epochs, preset, hidden_size, depth, heads, image_size, lr, batch_size,
            warmup_epochs, mixup, seed, data_dir, train_limit, test_limit, monitor_images,
            monitor_every, final_images, k))
        path = train_vit(cfg, out, progress=not _STATE["quiet"], threads=threads)
        m = read_metrics(path)
    if as_json:
        echo_json({"out": str(path), **m})
    else:  # -q hides progress and chatter, never results
        f = m["final"]
        typer.echo(f"test accuracy {f['test_accuracy']:.3f}, train accuracy "
                   f"{f['train_accuracy']:.3f}, mean depth-wise coupling (CLS, K={cfg.k}) "
                   f"{f['coupling']:.4f} on {f['images']} test images")
        typer.echo(f"wrote {path}")


@app.command("vit-grid")
def vit_grid(
    out: Annotated[Path, typer.Option("--out", "-o", help="Grid folder (grid.json, runs/<point>/).")],
    spec: Annotated[Path | None, typer.Option("--spec", help="YAML grid spec (drop_path, weight_decay, seeds, train: {...}); replaces the other options.")] = None,
    drop_paths: Annotated[str, typer.Option("--drop-path", help="Comma-separated rates (default: the paper's 8).")] = "0,0.025,0.05,0.075,0.1,0.15,0.2,0.3",
    weight_decays: Annotated[str, typer.Option("--weight-decay", help="Comma-separated decays (default: the paper's 8).")] = "0.005,0.01,0.02,0.04,0.06,0.08,0.1,0.2",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0",
    executor: Annotated[str, typer.Option(help="ray (one task per run) or local.")] = "ray",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: start a local one).")] = None,
    cpus_per_run: Annotated[int, typer.Option(help="CPUs of each run's Ray task.")] = 1,
    cluster_cpus: Annotated[int | None, typer.Option(help=CLUSTER_CPUS_HELP)] = None,
    dataset: _Dataset = "digits",
    epochs: _Epochs = 5,
    preset: _Preset = "tiny",
    hidden_size: _HiddenSize = None,
    depth: _Depth = None,
    heads: _Heads = None,
    image_size: _ImageSize = None,
    lr: _Lr = 5e-4,
    batch_size: _BatchSize = 64,
    warmup_epochs: _WarmupEpochs = 1.0,
    mixup: _Mixup = None,
    data_dir: _DataDir = None,
    train_limit: _TrainLimit = None,
    test_limit: _TestLimit = None,
    monitor_images: _MonitorImages = 4,
    monitor_every: _MonitorEvery = 1,
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
                monitor_every, final_images, k))
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
                "coupling_chance"]
        typer.echo(runs[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        typer.echo(f"{len(runs) - len(failed)} of {len(runs)} training runs complete; wrote {out}")
    if len(failed):
        typer.echo(f"error: {len(failed)} run(s) did not finish; see {out}/grid.json", err=True)
        raise typer.Exit(1)


@app.command("vit-figures")
def vit_figures(
    root: Annotated[Path, typer.Argument(help="A vit-grid folder, or any folder of vit-train outputs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the figures and tables.")] = Path("vit_figures"),
) -> None:
    """Coupling vs drop-path rate, vs test accuracy, and across epochs (PNG + CSV)."""
    from blockcoupling.studies.vit.report import write_vit_figures

    try:
        paths = write_vit_figures(root, out)
    except BlockCouplingError as err:
        _fail(err)
        return
    for p in paths:
        typer.echo(f"wrote {p}")
