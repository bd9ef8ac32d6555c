"""The collection directory: one format for every "many runs" kind (a sweep, a training
monitor, a ViT training grid): manifest, lock, one status file per unit, the catalogue.

Layout of a collection directory ``ROOT`` (every kind)::

    ROOT/sweep.json                the manifest: format + version, ``kind``, the spec, the unit
                                   order, one entry per session (executor, versions, times)
    ROOT/status/<unit_id>.json     the unit, its status (pending | running | done | failed),
                                   message, attempts, weights hash, seconds; written
                                   atomically by whoever runs the unit
    ROOT/units/<unit_id>/          the unit's folder (a run directory, or a ``vit-train``
                                   output holding one)
    ROOT/catalogue.parquet         one row per unit, derived from the status files
    ROOT/.lock                     the writer's lock (``store.fileio.DirLock``)

The status files are the source of truth: a collection killed at any point is read and
resumed from them, and a unit's rows live only in its own run directory. Unit ids follow one
rule (`collection_unit_id`). The manifest keeps the name ``sweep.json`` for every kind
(format 1 records no kind: the registry's default). What depends on a kind is registered in
`blockcoupling.runs.kinds`; this module names none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pandas as pd

from blockcoupling.errors import RunDirError
from blockcoupling.hashing import canonical_hash
from blockcoupling.store.fileio import atomic_path, dir_lock, lock_holder
from blockcoupling.store.folder import COLLECTION, another_kind
from blockcoupling.store.verified import load_sealed, write_sealed

FORMAT_NAME = "blockcoupling-sweep"
FORMAT_VERSION = 2  # 2: kind vit-grid and the units' ``run``; format 1 is read as it is
MANIFEST = COLLECTION.record
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
_UNIT_FIELDS = ("unit_id", "label", "model", "revision", "step", "prompt_set", "limit",
                "config_hash")  # a catalogue row's fields from the status file's unit record
_STATUS_FIELDS = ("status", "message", "weights_hash", "n_prompts", "seconds")


class CollectionUnit(Protocol):
    """What the format needs of a unit of any kind: its id and its plain-data record."""

    @property
    def unit_id(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


_R = TypeVar("_R", bound="UnitRecord")


@dataclass(frozen=True)
class UnitRecord:
    """A unit of any kind as plain data (it travels to Ray workers as is): what the status
    file and the catalogue record of it (``CATALOGUE_COLUMNS``). A kind uses it as it is (the
    monitor, the ViT grid) or extends it (the sweep's ``Unit`` adds how its model is loaded);
    its id comes from `collection_unit_id`, its ``config_hash`` from the measurement config's
    ``config_hash()``."""

    unit_id: str
    label: str
    model: str                # what was measured: a hub id, a local folder, a label
    revision: str | None      # hub revision (None: the default branch or a local folder)
    step: int | None          # training step, None if unknown
    prompt_set: str
    limit: int | None
    config: dict[str, Any]    # MeasureConfig.to_dict()
    config_hash: str
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)  # local input -> content hash
    run: str = ""  # the unit's run directory inside units/<unit_id>/ ("": that folder itself;
    #                a unit trained into its folder names its run, e.g. "coupling/final")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[_R], data: Mapping[str, Any]) -> _R:
        """The record of a status file's ``unit`` (keys of other kinds or versions ignored;
        JSON lists back into the fields' tuples)."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        out = {k: v for k, v in data.items() if k in names}
        for name, f in names.items():
            if name in out and isinstance(out[name], list) and str(f.type).startswith("tuple"):
                out[name] = tuple(out[name])
        out["inputs"] = dict(out.get("inputs") or {})
        return cls(**out)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    """Atomic, sealed JSON write of a manifest or a status file
    (``store.verified.write_sealed``: an edit is detected when it is read)."""
    write_sealed(path, data)


def manifest_fix(root: Path) -> str:
    """How a collection's lost or damaged manifest is rebuilt (from its status files)."""
    return ("Resume it (`blockcoupling sweep SPEC --out "
            f"{root} --resume` with the spec it was run with, the same "
            "CouplingMonitor(out=...) or the same vit-grid command): the manifest is "
            "rebuilt from the status files")


def read_json(path: Path) -> Any:
    """A collection manifest or status file, verified (``store.verified.load_sealed``; one
    written before they were sealed is read as it is), or one line naming its repair."""
    root = path.parent.parent if path.parent.name == STATUS else path.parent
    if path.name == MANIFEST:
        fix = manifest_fix(root)
    else:
        fix = f"Delete {path} and r{status_fix(root)[1:]}"
    return load_sealed(path, fix)


def status_fix(root: Path) -> str:
    """How a unit whose status file is damaged or lost is checked again."""
    return (f"Resume the collection with --resume (the same `blockcoupling sweep SPEC --out "
            f"{root} --resume`, CouplingMonitor or vit-grid command): the unit is then checked "
            "and measured again where needed")


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
    """The collection manifest of ``root``, checked (format, version, a ``kind`` that is a
    name), or one `RunDirError` line. A manifest of format 1 records no ``kind``: it is read
    as it is, and its kind is the registry's default (`blockcoupling.runs.kinds.manifest_kind`)."""
    if not root.is_dir():
        raise RunDirError(f"no sweep directory at {root}; check the path (a sweep directory is "
                          "created by `blockcoupling sweep SPEC --out DIR` or a CouplingMonitor)")
    path = root / MANIFEST
    if not path.exists() and (root / LEGACY_GRID_FILE).is_file():
        raise RunDirError(upgrade_line(root))
    if not path.exists() and (other := another_kind(root, COLLECTION)) is not None:
        raise other
    if not path.exists():
        if (root / STATUS).is_dir() and any((root / STATUS).glob("*.json")):
            raise RunDirError(f"{path} is missing: {root} has lost its manifest. "
                              f"{manifest_fix(root)}")
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
    if "kind" in data and (not isinstance(data["kind"], str) or not data["kind"]):
        raise RunDirError(f"{path}: its kind {data['kind']!r} is not a name; this directory "
                          "belongs to something else: choose another path")
    return data


def new_manifest(kind: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    from blockcoupling.store.fingerprint import library_versions

    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "kind": kind,
            "created": now(), "spec": spec, "order": [], "sessions": [],
            "versions": library_versions()}


@contextlib.contextmanager
def collection_lock(root: Path, kind: str = "collection") -> Iterator[None]:
    """Hold the collection directory's exclusive lock (refuses a second writer on it): the
    store's one directory lock (``store.fileio.DirLock``), removed when released. ``kind``:
    the kind of the writer asking, in the refusal's words."""
    busy = (f"{kind} directory {root} is in use by another {kind}{{who}}; wait for it to "
            "finish or stop it, or choose another --out")
    with dir_lock(root, busy=busy):
        yield


sweep_lock = collection_lock
"""The earlier name of `collection_lock`."""


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


def _read_status_file(path: Path) -> dict[str, Any]:
    """A status file, verified (`read_json`), and the status of the unit its name says (a
    status file copied or renamed to another unit's name is named as such)."""
    rec: dict[str, Any] = read_json(path)
    unit = rec.get("unit")
    uid = unit.get("unit_id") if isinstance(unit, dict) else None
    if uid != path.stem:
        root = path.parent.parent
        raise RunDirError(f"{path} holds the status of unit {uid!r}, not of {path.stem!r} (a "
                          f"copied or renamed status file). Delete it and r"
                          f"{status_fix(root)[1:]}")
    return rec


def read_status(root: Path, uid: str) -> dict[str, Any] | None:
    path = status_path(root, uid)
    return _read_status_file(path) if path.exists() else None


def write_status(root: Path, unit: CollectionUnit, status: str, **fields: Any) -> dict[str, Any]:
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
    return [_read_status_file(p) for p in sorted(folder.glob("*.json"))]


def catalogue(root: Path, manifest: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per unit (``CATALOGUE_COLUMNS``), in the sweep's unit order, with
    ``duplicate_of`` set for done units whose weights, prompt set and config repeat an
    earlier unit's."""
    manifest = manifest if manifest is not None else load_manifest(root)
    order = {uid: i for i, uid in enumerate(manifest.get("order", []))}
    for uid in order:  # a unit begun (its folder made after its status) has its status file
        if not status_path(root, uid).exists() and unit_dir(root, uid).exists():
            raise RunDirError(f"{status_path(root, uid)} is missing: the status of a unit of "
                              f"{root} was lost. {status_fix(root)}")
    rows = []
    for rec in all_status(root):
        u = rec.get("unit") or {}
        uid = u.get("unit_id")
        if not uid:
            continue
        rows.append({**{c: u.get(c) for c in _UNIT_FIELDS},
                     **{c: rec.get(c) for c in _STATUS_FIELDS},
                     "attempts": rec.get("attempts", 0), "run_dir": run_relpath(u)})
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
    done = df[(df["status"] == "done") & df["weights_hash"].fillna("").astype(bool)]
    first = done.groupby(["weights_hash", "prompt_set", "config_hash"], sort=False,
                         dropna=False)["unit_id"].transform("first")
    df["duplicate_of"] = first.where(first != done["unit_id"]).reindex(df.index)
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


class UnitDamagedError(RunDirError):
    """A done unit's files are missing, damaged or replaced (the message names the repair)."""


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


# ---------------------------------------------------------------------------- unit ids
def slug(text: str, width: int = 40) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s[:width] or "x"


def collection_unit_id(readable: Sequence[tuple[str, int]], identity: Any) -> str:
    """The one unit-id rule of every collection kind: the ``readable`` parts (text, width),
    each made a file-name slug, then ``canonical_hash(identity)`` (12 hex digits) of the
    kind's identity fields. The hash decides; the rest is for humans."""
    digest = canonical_hash(identity, digits=12, compact=False, strict=False)
    return "-".join([*(slug(text, width) for text, width in readable), digest])
