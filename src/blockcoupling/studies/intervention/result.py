"""What ``study intervention`` found: `InterventionResult` (``study.json`` is its
`InterventionResult.to_dict`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from blockcoupling.studies.intervention.design import InterventionSpec, describe_design

__all__ = ["InterventionResult"]


@dataclass
class InterventionResult:
    """What `run_study` found (``study.json`` is `to_dict`)."""

    spec: InterventionSpec
    runs: pd.DataFrame            # one row per run at the end of training
    analysis: dict[str, Any]      # `analysis.analyse`
    powers: dict[str, Any]        # `design.design_powers`
    statement: list[str]
    seconds: dict[str, float]
    reproducibility: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        from blockcoupling.engine.statistic import StatisticRule
        from blockcoupling.jsonsafe import jsonable
        from blockcoupling.studies.intervention.design import HYPOTHESES, PLANNING
        from blockcoupling.studies.vit.train import STATISTIC_TOKENS

        t = self.spec.train
        rule = StatisticRule(variant=self.spec.variant, k=t.k, n_boot=0,
                             tokens=STATISTIC_TOKENS[t.tokens]).to_dict(t.k)
        a = self.analysis
        return jsonable({
            "study": "intervention", "hypotheses": HYPOTHESES, "spec": self.spec.to_dict(),
            "design": {"runs": self.spec.n_runs, "arms": list(self.spec.arms),
                       "seeds": list(self.spec.seeds), "description":
                       describe_design(self.spec), "planning": PLANNING,
                       "power": self.powers},
            "statistic": rule, "surrogate": _SURROGATE,
            "arms": a["arms"].to_dict("records"), "manipulation_check": a["tests"]["H1"],
            "tests": a["tests"], "runs": self.runs.to_dict("records"),
            "statement": self.statement, "reproducibility": self.reproducibility,
            "seconds": self.seconds})

    def summary(self) -> str:
        return "\n".join(self.statement)


_SURROGATE = (
    "The term added to the loss: -strength x the mean over block pairs l != l' (and over 4 "
    "images of the batch) of the traceless alignment <T^l, T^l'>_F / (||T^l||_F ||T^l'||_F), "
    "T^l = J^l - tr(J^l)/d I, J^l the block's Jacobian at [CLS] (engine.surrogate), estimated "
    "from Jacobian-vector products on 8 Haar-random orthonormal directions per step; "
    "'alignment' is its exact value (all d directions) on the final images.")
