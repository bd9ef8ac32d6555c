"""The studies built on the library: sweeps over models and checkpoints, the training-time
monitor, coupling against generalisation, the ViT stochastic-depth study and the offline demo.

Their public names are exported here, lazily (PEP 562 ``__getattr__``: ``import
blockcoupling.studies`` imports no torch, ray or statsmodels):

>>> from blockcoupling.studies import run_sweep, CouplingMonitor   # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockcoupling import lazy

#: module -> the public names it provides (imported on first attribute access). No name may
#: be a submodule's (``correlate`` the function is ``blockcoupling.studies.correlate.correlate``).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "blockcoupling.studies.monitor": ("CouplingCallback", "CouplingMonitor"),
    "blockcoupling.runs.read": ("Sweep", "open_collection", "open_sweep", "sweep_status"),
    "blockcoupling.studies.sweep": ("SweepSpec", "load_spec", "run_sweep"),
    # (the function correlate and chance_floor stay in their modules: a package attribute of
    # the same name as a submodule would shadow it, e.g. `from blockcoupling.studies import
    # correlate` would give the function or the module depending on import order)
    "blockcoupling.studies.correlate": ("CorrelationResult", "paper_scores"),
    "blockcoupling.studies.vit.train": ("VitTrainConfig", "train_vit"),
    "blockcoupling.studies.vit.grid": ("run_grid",),
    "blockcoupling.studies.lm_study": ("run_study",),
    "blockcoupling.studies.demo": ("run_demo",),
}
__getattr__, __dir__ = lazy.hooks(globals(), __name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ does the work
    from blockcoupling.runs.read import Sweep, open_collection, open_sweep, sweep_status
    from blockcoupling.studies.correlate import CorrelationResult, paper_scores
    from blockcoupling.studies.demo import run_demo
    from blockcoupling.studies.lm_study import run_study
    from blockcoupling.studies.monitor import CouplingCallback, CouplingMonitor
    from blockcoupling.studies.sweep import SweepSpec, load_spec, run_sweep
    from blockcoupling.studies.vit.grid import run_grid
    from blockcoupling.studies.vit.train import VitTrainConfig, train_vit


__all__ = [
    "CorrelationResult",
    "CouplingCallback",
    "CouplingMonitor",
    "Sweep",
    "SweepSpec",
    "VitTrainConfig",
    "load_spec",
    "open_collection",
    "open_sweep",
    "paper_scores",
    "run_demo",
    "run_grid",
    "run_study",
    "run_sweep",
    "sweep_status",
    "train_vit",
]
