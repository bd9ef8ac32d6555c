"""The ``--dry-run`` plan of ``study generalization``: its runs are one ViT grid."""

from __future__ import annotations

from typing import Any

from blockcoupling.runs.plans import StudyPlan

__all__ = ["plan_generalization"]


def plan_generalization(spec: Any) -> StudyPlan:
    """The plan of ``study generalization`` for a ``GeneralizationSpec`` (already checked,
    its power included): every run's training (its steps, the checkpoints measured) and
    measurements, with the design and its power as notes."""
    from blockcoupling.studies.generalization.design import describe_design
    from blockcoupling.studies.vit.plan import plan_grid

    plan = plan_grid(spec.train, spec.grid(), "the generalization study")  # what run_study trains
    plan.notes += [*describe_design(spec), "runs already trained in --out are reused"]
    return plan
