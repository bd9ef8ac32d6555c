"""The order of models on the per-model figures (the paper sorts them by size, fig. 37, or by
benchmark score, fig. 23): ``blockcoupling report RUN ... --sort KEY [--scores SOURCE]``.

Counts (parameters, layers, width) come from each run's meta
(`blockcoupling.report.summaries.profiles.sort_values`); a score comes from a score
table (``paper``, a CSV, an lm-evaluation-harness folder) matched to the runs by the
correlation study's own rule (`blockcoupling.studies.scores.match_scores`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries.profiles import SORT_KEYS, run_order, sort_values

#: how the page says the runs were ordered
ORDER_NAMES: dict[str, str] = {
    "given": "in the order given", "params": "by parameter count", "layers": "by depth",
    "d_model": "by width d_model", "score": "by benchmark score"}


def score_values(run_dirs: Sequence[str | Path], source: str,
                 labels: Sequence[str] | None = None) -> list[float | None]:
    """Each run's score in ``source`` (None where the table has none for it); a run the table
    does not name at all is one error listing it (the correlation's matching rule)."""
    from blockcoupling.studies.model_units import load_units
    from blockcoupling.studies.scores import match_scores, read_scores

    units = load_units(run_dirs, labels)
    if len(units) != len(run_dirs):
        raise BlockCouplingError("sort by score: give run directories (one model each), not a "
                                 "collection")
    table, _ = read_scores(source)
    models = pd.DataFrame({"label": [u.label for u in units],
                           "layers_run": [u.num_layers for u in units],
                           "d_model_run": [u.hidden_size for u in units]})
    matched, _excluded = match_scores(models, units, table)
    by_label = dict(zip(matched["label"], matched["score"].astype(float), strict=True))
    return [by_label.get(u.label) for u in units]


def order_runs(measurements: Sequence[Any], labels: Sequence[str], key: str, *,
               run_dirs: Sequence[str | Path] = (), scores: str | None = None
               ) -> tuple[list[int], str]:
    """``(indices in the new order, how it was ordered)`` for ``key`` of
    `ORDER_NAMES`; ``score`` needs ``scores`` and the ``run_dirs``."""
    if key not in SORT_KEYS:
        raise BlockCouplingError(f"--sort {key!r}: choose {', '.join(SORT_KEYS)}")
    if key == "score":
        if scores is None:
            raise BlockCouplingError("--sort score needs --scores (paper, a CSV with model and "
                                     "score, or an lm-evaluation-harness folder)")
        values: list[float | None] = score_values(run_dirs, scores, labels)
    else:
        values = list(sort_values(measurements, key, labels))
    order, missing = run_order(values, labels, key)
    name = ORDER_NAMES[key]
    if missing:
        name += f" (without a value, last: {', '.join(missing)})"
    return order, name


__all__ = ["ORDER_NAMES", "order_runs", "score_values"]
