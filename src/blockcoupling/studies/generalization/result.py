"""What ``study generalization`` found: `GeneralizationResult` (``study.json`` is its
`GeneralizationResult.to_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.studies.generalization.design import (
    HYPOTHESES,
    PLANNING,
    GeneralizationSpec,
    architecture,
    describe_design,
    design_power,
)

__all__ = ["GeneralizationResult"]


@dataclass
class GeneralizationResult:
    """What `run_study` found (``study.json`` is `to_dict`)."""

    spec: GeneralizationSpec
    runs: pd.DataFrame            # the runs at the comparison point
    final: pd.DataFrame           # the runs at the end of training
    cells: pd.DataFrame
    analysis: dict[str, Any]
    statement: list[str]
    reproducibility: dict[str, Any]
    powers: dict[str, Any] = field(default_factory=dict)
    control: pd.DataFrame | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    out: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        from blockcoupling.engine.statistic import StatisticRule
        from blockcoupling.jsonsafe import jsonable
        from blockcoupling.studies.regression import tost_power
        from blockcoupling.studies.vit.train import STATISTIC_TOKENS

        a = self.analysis
        rules = {v: StatisticRule(variant=v, k=self.spec.train.k, n_boot=0,
                                  tokens=STATISTIC_TOKENS[self.spec.train.tokens])
                 .to_dict(self.spec.train.k) for v in self.spec.variants}
        return jsonable({
            "study": "generalization", "hypotheses": HYPOTHESES, "spec": self.spec.to_dict(),
            "design": {"cells": self.spec.n_cells, "runs": self.spec.n_runs,
                       "architecture": architecture(self.spec), "description":
                       describe_design(self.spec),
                       "power_simulated": self.powers, "planning": PLANNING,
                       "power": {"H1": design_power(self.spec),
                                 "E1_at_0": tost_power(self.spec.n_cells, self.spec.bound,
                                                       self.spec.alpha),
                                 "effect": f"a correlation of {self.spec.bound:g} between "
                                           "cell means", "alpha": self.spec.alpha,
                                 "method": "exact distribution of Pearson's r for "
                                           "bivariate-normal cell means (studies.regression."
                                           "correlation_power, tost_power)"}},
            "statistic": rules,
            "se_levels": {"within_model": "<variant>_se of a run: sd over its measured "
                                          "images / sqrt(n), one trained model",
                          "seed_level": "<col>_se of a cell: sd over its runs (seeds) / "
                                        "sqrt(n), runs as the unit of replication "
                                        "(engine.statistic.seed_level); <variant>_within_se "
                                        "of a cell: sqrt(sum of its runs' se^2) / n, what "
                                        "the images alone give the cell mean"},
            "comparison_point": {"point": a["point"], "reason": a["reason"]},
            "positive_control": a["control"], "positive_control_final": a["control_final"],
            "tests": a["tests"], "spread": a["spread"],
            "cells": self.cells.to_dict("records"), "runs": self.runs.to_dict("records"),
            "control_runs": None if self.control is None else self.control.to_dict("records"),
            "final": self.final.to_dict("records") if a["point"] != "final" else None,
            "statement": self.statement, "reproducibility": self.reproducibility,
            "seconds": self.seconds, "seconds_note": (
                "total and cpu_driver: this invocation (reused runs cost nothing); cpu_runs: "
                "the runs' own CPU seconds as their metrics.json record them (a resumed run: "
                "since its resume)")})

    def summary(self) -> str:
        return "\n".join(self.statement)
