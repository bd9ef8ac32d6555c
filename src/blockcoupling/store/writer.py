"""``RunWriter``: a run directory written part by part, safe against a kill at any point.

Each step is durable before the next: **open** (the lock, a sealed manifest ``status:
running``; a directory that holds no results yet is replaced), **part** (its files and sealed
``part.json`` in ``parts/.tmp-part-N-PID``, committed by one ``os.replace`` to
``parts/part-N``: a kill loses at most that part), **finalize** (consolidated files under
temporary names, the manifest naming their checksums committed, then the renames;
`blockcoupling.store.integrity` rolls a killed finalize forward). Resume checks the directory
as a reader does and refuses other settings (all but ``RUNTIME_KEYS``) with the list of
differences; `RunWriter.done_prompt_ids` are the prompts already stored.
"""

from __future__ import annotations

import contextlib
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
    TMP_PREFIX,
    atomic_write_bytes,
    commit_temp,
    disk_errors,
    fsync_dir,
    sha256_bytes,
    write_file,
    write_temp,
)
from blockcoupling.store.folder import NEW, REPLACE, RUN_DIRECTORY, decide, entries, open_folder
from blockcoupling.store.integrity import (
    DATA_FILES,
    RunContents,
    bases_entries,
    damaged_files,
    part_dirs,
    part_hint,
    part_meta_bytes,
    roll_forward,
    scan,
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
from blockcoupling.store.verified import verified_bytes


def _what_is_there(root: Path) -> str:
    """`` (2 of 4 prompts stored, running)``, or nothing if that cannot be read."""
    try:
        manifest = load_manifest(root)
        done = len(scan(root, manifest).done)
    except RunDirError:
        return ""
    return f" ({done} of {len(manifest['prompts'])} prompts stored, {manifest['status']})"


def _holds_no_results(root: Path) -> bool:
    """True for a run directory whose run never stored a result (only its manifest and an
    empty parts folder): replacing it loses nothing."""
    names = {p.name for p in entries(root)}
    if not names <= {MANIFEST, PARTS} or MANIFEST not in names:
        return False
    try:
        manifest = load_manifest(root)
    except RunDirError:
        return False
    return not manifest.get("consolidated") and not part_dirs(root)


def _verify_parts(contents: RunContents) -> None:
    """Every file of every pending part matches its checksum (tables, arrays, bases)."""
    for part in contents.parts:
        for name in DATA_FILES:
            verified_bytes(part.path / name, part.files.get(name), part_hint(part.path))
        stored.verify_part(part)


def _payload(m: Measurement, run_meta: Any) -> dict[str, bytes]:
    """The files of a part or of the consolidated run: one Parquet file per table, the arrays."""
    return {**{f"{name}.parquet": table_bytes(name, m.table(name), run_meta) for name in TABLES},
            ARRAYS: arrays_bytes(m.arrays)}


#: a run directory in the run protocol's words (`blockcoupling.store.folder`)
RUN = RUN_DIRECTORY


def check_target(root: Path, config: MeasureConfig, meta: Mapping[str, Any],
                 records: list[dict[str, Any]], resume: bool, *,
                 locked: bool = False, verify_parts: bool | None = None
                 ) -> dict[str, Any] | None:
    """What opening ``root`` for this run refuses, checked without writing anything (the
    writer's open and ``measure --dry-run`` run this one function): the run protocol's
    decision (`store.folder.decide`: a file at ``root``, another writer holding it unless
    ``locked``, a run there without ``resume``, a run of other settings), then damaged stored
    parts (``verify_parts``, default: unless ``locked``, as the writer verifies them itself
    after rolling a killed consolidation forward). Returns the manifest to resume, or None
    when the run starts afresh (new, empty, or no result stored yet)."""
    state = decide(root, RUN, resume=resume, locked=locked,
                   **_identity(root, config, meta, records))
    if state in (NEW, REPLACE):
        return None
    manifest = load_manifest(root)
    if verify_parts if verify_parts is not None else not locked:
        _verify_parts(scan(root, manifest))
    return manifest


def _identity(root: Path, config: MeasureConfig, meta: Mapping[str, Any],
              records: list[dict[str, Any]]) -> dict[str, Any]:
    """How the protocol reads a run directory's identity: the settings, model and prompts
    it records against this run's (a damaged manifest is its own line), whether it stored a
    result, and what it holds in words."""
    def differences() -> list[str]:
        return resume_differences(load_manifest(root), jsonable(config.to_dict()), dict(meta),
                                  records)

    return {"differences": differences, "has_results": lambda: not _holds_no_results(root),
            "describe": lambda: _what_is_there(root)}


def resume_config(root: Path, config: MeasureConfig, resume: bool) -> tuple[MeasureConfig, str | None]:
    """The config a run in ``root`` is resumed with, and the line that says why it is not
    ``config``: a stored run whose variants differ from ``config``'s only in variants that
    are no part of the identity (``Variant.hashed=False``: a variant added after the run
    began is on by default now) keeps the variants its recorded config asked for, so every
    prompt of it has the same tables. Anything else (no run with results there, another
    difference) is ``config`` unchanged, and `check_target` refuses what differs."""
    if not resume or not entries(root) or _holds_no_results(root):
        return config, None
    try:
        old = list((load_manifest(root).get("config") or {}).get("variants") or ())
        theirs = config.replace(variants=tuple(old)) if old else config
    except BlockCouplingError:
        return config, None  # damaged or of another version: check_target says it
    if list(config.variants) == old or theirs.config_hash() != config.config_hash():
        return config, None
    added = [v for v in config.variants if v not in old]
    more = (f"; {', '.join(added)} {'is' if len(added) == 1 else 'are'} not measured in this "
            "run: measure into a new --out for it" if added else "")
    return theirs, (f"{root}: resumed with the variants it began with ({', '.join(old)})"
                    + more)


class RunWriter:
    """Writes a run directory part by part; a context manager holding the directory's lock.

    ``meta`` is stored verbatim (JSON-safe) and returned by [`open_run`][blockcoupling.store.reader.open_run]; its entries
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
        self._open_folder: contextlib.ExitStack | None = contextlib.ExitStack()
        self._finalized = False
        records = prompt_records(prompts)
        self._order = {p["prompt_id"]: i for i, p in enumerate(records)}
        try:
            with disk_errors(self.root):
                state = self._open_folder.enter_context(open_folder(
                    self.root, RUN, resume=resume,
                    **_identity(self.root, config, dict(meta), records)))
                self._open(state, config, dict(meta), records)
        except BaseException:
            self.close()
            raise

    # -------------------------------------------------------------- opening
    def _open(self, state: str, config: MeasureConfig, meta: dict[str, Any],
              records: list[dict[str, Any]]) -> None:
        new_config = jsonable(config.to_dict())
        self.damaged_bases: dict[str, list[str]] = {}  # consolidated bases file -> prompts
        if state in (NEW, REPLACE):  # new, empty, or a run that failed before its first result
            self.manifest = new_manifest(new_config, meta, records)
            write_manifest(self.root, self.manifest)
            self._done: set[str] = set()
            return
        manifest = load_manifest(self.root)
        cons = manifest.get("consolidated") or {}
        roll_forward(self.root, cons.get("files", {}))
        contents = scan(self.root, manifest)
        self._cleanup(contents)
        _verify_parts(contents)
        stored_bases = bases_entries(manifest)
        self.damaged_bases = {name: list(stored_bases[name].get("prompt_ids") or [])
                              for name in damaged_files(self.root, manifest)}
        self._done = contents.done
        manifest["config"] = new_config  # only runtime keys can differ
        manifest["status"] = "running"
        manifest.setdefault("resumed", []).append(now())
        self.manifest = manifest
        write_manifest(self.root, manifest)

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

    def repair_bases(self, name: str, data: bytes) -> None:
        """Put back the consolidated bases file ``name`` (listed in ``damaged_bases``) from
        its prompts measured again: ``data`` must match the checksum recorded when the file
        was first written (the same computation gives the same bytes), else RunDirError."""
        self._check_open()
        want = bases_entries(self.manifest)[name].get("sha256")
        if sha256_bytes(data) != want:
            raise RunDirError(
                f"the stored bases {self.root / name} could not be rebuilt bit for bit (their "
                "prompts measured again gave other values: another machine, thread count or "
                "library version?); measure again into a new --out")
        with disk_errors(self.root):
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.root / name, data)
        self.damaged_bases.pop(name, None)

    # -------------------------------------------------------------- writing
    def done_prompt_ids(self) -> set[str]:
        """Prompt ids whose results are safely on disk (skip them when resuming)."""
        return set(self._done)

    def _check_open(self) -> None:
        if self._finalized:
            raise BlockCouplingError(f"the run {self.root} is finalized; open a new RunWriter")
        if self._open_folder is None:
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
        payload = _payload(part, self.manifest.get("meta"))
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
            payload = _payload(meas, manifest.get("meta"))
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
        folder, self._open_folder = getattr(self, "_open_folder", None), None
        if folder is not None:
            folder.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - never raise from a finalizer
            pass
