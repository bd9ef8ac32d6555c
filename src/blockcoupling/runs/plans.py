"""The plans that ``--dry-run`` prints for the studies and sweeps: validated and costed, nothing
written. `RunPlan` (one training run or one unit) and `StudyPlan` (all of them, with a stated
cost model) are what every plan is made of; each kind's and study's plan lives beside its
code. The time estimate is a stated model, not a measurement: ``6 x parameters x tokens``
flop per training step and what `plan_measure` states per measurement, at `GFLOPS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blockcoupling.engine.plan import GFLOPS, MeasurePlan, duration, span

__all__ = ["TRAINING_MODEL", "RunPlan", "StudyPlan"]

#: how the training time is estimated (stated in every plan)
TRAINING_MODEL = (f"stated model: training 6 x parameters x tokens flop per step, measurement "
                  f"VJP and eigh flops, at {GFLOPS / 1e9:.0f} GFLOP/s; not measured")


@dataclass
class RunPlan:
    """One training run (or one sweep unit: no training) and the measurements it makes."""

    name: str
    measure: MeasurePlan                       # one checkpoint's measurement
    checkpoints: tuple[int, ...] = ()          # steps (LM) or epochs (ViT) measured
    unit: str = "step"                         # what ``checkpoints`` count
    steps: int = 0                             # training steps
    parameters: int = 0
    training_flops: float = 0.0
    final: MeasurePlan | None = None           # the trained model's own measurement (ViT)

    @property
    def measurements(self) -> int:
        return max(1, len(self.checkpoints)) + (self.final is not None)

    @property
    def estimated_seconds(self) -> float:
        measure = max(1, len(self.checkpoints)) * self.measure.estimated_seconds
        return self.training_flops / GFLOPS + measure + (
            self.final.estimated_seconds if self.final is not None else 0.0)

    def describe(self) -> str:
        lines = [f"  {self.name}"]
        if self.steps:
            lines[0] += (f": {self.steps:,} training steps ({self.parameters:,} parameters), "
                         f"measured at {self.unit}s {span(self.checkpoints)} "
                         f"({len(self.checkpoints)} checkpoints)")
        lines.append(f"    each measurement: {_measure_line(self.measure)}")
        if self.final is not None:
            lines.append(f"    final measurement: {_measure_line(self.final)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "steps": self.steps, "parameters": self.parameters,
                "unit": self.unit, "checkpoints": list(self.checkpoints),
                "training_flops": self.training_flops, "measure": self.measure.to_dict(),
                "final": self.final.to_dict() if self.final is not None else None,
                "estimated_seconds": self.estimated_seconds}


@dataclass
class StudyPlan:
    """What a study or a sweep will do, before it does it (``describe()``, ``to_dict()``)."""

    study: str
    runs: list[RunPlan]
    estimate: str = TRAINING_MODEL
    notes: list[str] = field(default_factory=list)
    capped: bool = False  # steps are caps (runs stop at a plateau): the estimate is a bound

    @property
    def estimated_seconds(self) -> float:
        return sum(r.estimated_seconds for r in self.runs)

    def describe(self) -> str:
        steps = sum(r.steps for r in self.runs)
        what = (f"{len(self.runs)} training runs, {steps:,} training steps, "
                if steps else f"{len(self.runs)} units, ")
        lines = [f"plan of {self.study}: {what}"
                 f"{sum(r.measurements for r in self.runs):,} measurements; nothing is written"]
        lines += [r.describe() for r in self.runs]
        lines += [f"  {n}" for n in self.notes]
        bound = "at most " * self.capped  # every run trained to its cap
        lines.append(f"  estimated time {bound}{duration(self.estimated_seconds)} "
                     f"({self.estimate})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "runs": [r.to_dict() for r in self.runs],
                "estimated_seconds": self.estimated_seconds, "estimate": self.estimate,
                "notes": list(self.notes), "capped": self.capped}


def _measure_line(p: MeasurePlan) -> str:
    pairs = ", ".join(f"{k} {v:,}" for k, v in p.pairs.items()) or "no coupling"
    return (f"{p.prompts:,} inputs ({p.tokens:,} tokens) on {p.num_layers} blocks of d = "
            f"{p.hidden_size}, {p.jacobians:,} Jacobian blocks, pairs {pairs}, "
            f"{duration(p.estimated_seconds)}")
