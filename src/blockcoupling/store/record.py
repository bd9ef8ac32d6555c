"""``measure_to_dir``: the engine's parts written one by one into a resumable run directory."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from blockcoupling.engine.config import MeasureConfig, parse_config
from blockcoupling.engine.events import EventCallback
from blockcoupling.engine.inputs import normalise_inputs
from blockcoupling.engine.measure import build_meta, iter_measure, last_fast_path
from blockcoupling.engine.plan import MeasurePlan
from blockcoupling.engine.results import Measurement, conform
from blockcoupling.engine.wrappers import as_module
from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.store.fingerprint import weights_hash
from blockcoupling.store.preflight import preflight
from blockcoupling.store.writer import RunWriter

#: A part (the unit of a run directory's commits) is written once its prompts took this many
#: seconds to measure (and after the last prompt): a prompt of a large model is its own part,
#: while the cheap prompts of a small one share a part (each part costs a few tens of ms of
#: Parquet encoding and file syncs; BENCHMARKS.md, issue 34). A kill loses at most this much.
#: The environment variable ``BLOCKCOUPLING_PART_SECONDS`` sets another default (0: a part per
#: prompt, as the fault tests use it, also in the processes they start).
PART_SECONDS: float = 5.0
PART_SECONDS_ENV = "BLOCKCOUPLING_PART_SECONDS"


def default_part_seconds() -> float:
    """``BLOCKCOUPLING_PART_SECONDS`` if set (a number >= 0), else `PART_SECONDS`."""
    raw = os.environ.get(PART_SECONDS_ENV, "").strip()
    if not raw:
        return PART_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 and not math.isnan(value)):
        raise BlockCouplingError(f"{PART_SECONDS_ENV}={raw!r}: give a number of seconds >= 0 "
                                 "(0: a part per prompt), or unset it")
    return value


def measure_to_dir(model: torch.nn.Module, tokenizer: Any, prompts: Any, out_dir: Any, *,
                   meta: dict[str, Any] | None = None, prompts_spec: str = "", resume: bool = False,
                   progress: bool = True, config: MeasureConfig | None = None,
                   on_event: EventCallback | None = None, part_seconds: float | None = None,
                   **options: Any) -> Measurement:
    """Like `measure`, but written part by part into a resumable run directory.

    ``prompts`` is anything `blockcoupling.engine.inputs.normalise_inputs` accepts:
    text prompts, or ready-made inputs such as ``{"pixel_values": images}`` (their ids are
    derived from their content, so the same inputs resume the same run). The inputs, the
    options and the model are checked before the directory is created. A part holds the
    prompts measured since the last one, written once they took ``part_seconds`` (0: every
    prompt its own part) and after the last prompt; prompts measured before an error or an
    interruption are written before it propagates. The values do not depend on the parts.
    """
    t_start = time.perf_counter()
    if part_seconds is None:
        part_seconds = default_part_seconds()
    cfg = _resumed(out_dir, parse_config(config, **options), resume)
    items, prompts_df, plan, spec, full_meta = _checked(
        model, tokenizer, prompts, cfg, out_dir, meta, prompts_spec, resume, progress)
    t0 = time.perf_counter()
    with RunWriter(out_dir, config=cfg, meta=full_meta, prompts=prompts_df, resume=resume) as writer:
        if writer.damaged_bases:
            _repair_bases(writer, model, tokenizer, items, cfg, plan, progress)
        done = writer.done_prompt_ids()
        setup = time.perf_counter() - t_start  # checks, fingerprint, the directory opened
        measuring = writing = buffered = 0.0
        buffer: list[Measurement] = []
        last: list[Measurement] = []  # the last part: its meta holds the fast-path record

        def flush() -> None:
            nonlocal writing, buffered
            if buffer:
                t = time.perf_counter()
                writer.write_part(buffer[0] if len(buffer) == 1 else
                                  Measurement.concat(buffer, config=cfg))
                writing += time.perf_counter() - t
                buffer.clear()
            buffered = 0.0

        parts = iter_measure(model, tokenizer, items, cfg, skip=done, progress=progress,
                             on_event=on_event, plan=plan)
        while True:
            t1 = time.perf_counter()
            try:
                part = next(parts, None)
            except BaseException:
                flush()  # what was measured before the error or the interruption is kept
                raise
            dt = time.perf_counter() - t1
            measuring += dt
            if part is None:
                break
            buffer.append(part)
            last[:] = [part]
            buffered += dt
            if buffered >= part_seconds:
                flush()
        flush()
        from blockcoupling.engine.offload import peak_memory

        # where the call's time went (the consolidation in finalize comes after: its caller
        # times it, e.g. the sweep's unit status)
        return writer.finalize(timings={"seconds": time.perf_counter() - t0,
                                        "setup_seconds": setup, "measure_seconds": measuring,
                                        "write_seconds": writing,
                                        "peak_memory": peak_memory()},
                               fast_path=last_fast_path(last))


def _resumed(out_dir: Any, cfg: MeasureConfig, resume: bool) -> MeasureConfig:
    """``cfg``, or the variants a resumed run began with (`writer.resume_config`: a variant
    added since is not measured for its remaining prompts), said in a warning."""
    from blockcoupling.store.writer import resume_config

    cfg, line = resume_config(Path(out_dir), cfg, resume)
    if line is not None:
        warnings.warn(line, UserWarning, stacklevel=3)
    return cfg


def _repair_bases(writer: RunWriter, model: torch.nn.Module, tokenizer: Any, items: list[Any],
                  cfg: MeasureConfig, plan: MeasurePlan, progress: bool) -> None:
    """Rebuild the damaged consolidated bases files of a resumed run: their prompts are
    measured again (in the batches of the first run) and each file's bytes must equal the
    ones recorded when it was written (``RunWriter.repair_bases``)."""
    from blockcoupling.engine.bases import InMemoryBases
    from blockcoupling.store.bases import bases_bytes

    want = {pid for ids in writer.damaged_bases.values() for pid in ids}
    if progress:
        print(f"bases: {len(writer.damaged_bases)} stored file(s) damaged; measuring their "
              f"{len(want)} prompt(s) again", file=sys.stderr)
    skip = {it.prompt_id for it in items} - want
    sources = [part.basis_store for part in iter_measure(model, tokenizer, items, cfg, skip=skip,
                                                         progress=progress, plan=plan)]
    merged = InMemoryBases.merge(sources)
    for name, ids in list(writer.damaged_bases.items()):
        data = bases_bytes(merged, ids)
        if data is None:
            raise RunDirError(f"the prompts of {name} gave no bases when measured again; "
                              "measure again into a new --out")
        writer.repair_bases(name, data)


def _checked(model: torch.nn.Module, tokenizer: Any, prompts: Any, cfg: MeasureConfig,
             out_dir: Any, meta: dict[str, Any] | None, prompts_spec: str, resume: bool,
             progress: bool, model_name: str = "model", dry_run: bool = False
             ) -> tuple[list[Any], pd.DataFrame, MeasurePlan, Any, dict[str, Any]]:
    """Every check of a run before its directory is touched (``measure_to_dir`` and
    ``plan_run`` alike): the inputs, the options against the model (``preflight``), the
    stored bases' size against the disk, and what ``--out`` holds (``writer.check_target``:
    a run there without ``resume``, a run of other settings, another writer). Returns
    (items, prompts table, plan, block spec, the run's meta)."""
    from blockcoupling.store.manifest import prompt_records
    from blockcoupling.store.writer import check_target

    items = normalise_inputs(prompts)
    if items[0].is_text and tokenizer is None:
        raise BlockCouplingError("text prompts need a tokenizer; pass the model's tokenizer")
    prompts_df = conform("prompts", [dict(prompt_id=it.prompt_id, text=it.text, n_tokens=0,
                                          label=it.label) for it in items])
    plan = preflight(model, tokenizer, items, cfg, model_name=model_name)  # before any file
    spec = plan.spec  # the spec the run measures (a custom module's causality resolved)
    full_meta = build_meta(model, cfg, spec=spec, prompts_spec=prompts_spec,
                           weights_hash=weights_hash(as_module(model)))
    full_meta.update(meta or {})
    if cfg.save_bases or cfg.save_jacobians:
        _check_bases_size(plan, items, cfg, out_dir, progress)
    # the writer verifies the stored parts itself: read them twice only for a plan
    check_target(Path(out_dir), cfg, full_meta, prompt_records(prompts_df), resume,
                 verify_parts=dry_run)
    return items, prompts_df, plan, spec, full_meta


def _check_bases_size(plan: MeasurePlan, items: list[Any], cfg: MeasureConfig, out_dir: Any,
                      progress: bool) -> None:
    """Print the estimated size of the stored bases and Jacobians; refuse Jacobians above
    the limit (unless ``force_size``) and anything the disk cannot hold. The sizes are the
    plan's (`plan_measure`: one work list, on the run's own block spec, a custom module's
    stated ``hidden_size`` and ``causal`` included), never computed again here."""
    from blockcoupling.store import bases as stored

    # text prompts and ready-made token ids have known lengths; images are counted after
    # their first capture
    if not items[0].is_text and _tensor_lengths(items) is None:
        if progress:
            print("bases: size known after the first prompt (ready-made inputs)", file=sys.stderr)
        return
    if not plan.hidden_size:  # a custom module given no hidden_size
        if cfg.save_jacobians and not cfg.force_size:
            raise BlockCouplingError(
                "save_jacobians: their size cannot be checked before the run (the custom "
                "module's width is not known before it runs); give hidden_size, or force_size "
                "to store them unchecked")
        if progress:
            print("bases: size known after the first prompt (a custom module's width)",
                  file=sys.stderr)
        return
    n_jac, nbytes, jbytes = plan.stored_jacobians, plan.bases_bytes, plan.jacobian_bytes
    if progress and cfg.save_bases:
        print(f"bases: {n_jac} Jacobians x (U, V of {cfg.k_max} x d, S) = about "
              f"{stored.human(nbytes)} in {out_dir}", file=sys.stderr)
    if cfg.save_jacobians:
        if progress:
            print(f"jacobians: {n_jac} Jacobians of d x d = about {stored.human(jbytes)} in "
                  f"{out_dir}", file=sys.stderr)
        stored.check_jacobian_limit(jbytes, cfg.force_size)
    stored.check_disk(Path(out_dir), nbytes * cfg.save_bases + jbytes * cfg.save_jacobians,
                      "the stored bases and Jacobians")


def _tensor_lengths(items: list[Any]) -> list[int] | None:
    """Real tokens of ready-made token inputs (``attention_mask`` or ``input_ids``); None for
    other inputs (images: their token count is known after the capture)."""
    out = []
    for it in items:
        t = it.tensors or {}
        if "attention_mask" in t:
            out.append(int(t["attention_mask"].sum()))
        elif "input_ids" in t:
            out.append(int(t["input_ids"].shape[-1]))
        else:
            return None
    return out


def plan_run(model: torch.nn.Module, tokenizer: Any, prompts: Any, *,
             config: MeasureConfig | None = None, model_name: str = "model",
             out_dir: Any = None, meta: dict[str, Any] | None = None, prompts_spec: str = "",
             resume: bool = False, **options: Any) -> MeasurePlan:
    """The checks `measure_to_dir` runs before it creates anything, and the plan of the
    work (``blockcoupling measure --dry-run``); nothing is written. With ``out_dir`` (and the
    ``meta``, ``prompts_spec`` and ``resume`` the run would get) every check of the run is
    made, the output directory's included: what the run would refuse is refused."""
    cfg = parse_config(config, **options)
    if out_dir is not None:
        cfg = _resumed(out_dir, cfg, resume)
        return _checked(model, tokenizer, prompts, cfg, out_dir, meta, prompts_spec, resume,
                        progress=False, model_name=model_name, dry_run=True)[2]
    items = normalise_inputs(prompts)
    if items[0].is_text and tokenizer is None:
        raise BlockCouplingError("text prompts need a tokenizer; pass the model's tokenizer")
    return preflight(model, tokenizer, items, cfg, model_name=model_name)


__all__ = ["measure_to_dir", "plan_run"]
