"""blockcoupling: transformer block coupling, trajectory and spectral metrics.

The public API, re-exported explicitly; everything else is private to its module.

>>> import blockcoupling as bc
>>> m = bc.measure(model, tokenizer, ["What is the capital of France? The capital is"],
...                coupling=("depth",), k=(10, 30, 50), tokens="last")   # doctest: +SKIP
>>> m.coupling.head()                                                     # doctest: +SKIP
"""

from blockcoupling.engine.blocks import SUPPORTED_ARCHITECTURES, BlockSpec, find_blocks
from blockcoupling.engine.config import KINDS, ORIENTATIONS, VARIANTS, MeasureConfig
from blockcoupling.engine.measure import iter_measure, measure
from blockcoupling.engine.results import SCHEMAS, Measurement
from blockcoupling.errors import (
    ArchitectureError,
    BlockCouplingError,
    NumericalError,
    ReplayError,
    RunDirError,
)
from blockcoupling.prompts.sources import BUILTIN_SETS, Prompt, load_prompts
from blockcoupling.store.record import measure_to_dir
from blockcoupling.store.rundir import is_run_dir, open_run
from blockcoupling.studies.vit.train import VitTrainConfig, train_vit

__version__ = "0.1.0"


def write_report(measurements, out, **kwargs):  # noqa: ANN001, ANN003, ANN201
    """Write the HTML report for one or more Measurements (see :mod:`blockcoupling.report.html`;
    imported lazily because matplotlib is slow to import)."""
    from blockcoupling.report.html import write_report as _write

    return _write(measurements, out, **kwargs)


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
    "MeasureConfig",
    "Measurement",
    "NumericalError",
    "Prompt",
    "ReplayError",
    "RunDirError",
    "VitTrainConfig",
    "__version__",
    "find_blocks",
    "is_run_dir",
    "iter_measure",
    "load_prompts",
    "measure",
    "measure_to_dir",
    "open_run",
    "train_vit",
    "write_report",
]
