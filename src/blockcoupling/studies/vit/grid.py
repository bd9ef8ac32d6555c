"""The drop-path x weight-decay grid: one training run per point, on Ray or in this process.

A grid directory ``ROOT``::

    ROOT/grid.json                 the base config, the grid values, one record per run
    ROOT/runs/dp0.1-wd0.05-s0/     a ``vit-train`` output folder per point (train.py)

Every run is ``train_vit(config, ROOT/runs/<name>)``, which skips a finished run and resumes
an interrupted one, so running a grid again (after a crash, or with more points) only does
the work that is missing. On Ray each run is one task (``num_cpus`` per task, default 1) on
the cluster started or reached by the sweep's ``start_ray``; a run that fails for a user
reason is recorded as ``failed`` with its message and the others go on.

:func:`collect_runs` and :func:`collect_epochs` read any folder holding ``vit-train`` outputs
(a grid, or runs trained one by one) into tables for the figures (``studies/vit/report.py``).
"""

from __future__ import annotations

import json
import math
import time
import traceback
from collections.abc import Callable, Sequence
from itertools import product
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.fileio import atomic_write_text
from blockcoupling.studies.vit.train import (
    COUPLING_METRICS,
    METRICS_FILE,
    VitTrainConfig,
    is_trained,
    read_metrics,
    train_vit,
)

#: The paper's grid (DEFINITIONS.md, "Training and ViTs").
PAPER_DROP_PATH: tuple[float, ...] = (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)
PAPER_WEIGHT_DECAY: tuple[float, ...] = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2)
GRID_FILE = "grid.json"
GRID_FORMAT = "blockcoupling-vit-grid"
EXECUTORS = ("ray", "local")


def run_name(config: VitTrainConfig) -> str:
    """``dp<rate>-wd<decay>-s<seed>``, e.g. ``dp0.1-wd0.05-s0``."""
    return f"dp{config.drop_path:g}-wd{config.weight_decay:g}-s{config.seed}"


def grid_configs(base: VitTrainConfig, drop_paths: Sequence[float] = PAPER_DROP_PATH,
                 weight_decays: Sequence[float] = PAPER_WEIGHT_DECAY,
                 seeds: Sequence[int] = (0,)) -> list[VitTrainConfig]:
    """One config per (weight decay, drop-path rate, seed), weight decay outermost."""
    if not drop_paths or not weight_decays or not seeds:
        raise BlockCouplingError("the grid needs at least one drop-path rate, weight decay and seed")
    out = [base.replace(drop_path=float(dp), weight_decay=float(wd), seed=int(s))
           for wd, dp, s in product(weight_decays, drop_paths, seeds)]
    names = [run_name(c) for c in out]
    if len(set(names)) != len(names):
        raise BlockCouplingError("the grid repeats a (drop-path, weight decay, seed) point")
    return out


def load_grid_spec(source: str | Path | dict[str, Any]
                   ) -> tuple[VitTrainConfig, dict[str, Any]]:
    """A grid from YAML (or a dict): ``drop_path`` and ``weight_decay`` lists (default: the
    paper's), ``seeds`` (default [0]), ``train`` (:class:`VitTrainConfig` fields, shared by
    every run), and optionally ``executor``, ``address``, ``cpus_per_run``, ``threads``.
    Returns the base config and the keyword arguments of :func:`run_grid`::

        drop_path: [0, 0.1, 0.3]
        weight_decay: [0.01, 0.1]
        seeds: [0, 1]
        train: {dataset: digits, epochs: 5, preset: tiny}
        executor: ray
    """
    if isinstance(source, dict):
        data = source
    else:
        import yaml

        path = Path(source)
        if not path.is_file():
            raise BlockCouplingError(f"grid spec {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise BlockCouplingError(f"grid spec {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise BlockCouplingError("a grid spec is a mapping with drop_path, weight_decay, train")
    allowed = {"drop_path", "weight_decay", "seeds", "train", "executor", "address",
               "cpus_per_run", "threads"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise BlockCouplingError(f"unknown grid spec key(s) {unknown}; known: {sorted(allowed)}")
    train = dict(data.get("train") or {})
    for key in ("drop_path", "weight_decay", "seed"):
        if key in train:
            raise BlockCouplingError(f"train.{key} is set by the grid; give it at the top level")
    base = VitTrainConfig.from_dict(train)

    def numbers(key: str, default: Sequence[float]) -> list[float]:
        value = data.get(key, list(default))
        value = value if isinstance(value, list) else [value]
        try:
            return [float(v) for v in value]
        except (TypeError, ValueError) as err:
            raise BlockCouplingError(f"{key}: give a list of numbers") from err

    kwargs: dict[str, Any] = {
        "drop_paths": numbers("drop_path", PAPER_DROP_PATH),
        "weight_decays": numbers("weight_decay", PAPER_WEIGHT_DECAY),
        "seeds": [int(v) for v in numbers("seeds", (0,))],
    }
    for key, name in (("executor", "executor"), ("address", "address"),
                      ("cpus_per_run", "num_cpus"), ("threads", "threads")):
        if key in data:
            kwargs[name] = data[key]
    return base, kwargs


def train_unit(config: dict[str, Any], out_dir: str, threads: int | None = 1) -> dict[str, Any]:
    """Train one grid point; never raises for a user error (returns a ``failed`` record)."""
    t0 = time.perf_counter()
    name = Path(out_dir).name
    try:
        cfg = VitTrainConfig.from_dict(config)
        skipped = is_trained(out_dir, cfg)
        train_vit(cfg, out_dir, progress=False, threads=threads)
        return {"name": name, "status": "done", "skipped": skipped, "message": None,
                "seconds": time.perf_counter() - t0}
    except BlockCouplingError as err:
        return {"name": name, "status": "failed", "skipped": False, "message": str(err),
                "seconds": time.perf_counter() - t0}
    except Exception as err:  # noqa: BLE001 - keep the other runs going
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return {"name": name, "status": "failed", "skipped": False,
                "message": f"unexpected error (please report it): {last}",
                "seconds": time.perf_counter() - t0}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str))


def run_grid(base: VitTrainConfig, root: str | Path, *,
             drop_paths: Sequence[float] = PAPER_DROP_PATH,
             weight_decays: Sequence[float] = PAPER_WEIGHT_DECAY, seeds: Sequence[int] = (0,),
             executor: str = "ray", address: str | None = None, num_cpus: int = 1,
             threads: int | None = 1, progress: bool = True,
             on_run: Callable[[dict[str, Any]], None] | None = None) -> pd.DataFrame:
    """Train every grid point into ``root/runs/<name>``; returns :func:`collect_runs` with a
    ``message`` column (runs that failed are ``status == "failed"``).

    ``executor="ray"``: one task per run (``num_cpus`` each) on the cluster at ``address``
    or a local one; ``"local"``: one after the other in this process. A grid directory may be
    run again with the same base config (finished runs are skipped, new points are added);
    another base config is refused.
    """
    if executor not in EXECUTORS:
        raise BlockCouplingError(f"executor {executor!r}: choose ray or local")
    configs = grid_configs(base, drop_paths, weight_decays, seeds)
    rootp = Path(root)
    if rootp.exists() and not rootp.is_dir():
        raise BlockCouplingError(f"{rootp} is a file; give a directory for the grid")
    rootp.mkdir(parents=True, exist_ok=True)
    grid_path = rootp / GRID_FILE
    base_dict = json.loads(json.dumps(base.replace(drop_path=0.0, weight_decay=0.0, seed=0)
                                      .to_dict(), default=str))
    if grid_path.exists():
        doc = json.loads(grid_path.read_text())
        if doc.get("format") != GRID_FORMAT or doc.get("base") != base_dict:
            raise BlockCouplingError(
                f"{rootp} holds a grid with another base config; choose another --out (or run "
                "the same options again to continue it)"
            )
    elif any(p for p in rootp.iterdir()):
        raise BlockCouplingError(f"{rootp} is not empty and holds no ViT grid; choose another --out")
    else:
        doc = {"format": GRID_FORMAT, "base": base_dict, "runs": {}}
    for c in configs:
        doc["runs"].setdefault(run_name(c), {"drop_path": c.drop_path,
                                             "weight_decay": c.weight_decay, "seed": c.seed,
                                             "config_key": c.key(), "status": "pending"})
    doc["drop_paths"] = sorted({r["drop_path"] for r in doc["runs"].values()})
    doc["weight_decays"] = sorted({r["weight_decay"] for r in doc["runs"].values()})
    _write_json(grid_path, doc)

    def done(rec: dict[str, Any]) -> None:
        doc["runs"][rec["name"]].update(status=rec["status"], message=rec["message"],
                                        seconds=rec["seconds"])
        _write_json(grid_path, doc)
        if on_run is not None:
            on_run(rec)
        if bar is not None:
            bar.update(1)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(configs), desc="vit grid", unit="run")
    # absolute: a Ray worker's working directory may be another
    jobs = [(c.to_dict(), str(rootp.resolve() / "runs" / run_name(c))) for c in configs]
    try:
        if executor == "local":
            for cfg, out in jobs:
                done(train_unit(cfg, out, threads))
        else:
            _run_ray(jobs, done, address=address, num_cpus=num_cpus, threads=threads)
    finally:
        if bar is not None:
            bar.close()
    runs = collect_runs(rootp)
    runs["message"] = None
    missing = []
    for name, rec in doc["runs"].items():  # runs that failed before writing metrics.json
        if rec.get("status") == "failed":
            if name in set(runs["name"]):
                runs.loc[runs["name"] == name, ["status", "message"]] = ["failed", rec["message"]]
            else:
                missing.append({"name": name, "path": str(rootp / "runs" / name),
                                "status": "failed", "drop_path": rec["drop_path"],
                                "weight_decay": rec["weight_decay"], "seed": rec["seed"],
                                "message": rec.get("message")})
    if missing:
        runs = pd.concat([runs, pd.DataFrame(missing)], ignore_index=True)
    return runs


def _run_ray(jobs: list[tuple[dict[str, Any], str]], done: Callable[[dict[str, Any]], None], *,
             address: str | None, num_cpus: int, threads: int | None) -> None:
    from blockcoupling.studies.sweep.runner import died, ray_each

    def on_result(i: int, rec: Any, err: BaseException | None) -> None:
        if err is not None:
            rec = {"name": Path(jobs[i][1]).name, "status": "failed", "skipped": False,
                   "message": f"the worker died ({died(err)}); run the grid again to continue",
                   "seconds": float("nan")}
        done(rec)

    ray_each(train_unit, [((cfg, out, threads), {"num_cpus": num_cpus, "max_retries": 2,
                                                 "retry_exceptions": False})
                          for cfg, out in jobs], on_result, address=address)


# ---------------------------------------------------------------------------- reading
def _run_dirs(root: Path) -> list[Path]:
    if (root / METRICS_FILE).exists():
        return [root]
    return sorted(p.parent for p in root.rglob(METRICS_FILE))


def collect_runs(root: str | Path) -> pd.DataFrame:
    """One row per ``vit-train`` output under ``root``: its grid point, status, final
    accuracies and losses, final coupling (``COUPLING_METRICS``: raw ``coupling`` with its se
    and chance level, ``coupling_vs_null`` with its se, on ``final_images`` test images) and
    the last monitored coupling (``coupling_monitor``)."""
    rows = []
    for d in _run_dirs(Path(root)):
        m = read_metrics(d)
        cfg = m["config"]
        epochs = m.get("epochs", [])
        last = epochs[-1] if epochs else {}
        final = m.get("final", {})
        monitored = [e["coupling"] for e in epochs
                     if e.get("coupling") is not None and not math.isnan(e["coupling"])]
        rows.append({
            "name": d.name, "path": str(d), "status": m.get("status"),
            "dataset": cfg["dataset"], "drop_path": cfg["drop_path"],
            "weight_decay": cfg["weight_decay"], "seed": cfg["seed"],
            "epochs": int(last.get("epoch", 0)), "k": cfg["k"],
            "train_accuracy": last.get("train_accuracy", math.nan),
            "test_accuracy": last.get("test_accuracy", math.nan),
            "train_loss": last.get("train_loss", math.nan),
            "test_loss": last.get("test_loss", math.nan),
            **{c: final.get(c, math.nan) for c in COUPLING_METRICS},
            "coupling_monitor": monitored[-1] if monitored else math.nan,
        })
    cols = ["name", "path", "status", "dataset", "drop_path", "weight_decay", "seed", "epochs",
            "k", "train_accuracy", "test_accuracy", "train_loss", "test_loss",
            *COUPLING_METRICS, "coupling_monitor"]
    return pd.DataFrame(rows, columns=cols)


def collect_epochs(root: str | Path) -> pd.DataFrame:
    """One row per (run, epoch): the metrics.json epoch records with the run's grid point."""
    frames = []
    for d in _run_dirs(Path(root)):
        m = read_metrics(d)
        df = pd.DataFrame(m.get("epochs", []))
        if df.empty:
            continue
        df.insert(0, "name", d.name)
        df.insert(1, "drop_path", m["config"]["drop_path"])
        df.insert(2, "weight_decay", m["config"]["weight_decay"])
        df.insert(3, "seed", m["config"]["seed"])
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["name", "drop_path", "weight_decay", "seed", "epoch",
                                     "test_accuracy", "coupling"])
    return pd.concat(frames, ignore_index=True)


__all__ = ["EXECUTORS", "PAPER_DROP_PATH", "PAPER_WEIGHT_DECAY", "collect_epochs",
           "collect_runs", "grid_configs", "load_grid_spec", "run_grid", "run_name",
           "train_unit"]
