"""The drop-path x weight-decay grid: one training run per point, on Ray or in this process.

A grid is a collection of kind ``vit-grid`` (the layout of ``store/collection.py``)::

    ROOT/sweep.json                the collection manifest: kind vit-grid, the spec (base
                                   config, grid values), unit order, sessions
    ROOT/status/<unit_id>.json     one status record per grid point (pending | running | done |
                                   failed), written by the driver
    ROOT/units/<unit_id>/          a ``vit-train`` output folder per point (train.py); its
                                   final measurement ``coupling/final`` is the unit's run
    ROOT/catalogue.parquet, ROOT/.lock

Unit ids follow the collections' one rule: ``dp<rate>-wd<decay>-s<seed>-<hash12>`` (the
hash: the run's whole training config). Every run is ``train_vit(config, ROOT/units/<id>)``,
which skips a finished run and resumes an interrupted one, so running a grid again (after a
crash, or with more points) only does the work that is missing. On Ray each run is one task
(``num_cpus`` per task, default 1) on the cluster started or reached by the sweep's
``start_ray``; a run that fails for a user reason is recorded as ``failed`` with its message
and the others go on. The old layout (``grid.json`` + ``runs/``) is one line naming
``blockcoupling collection upgrade``.

`collect_runs` and `collect_epochs` read a grid, or any folder holding
``vit-train`` outputs (runs trained one by one), into tables for the figures
(``studies/vit/report.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling import validate
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, from_mapping, key_names, opt, parse_given
from blockcoupling.runs import kinds
from blockcoupling.runs.executor import CONNECT_TIMEOUT_S, EXECUTORS
from blockcoupling.studies.vit.train import (
    COUPLING_METRICS,
    METRICS_FILE,
    TOKEN_METRICS,
    VitTrainConfig,
    is_trained,
    read_metrics,
    train_vit,
)

#: The paper's grid (DEFINITIONS.md, "Training and ViTs").
PAPER_DROP_PATH: tuple[float, ...] = (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)
PAPER_WEIGHT_DECAY: tuple[float, ...] = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2)


KIND = "vit-grid"
#: the optional axes of a grid beyond drop-path, weight decay and seed: the config field,
#: the key of its value list (in a grid spec's manifest and ``run_grid``'s keywords) and the
#: prefix of its value in a run's name. A grid names an axis only when it varies it, so the
#: names (and unit ids) of the drop-path x weight-decay grids stay as they were.
EXTRA_AXES: dict[str, tuple[str, str]] = {"train_limit": ("train_limits", "n"),
                                          "label_noise": ("label_noises", "noise")}


def run_name(config: VitTrainConfig, axes: Sequence[str] = ()) -> str:
    """``dp<rate>-wd<decay>-s<seed>``, e.g. ``dp0.1-wd0.05-s0``, after the values of the
    extra ``axes`` the grid varies (`EXTRA_AXES`), e.g. ``n90-noise0.2-dp0.1-wd0.05-s0``."""
    extra = "".join(f"{EXTRA_AXES[a][1]}{getattr(config, a) or 0:g}-" for a in EXTRA_AXES
                    if a in axes)
    return f"{extra}dp{config.drop_path:g}-wd{config.weight_decay:g}-s{config.seed}"


def grid_configs(base: VitTrainConfig, drop_paths: Sequence[float] = PAPER_DROP_PATH,
                 weight_decays: Sequence[float] = PAPER_WEIGHT_DECAY,
                 seeds: Sequence[int] = (0,), *, train_limits: Sequence[int] | None = None,
                 label_noises: Sequence[float] | None = None) -> list[VitTrainConfig]:
    """One config per (weight decay, drop-path rate, seed), weight decay outermost; with
    ``train_limits`` / ``label_noises`` (extra axes, `EXTRA_AXES`) one per their
    values too, those outermost (training-set size, then label noise)."""
    if not drop_paths or not weight_decays or not seeds:
        raise BlockCouplingError("the grid needs at least one drop-path rate, weight decay and seed")
    from blockcoupling.validate import number, whole

    for name, values in (("train_limit", train_limits), ("label_noise", label_noises)):
        if values is not None and not len(values):
            raise BlockCouplingError(f"{name}: give at least one value")
    out = [base.replace(drop_path=number(dp, "drop-path"), weight_decay=number(wd, "weight-decay"),
                        seed=whole(s, "seed", minimum=0),
                        **({"train_limit": whole(tl, "train-limit", minimum=1)}
                           if train_limits is not None else {}),
                        **({"label_noise": number(ln, "label-noise", minimum=0, below=1)}
                           if label_noises is not None else {}))
           for tl, ln, wd, dp, s in product(train_limits or (None,), label_noises or (None,),
                                            weight_decays, drop_paths, seeds)]
    axes = grid_axes(train_limits, label_noises)
    names = [run_name(c, axes) for c in out]
    if len(set(names)) != len(names):
        raise BlockCouplingError("the grid repeats a point (" + ", ".join(
            [*axes, "drop-path", "weight decay", "seed"]) + ")")
    return out


def grid_axes(train_limits: Sequence[int] | None = None,
              label_noises: Sequence[float] | None = None) -> tuple[str, ...]:
    """The extra axes a grid varies (`EXTRA_AXES` order)."""
    given = {"train_limit": train_limits, "label_noise": label_noises}
    return tuple(a for a in EXTRA_AXES if given[a] is not None)


def _axis(key: str, value: Any) -> tuple[Any, ...]:
    """A grid axis: one value, a list, or comma-separated numbers (``0,0.1``: the command
    line's form), at least one; each value's rule is the field's ``check``."""
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",") if v.strip()]
        try:
            values = [float(v) for v in items]
        except ValueError:
            raise validate.OptionError(f"{key} {value!r}: give comma-separated numbers such "
                                       "as 0,0.1") from None
        values = [int(v) if v.is_integer() else v for v in values]
    else:
        values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise validate.OptionError(f"{key}: give at least one value")
    return tuple(values)


def _train(key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise validate.OptionError(f"{key}: give a mapping of training options, e.g. "
                                   "{dataset: digits, epochs: 5}")
    return dict(value)


#: the rule of a rate in [0, 1) (a drop-path rate, a label-noise fraction)
_DROP_PATH = validate.rule(validate.number, minimum=0, below=1)
_WEIGHT_DECAY = validate.rule(validate.number, minimum=0)


@dataclass(frozen=True)
class GridSpec:
    """A ViT grid spec's keys (`load_grid_spec`), each declared once with
    `blockcoupling.fields.opt`: its parser and check, its one-line errors."""

    kind: str = opt(KIND, "The collection kind: vit-grid.")
    drop_path: tuple[float, ...] = opt(PAPER_DROP_PATH, "Drop-path rates (the paper's).",
                                       parse=_axis, check=_DROP_PATH)
    weight_decay: tuple[float, ...] = opt(PAPER_WEIGHT_DECAY, "Weight decays (the paper's).",
                                          parse=_axis, check=_WEIGHT_DECAY)
    seeds: tuple[int, ...] = opt((0,), "Seeds.", parse=_axis, check=validate.SEED)
    train: dict[str, Any] = opt(default_factory=dict, help="VitTrainConfig fields shared by "
                                "every run.", parse=_train)
    train_limit: tuple[int, ...] | None = opt(None, "Extra axis: training-set sizes.",
                                              parse=_axis, check=validate.COUNT)
    label_noise: tuple[float, ...] | None = opt(None, "Extra axis: label-noise rates.",
                                                parse=_axis, check=_DROP_PATH)
    executor: str | None = opt(None, "ray or local.", check=validate.EXECUTOR)
    address: str | None = opt(None, "The Ray cluster's address.", check=(validate.text, {}))
    cpus_per_run: int | None = opt(None, "CPUs of each run's Ray task.", check=validate.COUNT)
    threads: int | None = opt(None, "Torch threads of each run.", check=validate.COUNT)

    def __post_init__(self) -> None:
        if self.kind != KIND:
            raise validate.OptionError(f"kind: {self.kind!r} is not a ViT grid spec (kind: "
                                       f"{KIND})")
        check_fields(self, dashes=False)
        axes = ("drop_path", "weight_decay", "seed",
                *(a for a in EXTRA_AXES if getattr(self, a) is not None))
        for key in axes:
            if key in self.train:
                raise validate.OptionError(f"train.{key} is set by the grid; give it at the "
                                           "top level")

    def base(self) -> VitTrainConfig:
        """The training config every run shares (``train:``), its keys named as the spec's
        (``train.epochs``)."""
        with key_names("train."):
            try:
                return VitTrainConfig.from_dict(parse_given(VitTrainConfig, self.train))
            except validate.OptionError:
                raise
            except BlockCouplingError as err:  # a rule between training options
                raise validate.OptionError(f"train: {err}") from err

    def run_grid_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `run_grid` (the keys given; the axes always)."""
        out: dict[str, Any] = {"drop_paths": list(self.drop_path),
                               "weight_decays": list(self.weight_decay), "seeds": list(self.seeds)}
        for axis, (name, _) in EXTRA_AXES.items():
            if getattr(self, axis) is not None:
                out[name] = list(getattr(self, axis))
        for key, name in (("executor", "executor"), ("address", "address"),
                          ("cpus_per_run", "num_cpus"), ("threads", "threads")):
            if getattr(self, key) is not None:
                out[name] = getattr(self, key)
        return out


def load_grid_spec(source: str | Path | dict[str, Any]
                   ) -> tuple[VitTrainConfig, dict[str, Any]]:
    """A grid from YAML (or a dict): ``drop_path`` and ``weight_decay`` lists (default: the
    paper's), ``seeds`` (default [0]), ``train`` (`VitTrainConfig` fields, shared by
    every run), optionally the extra axes ``train_limit`` and ``label_noise`` (lists), and
    ``executor``, ``address``, ``cpus_per_run``, ``threads`` (the keys of `GridSpec`).
    Returns the base config and the keyword arguments of `run_grid`::

        drop_path: [0, 0.1, 0.3]
        weight_decay: [0.01, 0.1]
        seeds: [0, 1]
        train: {dataset: digits, epochs: 5, preset: tiny}
        executor: ray
    """
    if isinstance(source, dict):
        data = source
    else:
        from blockcoupling.store.verified import load_yaml

        data = load_yaml(Path(source), "grid spec", error=validate.OptionError) or {}
    if not isinstance(data, dict):
        raise validate.OptionError("a grid spec is a mapping with drop_path, weight_decay, "
                                   "train")
    if data.get("kind", KIND) != KIND:  # before the other keys: another kind's spec
        raise validate.OptionError(f"kind: {data['kind']!r} is not a ViT grid spec (kind: "
                                   f"{KIND})")
    spec: GridSpec = from_mapping(GridSpec, data, "grid spec")
    return spec.base(), spec.run_grid_kwargs()


def train_unit(unit: Any, folder: Path, threads: int | None = 1) -> dict[str, Any]:
    """The work of one grid point (`blockcoupling.runs.protocol.unit_task`): its ViT
    trained into ``folder`` (a finished training is kept, an interrupted one resumed)."""
    cfg = VitTrainConfig.from_dict(unit.config)
    skipped = is_trained(folder, cfg)
    train_vit(cfg, folder, progress=False, threads=threads)
    return {"skipped": skipped}


#: a grid unit's run directory inside its vit-train folder (the final measurement)
FINAL_RUN = "coupling/final"


def grid_unit(config: VitTrainConfig, axes: Sequence[str] = ()) -> Any:
    """The collection unit of one grid point (``store.collection.UnitRecord``): label
    `run_name` (with the grid's extra ``axes``), id by the collections' one rule over
    the whole training config, config hash of its final measurement, run directory
    ``coupling/final``."""
    from blockcoupling.store.collection import UnitRecord, collection_unit_id
    from blockcoupling.studies.vit.train import images_config, measured_tokens

    label = run_name(config, axes)
    final = images_config(config.k, measured_tokens(config.tokens, both=True))
    return UnitRecord(unit_id=collection_unit_id([(label, 48)], [KIND, config.key()]),
                      label=label, model=f"vit:{config.preset}", revision=None, step=None,
                      prompt_set=f"{config.dataset}:test", limit=config.final_images,
                      config=json.loads(json.dumps(config.to_dict(), default=str)),
                      config_hash=final.config_hash(), run=FINAL_RUN)


def headline_tokens(base_dict: dict[str, Any]) -> str:
    """The token rule of a grid's headline statistic, as its manifest states it for every
    reader (``Sweep.default_tokens``): the base config's ``--tokens`` ([CLS]: ``first``)."""
    from blockcoupling.studies.vit.train import STATISTIC_TOKENS

    return STATISTIC_TOKENS[str(base_dict.get("tokens", "cls"))]


def _same_base(base_dict: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    """A grid's identity is its base config: a grid of the same one continues (and may grow
    by new points); another is refused."""
    def same(manifest: dict[str, Any]) -> list[str]:
        stored = ((manifest.get("spec") or {}).get(KIND) or {}).get("base")
        return [] if stored == base_dict else [
            "another base config (the training options every run shares); run the same "
            "options again to continue it"]

    return same


def _add_points(base_dict: dict[str, Any], configs: Sequence[VitTrainConfig],
                axes: Sequence[str]) -> Callable[[dict[str, Any]], None]:
    """What a run of the grid adds to its manifest: its points' values on every axis, the
    headline token rule, the format version."""
    from blockcoupling.store import collection as store

    def update(manifest: dict[str, Any]) -> None:
        grid = manifest["spec"][KIND]
        for key, attr in (("drop_paths", "drop_path"), ("weight_decays", "weight_decay"),
                          ("seeds", "seed"), *((EXTRA_AXES[a][0], a) for a in axes)):
            grid[key] = sorted({*grid.get(key, []), *(getattr(c, attr) or 0 for c in configs)})
        manifest["headline_tokens"] = headline_tokens(base_dict)
        manifest["format_version"] = store.FORMAT_VERSION

    return update


def run_grid(base: VitTrainConfig, root: str | Path, *,
             drop_paths: Sequence[float] = PAPER_DROP_PATH,
             weight_decays: Sequence[float] = PAPER_WEIGHT_DECAY, seeds: Sequence[int] = (0,),
             train_limits: Sequence[int] | None = None,
             label_noises: Sequence[float] | None = None,
             executor: str = "ray", address: str | None = None, num_cpus: int = 1,
             threads: int | None = 1, progress: bool = True,
             on_run: Callable[[dict[str, Any]], None] | None = None,
             cluster_cpus: int | None = None, resume: bool | None = None,
             retries: int | None = None,
             connect_timeout: float = CONNECT_TIMEOUT_S) -> pd.DataFrame:
    """Train every grid point into ``root/units/<id>`` by the run protocol of every
    collection (`blockcoupling.runs.protocol.run_collection`); returns `collect_runs` with a
    ``message`` column (runs that failed are ``status == "failed"``).

    ``train_limits`` / ``label_noises``: extra axes (`grid_configs`; the runs' names
    then start with them). ``executor="ray"``: one task per run (``num_cpus`` each) on the
    cluster at ``address`` (or the one ``ray.init()`` finds), reached before anything is
    written, or a local one of ``cluster_cpus`` CPUs; ``"local"``: one after the other in
    this process. A grid directory may be run again with the same base config (finished runs
    are skipped, damaged ones trained again, new points added; ``resume=False``: a grid
    that holds trained runs is refused, as ``sweep`` without ``--resume`` refuses); another
    base config is refused. ``retries``: Ray retries of a run whose worker died.
    """
    from blockcoupling.runs import protocol
    from blockcoupling.runs.executor import check_executor
    from blockcoupling.validate import optional, whole

    check_executor(executor)
    num_cpus = whole(num_cpus, "cpus-per-run", minimum=1)
    threads = optional(whole, threads, "threads", minimum=1)
    configs = grid_configs(base, drop_paths, weight_decays, seeds, train_limits=train_limits,
                           label_noises=label_noises)  # checked before Ray starts
    axes = grid_axes(train_limits, label_noises)
    units = [grid_unit(c, axes) for c in configs]
    rootp = Path(root)
    base_dict = json.loads(json.dumps(base.replace(
        drop_path=0.0, weight_decay=0.0, seed=0, **dict.fromkeys(axes)).to_dict(), default=str))
    spec = {KIND: {"base": base_dict, "drop_paths": [], "weight_decays": [], "seeds": [],
                   **{EXTRA_AXES[a][0]: [] for a in axes}}}

    def done(rec: dict[str, Any]) -> None:
        if on_run is not None:
            unit = rec.get("unit") or {}
            on_run({"name": unit.get("label"), "unit_id": unit.get("unit_id"),
                    "status": rec.get("status"), "message": rec.get("message"),
                    "seconds": rec.get("seconds", math.nan), "skipped": rec.get("skipped")})

    protocol.run_collection(
        rootp, kind=KIND, spec=spec, units=units, work=train_unit, args=(threads,),
        resume=True if resume is None else resume, executor=executor, address=address,
        cluster_cpus=cluster_cpus, retries=retries, progress=progress,
        connect_timeout=connect_timeout,
        same=_same_base(base_dict), update=_add_points(base_dict, configs, axes),
        resources=lambda u: {"num_cpus": num_cpus}, on_done=done)
    return _grid_runs(rootp, units)


def _grid_runs(rootp: Path, units: list[Any]) -> pd.DataFrame:
    """The grid's runs table (`collect_runs`), with the runs that failed before writing
    their ``metrics.json`` added from their status."""
    from blockcoupling.store import collection as store

    runs = collect_runs(rootp)
    runs["message"] = None
    missing = []
    for u in units:  # runs that failed before writing metrics.json
        rec = store.read_status(rootp, u.unit_id) or {}
        if rec.get("status") == "failed":
            if u.label in set(runs["name"]):
                runs.loc[runs["name"] == u.label, ["status", "message"]] = [
                    "failed", rec.get("message")]
            else:
                c = VitTrainConfig.from_dict(u.config)
                missing.append({"name": u.label, "path": str(store.unit_dir(rootp, u.unit_id)),
                                "status": "failed", "drop_path": c.drop_path,
                                "weight_decay": c.weight_decay, "seed": c.seed,
                                "message": rec.get("message")})
    if missing:
        runs = pd.concat([runs, pd.DataFrame(missing)], ignore_index=True)
    return runs


# ---------------------------------------------------------------------------- reading
def _run_dirs(root: Path) -> list[tuple[str, Path]]:
    """(name, vit-train folder) of every run: a grid's units by their label (its catalogue
    order), one vit-train output, or the vit-train outputs anywhere under a plain folder."""
    from blockcoupling.store import collection as store

    if store.is_collection_dir(root):
        manifest = store.load_manifest(root)  # the old layout: the line that converts it
        if (kind := kinds.manifest_kind(manifest)) != KIND:
            raise BlockCouplingError(f"{root} is a {kind} collection, not a ViT "
                                     "grid; give a vit-grid --out or vit-train outputs")
        cat = store.catalogue(root, manifest)
        return [(str(r.label), store.unit_dir(root, str(r.unit_id))) for r in cat.itertuples()
                if (store.unit_dir(root, str(r.unit_id)) / METRICS_FILE).exists()]
    if (root / METRICS_FILE).exists():
        return [(root.name, root)]
    return [(p.parent.name, p.parent) for p in sorted(root.rglob(METRICS_FILE))]


def _trainings(root: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """(name, folder, verified ``metrics.json``) of every run (`_run_dirs`), joined by
    content: two folders of the same trained weights (a copied training) are one training
    counted twice, refused in one line (``joins.check_distinct_weights``)."""
    from blockcoupling.studies.joins import check_distinct_weights

    runs = [(name, d, read_metrics(d)) for name, d in _run_dirs(root)]
    check_distinct_weights({(str(d.relative_to(root)) if d != root else d.name) or name:
                            m.get("model_sha256") for name, d, m in runs})
    return runs


def collect_runs(root: str | Path) -> pd.DataFrame:
    """One row per ``vit-train`` output under ``root``: its grid point (and its training
    images ``n_train`` and ``label_noise``), status, final
    accuracies and losses, final coupling (``COUPLING_METRICS``: raw ``coupling`` with its se
    and chance level, ``coupling_vs_null`` with its se, on ``final_images`` test images, at
    the run's ``tokens``), the same at [CLS] and at the last patch (``TOKEN_METRICS``, e.g.
    ``coupling_vs_null_cls``, ``coupling_vs_null_last``) and the last monitored coupling
    (``coupling_monitor``)."""
    rows = []
    for name, d, m in _trainings(Path(root)):
        cfg = m["config"]
        epochs = m.get("epochs", [])
        last = epochs[-1] if epochs else {}
        final = m.get("final", {})
        monitored = [e["coupling"] for e in epochs
                     if e.get("coupling") is not None and not math.isnan(e["coupling"])]
        rows.append({
            "name": name, "path": str(d), "status": m.get("status"),
            "dataset": cfg["dataset"], "drop_path": cfg["drop_path"],
            "weight_decay": cfg["weight_decay"], "seed": cfg["seed"],
            "n_train": (m.get("data") or {}).get("train", math.nan),
            "label_noise": cfg.get("label_noise") or 0.0,
            "epochs": int(last.get("epoch", 0)), "k": cfg["k"],
            "tokens": cfg.get("tokens", "cls"),
            "train_accuracy": last.get("train_accuracy", math.nan),
            "test_accuracy": last.get("test_accuracy", math.nan),
            "train_loss": last.get("train_loss", math.nan),
            "test_loss": last.get("test_loss", math.nan),
            **{c: final.get(c, math.nan) for c in (*COUPLING_METRICS, *TOKEN_METRICS)},
            "coupling_monitor": monitored[-1] if monitored else math.nan,
        })
    cols = ["name", "path", "status", "dataset", "drop_path", "weight_decay", "seed",
            "n_train", "label_noise", "epochs",
            "k", "tokens", "train_accuracy", "test_accuracy", "train_loss", "test_loss",
            *COUPLING_METRICS, *TOKEN_METRICS, "coupling_monitor"]
    return pd.DataFrame(rows, columns=cols)


def collect_epochs(root: str | Path) -> pd.DataFrame:
    """One row per (run, epoch): the metrics.json epoch records with the run's grid point."""
    frames = []
    for name, _d, m in _trainings(Path(root)):
        df = pd.DataFrame(m.get("epochs", []))
        if df.empty:
            continue
        df.insert(0, "name", name)
        df.insert(1, "drop_path", m["config"]["drop_path"])
        df.insert(2, "weight_decay", m["config"]["weight_decay"])
        df.insert(3, "seed", m["config"]["seed"])
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["name", "drop_path", "weight_decay", "seed", "epoch",
                                     "test_accuracy", "coupling"])
    return pd.concat(frames, ignore_index=True)


__all__ = ["EXECUTORS", "FINAL_RUN", "KIND", "PAPER_DROP_PATH", "PAPER_WEIGHT_DECAY", "collect_epochs",
           "collect_runs", "grid_configs", "grid_unit", "load_grid_spec", "run_grid", "run_name",
           "train_unit"]
