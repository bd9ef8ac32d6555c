"""The manifest of a run directory: format, what it records, its seal, and resume identity.

``RUN/manifest.json`` is the run's single source of truth. It records the format name and
version, the config, the model identity (id, revision, weights hash), versions, timings, the
status (``running`` or ``complete``), every prompt (id, text, label) in order, and, once the
run is consolidated, the checksum of every consolidated file. It is *sealed*: ``digest`` is
the sha256 of its canonical JSON without ``digest``, so an edit by hand (another ``k``, a
prompt removed, ``consolidated: null``) is detected when the run is read or resumed.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.jsonsafe import jsonable as _jsonable
from blockcoupling.store.fileio import atomic_write_bytes
from blockcoupling.store.fingerprint import library_versions
from blockcoupling.store.folder import RUN_DIRECTORY, another_kind
from blockcoupling.store.verified import digest_of, load_json

FORMAT_NAME = "blockcoupling-run"
FORMAT_VERSION = 2  # 2: sealed manifest, checksummed parts and consolidated files
MANIFEST = RUN_DIRECTORY.record
ARRAYS = "arrays.npz"
PARTS = "parts"
PART_META = "part.json"

# Options a run may be resumed with other values of. None: every field of the config can
# change a number (``MeasureConfig.config_hash`` hashes them all but the figure selection,
# which decides the content of arrays.npz): batch_size decides which prompts are padded
# together, chunk_size how many Jacobian rows share one batched product, and both change
# float32 rounding. A resumed run is bit-identical to an uninterrupted one only with the same
# values, so other values are refused with the list of differences.
RUNTIME_KEYS: frozenset[str] = frozenset()
# Entries of ``meta`` that identify what was measured: resuming with different values is refused.
IDENTITY_META_KEYS: tuple[str, ...] = ("model", "revision", "weights_hash", "init", "init_seed")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def jsonable(obj: Any) -> Any:
    """A JSON-safe copy of ``obj`` for a manifest (``blockcoupling.jsonsafe``), keeping
    non-finite floats as the strings "inf", "-inf", "nan"."""
    return _jsonable(obj, nonfinite="string")


# ---------------------------------------------------------------------------- seal
def sealed_json_bytes(data: Mapping[str, Any]) -> bytes:
    """``data`` (made JSON-safe) with its ``digest``, as indented UTF-8 JSON."""
    plain = jsonable(data)
    plain["digest"] = digest_of(plain)
    return (json.dumps(plain, indent=2, allow_nan=False, ensure_ascii=False) + "\n").encode()


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    atomic_write_bytes(root / MANIFEST, sealed_json_bytes(manifest))


# ---------------------------------------------------------------------------- loading
def load_manifest(root: Path) -> dict[str, Any]:
    """The verified manifest of ``root``; RunDirError if missing, corrupt, edited or foreign."""
    if not root.exists():
        raise RunDirError(
            f"no run directory at {root}; check the path (a run directory is created by "
            "`blockcoupling measure ... --out DIR`)"
        )
    if not root.is_dir():
        raise RunDirError(f"{root} is a file, not a run directory; give the directory of a run")
    path = root / MANIFEST
    if not path.exists() and (other := another_kind(root, RUN_DIRECTORY)) is not None:
        raise other
    if not path.exists() and ((root / PARTS).is_dir() or any(root.glob("*.parquet"))):
        raise RunDirError(
            f"{path} is missing: the record of the run in {root} is lost (its tables are "
            "there, but not what was measured). Restore it from a backup, or re-run the "
            "measurement into a new --out."
        )
    if not path.exists():
        raise RunDirError(
            f"{root} is not a blockcoupling run directory (it has no {MANIFEST}); give the "
            "--out directory of a run, or choose a new --out to start one"
        )
    data = load_json(path, "The run cannot be read or resumed: restore the manifest from a "
                     "backup, or re-run the measurement into a new --out.")
    if data.get("format") != FORMAT_NAME:
        found = data.get("format")
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
    if version >= 2 and data.get("digest") != digest_of(data):
        raise RunDirError(
            f"{path} was changed after blockcoupling wrote it (its digest does not match its "
            "content), so its results cannot be trusted; undo the edit (restore the file from "
            "a backup) or re-run the measurement into a new --out"
        )
    for key in ("config", "prompts", "status"):
        if key not in data:
            raise RunDirError(
                f"{path} lacks the entry {key!r}; the manifest is damaged. Re-run the "
                "measurement into a new --out."
            )
    return data


def config_from_manifest(root: Path, manifest: Mapping[str, Any]) -> MeasureConfig:
    try:
        return MeasureConfig.from_dict(dict(manifest["config"]))
    except (TypeError, ValueError) as err:
        raise RunDirError(
            f"the config in {root / MANIFEST} is invalid ({err}); the manifest is damaged or "
            "from an incompatible blockcoupling version"
        ) from err


def meta_from_manifest(root: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The Measurement.meta of a run: the writer's meta plus versions, timings and status."""
    meta = dict(manifest.get("meta") or {})
    meta.setdefault("versions", manifest.get("versions", {}))
    meta.setdefault("timings", manifest.get("timings", {}))
    if "peak_memory" in meta["timings"]:  # the same place as in measure()'s meta
        meta.setdefault("peak_memory", meta["timings"]["peak_memory"])
    meta.setdefault("weights_hash", manifest.get("weights_hash"))
    meta["status"] = manifest["status"]
    meta["run_dir"] = str(root)
    return meta


# ---------------------------------------------------------------------------- creating
def prompt_records(prompts: pd.DataFrame) -> list[dict[str, Any]]:
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


def new_manifest(config: dict[str, Any], meta: dict[str, Any],
                 records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "status": "running",
        "created": now(),
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
        "meta": jsonable(meta),
        "prompts": records,
        "consolidated": None,
    }


def resume_differences(manifest: Mapping[str, Any], config: dict[str, Any],
                       meta: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """What differs between a stored run and the settings it is resumed with (empty: none).
    A field the stored config lacks (a run made before the field existed) counts as its
    default, which is what that run measured."""
    defaults = MeasureConfig().to_dict()
    old = {**{k: v for k, v in defaults.items() if k not in manifest["config"]},
           **manifest["config"]}
    diffs = []
    for key in sorted(set(old) | set(config)):
        if key in RUNTIME_KEYS or old.get(key) == config.get(key):
            continue
        line = f"{key}: run has {old.get(key, '<unset>')!r}, now {config.get(key, '<unset>')!r}"
        if key in ("batch_size", "chunk_size"):
            flag = "--" + key.replace("_", "-")
            again = f"without {flag}" if old.get(key) is None else f"with {flag} {old.get(key)}"
            line += f" (it changes float32 rounding; resume {again})"
        diffs.append(line)
    stored_meta = manifest.get("meta") or {}
    new_meta = jsonable(meta)
    for key in IDENTITY_META_KEYS:
        a, b = stored_meta.get(key), new_meta.get(key)
        if a is not None and b is not None and a != b:
            diffs.append(f"{key}: run has {a!r}, now {b!r}")
    old_prompts = {p["prompt_id"]: p for p in manifest["prompts"]}
    new_prompts = {p["prompt_id"]: p for p in records}
    changed = sorted(
        pid for pid in set(old_prompts) | set(new_prompts)
        if old_prompts.get(pid) != new_prompts.get(pid)
    )
    if changed or list(old_prompts) != list(new_prompts):
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        diffs.append(f"prompts differ ({len(changed)} prompt(s) added, removed or changed: "
                     f"{shown or 'order'}); resume with the same prompts")
    return diffs
