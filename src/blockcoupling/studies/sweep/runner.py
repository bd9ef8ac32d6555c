"""Running a sweep: one task per unit on Ray (default) or in this process (``local``), by
the run protocol of every collection kind (`blockcoupling.runs.protocol.run_collection`).

Each unit is measured by `measure_unit` into ``SWEEP/units/<unit_id>`` with
``measure_to_dir(..., resume=True)``: a unit whose worker was killed is retried by Ray
(``max_retries``) and continues from its finished prompts; a driver killed at any point is
continued with ``resume=True`` (CLI ``--resume``), which skips units already done. A unit that
fails for a user reason (missing revision, prompt too long for the model, ...) is marked
``failed`` with its message and the others go on.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from blockcoupling.engine.fastrecord import FastPathWarning, describe, fallback_layers
from blockcoupling.errors import RunDirError
from blockcoupling.runs import protocol
from blockcoupling.runs.executor import CONNECT_TIMEOUT_S, check_executor
from blockcoupling.store import collection as store
from blockcoupling.studies.sweep.spec import SweepSpec, load_spec
from blockcoupling.studies.sweep.units import Unit, expand

KIND = "sweep"


# ============================================================================ one unit
def measure_unit(u: Unit, out: Path) -> dict[str, Any]:
    """The work of one sweep unit (`protocol.unit_task`): its model measured on its prompts
    into its run directory ``out`` (resumed; a finished one is read back). Returns the
    status fields of a sweep unit: where its time went and whether its fast path was
    refused."""
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.store.reader import is_run_dir, open_run
    from blockcoupling.store.record import measure_to_dir

    if is_run_dir(out) and protocol.is_complete(out):
        open_run(out)  # verified: its status then records it
        return {}
    t0 = time.perf_counter()
    cfg = MeasureConfig.from_dict(dict(u.config))
    model, tok, prompts = load_unit(u, cfg)
    t_loaded = time.perf_counter()
    meta = u.source().meta(label=u.label, step=u.step, unit_id=u.unit_id,
                           prompt_set=u.prompt_set)
    with warnings.catch_warnings():  # said once for the sweep, by the driver
        warnings.simplefilter("ignore", FastPathWarning)
        m = measure_to_dir(model, tok, prompts, out, meta=meta, prompts_spec=u.prompt_set,
                           resume=True, progress=False, config=cfg)
    refused = fallback_layers(m.fast_path)
    return {"timings": unit_timings(t_loaded - t0, time.perf_counter() - t_loaded,
                                    m.meta.get("timings", {})),
            "fast_path_refused": describe(m.meta) if refused else None}


def run_unit(unit: Unit | Mapping[str, Any], root: str | os.PathLike[str]) -> dict[str, Any]:
    """Measure one unit into ``root/units/<unit_id>`` and record its status; returns the
    status record. Never raises for a failing unit (it is recorded as ``failed``)."""
    u = unit if isinstance(unit, Unit) else Unit.from_dict(dict(unit))
    return protocol.unit_task(measure_unit, u, root)


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


# ============================================================================ the sweep
def _inputs(units: Sequence[Unit]) -> dict[str, str]:
    """Every local input of the sweep's units -> its content hash."""
    return {k: v for u in units for k, v in u.inputs.items()}


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
    return not protocol.differences(manifest, protocol.spec_json(sp.to_dict()),
                                    _inputs(expand(sp)))


def run_sweep(spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec,
              out: str | os.PathLike[str], *, executor: str = "ray", address: str | None = None,
              resume: bool = False, progress: bool = True, num_cpus: int | None = None,
              retries: int | None = None,
              connect_timeout: float = CONNECT_TIMEOUT_S) -> Any:
    """Run (or with ``resume=True`` continue) a sweep into the directory ``out`` and return
    [`open_sweep`][blockcoupling.runs.read.open_sweep] of it, by the run protocol
    (`blockcoupling.runs.protocol.run_collection`).

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
    check_executor(executor)  # before the spec is read
    sp = load_spec(spec)
    units = expand(sp)
    refused: list[str] = []  # units whose fast path was refused somewhere: said once

    def on_done(rec: dict[str, Any]) -> None:
        if rec.get("fast_path_refused"):
            refused.append(f"{rec['unit'].get('unit_id')}: {rec['fast_path_refused']}")

    collection = protocol.run_collection(
        out, kind=KIND, spec=sp.to_dict(), units=units, work=measure_unit, resume=resume,
        executor=executor, address=address, cluster_cpus=num_cpus,
        retries=sp.retries if retries is None else retries, connect_timeout=connect_timeout,
        progress=progress, inputs=_inputs(units), on_done=on_done,
        resources=lambda u: {"num_cpus": u.num_cpus, "num_gpus": u.num_gpus})
    if refused:
        todo = len(refused)
        warnings.warn(f"the fast path was refused in {todo} of {len(units)} units, "
                      f"which took the generic path (same values, slower); {refused[0]}"
                      + (" (each unit's meta['fast_path'] records its layers)"
                         if todo > 1 else ""), FastPathWarning, stacklevel=2)
    return collection
