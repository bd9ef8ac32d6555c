"""``RunWriter``: a run directory written part by part, safe against a kill at any point.

Write protocol (each step durable before the next):

1. **open**: take the lock (``RUN/.lock``), write a sealed manifest (``status: running``).
   A directory that holds no results yet (a run that failed before its first part) is
   replaced, so a failed or crashed start never blocks the corrected command.
2. **part**: the part's files and its sealed ``part.json`` (checksums of every file) go into
   ``parts/.tmp-part-N-PID``, which one ``os.replace`` renames to ``parts/part-N``: the commit.
   A kill loses at most the part being written.
3. **finalize**: the consolidated tables and ``arrays.npz`` are written to temporary names,
   the manifest naming their checksums (``status: complete``) is committed, then the files are
   renamed into place and the merged parts and the lock file are deleted. A kill before the
   commit leaves the parts; after it, the temporary files, which the next reader verifies and
   the next writer renames (integrity.roll_forward).

Resume checks the directory as a reader does (seals, checksums, duplicates), refuses other
settings (everything but ``RUNTIME_KEYS``) with the list of differences, and reports the
prompts already stored through :meth:`RunWriter.done_prompt_ids`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import TABLES, Measurement
from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.store import bases as stored
from blockcoupling.store.fileio import (
    LOCK,
    TMP_PREFIX,
    DirLock,
    atomic_write_bytes,
    commit_temp,
    disk_errors,
    fsync_dir,
    sha256_bytes,
    write_file,
    write_temp,
)
from blockcoupling.store.integrity import (
    DATA_FILES,
    RunContents,
    part_dirs,
    part_hint,
    part_meta_bytes,
    roll_forward,
    scan,
    verified_bytes,
)
from blockcoupling.store.manifest import (
    ARRAYS,
    MANIFEST,
    PART_META,
    PARTS,
    jsonable,
    load_manifest,
    meta_from_manifest,
    new_manifest,
    now,
    prompt_records,
    resume_differences,
    write_manifest,
)
from blockcoupling.store.reader import read_measurement
from blockcoupling.store.schema import SCHEMA_FILE, schema_markdown
from blockcoupling.store.tables import arrays_bytes, part_prompt_ids, table_bytes


class RunWriter:
    """Writes a run directory part by part; a context manager holding the directory's lock.

    ``meta`` is stored verbatim (JSON-safe) and returned by :func:`open_run`; its entries
    ``model``, ``revision``, ``weights_hash`` and ``device`` are also lifted to the top of the
    manifest. ``prompts`` has columns ``prompt_id``, ``text`` and optionally ``label``.

    Without ``resume`` the directory must not exist, be empty, or hold a run without results.
    With ``resume`` an existing run is continued: its config (except ``RUNTIME_KEYS``),
    prompts and model identity must match, else RunDirError lists what differs.
    """

    def __init__(self, path: str | os.PathLike[str], *, config: MeasureConfig,
                 meta: Mapping[str, Any], prompts: pd.DataFrame, resume: bool = False) -> None:
        self.root = Path(path)
        self.config = config
        self._lock: DirLock | None = None
        self._finalized = False
        records = prompt_records(prompts)
        self._order = {p["prompt_id"]: i for i, p in enumerate(records)}
        with disk_errors(self.root):
            if self.root.exists() and not self.root.is_dir():
                raise RunDirError(f"--out {self.root} is a file; choose a directory for the run")
            self.root.mkdir(parents=True, exist_ok=True)
            self._lock = DirLock(self.root)
            try:
                self._open(config, dict(meta), records, resume)
            except BaseException:
                self.close()
                raise

    # -------------------------------------------------------------- opening
    def _open(self, config: MeasureConfig, meta: dict[str, Any],
              records: list[dict[str, Any]], resume: bool) -> None:
        entries = [p for p in self.root.iterdir()
                   if p.name != LOCK and not p.name.startswith(TMP_PREFIX)]
        new_config = jsonable(config.to_dict())
        if entries and not self._holds_no_results(entries):
            if not resume:
                raise RunDirError(
                    f"{self.root} already exists and is not empty{self._what_is_there()}; use "
                    "--resume to continue it or choose a new --out"
                )
        elif entries:  # a run that failed before its first result: start it afresh
            for entry in entries:
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            entries = []
        if not entries:
            self.manifest = new_manifest(new_config, meta, records)
            write_manifest(self.root, self.manifest)
            self._contents = RunContents()
            self._done: set[str] = set()
            return
        manifest = load_manifest(self.root)
        diffs = resume_differences(manifest, new_config, meta, records)
        if diffs:
            raise RunDirError(
                f"cannot resume {self.root}: it was measured with different settings:\n  "
                + "\n  ".join(diffs)
                + "\nresume with the run's original options, or choose a new --out"
            )
        cons = manifest.get("consolidated") or {}
        roll_forward(self.root, cons.get("files", {}))
        contents = scan(self.root, manifest)
        self._cleanup(contents)
        for part in contents.parts:  # every stored file must match its checksum
            for name in DATA_FILES:
                verified_bytes(part.path / name, part.files.get(name), part_hint(part.path))
            stored.verify_part(part)
        self._contents = contents
        self._done = contents.done
        manifest["config"] = new_config  # only runtime keys can differ
        manifest["status"] = "running"
        manifest.setdefault("resumed", []).append(now())
        self.manifest = manifest
        write_manifest(self.root, manifest)

    def _what_is_there(self) -> str:
        """`` (it holds a run: 2 of 4 prompts, running)``, or nothing if that cannot be read."""
        try:
            manifest = load_manifest(self.root)
            done = len(scan(self.root, manifest).done)
        except RunDirError:
            return ""
        return f" (it holds a run: {done} of {len(manifest['prompts'])} prompts, {manifest['status']})"

    def _holds_no_results(self, entries: list[Path]) -> bool:
        """True for a run directory whose run never stored a result (only its manifest and an
        empty parts folder): replacing it loses nothing."""
        names = {p.name for p in entries}
        if not names <= {MANIFEST, PARTS} or MANIFEST not in names:
            return False
        try:
            manifest = load_manifest(self.root)
        except RunDirError:
            return False
        return not manifest.get("consolidated") and not part_dirs(self.root)

    def _cleanup(self, contents: RunContents) -> None:
        """Remove leftovers of a killed writer (we hold the lock): temporary files and
        directories, and parts already merged into the consolidated tables."""
        for parent in (self.root, self.root / PARTS, self.root / stored.BASES_DIR):
            if not parent.is_dir():
                continue
            for entry in parent.iterdir():
                if entry.name.startswith(TMP_PREFIX):
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
        for part in contents.stale:
            shutil.rmtree(part, ignore_errors=True)

    # -------------------------------------------------------------- writing
    def done_prompt_ids(self) -> set[str]:
        """Prompt ids whose results are safely on disk (skip them when resuming)."""
        return set(self._done)

    def _check_open(self) -> None:
        if self._finalized:
            raise BlockCouplingError(f"the run {self.root} is finalized; open a new RunWriter")
        if self._lock is None:
            raise BlockCouplingError(f"the writer of {self.root} is closed")

    def write_part(self, part: Measurement) -> None:
        """Persist one part (its tables hold only its prompts) atomically under ``parts/``."""
        self._check_open()
        ids = part_prompt_ids(part)
        if not ids:
            raise BlockCouplingError(
                "a part must cover at least one prompt: fill its prompts table"
            )
        unknown = [i for i in ids if i not in self._order]
        if unknown:
            raise BlockCouplingError(
                f"part has prompt ids not in this run: {', '.join(unknown[:5])}"
            )
        again = sorted(set(ids) & self._done)
        if again:
            raise BlockCouplingError(
                f"prompt(s) {', '.join(again[:5])} are already written to {self.root}; skip "
                "the prompts in done_prompt_ids()"
            )
        run_meta = self.manifest.get("meta")
        payload = {f"{name}.parquet": table_bytes(name, part.table(name), run_meta)
                   for name in TABLES}
        payload[ARRAYS] = arrays_bytes(part.arrays)
        basis = stored.bases_bytes(part.basis_store, ids)
        if basis is not None:
            payload[stored.BASES_FILE] = basis
        meta = part_meta_bytes(ids, payload, now())
        with disk_errors(self.root):
            parts_dir = self.root / PARTS
            parts_dir.mkdir(exist_ok=True)
            existing = [int(p.name.removeprefix("part-")) for p in part_dirs(self.root)
                        if p.name.removeprefix("part-").isdigit()]
            merged = (self.manifest.get("consolidated") or {}).get("parts", [])
            existing += [int(n.removeprefix("part-")) for n in merged]
            name = f"part-{max(existing, default=0) + 1:06d}"
            tmp = parts_dir / f"{TMP_PREFIX}{name}-{os.getpid()}"
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            for fname, data in payload.items():
                write_file(tmp / fname, data)
            write_file(tmp / PART_META, meta)
            fsync_dir(tmp)
            os.replace(tmp, parts_dir / name)  # the commit point
            fsync_dir(parts_dir)
        self._done.update(ids)

    def finalize(self, *, timings: Mapping[str, Any] | None = None,
                 fast_path: Mapping[str, Any] | None = None) -> Measurement:
        """Consolidate all parts into one file per table + ``arrays.npz``, mark the run
        complete, release the lock and return the run. Safe against a kill at any point.
        ``fast_path``: the per-layer record of this process's measurement
        (engine/fastrecord.py), merged layer by layer into ``meta["fast_path"]`` (a resumed
        run keeps the layers only an earlier process recorded)."""
        self._check_open()
        manifest = self.manifest
        with disk_errors(self.root):
            contents = scan(self.root, manifest)
            meas = read_measurement(self.root, manifest, contents)
            run_meta = manifest.get("meta")
            payload = {f"{name}.parquet": table_bytes(name, meas.table(name), run_meta)
                       for name in TABLES}
            payload[ARRAYS] = arrays_bytes(meas.arrays)
            temps = {name: write_temp(self.root / name, data) for name, data in payload.items()}
            merged = list((manifest.get("consolidated") or {}).get("parts", []))
            merged += [p.path.name for p in contents.parts]
            done = sorted(self._done, key=lambda pid: self._order.get(pid, len(self._order)))
            # the parts' bases files are linked into bases/ before the commit names them
            basis_files = {**(manifest.get("consolidated") or {}).get("bases", {}),
                           **stored.consolidate(self.root, contents.parts)}
            manifest["consolidated"] = {
                "parts": merged, "prompt_ids": done,
                "files": {name: sha256_bytes(data) for name, data in payload.items()},
            }
            if basis_files:
                manifest["consolidated"]["bases"] = basis_files
            manifest["timings"] = {**manifest.get("timings", {}), **jsonable(dict(timings or {}))}
            if fast_path:
                meta = manifest.setdefault("meta", {})
                meta["fast_path"] = {**(meta.get("fast_path") or {}), **jsonable(dict(fast_path))}
            manifest["status"] = "complete"
            manifest["finished"] = now()
            manifest["missing_prompt_ids"] = [
                p["prompt_id"] for p in manifest["prompts"] if p["prompt_id"] not in self._done
            ]
            write_manifest(self.root, manifest)  # commit point: parts are now merged
            for name, tmp in temps.items():
                commit_temp(tmp, self.root / name)
            atomic_write_bytes(self.root / SCHEMA_FILE,
                               schema_markdown(manifest.get("meta")).encode())  # derived
            for part in contents.parts:
                shutil.rmtree(part.path, ignore_errors=True)
            if (self.root / PARTS).is_dir() and not any((self.root / PARTS).iterdir()):
                (self.root / PARTS).rmdir()
        self._finalized = True
        self.close()
        meas.meta = meta_from_manifest(self.root, manifest)
        meas.basis_store = stored.stored_bases(self.root, manifest, [])  # the parts are gone
        return meas

    def close(self) -> None:
        """Release the lock and remove ``.lock`` (an unfinished run stays resumable)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - never raise from a finalizer
            pass
