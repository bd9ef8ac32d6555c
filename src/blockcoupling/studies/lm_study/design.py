"""The lm-family study's design: its hypotheses, the spec (runs, seeds, the training
length rule, the measurement), the full and quick designs, the runs' tiny-LM configs and
prompts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, from_mapping, opt
from blockcoupling.studies.tiny_lm import (
    TinyLMConfig,
    doubling_checkpoints,
    held_out_text,
)
from blockcoupling.validate import OptionError, number, whole

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
        raise OptionError("study spec: a mapping with 'runs' is needed")
    runs_in = data.get("runs")
    if not isinstance(runs_in, list) or not runs_in:
        raise OptionError("study spec: 'runs' must be a non-empty list of runs")
    runs: list[StudyRun] = []
    for i, r in enumerate(runs_in):
        where = f"study spec: runs[{i}]"
        if not isinstance(r, Mapping):
            raise OptionError(f"{where} must be a mapping")
        seeds = r.get("seeds", [r.get("seed", 0)])
        if not isinstance(seeds, list) or not seeds:
            raise OptionError(f"{where}: seeds must be a non-empty list")
        base = {k: v for k, v in r.items() if k not in ("seed", "seeds")}
        runs += [from_mapping(StudyRun, {**base, "seed": s}, where) for s in seeds]
    return from_mapping(StudySpec, {**data, "runs": tuple(runs)}, "study spec")


def load_study_spec(path: str | Path) -> StudySpec:
    """`parse_study_spec` of a YAML file."""
    from blockcoupling.store.verified import load_yaml

    return parse_study_spec(load_yaml(Path(path), "study spec", error=OptionError))


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
