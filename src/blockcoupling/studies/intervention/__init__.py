"""``blockcoupling study intervention``: does changing coupling change generalisation? One
ViT architecture on digits trained with a loss term that raises or lowers its depth-wise
coupling (a differentiable estimate, `blockcoupling.engine.surrogate`), at several strengths
in both directions and 0, with seeds; the coupling reached measured by the engine, test
accuracy, pre-registered tests with their power.

- `.design`: the spec, the hypotheses, the planning values and the power by simulation;
- `.analysis`: pure statistics over the runs' table (arms at the seed level, paired tests);
- `.run`: trains the arms as a ViT grid collection (extra axis ``coupling_term``; resumable,
  Ray or local), reads them, analyses, writes ``study.json``, ``runs.csv``, ``arms.csv`` and
  ``study.html`` (`.page`).
"""

from blockcoupling.studies.intervention.design import (
    InterventionSpec,
    full_spec,
    load_spec,
    parse_spec,
    quick_spec,
)

__all__ = ["InterventionSpec", "full_spec", "load_spec", "parse_spec", "quick_spec"]
