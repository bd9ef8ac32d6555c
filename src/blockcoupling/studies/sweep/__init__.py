"""Sweeps: many models, revisions, checkpoints and prompt sets measured as resumable units,
on Ray (default) or in this process, read back as one set of tables.

>>> import blockcoupling as bc
>>> s = bc.run_sweep("study.yaml", "sweeps/pythia")           # doctest: +SKIP
>>> s = bc.open_sweep("sweeps/pythia"); s.summary()           # doctest: +SKIP

Modules: `spec` (the YAML spec), `units` (expansion, unit ids, checkpoints), `runner` (a
unit's run and the sweep's), `plan` (its ``--dry-run``), `kind` (its registration as a
collection kind). Shared with every kind of collection: `blockcoupling.store.collection`
(the format) and `blockcoupling.runs.read` (``open_collection``, alias ``open_sweep``: the
reader, re-exported here as the sweep's public names).
"""

from blockcoupling.runs.executor import EXECUTORS, SweepError, start_ray
from blockcoupling.runs.read import Sweep, open_collection, open_sweep, sweep_status
from blockcoupling.store.collection import is_collection_dir, is_sweep_dir
from blockcoupling.studies.sweep.runner import run_sweep, run_unit
from blockcoupling.studies.sweep.spec import ModelSpec, SpecError, SweepSpec, load_spec, parse_spec
from blockcoupling.studies.sweep.units import Unit, discover_checkpoints, expand, parse_step

__all__ = [
    "EXECUTORS",
    "ModelSpec",
    "SpecError",
    "Sweep",
    "SweepError",
    "SweepSpec",
    "Unit",
    "discover_checkpoints",
    "expand",
    "is_collection_dir",
    "is_sweep_dir",
    "load_spec",
    "open_collection",
    "open_sweep",
    "parse_spec",
    "parse_step",
    "run_sweep",
    "run_unit",
    "start_ray",
    "sweep_status",
]
