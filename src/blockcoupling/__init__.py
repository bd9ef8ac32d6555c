"""blockcoupling: transformer block coupling, trajectory and spectral metrics.

The public API, re-exported explicitly; everything else is private to its module.

>>> import blockcoupling as bc
>>> m = bc.measure(model, tokenizer, ["What is the capital of France? The capital is"],
...                coupling=("depth",), k=(10, 30, 50), tokens="last")   # doctest: +SKIP
>>> m.coupling.head()                                                     # doctest: +SKIP
"""

from blockcoupling.blocks import SUPPORTED_ARCHITECTURES, BlockSpec, find_blocks
from blockcoupling.config import KINDS, ORIENTATIONS, VARIANTS, MeasureConfig
from blockcoupling.errors import (
    ArchitectureError,
    BlockCouplingError,
    NumericalError,
    ReplayError,
    RunDirError,
)
from blockcoupling.measure import iter_measure, measure, measure_to_dir
from blockcoupling.results import SCHEMAS, Measurement

__version__ = "0.1.0"


def open_run(path):  # noqa: ANN001, ANN201 - thin lazy re-export of store.open_run
    """Open a run directory written by ``measure_to_dir`` / ``blockcoupling measure``."""
    from blockcoupling.store import open_run as _open_run

    return _open_run(path)


def load_prompts(spec, **kwargs):  # noqa: ANN001, ANN003, ANN201
    """Load a prompt set: a file, ``builtin:NAME`` or ``hf:DATASET`` (see prompts.py)."""
    from blockcoupling.prompts import load_prompts as _load

    return _load(spec, **kwargs)


def write_report(measurements, out, **kwargs):  # noqa: ANN001, ANN003, ANN201
    """Write the HTML report for one or more Measurements (see report.py)."""
    from blockcoupling.report import write_report as _write

    return _write(measurements, out, **kwargs)


__all__ = [
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
    "ReplayError",
    "RunDirError",
    "__version__",
    "find_blocks",
    "iter_measure",
    "load_prompts",
    "measure",
    "measure_to_dir",
    "open_run",
    "write_report",
]
