"""The one reader of every file blockcoupling wrote: bytes checked against the checksum
recorded when they were written, then parsed and typed, or one line naming the file, what is
wrong with it and what to do.

Three ways a checksum is recorded, one way each is read:

- **a record that lists it** (a run's manifest, a part's ``part.json``, a training's
  ``metrics.json``): the caller passes the recorded ``"sha256:<hex>"`` as ``expected`` to
  `verified_bytes` (or `load_json`, `load_parquet`);
- **a sealed JSON record** (`write_sealed` / `load_sealed`): the record carries its own
  checksum (``digest``: the sha256 of its canonical JSON without it, `digest_of`);
- **a ledger** (`Ledger`): the sealed list ``FOLDER/checksums.json`` of the files a command
  wrote into one folder; `Ledger.write` writes a file and records it in one step (a kill
  anywhere leaves the old file or the new one, each matching the ledger), `Ledger.read`
  serves it verified.

Every failure is a [`RunDirError`][blockcoupling.errors.RunDirError] of one line: the path,
the problem (missing, a folder, unreadable, empty, truncated or altered, not JSON, another
type, nested too deeply, not Parquet) and ``hint``, the caller's sentence naming the command
that repairs it. Nothing is returned that did not pass its check; a file written before its
kind was checksummed (no checksum recorded) is read as it is where the caller says so
(``legacy``), never silently where a checksum is expected.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from blockcoupling.errors import RunDirError
from blockcoupling.hashing import canonical_hash
from blockcoupling.store.fileio import (
    atomic_write_text,
    commit_temp,
    sha256_bytes,
    temp_candidates,
    write_temp,
)

#: where a sealed JSON record keeps its seal
SEAL = "digest"
#: deeper JSON than this is no record blockcoupling wrote (and would exhaust the recursion
#: of the checks that walk it): refused as such
MAX_DEPTH = 64
#: the ledger of a folder: the sealed checksums of the files written into it
LEDGER = "checksums.json"
LEDGER_FORMAT = "blockcoupling-checksums"

#: what a file whose bytes do not match their recorded checksum is
ALTERED = ("is damaged or was altered (truncated, edited or replaced): its checksum does not "
           "match the one recorded when it was written")

Legacy = Literal["accept", "warn", "refuse"]
_TYPE_WORDS = {dict: "a JSON object", list: "a JSON list", str: "a string", float: "a number",
               int: "a whole number", bool: "true or false", type(None): "null"}


def _words(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_TYPE_WORDS.get(k, k.__name__) for k in kinds)


def stored_error(path: Path, problem: str, hint: str) -> RunDirError:
    """The one form of a stored file's error: ``<path> <problem>. <hint>``."""
    return RunDirError(f"{path} {problem}. {hint}".strip())


# ---------------------------------------------------------------------------- bytes
def verified_bytes(path: Path, expected: str | None, hint: str) -> bytes:
    """The bytes of ``path``, checked against ``expected`` (``"sha256:<hex>"``; None: no
    checksum was recorded, the bytes are returned as they are). A missing or mismatching file
    is served from a matching temporary sibling (a write killed after its record was
    committed), else one `RunDirError` line with ``hint``."""
    data: bytes | None = None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise stored_error(path, "is a folder where blockcoupling wrote a file; remove that "
                           "folder", hint) from None
    except OSError as err:
        raise stored_error(path, f"cannot be read ({err.strerror or err})", hint) from err
    if data is not None and (expected is None or sha256_bytes(data) == expected):
        return data
    if expected is not None:
        for tmp in temp_candidates(path):
            try:
                alt = tmp.read_bytes()
            except OSError:
                continue
            if sha256_bytes(alt) == expected:
                return alt
    if data is None:
        raise stored_error(path, "is missing", hint)
    raise stored_error(path, ALTERED, hint)


def roll_forward(root: Path, files: Mapping[str, str]) -> None:
    """Finish writes killed after their record was committed but before their rename: for
    each recorded file (relative path -> ``"sha256:<hex>"``) with a temporary sibling, the
    sibling that matches the record is renamed onto the file, unless the file matches
    already (one that cannot be read counts as not matching: its reader says so)."""
    for name, expected in files.items():
        path = root / name
        tmps = temp_candidates(path)
        if not tmps:
            continue
        try:
            if path.is_file() and sha256_bytes(path.read_bytes()) == expected:
                continue
        except OSError:
            pass
        for tmp in tmps:
            try:
                alt = tmp.read_bytes()
            except OSError:
                continue
            if sha256_bytes(alt) == expected:
                commit_temp(tmp, path)
                break


# ---------------------------------------------------------------------------- JSON
def json_depth_exceeds(data: Any, limit: int = MAX_DEPTH) -> bool:
    """True if ``data`` nests lists and mappings deeper than ``limit`` (walked without
    recursion, stopping at the first level past it)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict)
                                                  else node))
    return False


def parse_json(data: bytes, path: Path, hint: str, *,
               expect: type | tuple[type, ...] | None = dict) -> Any:
    """JSON from ``data`` (read from ``path``), of type ``expect`` (None: any) and at most
    `MAX_DEPTH` deep, or one `RunDirError` line."""
    if not data.strip():
        raise stored_error(path, "is empty", hint)
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise stored_error(path, f"is not UTF-8 text ({err.reason} at byte {err.start})",
                           hint) from err
    except json.JSONDecodeError as err:
        raise stored_error(path, f"is not valid JSON ({err.msg} at line {err.lineno} column "
                           f"{err.colno})", hint) from err
    except RecursionError as err:
        raise stored_error(path, f"is nested deeper than {MAX_DEPTH} levels: not a file "
                           "blockcoupling wrote", hint) from err
    if json_depth_exceeds(value):
        raise stored_error(path, f"is nested deeper than {MAX_DEPTH} levels: not a file "
                           "blockcoupling wrote", hint)
    if expect is not None and (not isinstance(value, expect) or (
            isinstance(value, bool) and bool not in (expect if isinstance(expect, tuple)
                                                    else (expect,)))):
        raise stored_error(path, f"holds {_words(type(value))} where {_words(expect)} was "
                           "written", hint)
    return value


def load_json(path: Path, hint: str, *, expected: str | None = None,
              expect: type | tuple[type, ...] | None = dict) -> Any:
    """`verified_bytes` then `parse_json`."""
    return parse_json(verified_bytes(path, expected, hint), path, hint, expect=expect)


# ---------------------------------------------------------------------------- sealed records
def digest_of(data: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``data`` without its ``digest`` entry (the seal of
    every sealed record: run manifests, parts, trainings, ledgers, status files)."""
    body = {k: v for k, v in data.items() if k != SEAL}
    return "sha256:" + canonical_hash(body, ascii=False)


def sealed_text(data: Mapping[str, Any]) -> str:
    """``data`` as indented JSON with its seal (``digest``: `digest_of` the rest, NaN read as
    null), for a record that readers check with `seal_problem` / `load_sealed`."""
    from blockcoupling.jsonsafe import jsonable

    plain = json.loads(json.dumps(data, default=str))
    plain.pop(SEAL, None)
    plain[SEAL] = digest_of(jsonable(plain))
    return json.dumps(plain, indent=2, default=str)


def seal_problem(data: Any) -> str | None:
    """Why a record read from JSON cannot be trusted (None: its seal matches). A record
    without a seal (written before records were sealed) is reported as such."""
    from blockcoupling.jsonsafe import jsonable

    if not isinstance(data, dict):
        return "it is not a JSON object"
    if SEAL not in data:
        return "it has no checksum (written by an older blockcoupling)"
    if json_depth_exceeds(data) or data[SEAL] != digest_of(jsonable(data)):
        return "it was changed after it was written (its checksum does not match)"
    return None


def write_sealed(path: Path, data: Mapping[str, Any]) -> Path:
    """Write ``data`` as a sealed record, atomically (its folders made); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, sealed_text(data) + "\n")
    return path


def load_sealed(path: Path, hint: str, *, legacy: Legacy = "accept") -> dict[str, Any]:
    """A sealed record (`write_sealed`), verified: one `RunDirError` line if it is missing,
    unreadable, not a JSON object, or changed after it was written. A record without a seal
    (written before its kind was sealed): ``legacy`` says whether it is read as it is
    (``accept``), read with a warning (``warn``) or refused (``refuse``)."""
    data: dict[str, Any] = load_json(path, hint)
    if SEAL not in data:
        if legacy == "refuse":
            raise stored_error(path, "has no checksum (written by an older blockcoupling)",
                               hint)
        if legacy == "warn":
            warnings.warn(f"{path} has no checksum (written by an older blockcoupling): read "
                          "unverified", UserWarning, stacklevel=2)
        return data
    problem = seal_problem(data)
    if problem is not None:
        raise stored_error(path, "was changed after blockcoupling wrote it (its checksum does "
                           "not match its content)", hint)
    return data


# ---------------------------------------------------------------------------- sealed blobs
#: the first line of a sealed blob: this prefix, then the payload's ``sha256:<hex>``
BLOB_MAGIC = b"blockcoupling-sealed "


def sealed_bytes(payload: bytes) -> bytes:
    """``payload`` with its checksum in a first line (`BLOB_MAGIC`), for a binary file that
    carries its own checksum (a training checkpoint: `load_sealed_bytes`)."""
    return BLOB_MAGIC + sha256_bytes(payload).encode() + b"\n" + payload


def load_sealed_bytes(path: Path, hint: str, *, legacy: Legacy = "accept") -> bytes:
    """The payload of a sealed blob (`sealed_bytes`), verified, or one line. A file without
    the first line (written before its kind was sealed): ``legacy`` as in `load_sealed`."""
    data = verified_bytes(path, None, hint)
    if not data.startswith(BLOB_MAGIC):
        if legacy == "refuse" or not data:
            raise stored_error(path, "has no checksum (written by an older blockcoupling, "
                               "or not by blockcoupling)", hint)
        if legacy == "warn":
            warnings.warn(f"{path} has no checksum (written by an older blockcoupling): read "
                          "unverified", UserWarning, stacklevel=2)
        return data
    head, _, payload = data.partition(b"\n")
    if head[len(BLOB_MAGIC):] != sha256_bytes(payload).encode():
        raise stored_error(path, ALTERED, hint)
    return payload


# ---------------------------------------------------------------------------- sealed logs
class SealedLog:
    """A JSON-lines log appended to record by record (a training's losses), each line sealed
    with its position: ``{..., "n": <line index>, "digest": ...}``, and its length sealed in
    ``<name>.seal`` whenever the writer `mark`s it (at each measured step and at the end).
    `read` refuses an edited, moved, deleted or cut line, and a log shorter than its seal
    says, in one line naming it; a line without a seal (written before logs were sealed) is
    read as it is. `append` first drops a last line cut short by a kill during an earlier
    append (with a warning) and numbers the new one."""

    def __init__(self, path: Path, hint: str) -> None:
        self.path = Path(path)
        self.seal_path = self.path.with_name(self.path.name + ".seal")
        self.hint = hint
        self._n: int | None = None
        self._last: str | None = None

    def _open(self) -> None:
        """Count the lines written before (dropping a line cut short) and keep the last seal."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        if data and not data.endswith(b"\n"):  # an append killed half-way
            keep = data[: data.rfind(b"\n") + 1]
            warnings.warn(f"{self.path}: its last line was cut short (an interrupted write); "
                          "it is dropped", UserWarning, stacklevel=4)
            with open(self.path, "r+b") as fh:
                fh.truncate(len(keep))
            data = keep
        lines = [ln for ln in data.split(b"\n") if ln.strip()]
        self._n = len(lines)
        self._last = None
        if lines:
            with contextlib.suppress(ValueError, RecursionError):
                last = json.loads(lines[-1])
                self._last = last.get(SEAL) if isinstance(last, dict) else None

    def append(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` (a mapping without ``n`` and ``digest``) as the next line."""
        from blockcoupling.jsonsafe import jsonable

        if self._n is None:
            self._open()
        plain = {**jsonable(dict(record)), "n": self._n}
        plain[SEAL] = digest_of(plain)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(plain, allow_nan=False) + "\n")
        self._n = (self._n or 0) + 1
        self._last = plain[SEAL]

    def mark(self) -> None:
        """Seal the log's length as it is now (its ``.seal``): a log cut afterwards at a line
        boundary is refused by `read`."""
        if self._n is None:
            if not self.path.exists():
                return
            self._open()
        write_sealed(self.seal_path, {"format": "blockcoupling-log-length", "lines": self._n,
                                      "last": self._last})

    def read(self) -> list[dict[str, Any]]:
        """Every record, verified (``n`` and ``digest`` removed); [] when there is no log."""
        sealed = load_sealed(self.seal_path, self.hint) if self.seal_path.exists() else None
        if not self.path.exists() and sealed is None:
            return []
        data = verified_bytes(self.path, None, self.hint)
        lines = [ln for ln in data.split(b"\n") if ln.strip()]
        if data and not data.endswith(b"\n"):
            raise stored_error(Path(f"{self.path} line {len(lines)}"), "is cut short (an "
                               "interrupted write, or the file was truncated)", self.hint)
        out = []
        for i, line in enumerate(lines):
            where = Path(f"{self.path} line {i + 1}")
            rec = parse_json(line, where, self.hint)
            if SEAL in rec and (rec.get("n") != i or seal_problem(rec) is not None):
                raise stored_error(where, "was changed, moved or cut after it was written "
                                   "(its checksum or position does not match)", self.hint)
            out.append(rec)
        if sealed is not None:
            n = sealed.get("lines")
            if not isinstance(n, int) or len(out) < n or (
                    n and out[n - 1].get(SEAL) != sealed.get("last")):
                raise stored_error(self.path, f"holds {len(out)} lines where {n} were sealed "
                                   f"in {self.seal_path.name} (lines were cut or replaced)",
                                   self.hint)
        for rec in out:
            rec.pop(SEAL, None)
            rec.pop("n", None)
        return out


# ---------------------------------------------------------------------------- user files
def load_yaml(path: Path, what: str, *, error: type[Exception] | None = None) -> Any:
    """A YAML file a user wrote (a spec): no checksum, but the same one-line errors as a
    stored file's: ``<what> <path>`` missing, a folder, unreadable, not UTF-8, not valid YAML
    (with its line and column) or nested deeper than `MAX_DEPTH`. ``error``: the
    BlockCouplingError subclass raised (default `BlockCouplingError`). An empty file is
    None."""
    from blockcoupling.errors import BlockCouplingError, require

    kind: Any = error or BlockCouplingError
    yaml = require("yaml", what="reading a YAML spec", package="pyyaml",
                   install="'blockcoupling[sweep]'", error=kind)
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise kind(f"{what} {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise kind(f"{what} {path} is a folder; give the YAML file") from None
    except OSError as err:
        raise kind(f"cannot read the {what} {path} ({err.strerror or err}); check the path "
                   "and its permissions") from err
    except UnicodeDecodeError as err:
        raise kind(f"{what} {path} is not valid YAML: not UTF-8 text ({err.reason} at byte "
                   f"{err.start})") from None
    try:
        data = yaml.safe_load(text)
        too_deep = json_depth_exceeds(data)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise kind(f"{what} {path} is not valid YAML{where}: {problem}") from None
    except RecursionError:  # the parser's own limit
        too_deep = True
    if too_deep:
        raise kind(f"{what} {path} is nested deeper than {MAX_DEPTH} levels; give a plain "
                   "spec")
    return data


# ---------------------------------------------------------------------------- tables
def parse_parquet(data: bytes, path: Path, hint: str) -> Any:
    """A pandas DataFrame from Parquet ``data`` (read from ``path``), or one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(pa.BufferReader(data)).to_pandas()
    except Exception as err:  # pyarrow raises several types for damaged files
        raise stored_error(path, f"is not a readable Parquet file ({type(err).__name__}: "
                           f"{err})", hint) from err


def load_parquet(path: Path, hint: str, *, expected: str | None = None) -> Any:
    """`verified_bytes` then `parse_parquet`."""
    return parse_parquet(verified_bytes(path, expected, hint), path, hint)


def parquet_bytes(df: Any) -> bytes:
    """The Parquet bytes of a pandas DataFrame (no index), for `Ledger.write`."""
    sink = io.BytesIO()
    df.to_parquet(sink, index=False)
    return sink.getvalue()


# ---------------------------------------------------------------------------- ledgers
class Ledger:
    """The sealed checksums of the files blockcoupling wrote into ``folder``
    (``folder/checksums.json``: ``{"format", "files": {relative path: "sha256:<hex>"},
    "digest"}``), and the verified reads and writes of those files.

    ``hint`` is the sentence every error adds (the command that repairs the folder);
    ``fmt`` the ledger's format name (a kind may keep its own, e.g. the tiny-LM cache's);
    ``legacy`` what a read does in a folder without a ledger (written before its kind had
    one): ``accept`` reads files as they are, ``warn`` with a warning, ``refuse`` says so in
    one line. The caller holds the folder's lock while writing (the ledger is kept in memory
    between writes)."""

    def __init__(self, folder: Path, hint: str, *, fmt: str = LEDGER_FORMAT,
                 name: str = LEDGER, legacy: Legacy = "refuse") -> None:
        self.folder = Path(folder)
        self.hint = hint
        self.fmt = fmt
        self.path = self.folder / name
        self.legacy = legacy
        self._entries: dict[str, str] | None = None

    # -- the ledger itself
    def exists(self) -> bool:
        """Whether the folder has a ledger (a file or anything else at its path)."""
        return self.path.exists() or bool(temp_candidates(self.path))

    def problem(self) -> str | None:
        """Why the ledger cannot be trusted (missing, unreadable, not this kind's, edited),
        or None."""
        try:
            self._load("")
        except RunDirError as err:
            return str(err)
        return None

    def entries(self) -> dict[str, str]:
        """relative path -> ``"sha256:<hex>"`` of every recorded file, verified (one line if
        the ledger is missing, damaged, edited or another kind's)."""
        return self._load(self.hint)

    def _load(self, hint: str) -> dict[str, str]:
        if self._entries is not None:
            return dict(self._entries)
        data = load_sealed(self.path, hint, legacy="refuse")
        files = data.get("files")
        if data.get("format") != self.fmt or not isinstance(files, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise stored_error(self.path, f"is not a {self.fmt} list of checksums", hint)
        self._entries = dict(files)
        return dict(files)

    def _commit(self, entries: Mapping[str, str]) -> None:
        atomic_write_text(self.path, sealed_text({"format": self.fmt,
                                                  "files": dict(sorted(entries.items()))})
                          + "\n")
        self._entries = dict(entries)

    def _current(self) -> dict[str, str]:
        """The entries to update: the ledger's, or none in a folder that has none yet."""
        return self.entries() if self.exists() else {}

    # -- writes
    def write(self, name: str, data: bytes) -> Path:
        """Write ``data`` to ``folder/name`` and record its checksum: a temporary file, the
        ledger's commit, one rename (a kill leaves the old file or the new one, each read
        verified: `verified_bytes` serves a committed temporary file)."""
        path = self.folder / name
        if path.is_dir() and not path.is_symlink():
            raise stored_error(path, "is a folder where blockcoupling writes a file; remove "
                               "that folder", self.hint)
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = self._current()
        tmp = write_temp(path, data)
        entries[name] = sha256_bytes(data)
        self._commit(entries)
        commit_temp(tmp, path)
        return path

    def write_json(self, name: str, data: Any) -> Path:
        """`write` of ``data`` as indented JSON (``jsonsafe``: NaN -> null)."""
        from blockcoupling.jsonsafe import jsonable

        text = json.dumps(jsonable(data), indent=1, allow_nan=False) + "\n"
        return self.write(name, text.encode("utf-8"))

    def record(self, names: Iterable[str]) -> None:
        """Record the files ``names`` as they are now (written by a writer that needs a path,
        e.g. a training cache sealed when its training finished)."""
        entries = self._current()
        for name in names:
            entries[name] = sha256_bytes((self.folder / name).read_bytes())
        self._commit(entries)

    def seal(self, names: Iterable[str]) -> None:
        """A new ledger listing exactly the files ``names`` as they are now."""
        self._commit({name: sha256_bytes((self.folder / name).read_bytes()) for name in names})

    def forget(self, names: Iterable[str]) -> None:
        """Drop ``names`` from the ledger (before their files are removed)."""
        entries = self._current()
        for name in names:
            entries.pop(name, None)
        self._commit(entries)

    # -- reads
    def has(self, name: str) -> bool:
        """Whether ``name`` is recorded (False in a folder without a ledger)."""
        return self.exists() and name in self.entries()

    def expected(self, name: str) -> str | None:
        """The recorded checksum of ``name``; None in a folder without a ledger that
        ``legacy`` lets be read; one line if ``name`` is not recorded."""
        if not self.exists():
            if self.legacy == "refuse":
                raise stored_error(self.folder / name, f"has no recorded checksum ({self.path} "
                                   "is missing)", self.hint)
            if self.legacy == "warn":
                warnings.warn(f"{self.folder} has no {self.path.name} (written by an older "
                              f"blockcoupling): {name} read unverified", UserWarning,
                              stacklevel=3)
            return None
        entries = self.entries()
        if name not in entries:
            what = "is not" if (self.folder / name).exists() else "is missing and not"
            raise stored_error(self.folder / name, f"{what} recorded in {self.path}", self.hint)
        return entries[name]

    def read(self, name: str) -> bytes:
        """The bytes of ``folder/name``, verified against the ledger."""
        return verified_bytes(self.folder / name, self.expected(name), self.hint)

    def json(self, name: str, expect: type | tuple[type, ...] | None = dict) -> Any:
        """`read` then `parse_json`."""
        return parse_json(self.read(name), self.folder / name, self.hint, expect=expect)

    def parquet(self, name: str) -> Any:
        """`read` then `parse_parquet`."""
        return parse_parquet(self.read(name), self.folder / name, self.hint)

    def check(self, names: Iterable[str] | None = None) -> str | None:
        """Why the folder's files cannot be trusted, or None: the ledger's problem, else the
        first of ``names`` (None: every recorded file) that is missing, altered or
        unreadable."""
        try:
            entries = self._load("")
            for name in (list(names) if names is not None else sorted(entries)):
                if name not in entries:
                    raise stored_error(self.folder / name, f"is not recorded in {self.path}",
                                       "")
                verified_bytes(self.folder / name, entries[name], "")
        except RunDirError as err:
            return str(err)
        return None


__all__ = ["ALTERED", "BLOB_MAGIC", "LEDGER", "MAX_DEPTH", "SEAL", "Ledger", "SealedLog",
           "digest_of",
           "json_depth_exceeds", "load_json", "load_parquet", "load_sealed", "load_sealed_bytes", "load_yaml",
           "parquet_bytes", "parse_json", "parse_parquet", "roll_forward", "seal_problem",
           "sealed_bytes",
           "sealed_text", "stored_error", "verified_bytes", "write_sealed"]
