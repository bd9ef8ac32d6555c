"""The run protocol of every collection kind: open the folder, lock it, record, verify on
read, resume, rebuild what is derivable. A kind gives its units and the work of one unit;
everything else is here, once (docs/DESIGN.md, "Recipe: add a collection kind").

`run_collection`: **open** (`store.folder.decide`, nothing written; the Ray cluster is
reached before anything is written), **lock** and decide again, then the manifest (new,
continued, or rebuilt from the status files), **verify** on resume (a damaged finished unit,
`integrity.unit_problem`, is measured again) and **record** one status file per unit,
written by whoever runs it (`unit_task`), the catalogue after each. A collection written
step by step (the training monitor) opens through `collection_folder`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shutil
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.runs import integrity, kinds
from blockcoupling.runs.executor import (
    CONNECT_TIMEOUT_S,
    ExecutorError,
    check_executor,
    died,
    import_ray,
    ray_session,
    run_each,
)
from blockcoupling.runs.identity import input_differences, input_hashes
from blockcoupling.store import collection as store
from blockcoupling.store.folder import COLLECTION, CONTINUE, REBUILD, Layout, decide, open_folder

#: Ray retries of a unit whose worker died (a spec's ``retries``, ``--retries``)
RETRIES = 3
#: how long a unit waits for its run directory still locked by a dying worker
UNIT_LOCK_WAIT_S = 120.0

#: what `unit_task` hands the work of one unit: ``work(unit, folder, *args)`` measures or
#: trains ``unit`` into ``folder`` (its ``units/<id>/``; resumable: a finished one is
#: kept) and may return status fields (a mapping) to record beside the run's own
Work = Callable[..., Any]


def layout(kind: str, flag: str = "--out") -> Layout:
    """A collection of ``kind`` in the protocol's words (``flag``: the option naming it)."""
    return replace(COLLECTION, what=kind, writer=kind, flag=flag)


def spec_json(spec: Any) -> Any:
    """A spec as the manifest stores it (plain JSON)."""
    return json.loads(json.dumps(spec, default=str))


def spec_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """One line per key whose value differs between two stored specs."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += spec_differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True))
                for d in spec_differences(a, b, f"{prefix}{i}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: stored {old!r}, now {new!r}"]


def differences(manifest: Mapping[str, Any], spec: Any,
                inputs: Mapping[str, str] | None) -> list[str]:
    """What differs between a stored collection and the spec (and the content of the input
    files) it is run with; empty: none."""
    diffs = spec_differences(manifest.get("spec"), spec)
    if inputs is None:
        return diffs
    if "inputs" not in manifest:
        if inputs:  # a collection from before input contents were recorded
            diffs.append("the collection does not record the content of its input files "
                         "(made by an older blockcoupling)")
    else:
        diffs += [f"input {d}" for d in input_differences(manifest["inputs"], inputs)]
    return diffs


def _readable(root: Path) -> bool:
    """Whether the manifest parses as a JSON object (else it is lost: rebuilt)."""
    try:
        return isinstance(store.read_json(root / store.MANIFEST), dict)
    except RunDirError:
        return False


def has_results(root: Path) -> bool:
    """Whether a collection stored anything of value: a done unit, or a unit's folder that
    holds a measured part, a finished run or any other work (a training)."""
    if any(r.get("status") == "done" for r in store.all_status(root)):
        return True
    folder = root / store.UNITS
    return folder.is_dir() and any(_holds_work(d) for d in folder.iterdir() if d.is_dir())


def _holds_work(unit: Path) -> bool:
    """A unit's folder holds more than the start of a run that stored nothing (its manifest,
    its lock, empty folders)."""
    return any(p.is_file() and p.name not in ("manifest.json", ".lock")
               for p in unit.rglob("*"))


def collection_identity(root: Path, kind: str, spec: Any, *, unit_ids: set[str] | None,
                        inputs: Mapping[str, str] | None = None,
                        same: Callable[[dict[str, Any]], list[str]] | None = None,
                        flag: str = "--out") -> dict[str, Any]:
    """How the protocol reads a collection's identity (`store.folder.decide`'s
    ``differences`` and ``has_results``): its kind, then ``same(manifest)`` (default: its
    spec and its inputs' content against this run's); a lost or damaged manifest is
    derivable when every status file names a unit of ``unit_ids``."""
    def diff() -> list[str] | None:
        if ((root / store.MANIFEST).is_file() and _readable(root)) or (
                root / store.LEGACY_GRID_FILE).is_file():
            manifest = store.load_manifest(root)  # the old layout: the line that converts it
            if (other := kinds.manifest_kind(manifest)) != kind:
                raise RunDirError(f"{root} holds a {other}, not a {kind}; choose a new {flag}")
            return same(manifest) if same is not None else differences(manifest, spec, inputs)
        if store.rebuilt_manifest(root, kind, spec, unit_ids) is None:  # no status files
            raise RunDirError(f"{root} is not empty and holds no {kind}; choose a new {flag}")
        return None  # lost or damaged: rebuilt from the status files

    return {"differences": diff, "has_results": lambda: has_results(root)}


#: inside `checks_only`: `run_collection` stops after its checks (``--dry-run``)
_CHECKS_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("checks_only",
                                                                    default=False)


class _Checked(Exception):  # noqa: N818 (a signal, not an error)
    """`run_collection`'s stop inside `checks_only`, carrying its decision."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


@contextlib.contextmanager
def checks_only() -> Iterator[dict[str, str]]:
    """``--dry-run`` of a collection's run, by the run itself: inside, `run_collection` (a
    kind's run is one call of it) makes every check of the real run (the executor, the
    options, ``--out`` by `check_collection`: a file, another kind's folder, another spec,
    a folder in use) and then stops, writing nothing and starting no cluster; the body's
    run returns nothing. The yielded mapping's ``state`` is what opening the folder would do
    (``store.folder.decide``). A kind gets its dry run's checks with no code of its own."""
    result: dict[str, str] = {}
    token = _CHECKS_ONLY.set(True)
    try:
        yield result
    except _Checked as stop:
        result["state"] = stop.state
    finally:
        _CHECKS_ONLY.reset(token)


def check_collection(root: Path, kind: str, spec: Any, *, unit_ids: set[str] | None,
                     resume: bool, inputs: Mapping[str, str] | None = None,
                     same: Callable[[dict[str, Any]], list[str]] | None = None) -> str:
    """What opening ``root`` for this collection does (`store.folder.decide`), or its one
    refusal line; nothing is written (``--dry-run``, and before a cluster is reached)."""
    return decide(root, layout(kind), resume=resume,
                  **collection_identity(root, kind, spec, unit_ids=unit_ids, inputs=inputs, same=same))


@contextlib.contextmanager
def collection_folder(root: Path, kind: str, spec: Any, *, unit_ids: set[str] | None,
                      resume: bool, inputs: Mapping[str, str] | None = None,
                      same: Callable[[dict[str, Any]], list[str]] | None = None,
                      flag: str = "--out") -> Iterator[tuple[str, dict[str, Any]]]:
    """The collection in ``root`` opened for writing (`store.folder.open_folder`: checked,
    locked, checked again), with its manifest: continued, rebuilt from the status files, or
    new (``spec``, ``inputs``). Yields (the decision, the manifest) while the lock is held;
    the caller writes the manifest."""
    with open_folder(root, layout(kind, flag), resume=resume, records=dict,
                     **collection_identity(root, kind, spec, unit_ids=unit_ids, inputs=inputs,
                                           same=same, flag=flag)) as state:
        if state == CONTINUE:
            manifest = store.load_manifest(root)
        elif state == REBUILD:
            manifest = store.rebuilt_manifest(root, kind, spec, unit_ids) or {}
        else:
            manifest = store.new_manifest(kind, spec)
        if inputs is not None and state != CONTINUE:
            manifest["inputs"] = dict(inputs)
        yield state, manifest


def recheck_done(root: Path, units: Sequence[store.CollectionUnit]) -> dict[str, str]:
    """On resume: every unit whose run directory is finished or whose status says done is
    checked (`integrity.unit_problem`); a damaged one is marked ``pending`` and its folder
    removed, so that it is measured again. Returns unit id -> what was wrong."""
    repaired: dict[str, str] = {}
    for u in units:
        rec = store.read_status(root, u.unit_id)
        run = root / store.run_relpath(u.to_dict())
        if not is_complete(run, damaged=True) and not (rec is not None
                                                      and rec.get("status") == "done"):
            continue
        problem = integrity.unit_problem(root, rec if rec is not None else {"unit": u.to_dict()})
        if problem is None:
            continue
        store.write_status(root, u, "pending", repaired=problem, weights_hash=None,
                           n_prompts=None)
        shutil.rmtree(store.unit_dir(root, u.unit_id), ignore_errors=True)
        repaired[u.unit_id] = problem
    return repaired


def is_complete(run_dir: Path, *, damaged: bool = False) -> bool:
    """Whether ``run_dir`` holds a finished run (its manifest verified); a manifest that
    fails its check counts as finished with ``damaged`` (to be checked and measured again)."""
    from blockcoupling.store.manifest import MANIFEST, load_manifest

    try:
        return load_manifest(run_dir).get("status") == "complete"
    except RunDirError:
        return damaged and (run_dir / MANIFEST).exists()


# ============================================================================ one unit
def unit_task(work: Work, unit: Any, root: str | os.PathLike[str], *args: Any
              ) -> dict[str, Any]:
    """Run ``work(unit, folder, *args)`` for one unit of the collection in ``root`` and record
    its status (running, then done or failed); returns the status record. Never raises for a
    failing unit. Before the work, the content of the unit's input files is checked against
    the content it was planned with; a run directory still locked by a dying worker is
    waited for. Done: the status records the unit's run (weights hash, prompts) beside
    what ``work`` returned."""
    rootp = Path(root)
    attempts = int((store.read_status(rootp, unit.unit_id) or {}).get("attempts", 0)) + 1
    store.write_status(rootp, unit, "running", attempts=attempts, pid=os.getpid(),
                       host=socket.gethostname(), started=store.now(), message=None)
    t0 = time.perf_counter()
    try:
        inputs = dict(getattr(unit, "inputs", None) or {})
        changed = input_differences(inputs, input_hashes(inputs))
        if changed:
            raise ExecutorError(f"an input changed while the collection ran "
                                f"({'; '.join(changed)}); restore it and resume, or start "
                                "a new one with another --out")
        fields = _waiting_for_lock(lambda: work(unit, store.unit_dir(rootp, unit.unit_id),
                                                *args))
        fields = {**run_record(rootp, unit), **(dict(fields) if isinstance(fields, Mapping)
                                                else {})}
    except BlockCouplingError as err:
        message = str(err)
    except OSError as err:  # a file of the user's: unreadable, missing, disk full
        where = f" {err.filename}" if err.filename else ""
        message = (f"cannot read or write{where}: {err.strerror or err}; check the path, then "
                   f"{integrity.repair_command(rootp, _kind_of(rootp))}")
    except Exception as err:  # a bug or an environment problem: keep the others going
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        message = f"unexpected error (please report it): {last}"
    else:
        return store.write_status(rootp, unit, "done", message=None, finished=store.now(),
                                  seconds=time.perf_counter() - t0, **fields)
    return store.write_status(rootp, unit, "failed", message=message, finished=store.now(),
                              seconds=time.perf_counter() - t0)


def _kind_of(root: Path) -> str | None:
    try:
        return kinds.manifest_kind(store.read_json(root / store.MANIFEST))
    except (RunDirError, AttributeError):
        return None


def run_record(root: Path, unit: store.CollectionUnit) -> dict[str, Any]:
    """What a done unit's status records of its run directory, as the integrity check
    compares it: the weights hash and the number of prompts its run measured."""
    from blockcoupling.store.manifest import load_manifest

    m = load_manifest(root / store.run_relpath(unit.to_dict()))
    if m.get("status") != "complete":
        raise RunDirError(f"the unit {unit.unit_id} finished without a complete run directory")
    return {"weights_hash": m.get("weights_hash"),
            "n_prompts": len((m.get("consolidated") or {}).get("prompt_ids") or [])}


def _waiting_for_lock(fn: Callable[[], Any]) -> Any:
    """Call ``fn``; while the unit's run directory is still locked (a killed driver's worker
    that has not exited yet), wait and try again, up to ``UNIT_LOCK_WAIT_S``."""
    deadline = time.monotonic() + UNIT_LOCK_WAIT_S
    while True:
        try:
            return fn()
        except RunDirError as err:
            if "in use by another" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


# ============================================================================ the driver
def run_collection(root: str | os.PathLike[str], *, kind: str, spec: Any,
                   units: Sequence[store.CollectionUnit], work: Work, args: tuple[Any, ...] = (),
                   resume: bool = False, executor: str = "ray", address: str | None = None,
                   cluster_cpus: int | None = None, retries: int | None = None,
                   connect_timeout: float = CONNECT_TIMEOUT_S, progress: bool = True,
                   inputs: Mapping[str, str] | None = None,
                   same: Callable[[dict[str, Any]], list[str]] | None = None,
                   update: Callable[[dict[str, Any]], None] | None = None,
                   resources: Callable[[Any], Mapping[str, Any]] | None = None,
                   on_done: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """Run (or with ``resume`` continue) the units of a collection of ``kind`` into
    ``root`` by the run protocol (module doc) and return it opened
    (`blockcoupling.runs.read.open_collection`).

    ``spec``: what the manifest records (plain JSON), compared on resume with ``inputs``
    (local input file -> content hash) unless the kind says otherwise (``same(manifest)``:
    the differences that refuse; ``update(manifest)``: what a continued run adds to it, a
    ViT grid's new points). ``work(unit, folder, *args)``: one unit (`unit_task`).
    ``executor``: ``ray`` (one task per unit, ``resources(unit)`` its Ray resources, on the
    cluster at ``address`` or the one Ray finds, else a local one of ``cluster_cpus``) or
    ``local``. ``retries``: Ray retries of a unit whose worker died. ``on_done(status)``
    after each unit."""
    from blockcoupling.validate import optional, whole

    check_executor(executor)
    retries = whole(RETRIES if retries is None else retries, "retries", minimum=0)
    cluster_cpus = optional(whole, cluster_cpus, "cluster-cpus", minimum=1)
    root = Path(root)
    spec = spec_json(spec)
    ids = {u.unit_id for u in units}
    state = check_collection(root, kind, spec, unit_ids=ids, resume=resume, inputs=inputs,
                             same=same)
    if _CHECKS_ONLY.get():
        raise _Checked(state)
    left = [u for u in units
            if (store.read_status(root, u.unit_id) or {}).get("status") != "done"]
    cluster_cm: Any = (ray_session(address, num_cpus=cluster_cpus,
                                   connect_timeout=connect_timeout)
                       if executor == "ray" and left else contextlib.nullcontext())
    with cluster_cm as cluster, collection_folder(  # `root` is created only now
            root, kind, spec, unit_ids=ids, resume=resume, inputs=inputs,
            same=same) as (state, manifest):
        if progress and cluster is not None:
            print(cluster.describe(), file=sys.stderr, flush=True)
        manifest["order"] = [*manifest.get("order", []),
                             *(u.unit_id for u in units if u.unit_id not in
                               manifest.get("order", []))]
        if update is not None:
            update(manifest)
        session: dict[str, Any] = {"started": store.now(), "executor": executor,
                                   "resume": bool(resume), "units": len(units)}
        if executor == "ray":
            session["ray_version"] = import_ray().__version__
        if cluster is not None:  # recorded before any unit runs (a killed driver too)
            session["address"] = cluster.address
            session["cluster"] = cluster.to_dict()
        manifest.setdefault("sessions", []).append(session)
        store.write_json(root / store.MANIFEST, manifest)
        if state in (CONTINUE, REBUILD):
            session["repaired"] = recheck_done(root, units)
        todo = []
        for u in units:
            if (store.read_status(root, u.unit_id) or {}).get("status") == "done":
                continue
            store.write_status(root, u, "pending")
            todo.append(u)
        store.write_catalogue(root)
        bar = None
        if progress:
            from blockcoupling.progress import bar as progress_bar

            bar = progress_bar(total=len(units), initial=len(units) - len(todo), desc=kind,
                               unit="unit")
        failed = 0

        def on_result(i: int, rec: Any, err: BaseException | None) -> None:
            nonlocal failed
            if err is not None:
                rec = store.write_status(
                    root, todo[i], "failed", finished=store.now(),
                    message=f"the worker running this unit died {retries + 1} time(s) "
                            f"({died(err)}); {integrity.repair_command(root, kind)}")
            failed += rec.get("status") == "failed"
            store.write_catalogue(root)
            if on_done is not None:
                on_done(rec)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(failed=failed)

        # a Ray worker gets the absolute path (its working directory may be another)
        where = str(root.resolve()) if executor == "ray" else root
        calls = [((work, u, where, *args),
                  {**(resources(u) if resources is not None else {}), "max_retries": retries,
                   "retry_exceptions": False, "name": f"unit:{u.unit_id}"}) for u in todo]
        try:
            run_each(unit_task, calls, on_result, executor=executor, address=address,
                     num_cpus=cluster_cpus)
        finally:
            if bar is not None:
                bar.close()
            session["finished"] = store.now()
            session["failed"] = failed
            store.write_json(root / store.MANIFEST, manifest)
            store.write_catalogue(root)
    from blockcoupling.runs.read import open_collection

    return open_collection(root)


__all__ = ["RETRIES", "check_collection", "checks_only", "collection_folder", "collection_identity",
           "differences", "has_results", "is_complete", "recheck_done", "run_collection",
           "run_record", "unit_task"]
