"""The ViT study's commands: ``vit-train``, ``vit-grid``, ``vit-figures``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.app import app, guarded, user_errors
from blockcoupling.errors import BlockCouplingError

_Dataset = Annotated[str, typer.Option(help="digits (offline, scikit-learn) or cifar10.")]


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
            monitor_every: int, final_images: int, k: int) -> dict[str, Any]:
    return dict(dataset=dataset, epochs=epochs, preset=preset, hidden_size=hidden_size,
                depth=depth, heads=heads, image_size=image_size, lr=lr, batch_size=batch_size,
                warmup_epochs=warmup_epochs, mixup=mixup, seed=seed,
                data_dir=str(data_dir) if data_dir is not None else None,
                train_limit=train_limit, test_limit=test_limit, monitor_images=monitor_images,
                monitor_every=monitor_every, final_images=final_images, k=k)


@app.command("vit-train")
def vit_train(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (model/, metrics.json, coupling/).")],
    dataset: _Dataset = "digits",
    drop_path: Annotated[float, typer.Option(help="Stochastic-depth rate (linear over blocks, as DeiT).")] = 0.1,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.05,
    epochs: Annotated[int, typer.Option(help="Training epochs (the paper: 500).")] = 5,
    preset: Annotated[str, typer.Option(help="Model shape: tiny, small, deit-tiny (192 wide, 12 deep, 3 heads).")] = "tiny",
    hidden_size: Annotated[int | None, typer.Option(help="Override the preset's width.")] = None,
    depth: Annotated[int | None, typer.Option(help="Override the preset's depth (the ICLR text: 24).")] = None,
    heads: Annotated[int | None, typer.Option(help="Override the preset's heads.")] = None,
    image_size: Annotated[int | None, typer.Option(help="Image side in pixels (default 16 digits, 32 CIFAR-10).")] = None,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 5e-4,
    batch_size: Annotated[int, typer.Option(help="Images per step.")] = 64,
    warmup_epochs: Annotated[float, typer.Option(help="Linear warm-up length in epochs.")] = 1.0,
    mixup: Annotated[float | None, typer.Option(help="Mixup alpha (default 0.8 on CIFAR-10, 0 on digits).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation, order and augmentation.")] = 0,
    data_dir: Annotated[Path | None, typer.Option(help="CIFAR-10 folder: DIR/train/<class>/*.png, DIR/test/<class>/*.png.")] = None,
    train_limit: Annotated[int | None, typer.Option(help="Use a seeded subset of the training split.")] = None,
    test_limit: Annotated[int | None, typer.Option(help="Use a seeded subset of the test split.")] = None,
    monitor_images: Annotated[int, typer.Option(help="Test images measured during training.")] = 4,
    monitor_every: Annotated[int, typer.Option(help="Measure every N epochs (0: only at the end).")] = 1,
    final_images: Annotated[int, typer.Option(help="Test images measured on the trained model.")] = 16,
    k: Annotated[int, typer.Option("--k", help="Top-K of the coupling.")] = 10,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: torch's).")] = None,
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
    if not _STATE["quiet"]:
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
    cpus_per_run: Annotated[int, typer.Option(help="CPUs per Ray task.")] = 1,
    dataset: _Dataset = "digits",
    epochs: Annotated[int, typer.Option(help="Training epochs per run.")] = 5,
    preset: Annotated[str, typer.Option(help="Model shape: tiny, small, deit-tiny.")] = "tiny",
    hidden_size: Annotated[int | None, typer.Option()] = None,
    depth: Annotated[int | None, typer.Option()] = None,
    heads: Annotated[int | None, typer.Option()] = None,
    image_size: Annotated[int | None, typer.Option()] = None,
    lr: Annotated[float, typer.Option()] = 5e-4,
    batch_size: Annotated[int, typer.Option()] = 64,
    warmup_epochs: Annotated[float, typer.Option()] = 1.0,
    mixup: Annotated[float | None, typer.Option()] = None,
    data_dir: Annotated[Path | None, typer.Option()] = None,
    train_limit: Annotated[int | None, typer.Option()] = None,
    test_limit: Annotated[int | None, typer.Option()] = None,
    monitor_images: Annotated[int, typer.Option()] = 4,
    monitor_every: Annotated[int, typer.Option()] = 1,
    final_images: Annotated[int, typer.Option()] = 16,
    k: Annotated[int, typer.Option("--k")] = 10,
    threads: Annotated[int, typer.Option(help="torch threads per run.")] = 1,
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
                          seeds=[int(v) for v in _floats(seeds, "seeds")], executor=executor,
                          address=address, num_cpus=cpus_per_run, threads=threads)
        runs = run_grid(base, out, progress=not _STATE["quiet"], **kwargs)
    report_grid(runs, out)


def report_grid(runs: Any, out: Path) -> None:
    """Print a finished grid's runs (test accuracy, coupling above chance with its se, raw
    coupling and its chance level); exit 1 if any did not finish.
    Shared by ``vit-grid`` and ``sweep`` on a grid spec."""
    failed = runs[runs["status"] != "complete"]
    if not _STATE["quiet"]:
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

    with user_errors("cannot read the runs or write the figures"):
        paths = write_vit_figures(root, out)
    if not _STATE["quiet"]:
        for p in paths:
            typer.echo(f"wrote {p}")
