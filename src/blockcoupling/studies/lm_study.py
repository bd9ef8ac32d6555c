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

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from blockcoupling.engine.statistic import seed_level
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, from_mapping, opt
from blockcoupling.runs.plans import RunPlan, StudyPlan
from blockcoupling.studies import joins
from blockcoupling.studies.tiny_lm import (
    TinyLMConfig,
    check_checkpoint,
    doubling_checkpoints,
    held_out_scores,
    held_out_text,
    train_tiny_lm,
    training_log,
    validation_chunk,
)
from blockcoupling.validate import OptionError, number, whole

__all__ = ["StudyResult", "StudyRun", "StudySpec", "check_study", "evaluate_checkpoint",
           "family_prompts",
           "full_spec", "load_study_spec", "parse_study_spec", "plan_lm_study", "quick_spec",
           "end_point", "run_study", "stopping_rule"]

HYPOTHESES = {
    "H1": "Across independently trained runs, the final depth-wise coupling above chance "
          "(coupling_vs_null) rises with held-out next-character accuracy: OLS slope > 0, "
          "one-sided p < alpha (the paper's claim, fig. 1a, at toy scale).",
    "H2": "Within runs, coupling above chance at the final checkpoint exceeds its value at "
          "initialisation (step 0): paired, one-sided (the paper's emergence claim).",
}



def stopping_rule(spec: StudySpec) -> str:
    """The training-length rule of ``spec``'s runs and their end points, in words (written in
    ``study.json``)."""
    return (f"Each run trains until its held-out loss (the whole held-out split, the same "
            f"tokens at every check) improves by less than {100 * spec.plateau_tol:g} % "
            f"relative over the last doubling of steps, checked at step 0 and every power of "
            f"two from step {spec.min_steps} on, with a constant learning rate after the "
            f"warm-up; a run that reaches its cap (max_steps) first is reported as not at the "
            f"plateau. Checkpoints: step 0 and the powers of two up to the stopping step. A "
            f"run's end point (H1; the final value of H2) is its latest checkpoint whose "
            f"held-out loss is within {100 * spec.plateau_tol:g} % of its lowest: the stopping "
            f"step, or the step before where the loss rose more than that (overfitting).")


def end_point(losses: Mapping[int, float], tol: float) -> int:
    """The latest step whose held-out loss is within ``tol`` (relative) of the lowest: the end
    of a run's plateau, never a checkpoint overfit by more than ``tol``."""
    best = min(losses.values())
    return max(s for s, v in losses.items() if v <= best * (1.0 + tol))


def _count(minimum: int = 1, maximum: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The range rule of a count (``fields.check_fields``): a whole number in
    ``[minimum, maximum]``. Every count of the study has an upper bound: the study trains
    tiny LMs on a CPU, so a width, a depth or a number of steps beyond these is a typo (it
    would exhaust memory or run for weeks), said in one line before anything runs."""
    return (whole, {"minimum": minimum, "maximum": maximum})


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _run_name(value: Any, name: str) -> str:
    """A run's name: letters, digits, ``.``, ``_`` and ``-`` (it names the run's checkpoints,
    its sweep label and its rows), at most 64 characters."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise OptionError(f"{name} must be a name of letters, digits, '.', '_' and '-' (at "
                          f"most 64 characters, starting with a letter or digit), not {value!r}")
    return value


@dataclass(frozen=True)
class StudyRun:
    """One independent training run (a list entry under ``runs:`` of a study spec; ``seeds:
    [..]`` there makes one run per seed)."""

    name: str = opt(help="The run's name (its id is NAME-sSEED).", check=(_run_name, {}))
    n_layer: int = opt(help="Transformer blocks (at least 2: coupling is across blocks).",
                       check=_count(2, 48))
    n_embd: int = opt(help="Width d (even, at least 4 K).", check=_count(1, 2048))
    batch_size: int = opt(help="Sequences per training step.", check=_count(1, 1024))
    max_steps: int = opt(help="The cap (a power of two >= min_steps): the run stops earlier "
                              "at a plateau.", check=_count(1, 1 << 24))
    seed: int = opt(0, help="Training seed.", check=_count(0, 2**31 - 2))
    train_chars: int | None = opt(None, help="The first N characters of the training split "
                                             "(None: all).", check=_count(1, 10**9))

    def __post_init__(self) -> None:
        check_fields(self, dashes=False)

    @property
    def run_id(self) -> str:
        return f"{self.name}-s{self.seed}"


@dataclass(frozen=True)
class StudySpec:
    """The study's design: runs, measurement and test settings (declared once with
    ``fields.opt``: the YAML keys, their range rules and their one-line errors come from these
    declarations; the rules across fields are checked below)."""

    runs: tuple[StudyRun, ...] = opt(help="The independent runs (at least 4, at most 256).")
    k: int = opt(8, help="The one K of every run's statistic.", check=_count(1, 512))
    n_prompts: int = opt(16, help="Held-out prompts per checkpoint (at least 2).",
                         check=_count(2, 1024))
    prompt_length: int = opt(48, help="Characters per prompt (at most block_size: a prompt "
                                      "fits the context).", check=_count(1, 2048))
    block_size: int = opt(64, help="Training context in characters.", check=_count(8, 2048))
    min_steps: int = opt(1024, help="The earliest step a run may stop at (>= 16: step 0 and "
                                    "the powers of two to 16 are 6 checkpoints).",
                         check=_count(16, 1 << 24))
    plateau_tol: float = opt(0.02, help="Stop when the held-out loss improves by less than "
                                        "this (relative) over a doubling of steps.",
                             check=(number, {"above": 0.0, "below": 1.0}))
    alpha: float = opt(0.05, help="The tests' level (one-sided).",
                       check=(number, {"above": 0.0, "below": 0.5}))

    def __post_init__(self) -> None:
        check_fields(self, dashes=False)
        if not isinstance(self.runs, tuple) or not all(isinstance(r, StudyRun)
                                                        for r in self.runs):
            raise BlockCouplingError("runs must be a list of runs")
        if not MIN_RUNS <= len(self.runs) <= MAX_RUNS:
            raise BlockCouplingError(
                f"{len(self.runs)} run(s); the tests need at least {MIN_RUNS} "
                f"independent runs (and the study trains at most {MAX_RUNS})")
        if self.prompt_length > self.block_size:
            raise BlockCouplingError(
                f"prompt_length {self.prompt_length} is longer than block_size "
                f"{self.block_size} (the models' context): lower prompt_length")
        ids = [r.run_id for r in self.runs]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise BlockCouplingError(f"run {dup[0]} is listed twice (same name and "
                                     "seed); give each run its own name or seed")
        shapes = [(r.n_layer, r.n_embd, r.batch_size, r.max_steps, r.train_chars, r.seed)
                  for r in self.runs]
        if len(set(shapes)) < len(shapes):
            raise BlockCouplingError("two runs have the same configuration and seed "
                                     "(one run would be counted twice)")
        for r in self.runs:
            if r.train_chars is not None and r.train_chars < 10 * self.block_size:
                raise BlockCouplingError(
                    f"run {r.name}: train_chars {r.train_chars} is below 10 "
                    f"windows of block_size {self.block_size}")
            if r.max_steps & (r.max_steps - 1) or r.max_steps < self.min_steps:
                raise BlockCouplingError(
                    f"run {r.name}: max_steps {r.max_steps} must be a power of two "
                    f">= min_steps {self.min_steps} (the cap of the plateau rule, which checks "
                    "each doubling of steps)")
            if r.n_embd < 4 * self.k:
                raise BlockCouplingError(
                    f"run {r.name}: n_embd {r.n_embd} < 4 K = {4 * self.k}; the "
                    "top-K of a block Jacobian needs K well below d (lower k)")
            if r.n_embd % 2:
                raise BlockCouplingError(f"run {r.name}: n_embd must be even")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = [asdict(r) for r in self.runs]
        return d


MIN_RUNS = 4
MAX_RUNS = 256


def parse_study_spec(data: Mapping[str, Any]) -> StudySpec:
    """A `StudySpec` from a mapping (YAML): ``runs`` (a list of mappings with ``name``,
    ``n_layer``, ``n_embd``, ``batch_size``, ``max_steps`` and ``seed`` or ``seeds``) and any
    of the spec's other fields. Unknown keys and bad values: one line naming the key
    (``fields.from_mapping``)."""
    if not isinstance(data, Mapping):
        raise BlockCouplingError("study spec: a mapping with 'runs' is needed")
    runs_in = data.get("runs")
    if not isinstance(runs_in, list) or not runs_in:
        raise BlockCouplingError("study spec: 'runs' must be a non-empty list of runs")
    runs: list[StudyRun] = []
    for i, r in enumerate(runs_in):
        where = f"study spec: runs[{i}]"
        if not isinstance(r, Mapping):
            raise BlockCouplingError(f"{where} must be a mapping")
        seeds = r.get("seeds", [r.get("seed", 0)])
        if not isinstance(seeds, list) or not seeds:
            raise BlockCouplingError(f"{where}: seeds must be a non-empty list")
        base = {k: v for k, v in r.items() if k not in ("seed", "seeds")}
        runs += [from_mapping(StudyRun, {**base, "seed": s}, where) for s in seeds]
    return from_mapping(StudySpec, {**data, "runs": tuple(runs)}, "study spec")


def load_study_spec(path: str | Path) -> StudySpec:
    """`parse_study_spec` of a YAML file."""
    from blockcoupling.store.verified import load_yaml

    data = load_yaml(Path(path), "study spec")
    return parse_study_spec(data)


def full_spec() -> StudySpec:
    """The full family: 9 independent runs (width 32-96, depth 2-4, batch 8-16, training data
    25 k or 50 k characters; three seeds of one configuration), each trained until its
    held-out loss plateaus (cap 16,384 steps); K = 8, 16 held-out prompts of 48 characters.
    The data are small so that every run reaches its plateau on a laptop (on the whole
    450 k-character split a 4-block d = 64 model still improves 5 % from step 4,096 to 8,192);
    the plateau is then where the held-out loss stops improving as the run begins to overfit.
    Models of 0.03-0.45 M parameters; cost in BENCHMARKS.md."""
    return StudySpec(runs=(
        *(StudyRun("L4-d64-b16", 4, 64, 16, 16384, seed, 50_000) for seed in (0, 1, 2)),
        StudyRun("L2-d32-b8", 2, 32, 8, 16384, 0, 50_000),
        StudyRun("L2-d64-b16", 2, 64, 16, 16384, 0, 50_000),
        StudyRun("L4-d32-b16", 4, 32, 16, 16384, 0, 50_000),
        StudyRun("L4-d96-b16", 4, 96, 16, 16384, 0, 50_000),
        StudyRun("L4-d64-b8", 4, 64, 8, 16384, 0, 50_000),
        StudyRun("L4-d64-b16-25k", 4, 64, 16, 16384, 0, 25_000),
    ))


def quick_spec() -> StudySpec:
    """The test-suite's family: 6 tiny runs (2-3 blocks, d 16-24, caps of 16-64 steps, two
    seeds of one), K = 2, 4 prompts, at least 6 checkpoints each (seconds each)."""
    return StudySpec(runs=(
        StudyRun("L2-d16-b4", 2, 16, 4, 16, 0),
        StudyRun("L2-d16-b4", 2, 16, 4, 16, 1),
        StudyRun("L2-d24-b8", 2, 24, 8, 64),
        StudyRun("L3-d16-b8", 3, 16, 8, 32),
        StudyRun("L3-d24-b4", 3, 24, 4, 32, 0, 20_000),
        StudyRun("L2-d24-b4", 2, 24, 4, 64),
    ), k=2, n_prompts=4, prompt_length=24, block_size=24, min_steps=16)


def family_prompts(cfg: TinyLMConfig, n: int = 4, length: int = 24) -> list[str]:
    """``n`` held-out windows of ``length`` characters at evenly spaced offsets (whitespace at
    the ends stripped): the prompts the coupling is measured on."""
    text = held_out_text(cfg)
    step = max(1, (len(text) - length) // max(1, n))
    out = []
    for i in range(n):
        window = " ".join(text[i * step: i * step + length].split())
        if window:
            out.append(window)
    return out


def evaluate_checkpoint(path: str | Path, cfg: TinyLMConfig) -> dict[str, float]:
    """Held-out next-character top-1 accuracy (``score``, percent) and mean cross-entropy
    (``val_loss``, nats) of a saved checkpoint, on the windows its training evaluated
    (``tiny_lm.validation_chunk``; the study's runs: the whole held-out split). The study
    takes these numbers from the training log; this recomputes them from the saved weights
    (tested equal)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_checkpoint(path)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = torch.tensor(tok.backend_tokenizer.encode(held_out_text(cfg),
                                                    add_special_tokens=False).ids)  # (N,)
    ev = held_out_scores(model, validation_chunk(cfg, ids))
    return {"val_loss": ev["val_loss"], "score": ev["accuracy"],
            "n_eval_tokens": ev["n_eval_tokens"]}


def tiny_config(spec: StudySpec, run: StudyRun) -> TinyLMConfig:
    return TinyLMConfig(n_layer=run.n_layer, n_embd=run.n_embd,
                        n_head=4 if run.n_embd % 4 == 0 else 2, block_size=spec.block_size,
                        batch_size=run.batch_size, max_steps=run.max_steps,
                        checkpoints=doubling_checkpoints(run.max_steps),
                        warmup_steps=min(50, max(1, spec.min_steps // 4)), val_windows=0,
                        lr_schedule="constant", plateau_tol=float(spec.plateau_tol),
                        min_steps=spec.min_steps, train_chars=run.train_chars, seed=run.seed)


def study_measure(spec: StudySpec) -> dict[str, Any]:
    """What every checkpoint's measurement is (the sweep's ``measure:``): depth-wise, last
    token, one K, raw c_K and coupling_vs_null; only what the study reads (no spectra,
    trajectory or K x K matrices), all prompts in one forward pass."""
    return {"coupling": ["depth"], "k": [spec.k], "tokens": "last", "p": [1],
            "variants": ["coupling", "coupling_vs_null"], "orientations": ["ujv"],
            "spectra": False, "trajectory": False, "figure_prompts": 0,
            "batch_size": spec.n_prompts}


def _one_sided(p_two: float, stat: float) -> float:
    """One-sided p for 'greater' from a two-sided p and the sign of the statistic."""
    return p_two / 2 if stat > 0 else 1 - p_two / 2


def _tests(models: pd.DataFrame, emergence: pd.DataFrame, alpha: float) -> dict[str, Any]:
    import scipy.stats as st

    from blockcoupling.studies.regression import partial_correlation, regression

    controls = ["log_params", "log_d_model", "log_train_tokens"]
    out: dict[str, Any] = {"alpha": alpha, "predictors": {}}
    y = models["accuracy"].to_numpy(dtype=float)
    for x in ("coupling_vs_null_mean", "coupling_mean"):
        entry: dict[str, Any] = {"x": x, "y": "accuracy", "alternative": "slope > 0"}
        try:
            r = regression(models[x], y, n_boot=0)
            entry.update({k: r[k] for k in ("n", "slope", "intercept", "slope_stderr", "r",
                                            "r2", "p")})
            entry["p_one_sided"] = _one_sided(r["p"], r["slope"])
        except BlockCouplingError as err:
            entry["skipped"] = str(err)
        try:
            pc = partial_correlation(models[x], y, [models[c] for c in controls])
            entry["partial"] = {"controlling_for": controls, **pc,
                                "p_one_sided": _one_sided(pc["p"], pc["r"])}
        except BlockCouplingError as err:
            entry["partial"] = {"controlling_for": controls, "skipped": str(err)}
        out["predictors"][x] = entry
    first = emergence[emergence["step"] == 0].set_index("run_id")["coupling_vs_null_mean"]
    ends = set(zip(models["run_id"], models["step"], strict=True))  # each run's end point
    last = emergence[[key in ends for key in zip(emergence["run_id"], emergence["step"],
                                                  strict=True)]].set_index(
        "run_id")["coupling_vs_null_mean"]
    pair = pd.concat([first.rename("init"), last.rename("final")], axis=1).dropna()
    h2: dict[str, Any] = {"n": int(len(pair)), "alternative": "final > init"}
    if len(pair) >= 2:
        t = st.ttest_rel(pair["final"], pair["init"], alternative="greater")
        h2.update(mean_difference=float((pair["final"] - pair["init"]).mean()),
                  t=float(t.statistic), p_t=float(t.pvalue))
        try:
            w = st.wilcoxon(pair["final"], pair["init"], alternative="greater")
            h2.update(wilcoxon=float(w.statistic), p_wilcoxon=float(w.pvalue))
        except ValueError as err:
            h2["wilcoxon_skipped"] = str(err)
    out["H2_emergence"] = h2
    return out


def _statement(models: pd.DataFrame, tests: dict[str, Any], spec: StudySpec,
               noise: dict[str, Any]) -> list[str]:
    a = spec.alpha
    lines = []
    h1 = tests["predictors"]["coupling_vs_null_mean"]
    if "skipped" in h1:
        lines.append(f"H1 could not be tested: {h1['skipped']}.")
    else:
        verdict = "supported" if h1["p_one_sided"] < a and h1["slope"] > 0 else "not supported"
        lines.append(
            f"H1 (coupling above chance rises with held-out accuracy across {h1['n']} "
            f"independent runs): {verdict} at alpha = {a:g}: slope {h1['slope']:.4g} accuracy "
            f"points per unit of coupling_vs_null, R^2 = {h1['r2']:.3f}, one-sided "
            f"p = {h1['p_one_sided']:.3g}.")
        pc = h1["partial"]
        lines.append(
            "Given log10 parameters, log10 d_model and log10 training tokens: " +
            (f"partial r = {pc['r']:+.3f}, one-sided p = {pc['p_one_sided']:.3g} "
             f"({pc['df']} df)." if "r" in pc else f"not computable ({pc['skipped']})."))
    raw = tests["predictors"]["coupling_mean"]
    if "r2" in raw:
        lines.append(f"Raw c_K (one K for every run) against accuracy: slope "
                     f"{raw['slope']:.4g}, R^2 = {raw['r2']:.3f}, one-sided "
                     f"p = {raw['p_one_sided']:.3g}.")
    h2 = tests["H2_emergence"]
    if "p_t" in h2:
        verdict = "supported" if h2["p_t"] < a and h2["mean_difference"] > 0 else "not supported"
        lines.append(
            f"H2 (coupling above chance at the end exceeds its value at step 0, {h2['n']} runs): "
            f"{verdict}: mean difference {h2['mean_difference']:+.4f}, paired t one-sided "
            f"p = {h2['p_t']:.3g}" + (f", Wilcoxon one-sided p = {h2['p_wilcoxon']:.3g}."
                                      if "p_wilcoxon" in h2 else "."))
    if noise:
        lines.append(
            f"Noise floor ({noise['config']}, {noise['n_seeds']} seeds): sd of the final "
            f"coupling_vs_null {noise['coupling_vs_null_sd']:.4f}, of the accuracy "
            f"{noise['accuracy_sd']:.2f} points.")
        sl = noise.get("seed_level")
        if sl:
            lines.append(
                f"Seed level ({noise['config']}, runs as the unit of replication): final "
                f"coupling_vs_null {sl['mean']:.4f}, se over seeds {sl['se']:.4f} (95 % t "
                f"interval {sl['ci_low']:.4f} to {sl['ci_high']:.4f}, {sl['n_runs'] - 1} df), "
                f"against a within-model se over prompts of {sl['within_se']:.4f}.")
    flat = [r for r in models.itertuples() if not r.plateau_reached]
    rule = (f"the held-out loss improving by less than {100 * spec.plateau_tol:g} % over the "
            f"last doubling of steps, checked at powers of two from step {spec.min_steps}")
    ends = ", ".join(f"{r.run_id} {r.stop_step}" + (f" (end point {r.step})"
                                                       if r.step != r.stop_step else "")
                     for r in models.itertuples())
    if flat:
        lines.append(f"{len(flat)} of {len(models)} runs had not reached the plateau criterion "
                     f"({rule}) by their cap: " + ", ".join(r.run_id for r in flat)
                     + f". Stopping steps: {ends}.")
    else:
        lines.append(f"Every run trained until its plateau ({rule}); stopping steps: {ends}.")
    lines.append(
        "What this cannot show: anything about LLMs (these are character-level models of "
        "thousands to a few hundred thousand parameters trained for minutes), causation "
        f"(width, depth and training length vary together), or small effects ({len(models)} "
        "runs give a test of low power).")
    return lines


def _versions() -> dict[str, Any]:
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


#: the study's own record of its spec (written under the lock before any training): a
#: second study of another spec on the same --out is refused before it trains
SPEC_FILE = "study-spec.json"
#: per run, the content of the checkpoints its sweep units were measured on
#: (``tiny_lm.cache_digest``): a run trained again into other weights is measured again
TRAINED_FILE = "trained.json"
#: what a study's output folder may hold (anything else: another folder, refused)
STUDY_FILES = ("study.json", "study.html", "prompts.txt", "sweep", SPEC_FILE, TRAINED_FILE,
               ".lock")


def _busy(out: Path) -> str:
    return (f"study folder {out} is in use by another study{{who}}; wait for it to finish or "
            "stop it, or choose another --out")


def check_study(out: str | Path, spec: StudySpec, executor: str = "local", *,
                locked: bool = False) -> list[str]:
    """Every check of ``study lm-family`` that needs no training, run before any (and by
    ``--dry-run``): the executor, the held-out prompts (enough of them, each within the
    models' context), and ``out`` (a folder, writable, not another folder's contents, not in
    use by another study unless ``locked``, not a study of another spec that has measured
    something). Returns the prompts. Writes nothing."""
    from blockcoupling.runs import executor as runner
    from blockcoupling.store.fileio import lock_holder
    from blockcoupling.studies.tiny_lm import build_tokenizer, corpus_text

    if executor not in runner.EXECUTORS:
        raise BlockCouplingError(f"--executor {executor!r}: choose local or ray")
    if executor == "ray":
        runner.import_ray()  # installed (the cluster is reached when the sweep starts)
    prompts = family_prompts(tiny_config(spec, spec.runs[0]), n=spec.n_prompts,
                             length=spec.prompt_length)
    if len(prompts) < spec.n_prompts:
        raise BlockCouplingError(f"the held-out text gave {len(prompts)} prompts of "
                                 f"{spec.prompt_length} characters; lower n_prompts")
    tok = build_tokenizer(corpus_text())
    for text in prompts:
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        if not 1 <= n <= spec.block_size:
            raise BlockCouplingError(f"a held-out prompt is {n} tokens, outside the models' "
                                     f"context of 1 to {spec.block_size}: lower prompt_length")
    out = Path(out)
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BlockCouplingError(f"--out {out}: {parent} is a file; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BlockCouplingError(f"--out {out}: {parent} is not writable; choose a --out in a "
                                 "folder you can write to")
    if not out.is_dir():
        return prompts
    if not locked and lock_holder(out) is not None:
        raise BlockCouplingError(_busy(out).replace("{who}", f" (PID {lock_holder(out)})"))
    other = sorted(p.name for p in out.iterdir() if p.name not in STUDY_FILES)
    if other:
        raise BlockCouplingError(f"--out {out} holds other files ({other[0]}, ...); choose a "
                                 "new or empty --out for the study")
    if _other_spec(out, spec) and _has_results(out):
        raise BlockCouplingError(
            f"{out} holds a study of another spec that has measured checkpoints; give another "
            "--out, or delete it to start this one there")
    return prompts


def _repair(out: Path) -> str:
    """What a reader of a damaged study record is told."""
    return (f"Delete it and run the same `blockcoupling study lm-family --out {out}` command "
            "again: the record is written anew (checkpoints whose weights are not known are "
            "measured again)")


def _other_spec(out: Path, spec: StudySpec) -> bool:
    """Whether ``out`` records a study spec other than ``spec`` (one line if the record is
    damaged: ``store.verified.load_sealed``)."""
    from blockcoupling.store.verified import SEAL, load_sealed

    path = out / SPEC_FILE
    if not path.exists():
        return False
    data = dict(load_sealed(path, _repair(out)))
    data.pop(SEAL, None)
    return bool(data != json.loads(json.dumps(spec.to_dict())))


def _trained(out: Path) -> dict[str, str] | None:
    """The study's record of the checkpoints its sweep measured (run id -> cache digest),
    verified; None when it has none but its sweep measured something (a record lost, or a
    study of an older blockcoupling): then every measured checkpoint is measured again."""
    from blockcoupling.store.verified import SEAL, load_sealed

    path = out / TRAINED_FILE
    if not path.exists():
        return {} if not _has_results(out) else None
    data = dict(load_sealed(path, _repair(out)))
    data.pop(SEAL, None)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise BlockCouplingError(f"{path} is not a record of trained runs. {_repair(out)}")
    return data


def _has_results(out: Path) -> bool:
    """Whether the study's sweep has measured anything (else it can be replaced)."""
    from blockcoupling.store import collection as store

    root = out / "sweep"
    if not store.is_sweep_dir(root):
        return False
    return any(r.get("status") == "done" for r in store.all_status(root))


def _start_afresh(out: Path) -> None:
    """Remove a study of another spec that measured nothing (its sweep, prompts, records)."""
    import shutil

    for name in ("sweep", "prompts.txt", "study.json", "study.html", SPEC_FILE, TRAINED_FILE):
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _remeasure_retrained(root: Path, digests: dict[str, str],
                         previous: dict[str, str] | None, progress: bool) -> None:
    """Mark again as pending the sweep units of runs whose checkpoints now hold other
    weights than those their units were measured on (a damaged cache trained again into
    different weights): the sweep's resume measures them again."""
    import shutil

    from blockcoupling.store import collection as store
    from blockcoupling.studies.sweep.units import Unit

    changed = (set(digests) if previous is None  # no record: everything measured is redone
               else {rid for rid, d in digests.items() if previous.get(rid) not in (None, d)})
    if not changed or not store.is_sweep_dir(root):
        return
    for rec in store.all_status(root):
        unit = rec.get("unit") or {}
        if unit.get("label") in changed and rec.get("status") != "pending":
            shutil.rmtree(store.unit_dir(root, str(unit.get("unit_id"))), ignore_errors=True)
            store.write_status(root, Unit.from_dict(unit), "pending", weights_hash=None,
                               repaired="its checkpoint was trained again")
    if progress:
        print(f"[study] {', '.join(sorted(changed))}: trained again into other weights; their "
              "checkpoints are measured again", flush=True)


def run_study(out: str | Path, spec: StudySpec | None = None, *, quick: bool = False,
              cache_dir: str | Path | None = None, progress: bool = True,
              executor: str = "local") -> StudyResult:
    """Train (or reuse the cached) runs, score and measure every checkpoint (a sweep in
    ``out/sweep``), test the hypotheses and write ``out/study.json`` and ``out/study.html``.

    Everything that can be checked without training is checked first (`check_study`);
    ``out`` is written only while this study holds its lock."""
    from blockcoupling.store.fileio import dir_lock
    from blockcoupling.store.verified import write_sealed

    spec = spec if spec is not None else (quick_spec() if quick else full_spec())
    out = Path(out)
    check_study(out, spec, executor)  # before the folder is made, before any training
    with dir_lock(out, busy=_busy(out)):
        prompts = check_study(out, spec, executor, locked=True)
        if _other_spec(out, spec):  # of another spec, with nothing measured: replaced
            _start_afresh(out)
        write_sealed(out / SPEC_FILE, spec.to_dict())
        return _run_study(out, spec, prompts, cache_dir, progress, executor)


def _run_study(out: Path, spec: StudySpec, prompts: list[str], cache_dir: str | Path | None,
               progress: bool, executor: str) -> StudyResult:
    """`run_study` once its checks passed and its lock is held."""
    from blockcoupling.store.fileio import atomic_write_text, write_json
    from blockcoupling.store.verified import write_sealed
    from blockcoupling.studies.sweep import is_sweep_dir, open_sweep, run_sweep
    from blockcoupling.studies.sweep.runner import spec_matches
    from blockcoupling.studies.tiny_lm import cache_digest

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    seconds: dict[str, float] = {}
    rows, paths, logs, digests = [], {}, {}, {}
    for run in spec.runs:
        cfg = tiny_config(spec, run)
        if progress:
            print(f"[study] train {run.run_id} (until the held-out loss plateaus; at most "
                  f"{run.max_steps} steps)", flush=True)
        ckpts = train_tiny_lm(cfg, cache_dir, progress=False, monitor=False)
        log = logs[run.run_id] = training_log(cfg, cache_dir)
        digests[run.run_id] = cache_digest(cfg, cache_dir)
        if progress:
            plat = log["plateau"]
            print(f"[study] {run.run_id}: stopped at step {log['end_step']} (held-out loss "
                  f"{log['final_val_loss']:.3f}, {100 * plat['rel_improvement']:+.1f} % over "
                  f"the last doubling; plateau {'reached' if plat['reached'] else 'NOT reached'})"
                  f", {log['seconds']:.0f} s", flush=True)
        paths[run.run_id] = [str(p) for _, p in ckpts]
        for step, _ in ckpts:  # scored in the training loop, on the whole held-out split
            ev = log["checkpoints"][str(step)]
            rows.append({"run_id": run.run_id, "step": step, "accuracy": ev["val_accuracy"],
                         "loss": ev["val_loss"], "n_params": int(log["n_params"]),
                         "train_tokens": step * run.batch_size * spec.block_size})
    seconds["train_and_score"] = time.perf_counter() - t0
    scores = pd.DataFrame(rows)
    text = "\n".join(prompts) + "\n"
    prompt_file = out / "prompts.txt"
    if not prompt_file.is_file() or prompt_file.read_text(encoding="utf-8") != text:
        atomic_write_text(prompt_file, text)
    sweep_spec = {"name": "lm-study",
                  "models": [{"label": rid, "checkpoints": p} for rid, p in paths.items()],
                  "prompts": [str(prompt_file)],
                  "measure": study_measure(spec)}
    root = out / "sweep"
    if is_sweep_dir(root) and not spec_matches(root, sweep_spec):
        if _has_results(out):
            raise BlockCouplingError(f"{root} holds a sweep of another study spec; give another "
                                     "--out or delete it")
        import shutil

        shutil.rmtree(root)  # nothing measured there: replaced
    _remeasure_retrained(root, digests, _trained(out), progress)
    write_sealed(out / TRAINED_FILE, digests)
    t1 = time.perf_counter()
    run_sweep(sweep_spec, root, executor=executor, resume=is_sweep_dir(root), progress=progress)
    seconds["measure"] = time.perf_counter() - t1
    sw = open_sweep(root)
    failed = sw.units[sw.units["status"] != "done"]
    if len(failed):
        raise BlockCouplingError(f"{len(failed)} checkpoint(s) could not be measured, e.g. "
                                 f"{failed.iloc[0]['unit_id']}: {failed.iloc[0]['message']}")
    stat = sw.coupling_statistic(k=spec.k, n_boot=0, include_duplicates=True)
    wide = stat.pivot_table(index=["label", "step"], columns="variant",
                            values=["mean", "se", "chance"], aggfunc="first")
    em = pd.DataFrame({
        "run_id": [str(i[0]) for i in wide.index], "step": [int(i[1]) for i in wide.index],
        "coupling_vs_null_mean": wide[("mean", "coupling_vs_null")].to_numpy(),
        "coupling_vs_null_se": wide[("se", "coupling_vs_null")].to_numpy(),
        "coupling_mean": wide[("mean", "coupling")].to_numpy(),
        "coupling_se": wide[("se", "coupling")].to_numpy(),
        "coupling_chance": wide[("chance", "coupling")].to_numpy()})
    em = joins.join_on(em, scores[["run_id", "step", "accuracy", "loss"]], ["run_id", "step"],
                       names=("the measured checkpoints", "the trained checkpoints' scores"),
                       what=f"the study in {out} is inconsistent: run it again with a new --out")
    order = {r.run_id: i for i, r in enumerate(spec.runs)}
    em = em.sort_values(["run_id", "step"], key=lambda c: c.map(order) if c.name == "run_id"
                        else c).reset_index(drop=True)
    models = []
    for run in spec.runs:
        g = em[em["run_id"] == run.run_id]
        log = logs[run.run_id]
        end = end_point(dict(zip(g["step"], g["loss"], strict=True)), spec.plateau_tol)
        last = g[g["step"] == end].iloc[0]
        srow = scores[(scores["run_id"] == run.run_id) & (scores["step"] == end)].iloc[0]
        plat = log["plateau"]
        models.append({
            "run_id": run.run_id, "name": run.name, "seed": run.seed, "step": end,
            "n_layer": run.n_layer, "d_model": run.n_embd, "batch_size": run.batch_size,
            "data_chars": int(log["n_train_tokens"]),  # the training split it drew from
            "params": int(srow["n_params"]), "train_tokens": int(srow["train_tokens"]),
            **{c: float(last[c]) for c in ("coupling_vs_null_mean", "coupling_vs_null_se",
                                           "coupling_mean", "coupling_se", "coupling_chance",
                                           "accuracy", "loss")},
            "stop_step": int(log["end_step"]), "plateau_reached": plat["reached"],
            "plateau": plat})
    mt = pd.DataFrame(models)
    mt["log_params"] = np.log10(mt["params"])
    mt["log_d_model"] = np.log10(mt["d_model"])
    mt["log_train_tokens"] = np.log10(mt["train_tokens"])
    tests = _tests(mt, em, spec.alpha)
    noise: dict[str, Any] = {}
    multi = mt.groupby("name").filter(lambda g: len(g) > 1)
    if len(multi):
        name = multi["name"].iloc[0]
        g = mt[mt["name"] == name]
        noise = {"config": name, "n_seeds": int(len(g)),
                 "coupling_vs_null_sd": float(g["coupling_vs_null_mean"].std(ddof=1)),
                 "accuracy_sd": float(g["accuracy"].std(ddof=1)),
                 # the runs as the unit of replication (engine.statistic.seed_level)
                 "seed_level": seed_level(g, by=("name",), value="coupling_vs_null_mean",
                                          within_se="coupling_vs_null_se"
                                          ).iloc[0].drop("name").to_dict()}
    statement = _statement(mt, tests, spec, noise)
    seconds["total"] = time.perf_counter() - t0
    seconds["cpu_total"] = time.process_time() - cpu0
    result = StudyResult(spec=spec, models=mt, emergence=em, tests=tests, statement=statement,
                         noise_floor=noise, reproducibility=_versions(), seconds=seconds,
                         out=out)
    write_json(out / "study.json", result.to_dict())
    write_study_page(result, out / "study.html")
    return result


def write_study_page(result: StudyResult, path: Path) -> Path:
    """``study.html``: the statement, the emergence curves, final accuracy against final
    coupling (error bars one se), the models and the tests."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from blockcoupling.report.page import Section, esc, figure_html, table_html, write_page

    em, mt = result.emergence, result.models
    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for i, (rid, g) in enumerate(em.groupby("run_id", sort=False)):
        x = g["step"].astype(float).to_numpy()
        axes[0].errorbar(x, g["coupling_vs_null_mean"], yerr=g["coupling_vs_null_se"],
                         fmt="o-", ms=3, capsize=2, color=f"C{i % 10}", label=rid)
        axes[1].plot(x, g["accuracy"], "o-", ms=3, color=f"C{i % 10}")
    for ax, lab in ((axes[0], "coupling above chance (coupling_vs_null)"),
                    (axes[1], "held-out accuracy (%)")):
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("training step")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.0, color="0.5", lw=0.8, ls=":")
    axes[0].legend(fontsize=6)
    fig2 = Figure(figsize=(9.0, 3.6), layout="constrained")
    FigureCanvasAgg(fig2)
    ax2 = fig2.subplots(1, 2)
    for ax, col, lab in ((ax2[0], "coupling_vs_null", "final coupling above chance"),
                         (ax2[1], "coupling", f"final raw c_K (K = {result.spec.k})")):
        ax.errorbar(mt[f"{col}_mean"], mt["accuracy"], xerr=mt[f"{col}_se"], fmt="o",
                    capsize=2)
        for r in mt.itertuples():
            ax.annotate(r.run_id, (getattr(r, f"{col}_mean"), r.accuracy), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(lab)
        ax.set_ylabel("held-out accuracy (%)")
        ax.grid(alpha=0.3)
    cols = ["run_id", "n_layer", "d_model", "batch_size", "data_chars", "stop_step", "step",
            "params",
            "coupling_vs_null_mean", "coupling_vs_null_se", "coupling_mean", "coupling_se",
            "coupling_chance", "accuracy", "loss", "plateau_reached"]
    sections = [
        Section("result", "What the study found", "".join(
            f"<p>{esc(line)}</p>" for line in result.statement)),
        Section("design", "Hypotheses (fixed before the data)", "".join(
            f"<p><b>{esc(k)}</b>: {esc(v)}</p>" for k, v in HYPOTHESES.items())
            + f"<p><b>Training length</b>: {esc(stopping_rule(result.spec))}</p>"),
        Section("emergence", "Emergence over training", figure_html(
            fig, "Left: depth-wise coupling above chance (coupling_vs_null, K = "
            f"{result.spec.k}, last token, pairs l != l') per run against the training step "
            "(symmetric-log axis), error bars one standard error over prompts; right: "
            "held-out next-character accuracy.")),
        Section("correlation", "Final coupling against held-out accuracy", figure_html(
            fig2, "One point per independent run (its final checkpoint); error bars one "
            "standard error over prompts.")),
        Section("models", "Runs", table_html(mt[cols].set_index("run_id"))),
    ]
    return write_page(path, "Tiny-LM family: coupling and generalisation", sections,
                      lead="blockcoupling study lm-family")


def plan_lm_study(spec: StudySpec) -> StudyPlan:
    """The plan of ``study lm-family`` for a ``StudySpec``: per run its training steps (a cap),
    the checkpoints (step 0 and the powers of two to the cap) and the measurement of each (the study's sweep), on the untrained
    model of the run's shape and the held-out prompts."""
    import dataclasses

    from transformers import GPT2LMHeadModel

    from blockcoupling.engine.config import parse_config
    from blockcoupling.store.record import plan_run
    from blockcoupling.studies.tiny_lm import build_tokenizer, corpus_text, gpt2_config

    tok = build_tokenizer(corpus_text())
    cfg = parse_config(None, **study_measure(spec))
    prompts = family_prompts(tiny_config(spec, spec.runs[0]), n=spec.n_prompts,
                             length=spec.prompt_length)
    runs = []
    shapes: dict[tuple[int, int], tuple[int, Any]] = {}  # runs of one shape: one plan
    for run in spec.runs:
        tc = tiny_config(spec, run)
        if (run.n_layer, run.n_embd) not in shapes:
            with torch.device("meta"):  # the shape only: no weights are allocated
                model = GPT2LMHeadModel(gpt2_config(tc, len(tok), tok.pad_token_id))
            shapes[run.n_layer, run.n_embd] = (
                sum(p.numel() for p in model.parameters()),
                plan_run(model, tok, prompts, config=cfg, model_name=run.run_id))
        params, plan = shapes[run.n_layer, run.n_embd]
        runs.append(RunPlan(
            name=run.run_id, checkpoints=tuple(tc.checkpoints), steps=tc.max_steps,
            parameters=params,
            training_flops=6.0 * params * tc.batch_size * tc.block_size * tc.max_steps,
            measure=dataclasses.replace(plan, model=run.run_id)))
    notes = ["steps and checkpoints are caps: each run stops at its held-out plateau",
             f"each checkpoint is also scored on held-out text; K = {spec.k}, "
             f"{len(prompts)} prompts of {spec.prompt_length} characters"]
    return StudyPlan(study="the LM family study", runs=runs, notes=notes, capped=True)
