"""Run directories: manifest, Parquet tables, lock, atomic parts, resume, ``open_run``."""

from blockcoupling.store.fingerprint import weights_hash
from blockcoupling.store.reader import RunProgress, is_run_dir, open_run, run_progress
from blockcoupling.store.record import measure_to_dir
from blockcoupling.store.writer import RunWriter

__all__ = ["RunProgress", "RunWriter", "is_run_dir", "measure_to_dir", "open_run",
           "run_progress", "weights_hash"]
