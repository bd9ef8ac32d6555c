"""Running a sweep: one task per unit on Ray (default) or in this process (``local``).

Each unit is measured by `run_unit` into ``SWEEP/units/<unit_id>`` with
``measure_to_dir(..., resume=True)``: a unit whose worker was killed is retried by Ray
(``max_retries``) and continues from its finished prompts; a driver killed at any point is
continued with ``resume=True`` (CLI ``--resume``), which skips units already done. A unit that
fails for a user reason (missing revision, prompt too long for the model, ...) is marked
``failed`` with its message and the others go on.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from blockcoupling.engine.fastrecord import FastPathWarning, describe, fallback_layers
from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.runs import integrity, kinds
from blockcoupling.runs.executor import (
    CONNECT_TIMEOUT_S,
    EXECUTORS,
    SweepError,
    died,
    import_ray,
    ray_session,
    run_each,
)
from blockcoupling.runs.identity import input_differences, input_hashes
from blockcoupling.store import collection as store
from blockcoupling.studies.sweep.spec import SweepSpec, load_spec
from blockcoupling.studies.sweep.units import Unit, expand

#: how long a unit waits for a run directory still locked by a dying worker
UNIT_LOCK_WAIT_S = 120.0


# ============================================================================ one unit
def run_unit(unit: Unit | Mapping[str, Any], root: str | os.PathLike[str]) -> dict[str, Any]:
    """Measure one unit into ``root/units/<unit_id>`` and record its status; returns the
    status record. Never raises for a failing unit (it is recorded as ``failed``)."""
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.store.record import measure_to_dir
    from blockcoupling.store.rundir import is_run_dir, open_run

    u = unit if isinstance(unit, Unit) else Unit.from_dict(dict(unit))
    rootp = Path(root)
    attempts = int((store.read_status(rootp, u.unit_id) or {}).get("attempts", 0)) + 1
    store.write_status(rootp, u, "running", attempts=attempts, pid=os.getpid(),
                       host=socket.gethostname(), started=store.now(), message=None)
    out = store.unit_dir(rootp, u.unit_id)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    try:
        if is_run_dir(out) and _complete(out):
            m = open_run(out)
        else:
            cfg = MeasureConfig.from_dict(dict(u.config))
            changed = input_differences(u.inputs, input_hashes(u.inputs))
            if changed:
                raise SweepError(f"an input changed while the sweep ran ({'; '.join(changed)});"
                                 " restore it and resume, or start a new sweep with --out")
            model, tok, prompts = load_unit(u, cfg)
            t_loaded = time.perf_counter()
            meta = u.source().meta(label=u.label, step=u.step, unit_id=u.unit_id,
                                   prompt_set=u.prompt_set)
            with warnings.catch_warnings():  # said once for the sweep, by the driver
                warnings.simplefilter("ignore", FastPathWarning)
                m = _measure_waiting_for_lock(
                    lambda: measure_to_dir(model, tok, prompts, out, meta=meta,
                                           prompts_spec=u.prompt_set, resume=True,
                                           progress=False, config=cfg))
            timings = unit_timings(t_loaded - t0, time.perf_counter() - t_loaded,
                                   m.meta.get("timings", {}))
    except BlockCouplingError as err:
        return store.write_status(rootp, u, "failed", message=str(err), finished=store.now(),
                                  seconds=time.perf_counter() - t0)
    except OSError as err:  # a file of the user's: unreadable, missing, disk full
        where = f" {err.filename}" if err.filename else ""
        return store.write_status(rootp, u, "failed", finished=store.now(),
                                  message=f"cannot read or write{where}: {err.strerror or err}; "
                                          "check the path, then resume with --resume",
                                  seconds=time.perf_counter() - t0)
    except Exception as err:  # a bug or an environment problem: keep the others going
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return store.write_status(rootp, u, "failed", finished=store.now(),
                                  message=f"unexpected error (please report it): {last}",
                                  seconds=time.perf_counter() - t0)
    refused = fallback_layers(m.fast_path)
    return store.write_status(rootp, u, "done", message=None, finished=store.now(),
                              seconds=time.perf_counter() - t0, timings=timings,
                              weights_hash=m.meta.get("weights_hash"), n_prompts=len(m.prompts),
                              fast_path_refused=describe(m.meta) if refused else None)


def unit_timings(load: float, recorded: float, run: Mapping[str, Any]) -> dict[str, float]:
    """Where a unit's time went, in seconds: ``load`` (model, tokenizer, prompts), ``setup``
    (the run's checks, the weights' fingerprint, the directory opened), ``measure`` (the
    engine), ``write`` (every part written, then the consolidation); from the load time,
    ``measure_to_dir``'s duration ``recorded`` and the timings its run recorded."""
    setup = float(run.get("setup_seconds", 0.0))
    measure = float(run.get("measure_seconds", 0.0))
    return {"load": load, "setup": setup, "measure": measure,
            "write": max(0.0, recorded - setup - measure)}


def load_unit(u: Unit, cfg: Any) -> tuple[Any, Any, list[Any]]:
    """(model, tokenizer, prompts) of a unit, as its measurement (and ``sweep --dry-run``'s
    plan) loads them."""
    from blockcoupling.prompts.sources import Prompt, load_prompts

    prompts: list[str] | list[Prompt]
    if u.prompt_texts:  # an inline set: ids p00000, p00001, ... (limit: the first N)
        prompts = list(u.prompt_texts)[: u.limit] if u.limit else list(u.prompt_texts)
    else:
        prompts = load_prompts(u.prompt_set, limit=u.limit, seed=cfg.seed)
    model, tok = u.source().load(head=bool(cfg.logit_lens))
    return model, tok, list(prompts)


def _complete(run_dir: Path, *, damaged: bool = False) -> bool:
    """Whether ``run_dir`` holds a finished run (its manifest verified); a manifest that
    fails its check counts as finished with ``damaged`` (to be checked and measured again)."""
    from blockcoupling.store.manifest import MANIFEST, load_manifest

    try:
        return load_manifest(run_dir).get("status") == "complete"
    except RunDirError:
        return damaged and (run_dir / MANIFEST).exists()


def _measure_waiting_for_lock(fn: Callable[[], Any]) -> Any:
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


def _execute(root: Path, units: list[Unit], *, executor: str, address: str | None,
             retries: int, num_cpus: int | None,
             progress: Callable[[dict[str, Any]], None]) -> None:
    """Every unit through the kinds' one task loop (`executor.run_each`)."""
    # a worker gets plain data and the absolute path (its working directory may be another)
    where: str | Path = str(root.resolve()) if executor == "ray" else root
    calls = [((u.to_dict() if executor == "ray" else u, where),
              {"num_cpus": u.num_cpus, "num_gpus": u.num_gpus, "max_retries": retries,
               "retry_exceptions": False, "name": f"unit:{u.unit_id}"}) for u in units]

    def on_result(i: int, rec: Any, err: BaseException | None) -> None:
        if err is not None:
            rec = store.write_status(
                root, units[i], "failed", finished=store.now(),
                message=f"the worker running this unit died {retries + 1} time(s) "
                        f"({died(err)}); resume the sweep with --resume to try again")
        progress(rec)

    run_each(run_unit, calls, on_result, executor=executor, address=address,
             num_cpus=num_cpus)


# ============================================================================ the sweep
def _spec_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _spec_diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: sweep has {old!r}, now {new!r}"]


def _spec_json(sp: SweepSpec) -> Any:
    return json.loads(json.dumps(sp.to_dict(), default=str))


def _sweep_inputs(units: Sequence[Unit]) -> dict[str, str]:
    """Every local input of the sweep's units -> its content hash."""
    return {k: v for u in units for k, v in u.inputs.items()}


def _resume_differences(manifest: dict[str, Any], spec_dict: Any,
                        inputs: dict[str, str]) -> list[str]:
    """What differs between a stored sweep and the spec (and input contents) it is resumed
    with; empty: none."""
    diffs = _spec_diff(manifest.get("spec"), spec_dict)
    if "inputs" not in manifest:
        if inputs:  # a sweep from before input contents were recorded
            diffs.append("the sweep does not record the content of its input files (made by "
                         "an older blockcoupling)")
    else:
        diffs += [f"input {d}" for d in input_differences(manifest["inputs"], inputs)]
    return diffs


def spec_matches(root: str | os.PathLike[str],
                 spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec) -> bool:
    """Whether the sweep in ``root`` was run with ``spec`` and inputs of the same content
    (what ``run_sweep(..., resume=True)`` requires); False for a directory that holds no
    sweep or whose manifest cannot be read."""
    if not store.is_sweep_dir(root):
        return False
    sp = load_spec(spec)
    try:
        manifest = store.load_manifest(Path(root))
    except RunDirError:
        return False
    return not _resume_differences(manifest, _spec_json(sp), _sweep_inputs(expand(sp)))


def _open_manifest(root: Path, *, resume: bool, spec_dict: Any, units: Sequence[Unit],  # noqa: C901 - old and new manifests; moves with the collection format (issue 33 item 1)
                   inputs: dict[str, str], check_only: bool = False) -> dict[str, Any]:
    """The manifest a run of the sweep continues (checked against the spec and the inputs'
    content) or starts; a lost or corrupt one is rebuilt from the status files on resume.
    ``check_only``: the same checks and errors, with nothing created or removed (before a
    cluster is reached)."""
    if root.exists() and not root.is_dir():
        raise SweepError(f"--out {root} is a file; give a directory for the sweep")
    ids = {u.unit_id for u in units}
    manifest: dict[str, Any] | None = None
    if store.is_sweep_dir(root):
        try:
            manifest = store.load_manifest(root)
        except RunDirError:
            if not resume:
                raise
            manifest = store.rebuilt_manifest(root, "sweep", spec_dict, ids)
            if manifest is None:
                raise
            manifest["inputs"] = inputs
            return manifest
    elif resume:
        manifest = store.rebuilt_manifest(root, "sweep", spec_dict, ids)
        if manifest is not None:
            manifest["inputs"] = inputs
            return manifest
    if manifest is None:
        others = [p for p in root.iterdir() if p.name != store.LOCK] if root.is_dir() else []
        if others:
            what = ("holds status files of a sweep whose manifest is lost; continue it with "
                    "--resume (it rebuilds the manifest)" if (root / store.STATUS).is_dir()
                    else "is not empty and holds no sweep; choose a new --out")
            raise SweepError(f"{root} {what}")
        manifest = store.new_manifest("sweep", spec_dict)
        manifest["inputs"] = inputs
        return manifest
    if kinds.manifest_kind(manifest) != "sweep":
        raise SweepError(f"{root} holds a {kinds.manifest_kind(manifest)} directory, not a "
                         "sweep; choose a new --out")
    diffs = _resume_differences(manifest, spec_dict, inputs)
    if (diffs or not resume) and not _holds_results(root):
        # nothing measured yet (every unit failed or never started, e.g. a wrong device):
        # the corrected spec replaces it, as `measure` replaces a run without results
        import shutil

        if check_only:
            return manifest

        for name in (store.STATUS, store.UNITS):
            shutil.rmtree(root / name, ignore_errors=True)
        (root / store.CATALOGUE).unlink(missing_ok=True)
        manifest = store.new_manifest("sweep", spec_dict)
        manifest["inputs"] = inputs
        return manifest
    if not resume:
        raise SweepError(f"{root} already holds a sweep; continue it with --resume, or "
                         "choose a new --out")
    if diffs:
        raise SweepError(f"cannot resume {root}: the spec differs from the sweep's, or a file "
                         "it reads changed (" + "; ".join(diffs[:3]) + "); resume with the "
                         "original spec and files, or choose a new --out")
    return manifest


def _holds_results(root: Path) -> bool:
    """Whether any unit of the sweep in ``root`` is done or has measured a prompt."""
    if any(r.get("status") == "done" for r in store.all_status(root)):
        return True
    units = root / store.UNITS
    return units.is_dir() and any(
        any(d.glob("parts/part-*")) or (d / "manifest.json").is_file() and _complete(d)
        for d in units.iterdir() if d.is_dir())


def _recheck_done(root: Path, units: Sequence[Unit]) -> dict[str, str]:
    """On resume: every unit whose run directory is finished is checked (``unit_problem``);
    a damaged one is marked ``pending`` and its directory removed, so that it is measured
    again. Returns unit id -> what was wrong."""
    import shutil

    repaired: dict[str, str] = {}
    for u in units:
        rec = store.read_status(root, u.unit_id)
        finished = _complete(store.unit_dir(root, u.unit_id), damaged=True)
        if not finished and not (rec is not None and rec.get("status") == "done"):
            continue
        problem = integrity.unit_problem(root, rec if rec is not None else {"unit": u.to_dict()})
        if problem is None:
            continue
        store.write_status(root, u, "pending", repaired=problem, weights_hash=None,
                           n_prompts=None)
        shutil.rmtree(store.unit_dir(root, u.unit_id), ignore_errors=True)
        repaired[u.unit_id] = problem
    return repaired


def run_sweep(spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec,  # noqa: C901 - local and Ray executors; moves with the executor module (issue 33 item 1)
              out: str | os.PathLike[str], *, executor: str = "ray", address: str | None = None,
              resume: bool = False, progress: bool = True, num_cpus: int | None = None,
              retries: int | None = None,
              connect_timeout: float = CONNECT_TIMEOUT_S) -> Any:
    """Run (or with ``resume=True`` continue) a sweep into the directory ``out`` and return
    [`open_sweep`][blockcoupling.runs.read.open_sweep] of it.

    ``spec``: a YAML file, a mapping of the same form, or a [`SweepSpec`][blockcoupling.studies.sweep.spec.SweepSpec]. ``executor``:
    ``"ray"`` (one task per unit, on the cluster ``ray.init()`` would use: ``address``,
    ``RAY_ADDRESS`` or the one ``ray start`` left on this node, else a local cluster of
    ``num_cpus`` started here; the Ray already initialised in this process is used as is) or
    ``"local"`` (units one after the other in this process, for debugging). The cluster is
    reached (within ``connect_timeout`` seconds) before ``out`` is created; its address and
    origin are recorded in the session (``sweep.json``) and, with ``progress``, printed.
    ``retries``: Ray retries of a unit whose worker died (default: the spec's ``retries``,
    3). Units already done are skipped on resume; failed and unfinished ones run again.
    """
    from blockcoupling.runs.read import open_sweep
    from blockcoupling.validate import optional, whole

    if executor not in EXECUTORS:
        raise SweepError(f"executor {executor!r}: choose ray or local")
    retries = optional(whole, retries, "retries", minimum=0)
    num_cpus = optional(whole, num_cpus, "cluster-cpus", minimum=1)
    sp = load_spec(spec)
    if executor == "ray":
        import_ray()
    units = expand(sp)
    root = Path(out)
    spec_dict = _spec_json(sp)
    inputs = _sweep_inputs(units)
    # refused before a cluster is reached, and nothing is created or removed yet
    _open_manifest(root, resume=resume, spec_dict=spec_dict, units=units, inputs=inputs,
                   check_only=True)
    left = [u for u in units
            if (store.read_status(root, u.unit_id) or {}).get("status") != "done"]
    cluster_cm: Any = (ray_session(address, num_cpus=num_cpus, connect_timeout=connect_timeout)
                       if executor == "ray" and left else contextlib.nullcontext())
    with cluster_cm as cluster, store.sweep_lock(root, "sweep"):  # `out` is created only now
        if progress and cluster is not None:
            print(cluster.describe(), file=sys.stderr, flush=True)
        manifest = _open_manifest(root, resume=resume, spec_dict=spec_dict, units=units,
                                  inputs=inputs)
        manifest["order"] = [u.unit_id for u in units]
        session: dict[str, Any] = {"started": store.now(), "executor": executor,
                                   "resume": bool(resume), "units": len(units)}
        if executor == "ray":
            session["ray_version"] = import_ray().__version__
        if cluster is not None:  # recorded before any unit runs (a killed driver too)
            session["address"] = cluster.address
            session["cluster"] = cluster.to_dict()
        manifest["sessions"].append(session)
        store.write_json(root / store.MANIFEST, manifest)

        if resume:
            session["repaired"] = _recheck_done(root, units)
        todo: list[Unit] = []
        for u in units:
            rec = store.read_status(root, u.unit_id)
            if rec is not None and rec.get("status") == "done":
                continue
            store.write_status(root, u, "pending")
            todo.append(u)
        store.write_catalogue(root)

        bar = None
        if progress:
            from blockcoupling.progress import bar as progress_bar

            bar = progress_bar(total=len(units), initial=len(units) - len(todo), desc="sweep",
                               unit="unit")
        failed = 0
        refused: list[str] = []  # units whose fast path was refused somewhere: said once

        def report(rec: dict[str, Any]) -> None:
            nonlocal failed
            failed += rec.get("status") == "failed"
            if rec.get("fast_path_refused"):
                refused.append(f"{rec['unit'].get('unit_id')}: {rec['fast_path_refused']}")
            store.write_catalogue(root)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(failed=failed)

        try:
            _execute(root, todo, executor=executor, address=address, num_cpus=num_cpus,
                     retries=sp.retries if retries is None else retries, progress=report)
        finally:
            if bar is not None:
                bar.close()
            session["finished"] = store.now()
            session["failed"] = failed
            store.write_json(root / store.MANIFEST, manifest)
            store.write_catalogue(root)
    if refused:
        warnings.warn(f"the fast path was refused in {len(refused)} of {len(todo)} units, "
                      f"which took the generic path (same values, slower); {refused[0]}"
                      + (" (each unit's meta['fast_path'] records its layers)"
                         if len(refused) > 1 else ""), FastPathWarning, stacklevel=2)
    return open_sweep(root)
