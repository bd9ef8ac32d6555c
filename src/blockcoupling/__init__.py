"""blockcoupling: transformer block coupling, trajectory and spectral metrics.

The public API of the library, re-exported explicitly; everything else is private to its
module. The studies built on it (sweeps, the training monitor, the correlation and ViT
studies) have their own exports in `blockcoupling.studies`; their old names here
(``bc.run_sweep``, ``bc.CouplingMonitor``, ...) still work for one release, with a
``DeprecationWarning`` naming the new place.

>>> import blockcoupling as bc
>>> m = bc.measure(model, tokenizer, ["What is the capital of France? The capital is"],
...                coupling=("depth",), k=(10, 30, 50), tokens="last")   # doctest: +SKIP
>>> m.coupling.head()                                                     # doctest: +SKIP

The names are imported lazily (PEP 562 ``__getattr__``) so that ``import blockcoupling`` and
the command line (``blockcoupling --help``) start without importing torch, pandas or
matplotlib; ``bc.measure`` imports its module on first use. To export a name, add it to
`_EXPORTS` under its module (one line per module) and to ``__all__``; the test-suite
checks that every exported name resolves and that ``blockcoupling --help`` imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from blockcoupling import lazy
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
    "blockcoupling.store.reader": ("is_run_dir", "open_run"),
    "blockcoupling.report.html": ("write_report",),
    "blockcoupling.runs.read": ("Sweep", "open_collection", "open_sweep"),  # the collections reader
    "blockcoupling.runs.statistic": ("coupling_statistic",),  # the headline statistic
    # coupling across runs (stored bases): a reader of run directories, like open_run
    "blockcoupling.studies.cross": ("CrossCoupling", "cross_coupling", "cross_sweep"),
}
_resolve, __dir__ = lazy.hooks(globals(), __name__, _EXPORTS)

#: study names that were top-level before 0.2 -> where they live now: still resolved, with a
#: DeprecationWarning; removed in the release after.
_DEPRECATED: dict[str, str] = {
    **dict.fromkeys(("CouplingCallback", "CouplingMonitor", "SweepSpec", "load_spec", "run_sweep",
                     "CorrelationResult", "paper_scores", "VitTrainConfig", "train_vit"),
                    "blockcoupling.studies"),
    "correlate": "blockcoupling.studies.correlate",  # the function of the module of that name
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ does the work
    from blockcoupling.engine.blocks import SUPPORTED_ARCHITECTURES, BlockSpec, find_blocks
    from blockcoupling.engine.config import KINDS, ORIENTATIONS, VARIANTS, MeasureConfig
    from blockcoupling.engine.events import MeasureEvent
    from blockcoupling.engine.inputs import MeasureInput
    from blockcoupling.engine.measure import iter_measure, measure
    from blockcoupling.engine.results import SCHEMAS, Measurement
    from blockcoupling.prompts.sources import BUILTIN_SETS, Prompt, load_prompts
    from blockcoupling.report.html import write_report
    from blockcoupling.runs.read import Sweep, open_collection, open_sweep
    from blockcoupling.runs.statistic import coupling_statistic
    from blockcoupling.store.reader import is_run_dir, open_run
    from blockcoupling.store.record import measure_to_dir
    from blockcoupling.studies.cross import CrossCoupling, cross_coupling, cross_sweep


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        import warnings

        warnings.warn(f"blockcoupling.{name} is deprecated: use {_DEPRECATED[name]}.{name} "
                      "(the top-level name goes in the next release)", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(_DEPRECATED[name]), name)
    return _resolve(name)


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
    "CrossCoupling",
    "MeasureConfig",
    "MeasureEvent",
    "MeasureInput",
    "Measurement",
    "NumericalError",
    "Prompt",
    "ReplayError",
    "RunDirError",
    "Sweep",
    "__version__",
    "coupling_statistic",
    "cross_coupling",
    "cross_sweep",
    "find_blocks",
    "is_run_dir",
    "iter_measure",
    "load_prompts",
    "measure",
    "measure_to_dir",
    "open_collection",
    "open_run",
    "open_sweep",
    "write_report",
]
