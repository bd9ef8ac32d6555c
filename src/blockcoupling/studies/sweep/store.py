"""The collection directory: one format for every "many runs" kind (a sweep, a training
monitor, a ViT training grid): manifest, lock, one status file per unit, the catalogue.

Layout of a collection directory ``ROOT`` (every kind)::

    ROOT/sweep.json                the collection manifest: format + version, ``kind`` (sweep |
                                   monitor | vit-grid), the spec, the unit order, and one entry
                                   per session (executor, Ray version and address, library
                                   versions, start and end)
    ROOT/status/<unit_id>.json     the unit (label, model, revision, step, prompt set, config
                                   hash, ``run``), its status (pending | running | done |
                                   failed), message, attempts, weights hash, seconds; written
                                   atomically by whoever runs the unit
    ROOT/units/<unit_id>/          the unit's folder: a run directory (``measure_to_dir``,
                                   resumable), or for a vit-grid unit a ``vit-train`` output
                                   whose run directory is ``units/<unit_id>/<run>``
                                   (``coupling/final``)
    ROOT/catalogue.parquet         one row per unit (derived from the status files; rewritten
                                   as units finish) for DuckDB / pyarrow users
    ROOT/.lock                     flock of the writer (``store.fileio.dir_lock``): two
                                   drivers on one directory are refused

Unit ids follow one rule (``units.collection_unit_id``: readable parts, then the
``canonical_hash`` of the kind's identity fields). The status files are the source of truth:
a collection killed at any point is read (and resumed) from them; a unit's rows live only in
its own run directory, so no unit ever writes rows twice. The manifest keeps the name
``sweep.json`` for every kind (the format began with sweeps; format 1 directories are read
as they are). The ViT grid's old layout (``grid.json`` + ``runs/``) is converted by
`blockcoupling.studies.collection.upgrade_collection`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import RunDirError
from blockcoupling.store.fileio import atomic_path, atomic_write_text, dir_lock, lock_holder
from blockcoupling.studies.sweep.units import Unit

FORMAT_NAME = "blockcoupling-sweep"
FORMAT_VERSION = 2  # 2: kind vit-grid and the units' ``run``; format 1 is read as it is
MANIFEST = "sweep.json"
#: the kinds of collection (the manifest's ``kind``)
KINDS = ("sweep", "monitor", "vit-grid")
#: the ViT grid's manifest before it became a kind of collection (read: the upgrade line)
LEGACY_GRID_FILE = "grid.json"
STATUS = "status"
UNITS = "units"
CATALOGUE = "catalogue.parquet"
LOCK = ".lock"
STATUSES = ("pending", "running", "done", "failed")

CATALOGUE_COLUMNS = ("unit_id", "label", "model", "revision", "step", "prompt_set", "limit",
                     "config_hash", "status", "message", "attempts", "weights_hash",
                     "duplicate_of", "n_prompts", "seconds", "run_dir")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (``store.fileio.atomic_write_text``)."""
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        root = path.parent.parent if path.parent.name == STATUS else path.parent
        if path.name == MANIFEST:
            fix = ("resume it (`blockcoupling sweep SPEC --out "
                   f"{root} --resume` with the spec it was run with, the same "
                   "CouplingMonitor(out=...) or the same vit-grid command): the manifest is "
                   "rebuilt from the status files")
        else:
            fix = (f"delete {path} and resume the sweep with --resume: the unit is then "
                   "checked and measured again where needed")
        raise RunDirError(f"{path} is unreadable or corrupt ({err}); {fix}") from err


def is_collection_dir(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` holds a collection manifest (``sweep.json``: any kind) or the old
    ViT grid layout (``grid.json``, which `load_manifest` answers with the line that
    converts it). The manifest, not the folder's contents, then says the kind."""
    return (Path(path) / MANIFEST).is_file() or (Path(path) / LEGACY_GRID_FILE).is_file()


is_sweep_dir = is_collection_dir
"""The earlier name of `is_collection_dir`."""


def upgrade_line(root: Path) -> str:
    """The one line that says how to convert the old ViT grid layout in ``root``."""
    return (f"{root} is a ViT grid in the old layout ({LEGACY_GRID_FILE} and runs/); convert it "
            f"into a collection with `blockcoupling collection upgrade {root}` (the trained "
            "runs are kept), then run the command again")


def load_manifest(root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise RunDirError(f"no sweep directory at {root}; check the path (a sweep directory is "
                          "created by `blockcoupling sweep SPEC --out DIR` or a CouplingMonitor)")
    path = root / MANIFEST
    if not path.is_file() and (root / LEGACY_GRID_FILE).is_file():
        raise RunDirError(upgrade_line(root))
    if not path.is_file():
        if (root / STATUS).is_dir() and any((root / STATUS).glob("*.json")):
            raise RunDirError(
                f"{root} has lost its manifest {MANIFEST}; resume it (`blockcoupling sweep SPEC "
                f"--out {root} --resume` with the spec it was run with, or the same "
                "CouplingMonitor(out=...)): the manifest is rebuilt from the status files")
        raise RunDirError(f"{root} is not a sweep directory (it has no {MANIFEST}); give the "
                          "--out directory of a sweep, a monitor or a vit-grid")
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME or not isinstance(
            data.get("order", []), list) or not isinstance(data.get("sessions", []), list):
        raise RunDirError(f"{path} is not a blockcoupling sweep manifest; this directory "
                          "belongs to something else: choose another path")
    version = data.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RunDirError(f"{path} was written by a newer blockcoupling (format "
                          f"{data.get('format_version')}); upgrade blockcoupling to read it")
    data.setdefault("kind", "sweep")
    if data["kind"] not in KINDS:
        raise RunDirError(f"{path}: unknown collection kind {data['kind']!r} (known: "
                          f"{', '.join(KINDS)}); it was written by another blockcoupling: "
                          "upgrade blockcoupling to read it")
    return data


def new_manifest(kind: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    from blockcoupling.store.rundir import library_versions

    assert kind in KINDS, kind
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "kind": kind,
            "created": now(), "spec": spec, "order": [], "sessions": [],
            "versions": library_versions()}


@contextlib.contextmanager
def sweep_lock(root: Path, kind: str = "sweep") -> Iterator[None]:
    """Hold the collection directory's exclusive lock (refuses a second writer on it): the
    store's one directory lock (``store.fileio.DirLock``), removed when released."""
    busy = (f"{kind} directory {root} is in use by another {kind}{{who}}; wait for it to "
            "finish or stop it, or choose another --out")
    with dir_lock(root, busy=busy):
        yield


def is_locked(root: Path) -> bool:
    """True while a driver holds the sweep's lock."""
    return lock_holder(root) is not None


def status_path(root: Path, uid: str) -> Path:
    return root / STATUS / f"{uid}.json"


def unit_dir(root: Path, uid: str) -> Path:
    """The unit's folder ``ROOT/units/<unit_id>``."""
    return root / UNITS / uid


def run_relpath(unit: dict[str, Any]) -> str:
    """The unit's run directory relative to the collection (``units/<id>[/<run>]``)."""
    run = str(unit.get("run") or "")
    return f"{UNITS}/{unit.get('unit_id')}" + (f"/{run}" if run else "")


def read_status(root: Path, uid: str) -> dict[str, Any] | None:
    path = status_path(root, uid)
    return read_json(path) if path.is_file() else None


def write_status(root: Path, unit: Unit, status: str, **fields: Any) -> dict[str, Any]:
    """Record ``status`` for ``unit`` (keeping earlier fields such as attempts)."""
    assert status in STATUSES
    (root / STATUS).mkdir(parents=True, exist_ok=True)
    old = read_status(root, unit.unit_id) or {}
    rec = {**old, "unit": unit.to_dict(), "status": status, "updated": now(), **fields}
    write_json(status_path(root, unit.unit_id), rec)
    return rec


def all_status(root: Path) -> list[dict[str, Any]]:
    folder = root / STATUS
    if not folder.is_dir():
        return []
    return [read_json(p) for p in sorted(folder.glob("*.json"))]


def catalogue(root: Path, manifest: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per unit (``CATALOGUE_COLUMNS``), in the sweep's unit order, with
    ``duplicate_of`` set for done units whose weights, prompt set and config repeat an
    earlier unit's."""
    manifest = manifest if manifest is not None else load_manifest(root)
    order = {uid: i for i, uid in enumerate(manifest.get("order", []))}
    rows = []
    for rec in all_status(root):
        u = rec.get("unit") or {}
        uid = u.get("unit_id")
        if not uid:
            continue
        rows.append({
            "unit_id": uid, "label": u.get("label"), "model": u.get("model"),
            "revision": u.get("revision"), "step": u.get("step"),
            "prompt_set": u.get("prompt_set"), "limit": u.get("limit"),
            "config_hash": u.get("config_hash"), "status": rec.get("status"),
            "message": rec.get("message"), "attempts": rec.get("attempts", 0),
            "weights_hash": rec.get("weights_hash"), "duplicate_of": None,
            "n_prompts": rec.get("n_prompts"), "seconds": rec.get("seconds"),
            "run_dir": run_relpath(u),
        })
    df = pd.DataFrame(rows, columns=list(CATALOGUE_COLUMNS))
    if df.empty:
        return df
    df["_order"] = [order.get(u, len(order)) for u in df["unit_id"]]
    df["_step"] = df["step"].astype("float64").fillna(-1.0)
    df = df.sort_values(["_order", "label", "_step", "unit_id"], kind="stable")
    df = df.drop(columns=["_order", "_step"]).reset_index(drop=True)
    df["step"] = df["step"].astype("Int64")
    df["limit"] = df["limit"].astype("Int64")
    df["attempts"] = df["attempts"].fillna(0).astype("int64")
    df["n_prompts"] = df["n_prompts"].astype("Int64")
    df["seconds"] = df["seconds"].astype("float64")
    first: dict[tuple[str, str, str], str] = {}
    dup: list[str | None] = []
    for r in df.itertuples():
        key = (r.weights_hash, r.prompt_set, r.config_hash)
        if r.status != "done" or not r.weights_hash:
            dup.append(None)
        elif key in first:
            dup.append(first[key])
        else:
            first[key] = r.unit_id
            dup.append(None)
    df["duplicate_of"] = pd.Series(dup, dtype="object")
    for col in ("unit_id", "label", "model", "revision", "prompt_set", "config_hash", "status",
                "message", "weights_hash", "duplicate_of", "run_dir"):
        df[col] = df[col].astype("string")
    return df


def write_catalogue(root: Path, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rewrite ``catalogue.parquet`` atomically from the status files."""
    df = catalogue(root) if df is None else df
    with atomic_path(root / CATALOGUE) as tmp:
        df.to_parquet(tmp, index=False)
    return df


# ---------------------------------------------------------------------------- integrity
class UnitDamagedError(RunDirError):
    """A done unit's files are missing, damaged or replaced (the message names the repair)."""


def repair_command(root: Path, kind: str | None) -> str:
    """How a damaged unit of the collection in ``root`` is measured again."""
    if kind == "monitor":
        return (f"run the training script again with CouplingMonitor(out={str(root)!r}): "
                "it measures the damaged steps again")
    if kind == "vit-grid":
        return (f"run the same vit-grid again with --out {root}: it trains the damaged points "
                "again")
    return (f"measure it again with `blockcoupling sweep SPEC --out {root} --resume` (SPEC: "
            "the spec the sweep was run with)")


def unit_problem(root: Path, rec: dict[str, Any]) -> str | None:
    """Why the run directory of a ``done`` unit cannot be trusted, or None: the checks of
    ``store.integrity.verify_complete`` (sealed manifest, checksums of every file, prompt
    rows) plus the unit's identity (unit id, config hash, weights hash, prompt count) against
    its status file."""
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.store.integrity import verify_complete

    unit = rec.get("unit") or {}
    uid = str(unit.get("unit_id"))
    path = root / run_relpath(unit)
    if unit.get("run"):  # a unit trained into its folder (vit-grid): its sealed record too
        from blockcoupling.studies.vit.train import metrics_problem

        problem = metrics_problem(unit_dir(root, uid))
        if problem is not None:
            return problem
    try:
        manifest = verify_complete(path)
        cfg_hash = MeasureConfig.from_dict(dict(manifest["config"])).config_hash()
    except (RunDirError, TypeError, ValueError) as err:
        return str(err)
    meta = manifest.get("meta") or {}
    if meta.get("unit_id") not in (None, uid):
        return f"{path} holds unit {meta.get('unit_id')!r} (a copied or replaced directory)"
    if unit.get("config_hash") and cfg_hash != unit.get("config_hash"):
        return f"{path} was measured with another configuration (a replaced directory)"
    weights = rec.get("weights_hash")
    if weights and manifest.get("weights_hash") != weights:
        return f"{path} holds other weights than the unit measured (a replaced directory)"
    n = rec.get("n_prompts")
    cons = manifest.get("consolidated") or {}
    if n is not None and len(cons.get("prompt_ids") or []) != int(n):
        return f"{path} holds {len(cons.get('prompt_ids') or [])} prompts, the status {n}"
    return None


def damaged_units(root: Path) -> dict[str, str]:
    """unit id -> problem, for every ``done`` unit whose files fail `unit_problem`."""
    out: dict[str, str] = {}
    for rec in all_status(root):
        if rec.get("status") == "done":
            problem = unit_problem(root, rec)
            if problem is not None:
                out[str((rec.get("unit") or {}).get("unit_id"))] = problem
    return out


def rebuilt_manifest(root: Path, kind: str, spec: dict[str, Any] | None,
                     unit_ids: set[str] | None) -> dict[str, Any] | None:
    """A new manifest for a collection whose ``sweep.json`` is missing or corrupt, when its
    status files say it is one (None: no status files). Every status file must name a unit
    of ``unit_ids`` (the units this spec makes; None: not checked), else RunDirError: the
    directory holds another collection."""
    folder = root / STATUS
    if not folder.is_dir() or not any(folder.glob("*.json")):
        return None
    if unit_ids is not None:
        foreign = sorted(p.stem for p in folder.glob("*.json") if p.stem not in unit_ids)
        if foreign:
            raise RunDirError(
                f"{root}: its manifest {MANIFEST} is lost or corrupt and its status files name "
                f"units this spec does not make ({', '.join(foreign[:3])}); resume with the "
                "spec the sweep was run with (or choose a new --out)")
    manifest = new_manifest(kind, spec)
    manifest["rebuilt"] = now()
    return manifest
