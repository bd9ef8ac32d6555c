"""The ``blockcoupling`` command line (also ``python -m blockcoupling``).

Exit codes: 0 success, 1 a user error (the message says what to do; no traceback),
2 bad usage: an option or a spec key refused (`validate.OptionError`, checked as the
options are parsed) and click's own usage errors, each one line. ``--verbose`` shows
tracebacks.

Each command family lives in its own module and registers on `app` when imported here;
heavy libraries (torch, matplotlib, ray) are imported inside the commands, not at start-up.
"""

from __future__ import annotations

import sys

from blockcoupling.cli import correlate as _correlate  # noqa: F401  (registers correlate)
from blockcoupling.cli import cross as _cross  # noqa: F401  (registers cross)
from blockcoupling.cli import paper as _paper  # noqa: F401  (registers perturb/difficulty)
from blockcoupling.cli import run as _run  # noqa: F401  (registers measure/report/show/models/demo)
from blockcoupling.cli import study as _study  # noqa: F401  (registers study lm-family)
from blockcoupling.cli import sweep as _sweep  # noqa: F401  (registers sweep/sweep-status)
from blockcoupling.cli import vit as _vit  # noqa: F401  (registers vit-train/vit-grid/vit-figures)
from blockcoupling.cli.app import app
from blockcoupling.errors import BlockCouplingError


def main() -> None:
    """Console entry point."""
    try:
        app()
    except BlockCouplingError as err:  # pragma: no cover - commands catch their own
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


__all__ = ["app", "main"]
