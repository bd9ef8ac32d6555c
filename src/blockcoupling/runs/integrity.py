"""What a collection's format needs from its kinds: whether a ``done`` unit's files can be
trusted (`unit_problem`, `damaged_units`) and the line that measures a damaged unit again
(`repair_command`). The format itself (manifest, status, catalogue, lock, unit ids) is
`blockcoupling.store.collection`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blockcoupling.errors import RunDirError
from blockcoupling.store.collection import all_status, run_relpath, unit_dir


def repair_command(root: Path, kind: str | None) -> str:
    """How a damaged unit of the collection in ``root`` is measured again (its kind's
    ``CollectionKind.repair``; a manifest without kind is the registry's default kind's)."""
    from blockcoupling.runs import kinds

    return (kinds.get(kind, root) if kind else kinds.default()).repair(root)


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
    if unit.get("run"):  # a unit trained into its folder: its kind's check of that folder
        from blockcoupling.runs import kinds

        for name in kinds.names():
            check = kinds.get(name).unit_check
            problem = check(unit_dir(root, uid)) if check is not None else None
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
