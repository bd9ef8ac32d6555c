"""How runs are made and read, whatever they measure: the machinery every collection kind and
every study stands on, naming none of them (``blockcoupling.studies`` stands on it; the map
is docs/DESIGN.md). Names are exported lazily (``import blockcoupling.runs`` imports no torch,
pandas or ray).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockcoupling import lazy

_EXPORTS: dict[str, tuple[str, ...]] = {
    "blockcoupling.runs.kinds": ("CollectionKind", "register"),
    "blockcoupling.runs.read": ("Sweep", "open_collection", "open_sweep", "sweep_status"),
    "blockcoupling.runs.collection": ("upgrade_collection", "write_collection_report"),
    "blockcoupling.runs.executor": ("run_each",),
    "blockcoupling.runs.plans": ("RunPlan", "StudyPlan"),
    "blockcoupling.runs.statistic": ("coupling_statistic",),
}
__getattr__, __dir__ = lazy.hooks(globals(), __name__, _EXPORTS)

if TYPE_CHECKING:
    from blockcoupling.runs.collection import upgrade_collection, write_collection_report
    from blockcoupling.runs.executor import run_each
    from blockcoupling.runs.kinds import CollectionKind, register
    from blockcoupling.runs.plans import RunPlan, StudyPlan
    from blockcoupling.runs.read import Sweep, open_collection, open_sweep, sweep_status
    from blockcoupling.runs.statistic import coupling_statistic


__all__ = [
    "CollectionKind",
    "RunPlan",
    "StudyPlan",
    "Sweep",
    "coupling_statistic",
    "open_collection",
    "open_sweep",
    "register",
    "run_each",
    "sweep_status",
    "upgrade_collection",
    "write_collection_report",
]
