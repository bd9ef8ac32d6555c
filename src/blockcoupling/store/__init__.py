"""Run directories: manifest, Parquet tables, lock, atomic parts, resume, ``open_run``."""

from blockcoupling.store.record import measure_to_dir
from blockcoupling.store.rundir import RunWriter, is_run_dir, open_run, weights_hash

__all__ = ["RunWriter", "is_run_dir", "measure_to_dir", "open_run", "weights_hash"]
