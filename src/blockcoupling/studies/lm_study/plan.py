"""The ``--dry-run`` plan of ``study lm-family``."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from blockcoupling.runs.plans import RunPlan, StudyPlan
from blockcoupling.studies.lm_study.design import (
    StudySpec,
    family_prompts,
    study_measure,
    tiny_config,
)


def plan_lm_study(spec: StudySpec) -> StudyPlan:
    """The plan of ``study lm-family`` for a ``StudySpec``: per run its training steps (a cap),
    the checkpoints (step 0 and the powers of two to the cap) and the measurement of each (the study's sweep), on the untrained
    model of the run's shape and the held-out prompts."""
    from transformers import GPT2LMHeadModel

    from blockcoupling.engine.config import parse_config
    from blockcoupling.store.record import plan_run
    from blockcoupling.studies.tiny_lm import build_tokenizer, corpus_text, gpt2_config

    tok = build_tokenizer(corpus_text())
    cfg = parse_config(None, **study_measure(spec))
    prompts = family_prompts(tiny_config(spec, spec.runs[0]), n=spec.n_prompts,
                             length=spec.prompt_length)
    runs = []
    shapes: dict[tuple[int, int], tuple[int, Any]] = {}  # runs of one shape: one plan
    for run in spec.runs:
        tc = tiny_config(spec, run)
        if (run.n_layer, run.n_embd) not in shapes:
            with torch.device("meta"):  # the shape only: no weights are allocated
                model = GPT2LMHeadModel(gpt2_config(tc, len(tok), tok.pad_token_id))
            shapes[run.n_layer, run.n_embd] = (
                sum(p.numel() for p in model.parameters()),
                plan_run(model, tok, prompts, config=cfg, model_name=run.run_id))
        params, plan = shapes[run.n_layer, run.n_embd]
        runs.append(RunPlan(
            name=run.run_id, checkpoints=tuple(tc.checkpoints), steps=tc.max_steps,
            parameters=params,
            training_flops=6.0 * params * tc.batch_size * tc.block_size * tc.max_steps,
            measure=dataclasses.replace(plan, model=run.run_id)))
    notes = ["steps and checkpoints are caps: each run stops at its held-out plateau",
             f"each checkpoint is also scored on held-out text; K = {spec.k}, "
             f"{len(prompts)} prompts of {spec.prompt_length} characters"]
    return StudyPlan(study="the LM family study", runs=runs, notes=notes, capped=True)
