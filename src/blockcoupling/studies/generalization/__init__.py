"""``blockcoupling study generalization``: does coupling above chance track generalisation
across models of one architecture, when generalisation is moved by the data (training-set
size x label noise), with a positive control, pre-registered tests and the design's power?

- `.design`: the spec (cells, seeds, the training config, the tests' settings), the
  hypotheses, the power check (before any training), the full and quick designs;
- `.analysis`: pure statistics over the runs' table (cells at the seed level, the positive
  control, H1, the equivalence test, the mixed model);
- `.run`: trains the runs as a ViT grid collection (resumable, Ray or local), reads them,
  analyses and writes ``study.json`` and ``study.html`` (`.page`);
- `.plan`: its ``--dry-run`` plan.
"""

from blockcoupling.studies.generalization.design import (
    GeneralizationSpec,
    full_spec,
    load_spec,
    parse_spec,
    quick_spec,
)
from blockcoupling.studies.generalization.result import GeneralizationResult
from blockcoupling.studies.generalization.run import run_study

__all__ = ["GeneralizationResult", "GeneralizationSpec", "full_spec", "load_spec", "parse_spec",
           "quick_spec", "run_study"]
