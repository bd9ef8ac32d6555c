"""The ViT grid's registration as a collection kind (`blockcoupling.runs.kinds`): a
spec with ``kind: vit-grid``, the ViT study page, [CLS] as its headline token, the check of a
trained unit, the conversion of the old grid layout (``grid.json`` + ``runs/``), and a folder
of loose ``vit-train`` outputs (``blockcoupling report FOLDER``: the same page)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from blockcoupling.errors import RunDirError
from blockcoupling.runs.kinds import CollectionKind, register
from blockcoupling.store import collection as store


def _page(collection: Any, out: Path) -> Path:
    from blockcoupling.studies.vit.report import write_vit_report

    return Path(write_vit_report(collection.root, Path(out)))


def _repair(root: Path) -> str:
    return f"run the same vit-grid again with --out {root}: it trains the damaged points again"


def _parse(data: Any) -> Any:
    from blockcoupling.studies.vit.grid import load_grid_spec

    return load_grid_spec(data)


def _plan(spec: Any) -> Any:
    from blockcoupling.studies.vit.grid import load_grid_spec
    from blockcoupling.studies.vit.plan import plan_grid

    return plan_grid(*load_grid_spec(spec))


def _recognises(folder: Path) -> bool:
    """A folder of ``vit-train`` outputs (a ``metrics.json`` of a ViT run in it or below)."""
    from blockcoupling.studies.vit.grid import collect_runs

    try:
        return not collect_runs(folder).empty
    except (OSError, ValueError, KeyError):
        return False


def _folder_page(folder: Path, out: Path) -> Path:
    from blockcoupling.studies.vit.report import write_vit_report

    return Path(write_vit_report(folder, Path(out)))


def _unit_check(folder: Path) -> str | None:
    from blockcoupling.studies.vit.train import metrics_problem

    return metrics_problem(folder)


def _upgrade(root: Path) -> bool:
    """``grid.json`` + ``runs/`` -> the vit-grid collection (under the caller's lock);
    False where ``root`` is not a ViT grid in the old layout."""
    if not (root / store.LEGACY_GRID_FILE).is_file():
        return False
    from blockcoupling.runs.protocol import run_record
    from blockcoupling.store.verified import load_json
    from blockcoupling.studies.vit.grid import KIND, grid_unit, headline_tokens
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
        again = f"Move that run's folder out of {root} and run the upgrade again."
        record = load_json(metrics, again)  # a record of an older blockcoupling: unsealed
        try:
            cfg = VitTrainConfig.from_dict(record["config"])
        except (ValueError, KeyError, TypeError) as err:
            raise RunDirError(f"{metrics} holds no training config ({err}). {again}") from err
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
        extra = run_record(root, u) if status == "done" else {}
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
    return True


#: a ViT grid spec's own keys (a spec naming them without ``kind:`` is asked for it)
GRID_KEYS = ("drop_path", "weight_decay", "train")

KIND = register(CollectionKind(name="vit-grid", page=_page, repair=_repair, parse_spec=_parse,
                               plan=_plan, headline_tokens="first", unit_check=_unit_check,
                               upgrade=_upgrade, spec_keys=GRID_KEYS, recognises=_recognises,
                               folder_page=_folder_page, package=__package__ or ""))
