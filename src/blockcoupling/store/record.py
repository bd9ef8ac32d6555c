"""``measure_to_dir``: the engine's parts written one by one into a resumable run directory."""

from __future__ import annotations

import time
from typing import Any

import torch

from blockcoupling.engine.causality import model_spec
from blockcoupling.engine.config import MeasureConfig, parse_config
from blockcoupling.engine.events import EventCallback
from blockcoupling.engine.inputs import normalise_inputs
from blockcoupling.engine.measure import build_meta, iter_measure
from blockcoupling.engine.plan import MeasurePlan
from blockcoupling.engine.results import Measurement, conform
from blockcoupling.engine.wrappers import as_module
from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.fingerprint import weights_hash
from blockcoupling.store.preflight import preflight
from blockcoupling.store.writer import RunWriter


def measure_to_dir(model: torch.nn.Module, tokenizer: Any, prompts: Any, out_dir: Any, *,
                   meta: dict[str, Any] | None = None, prompts_spec: str = "", resume: bool = False,
                   progress: bool = True, config: MeasureConfig | None = None,
                   on_event: EventCallback | None = None, **options: Any) -> Measurement:
    """Like :func:`measure`, but written prompt by prompt into a resumable run directory.

    ``prompts`` is anything :func:`blockcoupling.engine.inputs.normalise_inputs` accepts:
    text prompts, or ready-made inputs such as ``{"pixel_values": images}`` (their ids are
    derived from their content, so the same inputs resume the same run). The inputs, the
    options and the model are checked before the directory is created.
    """
    cfg = parse_config(config, **options)
    items = normalise_inputs(prompts)
    if items[0].is_text and tokenizer is None:
        raise BlockCouplingError("text prompts need a tokenizer; pass the model's tokenizer")
    prompts_df = conform("prompts", [dict(prompt_id=it.prompt_id, text=it.text, n_tokens=0,
                                          label=it.label) for it in items])
    preflight(model, tokenizer, items, cfg)  # before any file
    spec = model_spec(as_module(model), cfg, tokenizer, items)  # causality of custom modules
    full_meta = build_meta(model, cfg, spec=spec, prompts_spec=prompts_spec,
                           weights_hash=weights_hash(as_module(model)))
    full_meta.update(meta or {})
    t0 = time.perf_counter()
    with RunWriter(out_dir, config=cfg, meta=full_meta, prompts=prompts_df, resume=resume) as writer:
        done = writer.done_prompt_ids()
        for part in iter_measure(model, tokenizer, items, cfg, skip=done, progress=progress,
                                 on_event=on_event, spec=spec):
            writer.write_part(part)
        return writer.finalize(timings={"seconds": time.perf_counter() - t0})


def plan_run(model: torch.nn.Module, tokenizer: Any, prompts: Any, *,
             config: MeasureConfig | None = None, model_name: str = "model",
             **options: Any) -> MeasurePlan:
    """The checks :func:`measure_to_dir` runs before it creates anything, and the plan of the
    work (``blockcoupling measure --dry-run``); nothing is written."""
    cfg = parse_config(config, **options)
    items = normalise_inputs(prompts)
    if items[0].is_text and tokenizer is None:
        raise BlockCouplingError("text prompts need a tokenizer; pass the model's tokenizer")
    return preflight(model, tokenizer, items, cfg, model_name=model_name)


__all__ = ["measure_to_dir", "plan_run"]
