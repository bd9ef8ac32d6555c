"""User-facing errors.

Every problem a user can cause (bad model, bad option, bad prompt, bad run directory) is
raised as a [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] whose message says what went wrong *and what to do*.
It subclasses `ValueError` so generic callers can catch it; the CLI turns it into
exit code 1 with the message and no traceback.
"""

from __future__ import annotations


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
