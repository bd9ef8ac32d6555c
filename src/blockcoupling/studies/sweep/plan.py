"""The sweep's ``--dry-run`` plan (its kind's ``plan``, `blockcoupling.runs.kinds`): every
unit of a sweep spec, each with the `MeasurePlan` of its model and prompts (the model and the
prompts are loaded and checked as the unit's measurement loads them: ``runner.load_unit``,
``store.record.plan_run``)."""

from __future__ import annotations

from typing import Any

from blockcoupling.runs.plans import TRAINING_MODEL, RunPlan, StudyPlan

__all__ = ["plan_sweep"]


def plan_sweep(spec: Any) -> StudyPlan:
    """Every unit of ``spec`` (a YAML path, a mapping or a ``SweepSpec``) with its
    MeasurePlan; each unit's model and prompts are loaded and checked (one at a time)."""
    from blockcoupling.store.record import plan_run
    from blockcoupling.studies.sweep.runner import load_unit
    from blockcoupling.studies.sweep.spec import load_spec
    from blockcoupling.studies.sweep.units import expand

    sp = load_spec(spec)
    runs = []
    for u in expand(sp):
        model, tok, prompts = load_unit(u, sp.config)
        plan = plan_run(model, tok, prompts, config=sp.config,
                        model_name=f"{u.model}" + (f"@{u.revision}" if u.revision else ""))
        runs.append(RunPlan(name=u.unit_id, measure=plan))
        del model
    return StudyPlan(study=f"the sweep {sp.name or ''}".rstrip(), runs=runs,
                     estimate=runs[0].measure.estimate if runs else TRAINING_MODEL)
