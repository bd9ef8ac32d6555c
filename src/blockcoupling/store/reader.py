"""Reading run directories: ``open_run`` (verified), ``is_run_dir`` and ``run_progress``.

Every read verifies what it reads: the manifest's seal, each part's seal, every file's
checksum, and that no prompt is stored twice. A failure is a [`RunDirError`][blockcoupling.errors.RunDirError] that says
what is wrong and which command gets the user out of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from blockcoupling.engine.results import TABLES, Measurement
from blockcoupling.errors import RunDirError
from blockcoupling.store.bases import stored_bases
from blockcoupling.store.fileio import lock_holder
from blockcoupling.store.integrity import (
    RunContents,
    consolidated_hint,
    part_hint,
    scan,
)
from blockcoupling.store.manifest import (
    ARRAYS,
    config_from_manifest,
    load_manifest,
    meta_from_manifest,
)
from blockcoupling.store.tables import order_rows, read_arrays, read_table, to_frame
from blockcoupling.store.verified import verified_bytes


def read_measurement(root: Path, manifest: Mapping[str, Any],
                     contents: RunContents | None = None) -> Measurement:
    """Consolidated tables (if any) + pending parts, verified, rows in manifest prompt order."""
    contents = contents if contents is not None else scan(root, manifest)
    arrow: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
    arrays: dict[str, np.ndarray] = {}
    old_format = manifest.get("format_version", 1) < 2
    if manifest.get("consolidated"):
        hint = (consolidated_hint(root) if not old_format else
                "Re-run the measurement into a new --out.")
        sums = contents.consolidated_files
        for name in TABLES:
            path = root / f"{name}.parquet"
            if not old_format and not path.exists() and f"{name}.parquet" not in sums:
                raise RunDirError(f"{root}: the manifest lists no checksum for {path.name}. {hint}")
            if old_format and not path.is_file():
                raise RunDirError(f"table {name!r} is missing: {path} does not exist. {hint}")
            data = verified_bytes(path, sums.get(f"{name}.parquet"), hint)
            arrow[name].append(read_table(data, name, path, hint))
        arrays.update(read_arrays(verified_bytes(root / ARRAYS, sums.get(ARRAYS), hint),
                                  root / ARRAYS, hint))
    for part in contents.parts:
        hint = part_hint(part.path)
        for name in TABLES:
            path = part.path / f"{name}.parquet"
            data = verified_bytes(path, part.files.get(path.name), hint)
            arrow[name].append(read_table(data, name, path, hint))
        path = part.path / ARRAYS
        arrays.update(read_arrays(verified_bytes(path, part.files.get(ARRAYS), hint), path, hint))
    order = {p["prompt_id"]: i for i, p in enumerate(manifest["prompts"])}
    tables = {name: order_rows(to_frame(name, arrow[name], root), order) for name in TABLES}
    config = config_from_manifest(root, manifest)
    return Measurement(**tables, arrays=arrays, config=config,
                       meta=meta_from_manifest(root, manifest),
                       basis_store=stored_bases(root, manifest, contents.parts))


def open_run(path: str | os.PathLike[str]) -> Measurement:
    """Read a run directory (finished or not) into the [`Measurement`][blockcoupling.engine.results.Measurement] ``measure()`` returns.

    An unfinished run yields the prompts finished so far (``meta["status"] == "running"``).
    Raises RunDirError for a missing, corrupt, altered or foreign directory, saying what to do.
    """
    root = Path(path)
    return read_measurement(root, load_manifest(root))


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` holds a readable blockcoupling run manifest."""
    try:
        load_manifest(Path(path))
    except RunDirError:
        return False
    return True


@dataclass(frozen=True)
class RunProgress:
    """How far a run got: ``done`` of ``total`` prompts, its status and a live writer's PID."""

    status: str  # "complete" or "running"
    done: int
    total: int
    writer_pid: str | None  # PID of a process writing it now, else None

    @property
    def finished(self) -> bool:
        return self.status == "complete" and self.done == self.total

    def describe(self, root: Path) -> str:
        """One line for humans."""
        if self.writer_pid is not None:
            return (f"in progress: {self.done} of {self.total} prompts so far "
                    f"(being written by PID {self.writer_pid})")
        if self.status == "complete":
            missing = self.total - self.done
            return (f"complete: {self.done} of {self.total} prompts" +
                    (f" ({missing} not measured)" if missing else ""))
        return (f"INCOMPLETE: {self.done} of {self.total} prompts (the run was interrupted); "
                f"continue it with the same `blockcoupling measure` command and --resume "
                f"(--out {root})")


def run_progress(path: str | os.PathLike[str]) -> RunProgress:
    """Status and prompt counts of a run directory (verifies the manifest and parts' seals)."""
    root = Path(path)
    manifest = load_manifest(root)
    contents = scan(root, manifest)
    return RunProgress(status=str(manifest["status"]), done=len(contents.done),
                       total=len(manifest["prompts"]), writer_pid=lock_holder(root))
