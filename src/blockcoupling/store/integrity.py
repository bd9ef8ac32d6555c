"""What a run directory holds, verified: sealed part descriptions, checksummed files, no prompt
stored twice, nothing unknown to the manifest.

`scan` checks the structure (each part's sealed ``part.json``, duplicates, unknown prompts)
without reading the tables; `verified_bytes` checks a file's checksum as it is read. A kill
between the commit of a consolidating manifest and its renames leaves temporary files whose
checksums match it: they are read as they are, and the next writer renames them
(``roll_forward``), so a run is never stuck half-consolidated.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockcoupling.engine.results import TABLES
from blockcoupling.errors import RunDirError
from blockcoupling.store.fileio import sha256_bytes
from blockcoupling.store.manifest import ARRAYS, MANIFEST, PART_META, PARTS
from blockcoupling.store.verified import (  # noqa: F401 - their earlier home, kept importable
    SEAL,
    digest_of,
    load_json,
    roll_forward,
    seal_problem,
    sealed_text,
    verified_bytes,
)

TABLE_FILES: tuple[str, ...] = tuple(f"{name}.parquet" for name in TABLES)
DATA_FILES: tuple[str, ...] = (*TABLE_FILES, ARRAYS)


@dataclass
class Part:
    """A finished part directory and what its ``part.json`` says it holds."""

    path: Path
    prompt_ids: list[str]
    files: dict[str, str]  # file name -> "sha256:<hex>"


@dataclass
class RunContents:
    """The verified structure of a run directory."""

    consolidated_ids: list[str] = field(default_factory=list)
    consolidated_files: dict[str, str] = field(default_factory=dict)
    parts: list[Part] = field(default_factory=list)  # pending (not yet merged), in write order
    stale: list[Path] = field(default_factory=list)  # merged parts a kill left behind

    @property
    def done(self) -> set[str]:
        return set(self.consolidated_ids).union(*(p.prompt_ids for p in self.parts))


def part_hint(part: Path) -> str:
    return (f"Delete the part directory {part} and continue the run with --resume to "
            "recompute its prompts.")


def consolidated_hint(root: Path) -> str:
    return (
        f"The parts it was consolidated from were removed when the run finished, so --resume "
        f"cannot rebuild it: restore the file from a backup, or re-run the measurement into a "
        f"new --out (or delete {root} and run the same command again)."
    )


def part_meta_bytes(prompt_ids: list[str], files: Mapping[str, bytes], written: str) -> bytes:
    data: dict[str, Any] = {
        "prompt_ids": list(prompt_ids),
        "written": written,
        "files": {name: sha256_bytes(b) for name, b in files.items()},
    }
    data["digest"] = digest_of(data)
    return (json.dumps(data, indent=1) + "\n").encode()


def read_part(part: Path) -> Part:
    path = part / PART_META
    data = load_json(path, part_hint(part))
    try:
        ids, files = data["prompt_ids"], data.get("files")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or not ids:
            raise ValueError("prompt_ids is not a list of prompt ids")
        if "digest" in data and data["digest"] != digest_of(data):
            raise ValueError("it was changed after it was written (digest mismatch)")
        if files is None:  # format 1: no checksums
            files = {}
        if not isinstance(files, dict):
            raise ValueError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunDirError(f"{path} is damaged ({err}). {part_hint(part)}") from err
    return Part(part, ids, files)


def part_dirs(root: Path) -> list[Path]:
    """Finished part directories, in write order (temporary directories are ignored)."""
    parts = root / PARTS
    if not parts.is_dir():
        return []
    return sorted(p for p in parts.iterdir() if p.name.startswith("part-") and p.is_dir())


def scan(root: Path, manifest: Mapping[str, Any]) -> RunContents:
    """The run's consolidated prompts and pending parts; RunDirError if a prompt is stored
    twice (e.g. a copied part directory) or a part holds a prompt the manifest does not list."""
    cons = manifest.get("consolidated") or {}
    if not isinstance(cons, dict):
        raise RunDirError(f"{root / MANIFEST}: 'consolidated' is damaged; re-run into a new --out")
    out = RunContents(consolidated_ids=list(cons.get("prompt_ids", [])),
                      consolidated_files=dict(cons.get("files", {})))
    if manifest.get("format_version", 1) >= 2 and manifest["status"] == "complete" and not cons:
        raise RunDirError(
            f"{root / MANIFEST} says the run is complete but lists no consolidated files; the "
            "manifest was altered. Restore it from a backup or re-run into a new --out."
        )
    merged = set(cons.get("parts", []))
    known = {p["prompt_id"] for p in manifest["prompts"]}
    owner: dict[str, str] = {pid: "the consolidated tables" for pid in out.consolidated_ids}
    for path in part_dirs(root):
        if path.name in merged:
            out.stale.append(path)
            continue
        part = read_part(path)
        for pid in part.prompt_ids:
            if pid not in known:
                raise RunDirError(
                    f"part {path} holds prompt {pid!r}, which the run's manifest does not list; "
                    f"it does not belong to this run: remove it. {part_hint(path)}"
                )
            if pid in owner:
                raise RunDirError(
                    f"prompt {pid!r} is stored twice in {root}: in {owner[pid]} and in {path} "
                    f"(a copied part directory?); delete the copy {path}, then read or resume "
                    "the run again"
                )
            owner[pid] = str(path)
        out.parts.append(part)
    return out


def bases_entries(manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's consolidated bases files: ``{"bases/part-N.safetensors": {sha256,
    prompt_ids}}`` (empty for a run that stores none)."""
    cons = manifest.get("consolidated") or {}
    entries = cons.get("bases") if isinstance(cons, dict) else None
    return dict(entries) if isinstance(entries, dict) else {}


def damaged_files(root: Path, manifest: Mapping[str, Any]) -> dict[str, str]:
    """file name -> what is wrong, for every consolidated bases file that is missing or does
    not match its recorded checksum (``show``, a collection's check of a unit, and a resume,
    which measures their prompts again: `repair_hint`)."""
    out: dict[str, str] = {}
    for name, entry in bases_entries(manifest).items():
        try:
            data = (root / name).read_bytes()
        except FileNotFoundError:
            out[name] = "missing"
            continue
        except OSError as err:
            out[name] = f"unreadable ({err.strerror})"
            continue
        if sha256_bytes(data) != entry.get("sha256"):
            out[name] = "damaged or altered (its checksum does not match)"
    return out


def repair_hint(root: Path, damaged: Mapping[str, str]) -> str:
    """One line naming damaged bases files and the command that rebuilds them."""
    name, why = next(iter(damaged.items()))
    more = f" and {len(damaged) - 1} more" if len(damaged) > 1 else ""
    return (f"the stored bases of {root} are damaged: {root / name} is {why}{more}; run the same "
            "`blockcoupling measure` command with --resume: their prompts are measured again "
            "and the files rebuilt")


def verify_complete(root: Path) -> dict[str, Any]:
    """Check a finished run directory without parsing its tables and return its manifest:
    the sealed manifest (``load_manifest``) says ``complete``; every consolidated file in
    place matches its recorded checksum (a temporary sibling does not count: other readers,
    such as a sweep's DuckDB views, read the file itself); the ``prompts`` table has one row
    per consolidated prompt. RunDirError (what is wrong, no advice: the caller knows the
    repair) otherwise. Used by collections (sweeps, monitors) for each unit they read."""
    import pyarrow.parquet as pq

    from blockcoupling.store.manifest import load_manifest

    manifest = load_manifest(root)
    if manifest.get("status") != "complete":
        raise RunDirError(f"{root} is not a finished run (status {manifest.get('status')!r})")
    cons = manifest.get("consolidated")
    cons = cons if isinstance(cons, dict) else {}
    files = cons.get("files") or {}
    checked = manifest.get("format_version", 1) >= 2
    for name in DATA_FILES:
        path = root / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise RunDirError(f"{path} is missing") from None
        except OSError as err:
            raise RunDirError(f"cannot read {path} ({err.strerror})") from err
        if checked and files.get(name) is None:
            raise RunDirError(f"{root / MANIFEST} lists no checksum for {name}")
        if checked and sha256_bytes(data) != files[name]:
            raise RunDirError(f"{path} is damaged or was altered (its checksum does not match "
                              "the one recorded when it was written)")
        if name == "prompts.parquet":
            try:
                rows = pq.read_metadata(io.BytesIO(data)).num_rows
            except Exception as err:  # pyarrow's errors: an unreadable Parquet footer
                raise RunDirError(f"{path} is not a readable Parquet file ({err})") from err
            want = len(cons.get("prompt_ids") or []) if checked else rows
            if rows != want:
                raise RunDirError(f"{path} holds {rows} prompt rows, the manifest {want}")
    damaged = damaged_files(root, manifest)
    if damaged:
        name, why = next(iter(damaged.items()))
        raise RunDirError(f"{root / name} (stored bases) is {why}")
    return manifest
