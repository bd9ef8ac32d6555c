"""Stored top-K bases in a run directory (``save_bases=True``): safetensors, checksummed.

A part stores its prompts' factors as ``parts/part-N/bases.safetensors``, listed with its
sha256 in the part's sealed ``part.json``; consolidation does not merge them (they can be
large) but links each to ``bases/part-N.safetensors`` before the manifest's commit, which
lists them. Files are read lazily, one at a time, each verified as it is read. The size is
estimated before the run (`estimate`) and a run that would not fit the free disk is refused
before any file is written (`check_disk`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockcoupling.engine import bases as eb
from blockcoupling.engine.blocks import BlockSpec
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.store.fileio import TMP_PREFIX, fsync_dir
from blockcoupling.store.integrity import (
    Part,
    consolidated_hint,
    damaged_files,
    part_hint,
    repair_hint,
)
from blockcoupling.store.verified import verified_bytes

BASES_FILE = "bases.safetensors"  # in a part directory
BASES_DIR = "bases"  # consolidated: bases/part-N.safetensors
FORMAT = "blockcoupling-bases-1"
#: free space kept beyond the estimate (tables, manifest, file-system slack)
DISK_MARGIN = 64 << 20


def bases_bytes(source: eb.BasisSource | None, prompt_ids: Sequence[str]) -> bytes | None:
    """The safetensors bytes of the factors of ``prompt_ids`` (None if there are none)."""
    if source is None:
        return None
    from safetensors.torch import save

    tensors = {k: source.load(k) for pid in prompt_ids for k in source.keys(pid)}
    if not tensors:
        return None
    return save(eb.flatten(tensors), metadata={"format": FORMAT})


def _parse(data: bytes, path: Path, hint: str) -> dict[eb.BasisKey, eb.Factors]:
    from safetensors.torch import load

    try:
        return eb.unflatten(load(data))
    except Exception as err:  # safetensors raises its own error types for damaged files
        raise RunDirError(f"cannot read {path} ({type(err).__name__}: {err}). {hint}") from err


@dataclass(frozen=True)
class _File:
    path: Path
    sha256: str | None
    prompt_ids: tuple[str, ...]
    hint: str


class StoredBases:
    """The bases of a run directory (the store's `engine.bases.BasisSource`): read a
    file at a time, verified against its checksum, the last one read kept in memory."""

    def __init__(self, files: Sequence[_File]) -> None:
        self._by_prompt = {pid: f for f in files for pid in f.prompt_ids}
        self._cached: tuple[Path, dict[eb.BasisKey, eb.Factors]] | None = None

    def _file(self, f: _File) -> dict[eb.BasisKey, eb.Factors]:
        if self._cached is None or self._cached[0] != f.path:
            data = verified_bytes(f.path, f.sha256, f.hint)
            self._cached = (f.path, _parse(data, f.path, f.hint))
        return self._cached[1]

    def keys(self, prompt_id: str | None = None) -> list[eb.BasisKey]:
        pids = list(self._by_prompt) if prompt_id is None else [prompt_id]
        return [k for pid in pids if pid in self._by_prompt
                for k in self._file(self._by_prompt[pid]) if k[0] == pid]

    def load(self, key: eb.BasisKey) -> eb.Factors:
        f = self._by_prompt.get(key[0])
        got = self._file(f).get(key) if f is not None else None
        if got is None:
            raise BlockCouplingError(f"no stored bases for {key}")
        return got


def stored_bases(root: Path, manifest: Mapping[str, Any], parts: Sequence[Part]
                 ) -> StoredBases | None:
    """The run's bases (consolidated files and pending parts), or None if it stores none."""
    files = []
    cons = (manifest.get("consolidated") or {}).get("bases") or {}
    for name, entry in cons.items():
        files.append(_File(root / name, entry.get("sha256"), tuple(entry.get("prompt_ids", [])),
                           consolidated_hint(root)))
    for part in parts:
        if BASES_FILE in part.files:
            files.append(_File(part.path / BASES_FILE, part.files[BASES_FILE],
                               tuple(part.prompt_ids), part_hint(part.path)))
    if not files:
        return None
    return StoredBases(files)


def verify_part(part: Part) -> None:
    """Check a pending part's bases file against its checksum (resume)."""
    if BASES_FILE in part.files:
        verified_bytes(part.path / BASES_FILE, part.files[BASES_FILE], part_hint(part.path))


def consolidate(root: Path, parts: Sequence[Part]) -> dict[str, dict[str, Any]]:
    """Link (or copy) each part's verified bases file to ``bases/part-N.safetensors``, durably;
    returns the manifest entries ``{"bases/part-N.safetensors": {sha256, prompt_ids}}``."""
    out: dict[str, dict[str, Any]] = {}
    folder = root / BASES_DIR
    for part in parts:
        if BASES_FILE not in part.files:
            continue
        src = part.path / BASES_FILE
        verified_bytes(src, part.files[BASES_FILE], part_hint(part.path))
        folder.mkdir(exist_ok=True)
        name = f"{BASES_DIR}/{part.path.name}.safetensors"
        tmp = folder / f"{TMP_PREFIX}{part.path.name}-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, root / name)
        out[name] = {"sha256": part.files[BASES_FILE], "prompt_ids": list(part.prompt_ids)}
    if out:
        fsync_dir(folder)
    return out


def estimate(spec: BlockSpec, lengths: Sequence[int], cfg: MeasureConfig
             ) -> tuple[int, int, int]:
    """``(number of Jacobians, bytes of their bases, bytes of the Jacobians)`` a run of
    prompts of ``lengths`` real tokens stores on a model of ``spec`` (the run's own block
    spec: its width and causality as the run states them, ``hidden_size``/``causal`` of a
    custom module included): one (U, S, V) (and J) per prompt, layer and measured token
    pair. Read from `plan_measure`'s plan, the one source of these numbers (a run's own
    check reads its plan's fields)."""
    from blockcoupling.engine.plan import plan_measure

    plan = plan_measure(cfg, spec, [int(n) for n in lengths])
    return plan.stored_jacobians, plan.bases_bytes, plan.jacobian_bytes


def check_jacobian_limit(nbytes: int, force: bool) -> None:
    """``save_jacobians`` is for small models: refuse more than ``JACOBIANS_LIMIT_BYTES``."""
    if nbytes > eb.JACOBIANS_LIMIT_BYTES and not force:
        raise BlockCouplingError(
            f"--save-jacobians would store about {human(nbytes)} (more than "
            f"{human(eb.JACOBIANS_LIMIT_BYTES)}); store the bases instead (--save-bases), "
            "measure fewer prompts, layers or tokens, or add --force-size")


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def _bytes(n: int) -> str:
    return f"{human(n)} ({n:,} bytes)" if n >= 1024 else f"{n:,} bytes"


def check_disk(out_dir: Path, nbytes: int, what: str) -> None:
    """Refuse a run whose stored ``what`` (``nbytes``) plus `DISK_MARGIN` would not fit the
    free disk at ``out_dir`` (before anything is written); the refusal states the bytes
    needed, the margin, the free bytes and how much more must be freed."""
    parent = Path(out_dir).absolute()
    while not parent.exists():
        parent = parent.parent
    free = shutil.disk_usage(parent).free
    if nbytes + DISK_MARGIN > free:
        raise BlockCouplingError(
            f"{what} need about {_bytes(nbytes)}, and {_bytes(DISK_MARGIN)} more is kept free "
            f"as a margin (the tables, the manifest, file-system slack): {_bytes(nbytes + DISK_MARGIN)} "
            f"in all, but {parent} has {_bytes(free)} free; free disk space (at least "
            f"{_bytes(nbytes + DISK_MARGIN - free)} more), choose another --out, or store "
            "less (fewer prompts, layers or tokens, a smaller k)")


__all__ = ["BASES_DIR", "BASES_FILE", "StoredBases", "bases_bytes", "check_disk", "consolidate",
           "check_jacobian_limit", "damaged_files", "estimate", "human", "repair_hint",
           "stored_bases", "verify_part"]
