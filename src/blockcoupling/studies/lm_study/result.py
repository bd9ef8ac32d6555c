"""What the lm-family study found (``study.json``)."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from blockcoupling.studies.lm_study.design import HYPOTHESES, StudySpec, stopping_rule


def versions() -> dict[str, Any]:
    from importlib.metadata import version

    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "blockcoupling": version("blockcoupling"),
            "numpy": np.__version__, "pandas": pd.__version__, "torch_threads":
            torch.get_num_threads(),
            "note": "training is bit-reproducible only at the same torch thread count"}


@dataclass
class StudyResult:
    """What [`run_study`][blockcoupling.studies.lm_study.run_study] found (``study.json`` is `to_dict`)."""

    spec: StudySpec
    models: pd.DataFrame
    emergence: pd.DataFrame
    tests: dict[str, Any]
    statement: list[str]
    noise_floor: dict[str, Any]
    reproducibility: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)
    out: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        from blockcoupling.engine.statistic import StatisticRule, headline_rule
        from blockcoupling.jsonsafe import jsonable

        models = []
        for r in self.models.to_dict("records"):
            models.append({**r, "config": next(asdict(x) for x in self.spec.runs
                                               if x.run_id == r["run_id"])})
        emergence = {rid: g.drop(columns=["run_id"]).to_dict("records")
                     for rid, g in self.emergence.groupby("run_id", sort=False)}
        rule = StatisticRule(k=self.spec.k, n_boot=0)
        return jsonable({
            "study": "lm-family", "hypotheses": HYPOTHESES, "spec": self.spec.to_dict(),
            "stopping_rule": stopping_rule(self.spec),
            "statistic": rule.to_dict(self.spec.k) | {"description": headline_rule(
                k=self.spec.k)},
            "models": models, "emergence": emergence, "tests": self.tests,
            "noise_floor": self.noise_floor, "statement": self.statement,
            "reproducibility": self.reproducibility, "seconds": self.seconds})

    def summary(self) -> str:
        return "\n".join(self.statement)
