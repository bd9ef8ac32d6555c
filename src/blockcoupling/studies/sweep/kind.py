"""The sweep's registration as a collection kind (`blockcoupling.runs.kinds`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blockcoupling.runs.kinds import CollectionKind, register


def _page(collection: Any, out: Path) -> Path:
    from blockcoupling.report.emergence import write_emergence_report

    return Path(write_emergence_report(collection, out))


def _repair(root: Path) -> str:
    return (f"measure it again with `blockcoupling sweep SPEC --out {root} --resume` (SPEC: "
            "the spec the sweep was run with)")


def _parse(data: Any) -> Any:
    from blockcoupling.studies.sweep.spec import parse_spec

    return parse_spec(data)


def _run(spec: Any, out: Any, *, cluster_cpus: int | None = None, **options: Any) -> Any:
    from blockcoupling.studies.sweep.runner import run_sweep

    return run_sweep(spec, out, num_cpus=cluster_cpus, **options)


def _plan(spec: Any) -> Any:
    from blockcoupling.studies.sweep.plan import plan_sweep

    return plan_sweep(spec)


#: the default kind: a spec without ``kind:`` is a sweep, and so is a manifest of format 1
#: (which records no kind: sweeps were the only kind then)
KIND = register(CollectionKind(name="sweep", page=_page, repair=_repair, parse_spec=_parse,
                               plan=_plan, run=_run, default=True, package=__package__ or ""))
