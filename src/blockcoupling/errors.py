"""User-facing errors.

Every problem a user can cause (bad model, bad option, bad prompt, bad run directory) is
raised as a [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] whose message says what went wrong *and what to do*.
It subclasses `ValueError` so generic callers can catch it; the CLI turns it into
exit code 1 with the message and no traceback (2 for an option or a spec key refused:
``validate.OptionError``).

An optional dependency is imported with `require`, which states the one form of the message
a missing package gets: what needs it, the ``pip install`` line, and any other way out.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class BlockCouplingError(ValueError):
    """A clear, actionable error caused by the input (not a bug in blockcoupling)."""


class ArchitectureError(BlockCouplingError):
    """The blocks of a model could not be found or used."""


class ReplayError(BlockCouplingError):
    """Re-calling a block with its recorded call did not reproduce its output."""


class NumericalError(BlockCouplingError):
    """A NaN or infinity appeared in a block output or a Jacobian."""


class RunDirError(BlockCouplingError):
    """A run directory is missing, corrupt, locked or belongs to something else."""


def require(module: str, *, what: str, install: str, package: str | None = None,
            alternative: str = "",
            error: type[BlockCouplingError] = BlockCouplingError) -> ModuleType:
    """The module ``module`` (dotted), or ``error`` saying that ``what`` needs it and how to
    install it: ``"{what} needs {package}: pip install {install}"``, then ``(alternative)``
    when given. ``package`` names what is missing (default: the top-level name that failed
    to import, so a module's own missing dependency is named, not the module asked for)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing = package or (err.name or module).split(".")[0]
        tail = f" ({alternative})" if alternative else ""
        raise error(f"{what} needs {missing}: pip install {install}{tail}") from err
