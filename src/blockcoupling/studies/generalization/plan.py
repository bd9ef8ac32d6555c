"""The ``--dry-run`` plan of ``study generalization``: its runs are one ViT grid."""

from __future__ import annotations

from typing import Any

from blockcoupling.runs.plans import StudyPlan

__all__ = ["plan_generalization"]


def plan_generalization(spec: Any) -> StudyPlan:
    """The plan of ``study generalization`` for a ``GeneralizationSpec`` (already checked,
    its power included): every run's training (its steps, the checkpoints measured) and
    measurements, with the design and its power as notes."""
    from blockcoupling.studies.generalization.design import describe_design, design_powers
    from blockcoupling.studies.vit.grid import grid_axes
    from blockcoupling.studies.vit.plan import plan_vit_training

    # what run_study trains: the design's grid and the positive control's
    plan = plan_vit_training([*spec.configs(), *spec.control_configs()],
                             grid_axes(spec.train_sizes, spec.label_noises),
                             study="the generalization study")
    powers = design_powers(spec, reps=1000)
    plan.notes += [*describe_design(spec), "power by simulation (1,000 data sets each): "
                   + "; ".join(f"{k} {r['power']:.2f} at {r['effect']}" for k, r in
                               powers.items() if "power" in r),
                   "runs already trained in --out are reused"]
    return plan
