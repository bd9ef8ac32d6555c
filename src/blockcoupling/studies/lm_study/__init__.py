"""``blockcoupling study lm-family``: does coupling track generalisation, and does it emerge with
training, on a family of independently trained tiny LMs? A study that can answer, either way.

Design (fixed before any data are seen; stated in ``study.json``):

- **Independent runs** (`StudySpec`, `full_spec`): character-level GPT-2 LMs on
  the pydoc help texts (``studies.tiny_lm.train_tiny_lm``), varying width, depth, data per step
  (batch size) and training data (the first ``train_chars`` characters of the training split),
  with several seeds of one configuration (the noise floor). Each run enters the correlation
  once, at its final checkpoint: checkpoints of one run are never counted as separate models.
- **Training length: each run trains until its held-out loss plateaus.** The held-out loss
  (the whole held-out split, about 10.7 k characters, the same tokens at every check) is
  taken at step 0 and at every power of two; a run stops at the first power of two
  ``s >= min_steps`` where ``(L(s/2) - L(s)) / L(s/2) < plateau_tol`` (less than 2 %
  improvement over the last doubling of steps; a rise counts as no improvement), or at its
  cap ``max_steps`` (a power of two), where it is reported as not at the plateau. The
  learning rate is constant after the warm-up, so the schedule does not depend on the cap.
  ``min_steps`` (1,024) keeps the rule from stopping on the early plateau every run shows
  near loss 2.5 (a bigram model, steps 128-512), where the improvement per doubling can be
  as small as 4 %. **A run's end point** (its one entry in H1 and the "final" of H2) is its
  latest checkpoint whose held-out loss is within ``plateau_tol`` of the run's lowest
  (`end_point`): the stopping step, unless the loss rose by more than that over the last
  doubling (the run began to overfit), then the step before. The stopping step, the end point
  and the criterion's value are in ``study.json`` (``models[].plateau``, ``step``,
  ``stop_step``).
- **The statistic**: the headline rule of ``engine.statistic`` at one fixed K for every run
  (so raw c_K shares one chance level per width), ``coupling_vs_null`` primary and raw c_K
  beside, each with its standard error over ``n_prompts`` held-out prompts.
- **Emergence**: every run is measured at its checkpoints, step 0 and the powers of two up
  to its end (log-spaced; at least 6 points as ``min_steps >= 16``), with held-out accuracy
  and loss (taken in the training loop on the held-out split) beside.
- **Tests** (one-sided, as the paper's claims are): H1, across runs, the final
  ``coupling_vs_null`` rises with held-out accuracy (OLS slope > 0; the partial correlation
  given log10 parameters, log10 d_model and log10 training tokens is reported beside); H2, the
  final ``coupling_vs_null`` exceeds its step-0 value within runs (paired t-test and Wilcoxon
  signed-rank, ``alternative="greater"``). scipy.stats and statsmodels compute every number.

[`run_study`][blockcoupling.studies.lm_study.run_study] writes ``study.json`` and ``study.html``; ``--quick`` is the test-suite's
version (tiny runs, seconds each).
"""

from blockcoupling.studies.lm_study.design import (
    HYPOTHESES,
    StudyRun,
    StudySpec,
    end_point,
    family_prompts,
    full_spec,
    load_study_spec,
    parse_study_spec,
    quick_spec,
    stopping_rule,
    tiny_config,
)
from blockcoupling.studies.lm_study.plan import plan_lm_study
from blockcoupling.studies.lm_study.result import StudyResult
from blockcoupling.studies.lm_study.run import check_study, evaluate_checkpoint, run_study

__all__ = ["HYPOTHESES", "StudyResult", "StudyRun", "StudySpec", "check_study",
           "end_point", "evaluate_checkpoint", "family_prompts", "full_spec", "load_study_spec",
           "parse_study_spec", "plan_lm_study", "quick_spec", "run_study", "stopping_rule",
           "tiny_config"]
