"""The training monitor's registration as a collection kind (`blockcoupling.runs.kinds`):
written by training code (``CouplingMonitor``), never from a spec file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blockcoupling.runs.kinds import CollectionKind, register


def _page(collection: Any, out: Path) -> Path:
    from blockcoupling.report.emergence import write_emergence_report

    return Path(write_emergence_report(collection, out))


def _repair(root: Path) -> str:
    return (f"run the training script again with CouplingMonitor(out={str(root)!r}): "
            "it measures the damaged steps again")


KIND = register(CollectionKind(name="monitor", page=_page, repair=_repair,
                               package=__package__ or ""))
