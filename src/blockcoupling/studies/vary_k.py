"""The correlation at several K in one output (the paper's ``alignment_vary_k`` figure):
``blockcoupling correlate RUNS --scores S --k 8,16,32``.

The runs are read once (`blockcoupling.studies.model_units.load_units`); each K is then
the whole correlation study (`blockcoupling.studies.correlate.correlate`, fixed K for
every model), so every statistic of one K is exactly what ``correlate --k K`` reports.
Each run must have measured every K asked for (a missing K is one error naming it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.jsonsafe import jsonable
from blockcoupling.store.fileio import write_json
from blockcoupling.studies.correlate import CorrelationResult, correlate
from blockcoupling.studies.model_units import ModelUnit, load_units
from blockcoupling.studies.regression import COUPLING_PREDICTORS, fit_text

#: the columns of `VaryKResult.table`
TABLE_COLUMNS = ("k", "predictor", "n", "r", "r2", "r2_lo", "r2_hi", "p", "slope",
                 "spearman_rho", "spearman_p")


@dataclass
class VaryKResult:
    """One `CorrelationResult` per K (``results``, in increasing K)."""

    results: dict[int, CorrelationResult]

    @property
    def ks(self) -> list[int]:
        return sorted(self.results)

    def table(self) -> pd.DataFrame:
        """One row per (K, coupling predictor) with the regression of the score on it."""
        rows = []
        for k in self.ks:
            for name, r in self.results[k].overall["predictors"].items():
                if name not in COUPLING_PREDICTORS:
                    continue
                row: dict[str, Any] = {"k": k, "predictor": name, "n": r.get("n")}
                if "skipped" in r:
                    row["skipped"] = r["skipped"]
                else:
                    row.update({c: r[c] for c in ("r", "r2", "p", "slope", "spearman_rho",
                                                  "spearman_p")})
                    row["r2_lo"], row["r2_hi"] = r["r2_ci"]
                rows.append(row)
        return pd.DataFrame(rows, columns=[*TABLE_COLUMNS, "skipped"])

    def to_dict(self) -> dict[str, Any]:
        return jsonable({"ks": self.ks, "table": self.table().to_dict("records"),
                         "by_k": {str(k): self.results[k].to_dict() for k in self.ks}})

    def to_json(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    def summary(self) -> str:
        t = self.table()
        first = self.results[self.ks[0]]
        lines = [f"{len(first.table)} models, K = {', '.join(map(str, self.ks))}; statistic: "
                 f"{first.describe_statistic()}"]
        lines += [f"  K={row['k']:<4d} {row['predictor']:18s} " + fit_text(
            row, "n={n:3d} R^2={r2:.3f} [{r2_lo:.2f}, {r2_hi:.2f}] p={p:.3g} r={r:+.3f}")
            for row in t.to_dict("records")]
        return "\n".join(lines)


def correlate_vary_k(inputs: Sequence[str | Path] | Sequence[ModelUnit], scores: Any,
                     ks: Sequence[int], *, labels: Sequence[str] | None = None,
                     **options: Any) -> VaryKResult:
    """`correlate` at each K of ``ks`` (options as there, ``k`` excluded)."""
    if "k" in options:
        raise BlockCouplingError("give the K values as ks, not k")
    ks = sorted({int(k) for k in ks})
    if len(ks) < 2:
        raise BlockCouplingError("--k with several values needs at least two different K")
    units: list[ModelUnit] = ([u for u in inputs if isinstance(u, ModelUnit)]
                              if inputs and isinstance(inputs[0], ModelUnit)
                              else load_units(inputs, labels))  # type: ignore[arg-type]
    missing = []
    for u in units:
        have = set(u.coupling.loc[u.coupling["kind"] == "depth", "k"].astype(int))
        missing += [f"{u.label} (K={k})" for k in ks if k not in have]
    if missing:
        raise BlockCouplingError(
            f"not measured at every K: {', '.join(missing[:6])}"
            f"{' ...' if len(missing) > 6 else ''}; measure with --k {','.join(map(str, ks))}")
    return VaryKResult({k: correlate(units, scores, k=k, **options) for k in ks})


__all__ = ["TABLE_COLUMNS", "VaryKResult", "correlate_vary_k"]
