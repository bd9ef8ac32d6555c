"""What of a collection depends on its kind, asked of the registry (`blockcoupling.runs.kinds`)
and naming none: the report page (`write_collection_report`), the conversion of old layouts
(`upgrade_collection`, ``blockcoupling collection upgrade DIR``) and which kind a spec file
asks for (`spec_kind`: its ``kind:`` key, never guessed). Every kind is read by
[`open_collection`][blockcoupling.runs.read.open_collection].
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from blockcoupling.errors import RunDirError
from blockcoupling.runs import kinds
from blockcoupling.runs.read import Sweep, load_manifest, open_collection, open_sweep
from blockcoupling.store import collection as store
from blockcoupling.store.folder import COLLECTION, another_kind, settle
from blockcoupling.validate import OptionError


def spec_kind(data: Any, where: str = "spec") -> str:
    """The kind a spec (a parsed YAML mapping) asks for: its ``kind`` (the registry's
    default kind when absent), one of the registered kinds with a spec parser. A spec
    without ``kind`` but with another kind's own keys (``CollectionKind.spec_keys``) gets one
    line saying to add it."""
    default = kinds.default().name
    if not isinstance(data, dict):
        return default  # its parser says what a spec must be
    kind = data.get("kind", default)
    known = kinds.spec_kinds()
    if not isinstance(kind, str) or kind not in known:
        raise OptionError(f"{where}: unknown kind {kind!r}; a spec is kind: "
                                 f"{default} (the default) or "
                                 + " or ".join(f"kind: {k}" for k in known if k != default))
    if "kind" not in data and "models" not in data:
        for other in known:
            if set(kinds.get(other).spec_keys) & set(data):
                raise OptionError(
                    f"{where} has the keys of a {other} spec but no kind: add the line "
                    f"'kind: {other}' (specs say their kind; nothing is guessed)")
    return str(kind)


def write_collection_report(collection: Sweep, out: str | os.PathLike[str]) -> Path:
    """The collection's page: its kind's (``CollectionKind.page``: the ViT study page for a
    ViT grid, the emergence page for a sweep or a monitor)."""
    return kinds.get(collection.kind, collection.root).page(collection, Path(out))


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
        if (root / store.MANIFEST).is_file() or (root / store.LEGACY_GRID_FILE).is_file():
            settle(root)  # what a killed upgrade left (a temporary catalogue)
        upgrades = [k.upgrade for k in map(kinds.get, kinds.names()) if k.upgrade is not None]
        if not (root / store.MANIFEST).is_file() and not any(up(root) for up in upgrades):
            if (other := another_kind(root, COLLECTION, fix="nothing to upgrade")) is not None:
                raise other
            raise RunDirError(f"{root} is neither a collection nor a ViT grid in the old "
                              f"layout (no {store.MANIFEST}, no {store.LEGACY_GRID_FILE}); "
                              "nothing to upgrade")
        manifest = load_manifest(root)
        if manifest.get("format_version") != store.FORMAT_VERSION:
            manifest["format_version"] = store.FORMAT_VERSION
            store.write_json(root / store.MANIFEST, manifest)
        (root / store.LEGACY_GRID_FILE).unlink(missing_ok=True)
        store.write_catalogue(root)
    return open_collection(root)


__all__ = ["open_collection", "open_sweep", "upgrade_collection",
           "write_collection_report"]
