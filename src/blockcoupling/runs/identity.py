"""The content of a study's inputs, as part of its identity: a file it reads (a prompt file, a
data folder) counts by its content, not its path, so a resume after an edit is refused, not
mixed. `input_hashes` hashes the local files and folders a prompt spec or data folder reads;
`input_differences` says what changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from blockcoupling.errors import BlockCouplingError
from blockcoupling.hashing import canonical_hash
from blockcoupling.store.fileio import sha256_bytes


def content_hash(path: Path) -> str:
    """``"sha256:<hex>"`` of a file's bytes, or of a folder's files (every file below it, by
    relative path and content; hidden files skipped)."""
    try:
        if path.is_file():
            return sha256_bytes(path.read_bytes())
        entries = [[p.relative_to(path).as_posix(), sha256_bytes(p.read_bytes())]
                   for p in sorted(path.rglob("*")) if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts)]
        return "sha256:" + canonical_hash(entries)
    except OSError as err:
        raise BlockCouplingError(f"cannot read {err.filename or path} ({err.strerror}); check "
                                 "the path and its permissions") from err


def local_inputs(spec: str) -> list[Path]:
    """The local files or folders a prompt spec reads: the spec itself when it is a path,
    the ``@PATH`` of ``hf:NAME@PATH`` and ``protocol:paper@DIR`` when it exists."""
    if spec.startswith("builtin:") or spec.startswith("inline:"):
        return []
    if spec.startswith(("hf:", "protocol:")):
        _, at, tail = spec.partition("@")
        candidates = [Path(tail).expanduser()] if at and tail else []
    else:
        candidates = [Path(spec).expanduser()]
    return [p for p in candidates if p.exists()]


def input_hashes(paths: Iterable[str | Path]) -> dict[str, str]:
    """``{path: content hash}`` of each existing local input (absolute path as given)."""
    return {str(p): content_hash(Path(p)) for p in paths}


def input_differences(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """One line per input whose content differs between ``old`` and ``new`` (empty: none)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            out.append(f"{key}: content was {str(a)[7:19] if a else 'absent'}, now "
                       f"{str(b)[7:19] if b else 'absent'}")
    return out
