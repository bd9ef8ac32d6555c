"""Run directories: a measurement persisted as plain files, written incrementally and safely.

Layout of a run directory ``RUN``::

    RUN/manifest.json        format name + version, config, versions, model id, weights hash,
                             device, dtype, seed, timings, status, prompts (id, text, label)
    RUN/coupling.parquet     one tidy table per file (``results.SCHEMAS``), written at finalize()
    RUN/trajectory.parquet   ...
    RUN/arrays.npz           ``Measurement.arrays`` (figure arrays, e.g. "A/<prompt_id>/ujv")
    RUN/parts/part-000001/   one finished part (one prompt or a small batch): the 7 tables as
                             Parquet, its arrays.npz and part.json (its prompt ids)
    RUN/.lock                fcntl.flock lock file holding the writer's PID

Why this shape:

- **Crash safety.** A part is written into a temporary directory ``parts/.tmp-*`` and then
  renamed into place with one ``os.replace``: a SIGKILL loses at most the part in flight and
  never leaves a half-written ``part-*``. Consolidated tables, ``arrays.npz`` and the manifest
  are also written to temporary names and renamed. ``finalize()`` records which parts it
  merged in the manifest *before* deleting them, so a kill during finalize never duplicates
  or loses rows.
- **Resume.** The prompts that are done are the prompts of the finished parts (plus those of
  an earlier consolidation); ``RunWriter(..., resume=True)`` reports them through
  :meth:`RunWriter.done_prompt_ids` and the orchestrator skips them. Rows are ordered by the
  manifest's prompt order when read, so an interrupted-and-resumed run equals an
  uninterrupted one.
- **Plain files.** Parquet files carry an explicit Arrow schema (int32, float64, string) and
  no pandas metadata, so pyarrow, pandas, polars and DuckDB read them alike. Missing floats
  (e.g. ``p`` for variants without p) are stored as nulls and read back as NaN.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import hashlib
import io
import json
import math
import os
import platform
import shutil
from collections.abc import Mapping
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import SCHEMAS, TABLES, Measurement, conform
from blockcoupling.errors import BlockCouplingError, RunDirError

FORMAT_NAME = "blockcoupling-run"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"
PARTS = "parts"
LOCK = ".lock"
PART_META = "part.json"
_TMP = ".tmp-"

# Options that change how fast or in which batches a run goes, never its numbers: a run may
# be resumed with different values of these.
RUNTIME_KEYS: frozenset[str] = frozenset({"batch_size", "chunk_size"})
# Entries of ``meta`` that identify what was measured: resuming with different values is refused.
IDENTITY_META_KEYS: tuple[str, ...] = ("model", "revision", "weights_hash")

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int32": pa.int32(),
    "float64": pa.float64(),
}

# weights_hash: models up to this many bytes of state are hashed in full, larger ones sampled.
FULL_HASH_MAX_BYTES = 512 * 2**20
SAMPLES_PER_TENSOR = 4096


# ---------------------------------------------------------------------------- small helpers
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _jsonable(obj: Any) -> Any:
    """A JSON-safe copy of ``obj`` (dtypes, paths, numpy values and tuples become plain data;
    non-finite floats become the strings "inf", "-inf", "nan")."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=str) if isinstance(obj, (set, frozenset)) else obj
        return [_jsonable(v) for v in items]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, torch.dtype):
        return str(obj).removeprefix("torch.")
    if obj is pd.NA:
        return None
    return str(obj)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and one ``os.replace``."""
    tmp = path.with_name(f"{_TMP}{path.name}-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    text = json.dumps(_jsonable(data), indent=2, allow_nan=False, ensure_ascii=False)
    _atomic_write_bytes(path, (text + "\n").encode("utf-8"))


def _table_bytes(name: str, df: pd.DataFrame) -> bytes:
    """Parquet bytes of one table: explicit Arrow types for the schema columns, inferred types
    for extra columns, no pandas metadata."""
    df = conform(name, df)
    arrays: list[pa.Array] = []
    names: list[str] = []
    for col in df.columns:
        dtype = SCHEMAS[name].get(col)
        try:
            arr = pa.array(df[col], type=_ARROW_TYPES[dtype] if dtype else None, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise BlockCouplingError(
                f"table {name!r}: column {col!r} cannot be stored in Parquet ({err}); "
                "give it one plain type (numbers, strings or booleans)"
            ) from err
        arrays.append(arr)
        names.append(str(col))
    table = pa.Table.from_arrays(arrays, names=names)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _read_arrow(path: Path, name: str) -> pa.Table:
    """Read one table file; RunDirError if it is missing or damaged."""
    if not path.is_file():
        raise RunDirError(
            f"table {name!r} is missing: {path} does not exist. The run directory is "
            "incomplete; continue it with --resume (or re-run into a new --out)."
        )
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for damaged files
        raise RunDirError(
            f"cannot read {path} ({type(err).__name__}: {err}); the file is damaged. "
            + _repair_hint(path)
        ) from err
    missing = [c for c in SCHEMAS[name] if c not in table.column_names]
    if missing:
        raise RunDirError(
            f"{path} does not hold a valid {name!r} table (no column {', '.join(missing)}). "
            + _repair_hint(path)
        )
    return table


def _to_frame(name: str, tables: list[pa.Table], where: Path) -> pd.DataFrame:
    """Concatenate Arrow tables of one kind and type them as ``SCHEMAS[name]`` says."""
    if not tables:
        return conform(name, [])
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
        return conform(name, table.to_pandas())
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as err:
        raise RunDirError(
            f"the {name!r} tables under {where} do not fit together ({err}); a file was "
            "altered. Re-run the measurement into a new --out."
        ) from err


def _repair_hint(path: Path) -> str:
    if path.parent.parent.name == PARTS:
        return (
            f"Delete the part directory {path.parent} and continue the run with --resume to "
            "recompute its prompts."
        )
    return "Continue the run with --resume to rebuild it, or re-run into a new --out."


def _arrays_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    for key, value in arrays.items():
        if not isinstance(key, str):
            raise BlockCouplingError(f"array key {key!r} must be a string such as 'A/p0/ujv'")
        if np.asarray(value).dtype == object:
            raise BlockCouplingError(
                f"array {key!r} has dtype object; store numeric arrays only"
            )
    sink = io.BytesIO()
    np.savez(sink, **{k: np.asarray(v) for k, v in arrays.items()})
    return sink.getvalue()


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise RunDirError(
            f"{path} is missing; the run directory is incomplete. " + _repair_hint(path)
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as err:
        raise RunDirError(
            f"cannot read {path} ({type(err).__name__}: {err}). " + _repair_hint(path)
        ) from err


def _prompt_records(prompts: pd.DataFrame) -> list[dict[str, Any]]:
    """(prompt_id, text, label) records of the prompts table given to the writer."""
    if "prompt_id" not in prompts.columns or "text" not in prompts.columns:
        raise BlockCouplingError(
            "the prompts table needs the columns prompt_id and text (label is optional)"
        )
    ids = prompts["prompt_id"].astype(str)
    dup = ids[ids.duplicated()].unique().tolist()
    if dup:
        raise BlockCouplingError(
            f"prompt ids must be unique; repeated: {', '.join(dup[:5])}; rename them"
        )
    labels = prompts["label"] if "label" in prompts.columns else [None] * len(prompts)
    out = []
    for pid, text, label in zip(ids, prompts["text"], labels, strict=True):
        out.append({
            "prompt_id": pid,
            "text": str(text),
            "label": None if label is None or pd.isna(label) else str(label),
        })
    return out


def _order_rows(df: pd.DataFrame, order: Mapping[str, int]) -> pd.DataFrame:
    """Rows stably sorted by the position of their prompt in the manifest."""
    if df.empty:
        return df.reset_index(drop=True)
    key = pd.Index(list(order), dtype=object).get_indexer(df["prompt_id"].astype(object))
    key = np.where(key < 0, len(order), key)  # prompts unknown to the manifest go last
    idx = np.argsort(key, kind="stable")
    return df.iloc[idx].reset_index(drop=True)


def _part_prompt_ids(part: Measurement) -> list[str]:
    """The prompts a part covers: its ``prompts`` table, else every prompt id in its tables."""
    if len(part.prompts):
        ids = part.prompts["prompt_id"].astype(str).tolist()
    else:
        ids = []
        for name in TABLES:
            ids.extend(part.table(name)["prompt_id"].dropna().astype(str).tolist())
    return list(dict.fromkeys(ids))


def library_versions() -> dict[str, str]:
    """Versions of blockcoupling, its main libraries, Python and the platform."""
    out: dict[str, str] = {}
    for dist in ("blockcoupling", "torch", "transformers", "numpy", "pandas", "pyarrow"):
        try:
            out[dist] = _metadata.version(dist)
        except _metadata.PackageNotFoundError:
            out[dist] = "not installed"
    out["python"] = platform.python_version()
    out["platform"] = platform.platform()
    return out


# ---------------------------------------------------------------------------- weights hash
def _tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a (small) tensor, any dtype (bfloat16 included)."""
    flat = t.detach().reshape(-1).contiguous().cpu()
    return flat.view(torch.uint8).numpy().tobytes()


def weights_hash(model: torch.nn.Module, *, max_full_bytes: int = FULL_HASH_MAX_BYTES) -> str:
    """A fingerprint of a model's weights: ``"sha256-full:<hex>"`` or ``"sha256-sampled:<hex>"``.

    The sha256 runs over every entry of ``model.state_dict()`` (parameters and persistent
    buffers) in order: its name, shape and dtype, then its values. If the whole state holds at
    most ``max_full_bytes`` bytes (512 MiB by default) the values are hashed byte for byte
    ("full"); otherwise each tensor contributes a deterministic strided sample of at most
    ``SAMPLES_PER_TENSOR`` elements (every ``ceil(numel / 4096)``-th element, plus the last),
    which is cheap for billion-parameter models yet changes with any retraining ("sampled").
    Tensors on the ``meta`` device contribute only name, shape and dtype.
    """
    state = model.state_dict()
    total = sum(t.numel() * t.element_size() for t in state.values() if t.device.type != "meta")
    full = total <= max_full_bytes
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode())
        if t.device.type == "meta" or t.numel() == 0:
            continue
        if full:
            h.update(_tensor_bytes(t))
        else:
            flat = t.detach().reshape(-1)
            stride = max(1, math.ceil(flat.numel() / SAMPLES_PER_TENSOR))
            h.update(_tensor_bytes(flat[::stride]))
            h.update(_tensor_bytes(flat[-1:]))
    return f"sha256-{'full' if full else 'sampled'}:{h.hexdigest()}"


# ---------------------------------------------------------------------------- manifest
def _load_manifest(root: Path) -> dict[str, Any]:
    """The manifest of run directory ``root``; RunDirError if it is missing, corrupt or foreign."""
    if not root.exists():
        raise RunDirError(
            f"no run directory at {root}; check the path (a run directory is created by "
            "`blockcoupling measure ... --out DIR`)"
        )
    if not root.is_dir():
        raise RunDirError(f"{root} is a file, not a run directory; give the directory of a run")
    path = root / MANIFEST
    if not path.is_file():
        raise RunDirError(
            f"{root} is not a blockcoupling run directory (it has no {MANIFEST}); give the "
            "--out directory of a run, or choose a new --out to start one"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDirError(
            f"{path} is corrupt ({err}); the run cannot be read or resumed. Re-run the "
            "measurement into a new --out."
        ) from err
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise RunDirError(
            f"{path} is not a blockcoupling run manifest (format {found!r}, expected "
            f"{FORMAT_NAME!r}); this directory belongs to something else: choose another path"
        )
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RunDirError(
            f"{path} has format version {version!r}; this blockcoupling reads version "
            f"{FORMAT_VERSION} or older: upgrade blockcoupling to read it"
        )
    for key in ("config", "prompts", "status"):
        if key not in data:
            raise RunDirError(
                f"{path} lacks the entry {key!r}; the manifest is damaged. Re-run the "
                "measurement into a new --out."
            )
    return data


def _config_from_manifest(root: Path, manifest: Mapping[str, Any]) -> MeasureConfig:
    try:
        return MeasureConfig.from_dict(dict(manifest["config"]))
    except (TypeError, ValueError) as err:
        raise RunDirError(
            f"the config in {root / MANIFEST} is invalid ({err}); the manifest is damaged or "
            "from an incompatible blockcoupling version"
        ) from err


def _part_dirs(root: Path) -> list[Path]:
    """Finished part directories, in write order (temporary directories are ignored)."""
    parts = root / PARTS
    if not parts.is_dir():
        return []
    return sorted(p for p in parts.iterdir() if p.name.startswith("part-") and p.is_dir())


def _pending_parts(root: Path, manifest: Mapping[str, Any]) -> list[Path]:
    """Finished parts not yet merged into the consolidated tables."""
    merged = set((manifest.get("consolidated") or {}).get("parts", []))
    return [p for p in _part_dirs(root) if p.name not in merged]


def _read_part_meta(part: Path) -> list[str]:
    path = part / PART_META
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ids = data["prompt_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("prompt_ids is not a list of strings")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunDirError(
            f"part {part} is damaged ({PART_META}: {err}). " + _repair_hint(path)
        ) from err
    return ids


def _meta_from_manifest(root: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The Measurement.meta of a run: the writer's meta plus versions, timings and status."""
    meta = dict(manifest.get("meta") or {})
    meta.setdefault("versions", manifest.get("versions", {}))
    meta.setdefault("timings", manifest.get("timings", {}))
    meta.setdefault("weights_hash", manifest.get("weights_hash"))
    meta["status"] = manifest["status"]
    meta["run_dir"] = str(root)
    return meta


def _read_measurement(root: Path, manifest: Mapping[str, Any]) -> Measurement:
    """Consolidated tables (if any) + pending parts, rows in manifest prompt order."""
    arrow: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
    arrays: dict[str, np.ndarray] = {}
    if manifest.get("consolidated"):
        for name in TABLES:
            arrow[name].append(_read_arrow(root / f"{name}.parquet", name))
        arrays.update(_read_arrays(root / ARRAYS))
    for part in _pending_parts(root, manifest):
        _read_part_meta(part)
        for name in TABLES:
            arrow[name].append(_read_arrow(part / f"{name}.parquet", name))
        arrays.update(_read_arrays(part / ARRAYS))
    order = {p["prompt_id"]: i for i, p in enumerate(manifest["prompts"])}
    tables = {name: _order_rows(_to_frame(name, arrow[name], root), order) for name in TABLES}
    config = _config_from_manifest(root, manifest)
    return Measurement(**tables, arrays=arrays, config=config,
                       meta=_meta_from_manifest(root, manifest))


def open_run(path: str | os.PathLike[str]) -> Measurement:
    """Read a run directory (finished or not) into the :class:`Measurement` ``measure()`` returns.

    An unfinished run yields the prompts finished so far (``meta["status"] == "running"``).
    Raises RunDirError for a missing, corrupt or foreign directory, saying what to do.
    """
    root = Path(path)
    return _read_measurement(root, _load_manifest(root))


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` holds a readable blockcoupling run manifest."""
    try:
        _load_manifest(Path(path))
    except RunDirError:
        return False
    return True


# ---------------------------------------------------------------------------- lock
def _acquire_lock(root: Path) -> int:
    """Take the exclusive, non-blocking flock on ``root/.lock``; write our PID into it."""
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 64, 0).decode().strip()
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunDirError(f"cannot lock {root / LOCK}: {err}") from err
        who = f" (PID {holder})" if holder else ""
        raise RunDirError(
            f"run directory {root} is in use by another blockcoupling process{who}; wait for "
            "it to finish or stop it, or choose a new --out"
        ) from err
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


# ---------------------------------------------------------------------------- writer
class RunWriter:
    """Writes a run directory part by part; a context manager holding the directory's lock.

    ``meta`` is stored verbatim (JSON-safe) and returned by :func:`open_run`; its entries
    ``model``, ``revision``, ``weights_hash`` and ``device`` are also lifted to the top of the
    manifest. ``prompts`` has columns ``prompt_id``, ``text`` and optionally ``label``.

    Without ``resume`` the directory must not exist or be empty. With ``resume`` an existing
    run is continued: its config (except ``RUNTIME_KEYS``), prompts and model identity must
    match, else RunDirError lists what differs.
    """

    def __init__(self, path: str | os.PathLike[str], *, config: MeasureConfig,
                 meta: Mapping[str, Any], prompts: pd.DataFrame, resume: bool = False) -> None:
        self.root = Path(path)
        self.config = config
        self._fd: int | None = None
        self._finalized = False
        records = _prompt_records(prompts)
        self._order = {p["prompt_id"]: i for i, p in enumerate(records)}
        if self.root.exists() and not self.root.is_dir():
            raise RunDirError(f"--out {self.root} is a file; choose a directory for the run")
        self.root.mkdir(parents=True, exist_ok=True)
        self._fd = _acquire_lock(self.root)
        try:
            self._open(config, dict(meta), records, resume)
        except BaseException:
            self.close()
            raise

    # -------------------------------------------------------------- opening
    def _open(self, config: MeasureConfig, meta: dict[str, Any],
              records: list[dict[str, Any]], resume: bool) -> None:
        entries = [p for p in self.root.iterdir()
                   if p.name != LOCK and not p.name.startswith(_TMP)]
        if entries and not resume:
            raise RunDirError(
                f"{self.root} already exists and is not empty; use --resume to continue it "
                "or choose a new --out"
            )
        new_config = _jsonable(config.to_dict())
        if not entries:
            self.manifest = self._new_manifest(new_config, meta, records)
            _write_json(self.root / MANIFEST, self.manifest)
            self._done: set[str] = set()
            return
        manifest = _load_manifest(self.root)
        self._check_resumable(manifest, new_config, meta, records)
        self._cleanup(manifest)
        done = set((manifest.get("consolidated") or {}).get("prompt_ids", []))
        for part in _pending_parts(self.root, manifest):
            done.update(_read_part_meta(part))
            for name in TABLES:  # reads only the footer: catches truncated files early
                file = part / f"{name}.parquet"
                try:
                    pq.read_metadata(file)
                except Exception as err:
                    raise RunDirError(
                        f"cannot read {file} ({type(err).__name__}: {err}). "
                        + _repair_hint(file)
                    ) from err
        self._done = done
        manifest["config"] = new_config  # only runtime keys can differ
        manifest["status"] = "running"
        manifest.setdefault("resumed", []).append(_now())
        self.manifest = manifest
        _write_json(self.root / MANIFEST, manifest)

    def _new_manifest(self, config: dict[str, Any], meta: dict[str, Any],
                      records: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "status": "running",
            "created": _now(),
            "finished": None,
            "model": meta.get("model"),
            "revision": meta.get("revision"),
            "weights_hash": meta.get("weights_hash"),
            "device": meta.get("device"),
            "dtype": config["dtype"],
            "seed": config["seed"],
            "versions": library_versions(),
            "timings": {},
            "config": config,
            "meta": _jsonable(meta),
            "prompts": records,
            "consolidated": None,
        }

    def _check_resumable(self, manifest: Mapping[str, Any], config: dict[str, Any],
                         meta: dict[str, Any], records: list[dict[str, Any]]) -> None:
        old = manifest["config"]
        diffs = [
            f"{key}: run has {old.get(key, '<unset>')!r}, now {config.get(key, '<unset>')!r}"
            for key in sorted(set(old) | set(config))
            if key not in RUNTIME_KEYS and old.get(key) != config.get(key)
        ]
        stored_meta = manifest.get("meta") or {}
        new_meta = _jsonable(meta)
        for key in IDENTITY_META_KEYS:
            a, b = stored_meta.get(key), new_meta.get(key)
            if a is not None and b is not None and a != b:
                diffs.append(f"{key}: run has {a!r}, now {b!r}")
        if diffs:
            raise RunDirError(
                f"cannot resume {self.root}: it was measured with different settings:\n  "
                + "\n  ".join(diffs)
                + "\nresume with the run's original options, or choose a new --out"
            )
        old_prompts = {p["prompt_id"]: p for p in manifest["prompts"]}
        new_prompts = {p["prompt_id"]: p for p in records}
        changed = sorted(
            pid for pid in set(old_prompts) | set(new_prompts)
            if old_prompts.get(pid) != new_prompts.get(pid)
        )
        if changed or list(old_prompts) != list(new_prompts):
            shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
            raise RunDirError(
                f"cannot resume {self.root}: its prompts differ from the ones given "
                f"({len(changed)} prompt(s) added, removed or changed: {shown or 'order'}); "
                "resume with the same prompts, or choose a new --out"
            )

    def _cleanup(self, manifest: Mapping[str, Any]) -> None:
        """Remove leftovers of a killed writer (we hold the lock): temporary files and
        directories, and parts already merged into the consolidated tables."""
        merged = set((manifest.get("consolidated") or {}).get("parts", []))
        for parent in (self.root, self.root / PARTS):
            if not parent.is_dir():
                continue
            for entry in parent.iterdir():
                stale = entry.name.startswith(_TMP) or (
                    parent.name == PARTS and entry.name in merged
                )
                if stale:
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)

    # -------------------------------------------------------------- writing
    def done_prompt_ids(self) -> set[str]:
        """Prompt ids whose results are safely on disk (skip them when resuming)."""
        return set(self._done)

    def _check_open(self) -> None:
        if self._fd is None:
            raise BlockCouplingError(f"the writer of {self.root} is closed")
        if self._finalized:
            raise BlockCouplingError(f"the run {self.root} is finalized; open a new RunWriter")

    def write_part(self, part: Measurement) -> None:
        """Persist one part (its tables hold only its prompts) atomically under ``parts/``."""
        self._check_open()
        ids = _part_prompt_ids(part)
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
        payload = {f"{name}.parquet": _table_bytes(name, part.table(name)) for name in TABLES}
        payload[ARRAYS] = _arrays_bytes(part.arrays)
        payload[PART_META] = (json.dumps({"prompt_ids": ids, "written": _now()}) + "\n").encode()

        parts_dir = self.root / PARTS
        parts_dir.mkdir(exist_ok=True)
        existing = [int(p.name.removeprefix("part-")) for p in _part_dirs(self.root)
                    if p.name.removeprefix("part-").isdigit()]
        merged = (self.manifest.get("consolidated") or {}).get("parts", [])
        existing += [int(n.removeprefix("part-")) for n in merged]
        name = f"part-{max(existing, default=0) + 1:06d}"
        tmp = parts_dir / f"{_TMP}{name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for fname, data in payload.items():
            with open(tmp / fname, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        os.replace(tmp, parts_dir / name)  # the commit point
        _fsync_dir(parts_dir)
        self._done.update(ids)

    def finalize(self, *, timings: Mapping[str, Any] | None = None) -> Measurement:
        """Consolidate all parts into one file per table + ``arrays.npz``, mark the run
        complete and return it. Safe against a kill at any point (see the module docstring)."""
        self._check_open()
        manifest = self.manifest
        pending = _pending_parts(self.root, manifest)
        meas = _read_measurement(self.root, manifest)
        for name in TABLES:
            _atomic_write_bytes(self.root / f"{name}.parquet", _table_bytes(name, meas.table(name)))
        _atomic_write_bytes(self.root / ARRAYS, _arrays_bytes(meas.arrays))
        merged = list((manifest.get("consolidated") or {}).get("parts", []))
        merged += [p.name for p in pending]
        done = sorted(self._done, key=lambda pid: self._order.get(pid, len(self._order)))
        manifest["consolidated"] = {"parts": merged, "prompt_ids": done}
        manifest["timings"] = {**manifest.get("timings", {}), **_jsonable(dict(timings or {}))}
        manifest["status"] = "complete"
        manifest["finished"] = _now()
        manifest["missing_prompt_ids"] = [
            p["prompt_id"] for p in manifest["prompts"] if p["prompt_id"] not in self._done
        ]
        _write_json(self.root / MANIFEST, manifest)  # commit point: parts are now merged
        for part in pending:
            shutil.rmtree(part, ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.root / PARTS).rmdir()
        self._finalized = True
        meas.meta = _meta_from_manifest(self.root, manifest)
        return meas

    def close(self) -> None:
        """Release the lock (the run stays resumable if it was not finalized)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
