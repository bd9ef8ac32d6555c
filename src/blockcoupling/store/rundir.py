"""Run directories, the names other modules import (kept so ``store.rundir`` imports work).

The store is split by concept: `manifest` (format, seal, resume
identity), `fileio` (atomic writes, checksums, lock, OS errors),
`tables` (Parquet/npz bytes), `integrity`
(verified contents), `writer` (``RunWriter``),
`reader` (``open_run``) and `fingerprint`
(``weights_hash``). The map of the store: docs/DESIGN.md, "The map".
"""

from __future__ import annotations

from blockcoupling.store.fingerprint import library_versions, weights_hash
from blockcoupling.store.manifest import (
    ARRAYS,
    FORMAT_NAME,
    FORMAT_VERSION,
    IDENTITY_META_KEYS,
    MANIFEST,
    PART_META,
    PARTS,
    RUNTIME_KEYS,
)
from blockcoupling.store.reader import RunProgress, is_run_dir, open_run, run_progress
from blockcoupling.store.writer import RunWriter

__all__ = [
    "ARRAYS", "FORMAT_NAME", "FORMAT_VERSION", "IDENTITY_META_KEYS", "MANIFEST", "PARTS",
    "PART_META", "RUNTIME_KEYS", "RunProgress", "RunWriter", "is_run_dir", "library_versions",
    "open_run", "run_progress", "weights_hash",
]
