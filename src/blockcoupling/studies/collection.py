"""Collections: one format for every "many runs" kind, read by one reader.

A collection is a directory in the layout of `blockcoupling.store.collection` whose
manifest records its ``kind``: ``sweep`` (``run_sweep``), ``monitor`` (``CouplingMonitor``)
or ``vit-grid`` (``studies.vit.grid.run_grid``). Every kind has the same catalogue, unit-id
rule, lock and status vocabulary, and is read by [`open_collection`][blockcoupling.studies.sweep.read.open_collection] (alias
``open_sweep``); ``blockcoupling report``, ``sweep-status`` and ``correlate`` take any kind
through it. This module adds what depends on the kind: the report page
(`write_collection_report`) and the conversion of old layouts
(`upgrade_collection`, ``blockcoupling collection upgrade DIR``), and which kind a spec
file asks for (`spec_kind`: its ``kind:`` key, never guessed from its other keys).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.store import collection as store
from blockcoupling.studies.sweep.read import Sweep, open_collection, open_sweep

#: the kinds a spec file may ask for (a monitor is written by training code, not by a spec)
SPEC_KINDS = ("sweep", "vit-grid")
#: a ViT grid spec's own keys: named in the message for a grid spec that does not say its kind
_GRID_KEYS = ("drop_path", "weight_decay", "train")


def spec_kind(data: Any, where: str = "spec") -> str:
    """The kind a spec (a parsed YAML mapping) asks for: its ``kind`` (``sweep`` when absent).
    A spec without ``kind`` but with a ViT grid's keys gets one line saying to add it."""
    if not isinstance(data, dict):
        return "sweep"  # the sweep's parser says what a spec must be
    kind = data.get("kind", "sweep")
    if kind not in SPEC_KINDS:
        raise BlockCouplingError(f"{where}: unknown kind {kind!r}; a spec is kind: sweep "
                                 "(the default) or kind: vit-grid")
    if "kind" not in data and "models" not in data and set(_GRID_KEYS) & set(data):
        raise BlockCouplingError(f"{where} has a ViT grid's keys but no kind: add the line "
                                 "'kind: vit-grid' (specs say their kind; nothing is guessed)")
    return str(kind)


def write_collection_report(collection: Sweep, out: str | os.PathLike[str]) -> Path:
    """The collection's page: the ViT study page for a ``vit-grid``, the emergence page
    (coupling against the training step, per model) for a sweep or a monitor."""
    if collection.kind == "vit-grid":
        from blockcoupling.studies.vit.report import write_vit_report

        return Path(write_vit_report(collection.root, Path(out)))
    from blockcoupling.report.emergence import write_emergence_report

    return Path(write_emergence_report(collection, out))


def upgrade_collection(path: str | os.PathLike[str]) -> Sweep:
    """Convert ``path`` to the current collection format and open it: a ViT grid in the old
    layout (``grid.json`` + ``runs/<point>/``) becomes a ``vit-grid`` collection (each
    trained folder moved, not copied, to ``units/<unit_id>/``; status files from the
    trainings and ``grid.json``'s records); a collection of format 1 only has its version
    raised (its units, ids and statuses are already the format's). Safe to run again after an
    interruption."""
    root = Path(path)
    if not root.is_dir():
        raise RunDirError(f"no directory at {root}; give a sweep, monitor or ViT grid directory")
    with store.sweep_lock(root, "collection"):
        if not (root / store.MANIFEST).is_file():
            if not (root / store.LEGACY_GRID_FILE).is_file():
                raise RunDirError(f"{root} is neither a collection nor a ViT grid in the old "
                                  f"layout (no {store.MANIFEST}, no {store.LEGACY_GRID_FILE}); "
                                  "nothing to upgrade")
            _upgrade_grid(root)
        manifest = store.load_manifest(root)
        if manifest.get("format_version") != store.FORMAT_VERSION:
            manifest["format_version"] = store.FORMAT_VERSION
            store.write_json(root / store.MANIFEST, manifest)
        (root / store.LEGACY_GRID_FILE).unlink(missing_ok=True)
        store.write_catalogue(root)
    return open_collection(root)


def _upgrade_grid(root: Path) -> None:
    """``grid.json`` + ``runs/`` -> the vit-grid collection (under the caller's lock)."""
    from blockcoupling.studies.vit.grid import KIND, grid_unit, headline_tokens, unit_record
    from blockcoupling.studies.vit.train import METRICS_FILE, VitTrainConfig, is_trained

    legacy = root / store.LEGACY_GRID_FILE
    try:
        doc = json.loads(legacy.read_text(encoding="utf-8"))
        records = dict(doc["runs"]) if isinstance(doc, dict) else {}
        base_dict = doc.get("base") if isinstance(doc, dict) else None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        records, base_dict = {}, None  # unreadable: the trainings' own records say enough
    found: dict[str, tuple[Any, VitTrainConfig, Path]] = {}  # unit id -> (unit, config, folder)
    folders = [*sorted((root / "runs").glob(f"*/{METRICS_FILE}")),
               *sorted((root / store.UNITS).glob(f"*/{METRICS_FILE}"))]
    for metrics in folders:
        try:
            cfg = VitTrainConfig.from_dict(json.loads(metrics.read_text(encoding="utf-8"))
                                           ["config"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
            raise RunDirError(f"cannot read {metrics} ({err}); move that run's folder out of "
                              f"{root} and run the upgrade again") from err
        u = grid_unit(cfg)
        found[u.unit_id] = (u, cfg, metrics.parent)
    if base_dict is None and found:
        first = next(iter(found.values()))[1]
        base_dict = json.loads(json.dumps(first.replace(drop_path=0.0, weight_decay=0.0, seed=0)
                                          .to_dict(), default=str))
    if base_dict is None:
        raise RunDirError(f"{legacy} is unreadable and {root} holds no trained run; delete "
                          f"{root} and run the grid again")
    base = VitTrainConfig.from_dict(base_dict)
    labels = {u.label for u, _, _ in found.values()}
    failed: dict[str, str | None] = {}
    for name, rec in records.items():  # points that failed before their folder had metrics
        if name in labels or not isinstance(rec, dict):
            continue
        cfg = base.replace(drop_path=rec["drop_path"], weight_decay=rec["weight_decay"],
                           seed=rec["seed"])
        u = grid_unit(cfg)
        found.setdefault(u.unit_id, (u, cfg, root / "runs" / name))
        if rec.get("status") == "failed":
            failed[u.unit_id] = rec.get("message")
    units = sorted(found.values(), key=lambda x: (x[1].weight_decay, x[1].drop_path,
                                                  x[1].seed))
    (root / store.UNITS).mkdir(exist_ok=True)
    for u, cfg, folder in units:
        target = store.unit_dir(root, u.unit_id)
        if folder.is_dir() and folder != target:
            os.replace(folder, target)
        status = ("done" if is_trained(target, cfg) else
                  "failed" if u.unit_id in failed else "pending")
        extra = unit_record(root, u) if status == "done" else {}
        store.write_status(root, u, status, message=failed.get(u.unit_id), **extra)
    with contextlib.suppress(OSError):
        (root / "runs").rmdir()  # empty now; anything left in it stays
    spec = {KIND: {"base": base_dict,
                   "drop_paths": sorted({c.drop_path for _, c, _ in units}),
                   "weight_decays": sorted({c.weight_decay for _, c, _ in units}),
                   "seeds": sorted({c.seed for _, c, _ in units})}}
    manifest = store.new_manifest(KIND, spec)
    manifest["order"] = [u.unit_id for u, _, _ in units]
    manifest["headline_tokens"] = headline_tokens(base_dict)
    manifest["sessions"].append({"started": store.now(), "executor": "upgrade",
                                 "upgraded_from": store.LEGACY_GRID_FILE})
    store.write_json(root / store.MANIFEST, manifest)


__all__ = ["open_collection", "open_sweep", "upgrade_collection",
           "write_collection_report"]
