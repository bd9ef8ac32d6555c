"""blockcoupling: transformer block coupling, trajectory and spectral metrics.

The public API, re-exported explicitly; everything else is private to its module.

>>> import blockcoupling as bc
>>> m = bc.measure(model, tokenizer, ["What is the capital of France? The capital is"],
...                coupling=("depth",), k=(10, 30, 50), tokens="last")   # doctest: +SKIP
>>> m.coupling.head()                                                     # doctest: +SKIP

The names are imported lazily (PEP 562 ``__getattr__``) so that ``import blockcoupling`` and
the command line (``blockcoupling --help``) start without importing torch, pandas or
matplotlib; ``bc.measure`` imports its module on first use. To export a name, add it to
:data:`_EXPORTS` under its module (one line per module) and to ``__all__``; the test-suite
checks that every exported name resolves and that ``blockcoupling --help`` imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from blockcoupling.errors import (
    ArchitectureError,
    BlockCouplingError,
    NumericalError,
    ReplayError,
    RunDirError,
)

__version__ = "0.1.0"

#: module -> the public names it provides (imported on first attribute access).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "blockcoupling.engine.blocks": ("SUPPORTED_ARCHITECTURES", "BlockSpec", "find_blocks"),
    "blockcoupling.engine.config": ("KINDS", "ORIENTATIONS", "VARIANTS", "MeasureConfig"),
    "blockcoupling.engine.measure": ("iter_measure", "measure"),
    "blockcoupling.engine.events": ("MeasureEvent",),
    "blockcoupling.engine.inputs": ("MeasureInput",),
    "blockcoupling.engine.results": ("SCHEMAS", "Measurement"),
    "blockcoupling.prompts.sources": ("BUILTIN_SETS", "Prompt", "load_prompts"),
    "blockcoupling.store.record": ("measure_to_dir",),
    "blockcoupling.store.rundir": ("is_run_dir", "open_run"),
    "blockcoupling.report.html": ("write_report",),
    "blockcoupling.studies.statistic": ("coupling_statistic",),
    "blockcoupling.studies.monitor": ("CouplingCallback", "CouplingMonitor"),
    "blockcoupling.studies.sweep": ("Sweep", "SweepSpec", "load_spec", "open_sweep", "run_sweep"),
    "blockcoupling.studies.correlate": ("CorrelationResult", "correlate", "paper_scores"),
    "blockcoupling.studies.vit.train": ("VitTrainConfig", "train_vit"),
}
_WHERE: dict[str, str] = {name: mod for mod, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ does the work
    from blockcoupling.engine.blocks import SUPPORTED_ARCHITECTURES, BlockSpec, find_blocks
    from blockcoupling.engine.config import KINDS, ORIENTATIONS, VARIANTS, MeasureConfig
    from blockcoupling.engine.events import MeasureEvent
    from blockcoupling.engine.inputs import MeasureInput
    from blockcoupling.engine.measure import iter_measure, measure
    from blockcoupling.engine.results import SCHEMAS, Measurement
    from blockcoupling.prompts.sources import BUILTIN_SETS, Prompt, load_prompts
    from blockcoupling.report.html import write_report
    from blockcoupling.store.record import measure_to_dir
    from blockcoupling.store.rundir import is_run_dir, open_run
    from blockcoupling.studies.correlate import CorrelationResult, correlate, paper_scores
    from blockcoupling.studies.statistic import coupling_statistic
    from blockcoupling.studies.monitor import CouplingCallback, CouplingMonitor
    from blockcoupling.studies.sweep import Sweep, SweepSpec, load_spec, open_sweep, run_sweep
    from blockcoupling.studies.vit.train import VitTrainConfig, train_vit


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'blockcoupling' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BUILTIN_SETS",
    "KINDS",
    "ORIENTATIONS",
    "SCHEMAS",
    "SUPPORTED_ARCHITECTURES",
    "VARIANTS",
    "ArchitectureError",
    "BlockCouplingError",
    "BlockSpec",
    "CorrelationResult",
    "CouplingCallback",
    "CouplingMonitor",
    "MeasureConfig",
    "MeasureEvent",
    "MeasureInput",
    "Measurement",
    "NumericalError",
    "Prompt",
    "ReplayError",
    "RunDirError",
    "Sweep",
    "SweepSpec",
    "VitTrainConfig",
    "__version__",
    "correlate",
    "coupling_statistic",
    "find_blocks",
    "is_run_dir",
    "iter_measure",
    "load_prompts",
    "load_spec",
    "measure",
    "measure_to_dir",
    "open_run",
    "open_sweep",
    "paper_scores",
    "run_sweep",
    "train_vit",
    "write_report",
]
