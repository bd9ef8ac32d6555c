"""The design of ``blockcoupling study generalization``, fixed before any data are seen.

**Question**: across models of ONE architecture (so width, depth, K and the chance level are
the same for every run), does coupling above chance rise with generalisation (test accuracy)?

**Manipulation**: generalisation is moved by the data, not by the model: the training-set
size (``train_sizes``, a fresh subset of the training split per seed and size:
``subset_per_seed``, `blockcoupling.studies.vit.data.load_image_data`) crossed with label
noise (``label_noises``: that fraction of the training labels replaced by another class; the
test labels stay clean), each cell trained from ``seeds`` (subset, initialisation, order and
noise draw). Every run takes the same number
of optimiser steps (``VitTrainConfig.steps``), so the optimisation budget does not vary with
the data size. The default is the tiny ViT on scikit-learn's digits (offline).

**Comparison point**: each run's final measurement (``final_images`` test images); the
positive control (every cell above chance under every null in ``variants``) is checked there,
and where it fails at the monitored checkpoint of matched steps where it holds (the latest
one; ``monitor_every`` counts steps), and the study says so.

**Tests** (``HYPOTHESES``, one-sided in the claim's direction): the primary test W1 is
within cells, seed to seed (the Mundlak split of a mixed model over the runs), with its
equivalence test EW; each manipulated factor's own effect on coupling and on accuracy (S1
training-set size with clean labels, the key contrast; S2 size with the noise levels held
fixed; N1 label noise with the sizes held fixed); PC, the assay's positive control (a
drop-path contrast at fixed data, trained beside the design); C, coupling above chance in
every cell; and, beside them, H1 across cells (Pearson r > 0 over the cell means, the cell
the unit), its equivalence test E1 (TOST against ``bound``) and H1b over runs with a random
intercept per cell (statsmodels MixedLM). H1's power is exact
(`blockcoupling.studies.regression.correlation_power`) and must reach the stated ``power``
before any training; every other test's power is simulated from `PLANNING`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blockcoupling import validate
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, from_mapping, key_names, opt
from blockcoupling.studies.vit.train import SPLIT_SIZES, VitTrainConfig
from blockcoupling.validate import OptionError, number

__all__ = ["FULL_SIZES", "HYPOTHESES", "MIN_SEEDS", "GeneralizationSpec", "architecture",
           "describe_design", "design_power", "full_spec", "load_spec", "parse_spec",
           "quick_spec"]

#: the full design's training-set sizes: 8 levels log-spaced from 90 to the whole digits
#: training split (1,437 images, 16x)
FULL_SIZES: tuple[int, ...] = tuple(int(round(90 * (1437 / 90) ** (i / 7))) for i in range(8))
#: seeds per cell: a seed-level t interval needs >= 2 df
MIN_SEEDS = 3
#: the training fields the design sets per run (not in ``train``)
_DESIGN_FIELDS = ("train_limit", "label_noise", "seed")

#: The planning values of the power simulations, fixed before this design's data: from the
#: design's first run (2026-11-27, nested subsets shared by the seeds; docs/results/
#: generalization before the rerun) and the ViT how-to's 2 x 2 grid (the control's effect).
PLANNING: dict[str, float] = {
    # the across-cell slope of coupling_vs_rotated on test accuracy (H1's OLS slope): what
    # "coupling tracks accuracy" predicts per unit of accuracy; W1's effect, EW's bound
    "across_slope": 0.057,
    # the seed-to-seed sd within a cell: test accuracy and coupling_vs_rotated
    "within_accuracy_sd": 0.046, "within_coupling_sd": 0.0070,
    # clean labels: the cell-mean accuracy slope per ln(training images), and the residual
    # sd of cell-mean coupling around its line in ln(size)
    "size_accuracy_slope": 0.099, "size_coupling_resid_sd": 0.0080,
    # all cells: the residual sd of cell-mean coupling given ln(size) and noise levels, and
    # given noise and size levels; the accuracy slope per unit of label noise
    "pooled_coupling_resid_sd": 0.0091, "noise_coupling_resid_sd": 0.0061,
    "pooled_size_accuracy_slope": 0.115, "noise_accuracy_slope": -0.640,
    # the control: coupling at drop-path 0.1 minus 0 (full digits, 230 steps, one seed:
    # coupling_vs_null [CLS] 0.090 - 0.043), and its seed sd
    "control_difference": 0.047,
}

HYPOTHESES: dict[str, str] = {
    "W1": "Primary, within cells: across the seeds of a cell (same data distribution, a fresh "
          "training subset and initialisation per seed), coupling above chance rises with "
          "test accuracy: the within coefficient of the Mundlak split of the mixed model "
          "(statsmodels MixedLM, REML: coupling ~ accuracy - cell mean + cell mean, random "
          "intercept per cell) > 0, one-sided Wald test p < alpha; the fixed-effects OLS slope "
          "(cell dummies) is reported beside it (the same estimate in a balanced design).",
    "EW": "Equivalence within cells: the within slope lies within +-across_slope (the slope "
          "per unit of accuracy that 'coupling tracks accuracy' predicts, PLANNING): both "
          "one-sided t-tests of the fixed-effects slope (TOST) p < alpha.",
    "S1": "The key contrast, training-set size with clean labels: over the clean cells' means, "
          "the OLS slope of coupling on ln(training images) > 0 (one-sided: more data raises "
          "accuracy, and the claim predicts coupling rises with it); S1a, the same slope of "
          "test accuracy (two-sided): the manipulation check.",
    "S2": "Size over all cells, label noise held fixed (noise levels as fixed effects): the "
          "slope of cell-mean coupling on ln(size) > 0 (one-sided); of accuracy, two-sided.",
    "N1": "Label noise, size held fixed (size levels as fixed effects): the slope of cell-mean "
          "coupling on the noise fraction < 0 (one-sided, the claim's direction); of "
          "accuracy, two-sided.",
    "PC": "Positive control of the assay: at fixed data (the largest training-set size, clean "
          "labels, the same seeds), coupling differs between the design's drop-path rate and "
          "control_drop_path in the known direction (more drop-path, more coupling): Welch's "
          "one-sided t-test over the seeds, p < alpha. Test accuracy's difference is reported "
          "beside it (two-sided).",
    "H1": "Across the cells of the design (training-set size x label noise, one fixed "
          "architecture), the cell-mean coupling above chance at the comparison point rises "
          "with the cell-mean test accuracy: Pearson r > 0, one-sided p < alpha (the cell is "
          "the unit; its seeds are averaged). The paper's claim at toy scale; it mixes both "
          "manipulations (S1, S2, N1 separate them).",
    "E1": "Equivalence: the cell-level correlation lies within (-bound, +bound), the smallest "
          "effect of interest: both one-sided tests on Fisher's z (TOST) p < alpha.",
    "H1b": "Across runs with a random intercept per cell (statsmodels MixedLM, REML): the "
           "slope of coupling above chance on test accuracy > 0, one-sided Wald test (it "
           "mixes the between-cell and within-cell slopes: W1 splits them).",
    "C": "Positive control of coupling: in every cell, coupling above chance under each null "
         "(each variant of the spec) at the comparison point: the seed-level one-sided t-test "
         "of mean > 0, p < alpha. Where it fails at the end, the tests are made at the latest "
         "monitored checkpoint (matched steps) where it holds, and the study says so.",
}
def power_effects() -> dict[str, str]:
    """The effect each simulated power (`design_powers`) is stated for, from `PLANNING`."""
    P = PLANNING
    b = P["across_slope"]
    return {
        "W1": f"a within-cell slope of {b:g} per unit of accuracy (the first run's across-cell "
              "slope)",
        "EW_at_0": "a within-cell slope of 0",
        "S1": f"a slope of {P['size_accuracy_slope'] * b:+.4f} per ln(images), what coupling "
              f"would show if it tracked accuracy (accuracy's {P['size_accuracy_slope']:g} x "
              f"{b:g})",
        "S2": f"a slope of {P['pooled_size_accuracy_slope'] * b:+.4f} per ln(images) "
              f"(accuracy's {P['pooled_size_accuracy_slope']:g} x {b:g})",
        "N1": f"a slope of {P['noise_accuracy_slope'] * b:+.4f} per unit of noise (accuracy's "
              f"{P['noise_accuracy_slope']:g} x {b:g})",
        "PC": f"a difference of {P['control_difference']:g} (drop-path 0.1 vs 0 at 230 steps "
              "on the whole split, one seed)",
    }


def _fractions(name: str, value: Any) -> tuple[float, ...]:
    items = value if isinstance(value, list | tuple) else [value]
    if not items:
        raise OptionError(f"{name}: give at least one value")
    return tuple(number(v, name, minimum=0.0, below=1.0) for v in items)


def _ints(name: str, value: Any) -> tuple[int, ...]:
    from blockcoupling.engine.config import parse_ints

    return parse_ints(name, value)


def _strs(name: str, value: Any) -> tuple[str, ...]:
    from blockcoupling.engine.config import parse_strs

    return parse_strs(name, value)


def train_parser(base: Callable[[], VitTrainConfig], design_fields: tuple[str, ...],
                 axes: str) -> Callable[[str, Any], VitTrainConfig]:
    """A study spec's ``train`` parser: a mapping of `VitTrainConfig` fields on top of
    ``base()``; a field the design sets (``design_fields``, from its ``axes``) is one line."""
    def parse(name: str, value: Any) -> VitTrainConfig:
        if isinstance(value, VitTrainConfig):
            return value
        if not isinstance(value, Mapping):
            raise validate.OptionError(f"{name}: give a mapping of training options "
                                       "(VitTrainConfig fields), e.g. {dataset: digits, "
                                       "steps: 230}")
        given = [k for k in design_fields if k in value]
        if given:
            raise validate.OptionError(f"{name}.{given[0]} is set by the design ({axes}); "
                                       "give it at the top level")
        with key_names(f"{name}."):  # a training key is named as the spec writes it
            return VitTrainConfig.from_dict({**asdict(base()), **dict(value)})

    return parse


#: the full design's training config (every run): the tiny ViT (width 64, 4 blocks, 16 x 16
#: digits: 16 patches + [CLS]), drop-path 0.1, weight decay 0.05, 230 AdamW steps (10 epochs
#: of the whole split), warm-up 1/10 of the steps, K = 10 at [CLS], 32 final test images,
#: 4 monitored images every 46 steps; each seed draws its own training subset
FULL_TRAIN = VitTrainConfig(dataset="digits", preset="tiny", drop_path=0.1, weight_decay=0.05,
                            steps=230, epochs=10, warmup_epochs=1.0, k=10, tokens="cls",
                            final_images=32, monitor_images=4, monitor_every=46,
                            subset_per_seed=True)
_train = train_parser(lambda: FULL_TRAIN, _DESIGN_FIELDS, "train_sizes, label_noises, seeds")


@dataclass(frozen=True)
class GeneralizationSpec:
    """The design (declared once with ``fields.opt``: the YAML keys, their range rules and
    their one-line errors come from these declarations; the rules across fields, the power
    included, are checked below)."""

    train_sizes: tuple[int, ...] = opt(FULL_SIZES, "Training-set sizes (images; at least 3 "
                                       "distinct levels).", parse=_ints, check=validate.COUNT)
    label_noises: tuple[float, ...] = opt((0.0, 0.2, 0.4), "Label-noise fractions (distinct).",
                                          parse=_fractions)
    seeds: tuple[int, ...] = opt((0, 1, 2), f"Seeds per cell (at least {MIN_SEEDS}).",
                                 parse=_ints, check=validate.SEED)
    train: VitTrainConfig = opt(help="The training config of every run (VitTrainConfig "
                                "fields; train_limit, label_noise and seed come from the "
                                "design).", parse=_train, default_factory=lambda: FULL_TRAIN)
    control_drop_path: float = opt(0.0, "The positive control of the assay: the same "
                                   "pipeline at fixed data (the largest training-set size, "
                                   "clean labels, the same seeds) with this drop-path rate "
                                   "beside the design's own (train.drop_path): a contrast "
                                   "known to move coupling.", check=(number, {"minimum": 0.0,
                                                                                "below": 1.0}))
    variants: tuple[str, ...] = opt(("coupling_vs_rotated", "coupling_vs_null"),
                                    "Chance-corrected variants (0 = chance), one per null: the "
                                    "positive control needs each above chance in every cell; "
                                    "the first is the tests' coupling (the others' cell-level "
                                    "tests are reported beside it).", parse=_strs)
    alpha: float = opt(0.05, "The tests' level (one-sided; TOST: each side).",
                       check=(number, {"above": 0.0, "below": 0.5}))
    bound: float = opt(0.5, "The smallest effect of interest: a correlation (the TOST "
                       "bounds and the power's effect).", check=(number, {"above": 0.0,
                                                                          "below": 1.0}))
    power: float = opt(0.8, "The stated power of the primary test (H1) to detect a "
                       "correlation of `bound`: a design below it is refused before training.",
                       check=(number, {"minimum": 0.0, "below": 1.0}))
    note: str = opt("", "What this spec is for (printed with the plan).",
                    check=validate.rule(validate.text))

    def __post_init__(self) -> None:
        from blockcoupling.engine.names import VARIANTS

        check_fields(self, dashes=False)
        for name in ("train_sizes", "label_noises", "seeds"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise BlockCouplingError(f"{name} repeats a value: {list(values)}")
        if len(self.train_sizes) < 3:
            raise BlockCouplingError(f"train_sizes: {len(self.train_sizes)} level(s); the "
                                     "design needs at least 3 training-set sizes")
        if min(self.train_sizes) < 1:
            raise BlockCouplingError("train_sizes must be at least 1 image each")
        split = SPLIT_SIZES.get(self.train.dataset, (math.inf,))[0]
        if self.train.data_dir is None and max(self.train_sizes) > split:
            raise BlockCouplingError(
                f"train_sizes: {max(self.train_sizes)} exceeds the {self.train.dataset} "
                f"training split ({split} images); the largest level can be {split}")
        if len(self.seeds) < MIN_SEEDS:
            raise BlockCouplingError(
                f"{len(self.seeds)} seed(s) per cell; the design needs at least {MIN_SEEDS} "
                "(the seed-level se and the positive control's t-test per cell need >= 2 df)")
        if self.train.steps is None:
            raise BlockCouplingError("train.steps: give the optimiser steps of every run (the "
                                     "same for every training-set size)")
        for v in self.variants:
            if v not in VARIANTS or not v.startswith("coupling_vs_"):
                chance = [x for x in VARIANTS if x.startswith("coupling_vs_")]
                raise BlockCouplingError(f"variants: {v!r} is not a chance-corrected variant "
                                         f"(0 = chance); choose from {', '.join(chance)}")
        if not self.variants:
            raise BlockCouplingError("variants: give at least one chance-corrected variant")
        if self.control_drop_path == self.train.drop_path:
            raise BlockCouplingError(
                f"control_drop_path {self.control_drop_path:g} is the design's own drop-path "
                "rate (train.drop_path); the control contrasts another rate with it")
        achieved = design_power(self)
        if achieved < self.power:
            need = next(n for n in range(4, 10_000) if _power(n, self) >= self.power)
            raise BlockCouplingError(
                f"the design has {self.n_cells} cells ({len(self.train_sizes)} sizes x "
                f"{len(self.label_noises)} noise levels): its primary test has power "
                f"{achieved:.2f} to detect a correlation of {self.bound:g} at alpha "
                f"{self.alpha:g} (one-sided), below the stated {self.power:g}; give at least "
                f"{need} cells (more train_sizes or label_noises), or state a lower power")

    @property
    def n_cells(self) -> int:
        return len(self.train_sizes) * len(self.label_noises)

    @property
    def n_runs(self) -> int:
        return self.n_cells * len(self.seeds)

    def configs(self) -> list[VitTrainConfig]:
        """Every run's training config, in the grid's order (size, noise, seed)."""
        from blockcoupling.studies.vit.grid import grid_configs

        return grid_configs(self.train, **self.grid())

    def grid(self) -> dict[str, Any]:
        """The design's runs as one ViT grid on ``train``: the keywords of ``run_grid`` (what
        the study trains) and of ``vit.plan.plan_grid`` (what ``--dry-run`` plans)."""
        return {"drop_paths": (self.train.drop_path,), "weight_decays": (self.train.weight_decay,),
                "seeds": self.seeds, "train_limits": self.train_sizes,
                "label_noises": self.label_noises}

    def control_cell(self) -> tuple[int, float]:
        """The control's fixed data: (the largest training-set size, clean labels)."""
        return max(self.train_sizes), 0.0

    def control_grid(self) -> dict[str, Any]:
        """The positive control's extra runs as one ViT grid on ``train`` (``run_grid``'s
        keywords): the contrast rate at the control cell, the same seeds (its other arm is
        the design's own cell)."""
        n, noise = self.control_cell()
        return {"drop_paths": (self.control_drop_path,),
                "weight_decays": (self.train.weight_decay,), "seeds": self.seeds,
                "train_limits": (n,), "label_noises": (noise,)}

    def control_configs(self) -> list[VitTrainConfig]:
        """The positive control's runs' training configs (`control_grid`)."""
        from blockcoupling.studies.vit.grid import grid_configs

        return grid_configs(self.train, **self.control_grid())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["train"] = self.train.to_dict()
        return d


def _power(n_cells: int, spec: GeneralizationSpec) -> float:
    from blockcoupling.studies.regression import correlation_power

    return correlation_power(n_cells, spec.bound, spec.alpha)


def design_power(spec: GeneralizationSpec) -> float:
    """The exact power of the primary test (H1: the one-sided Pearson test over the
    ``n_cells`` cell means) to detect a population correlation of ``spec.bound``."""
    if spec.n_cells < 4:
        raise BlockCouplingError(f"the design has {spec.n_cells} cells; the cell-level tests "
                                 "need at least 4 (more train_sizes or label_noises)")
    return _power(spec.n_cells, spec)


def control_direction(spec: GeneralizationSpec) -> str:
    """PC's alternative for the design's runs minus the control's: more drop-path, more
    coupling (``greater`` when the design's rate is the higher one)."""
    return "greater" if spec.train.drop_path > spec.control_drop_path else "less"


def factor_design(spec: GeneralizationSpec, factor: str, fixed: str | None = None,
                  cells: Any = None) -> Any:
    """The OLS design matrix of a factor test over cell means: the intercept, the factor
    (``ln_size`` = ln(training images), or ``label_noise``) in column 1, and the levels of
    ``fixed`` (``n_train`` or ``label_noise``) as dummies (the first level dropped).
    ``cells``: a table with ``n_train`` and ``label_noise`` (default: every cell of the
    spec)."""
    import numpy as np
    import pandas as pd

    if cells is None:
        cells = pd.DataFrame([(n, e) for n in spec.train_sizes for e in spec.label_noises],
                             columns=["n_train", "label_noise"])
    x = np.log(cells["n_train"].to_numpy(float)) if factor == "ln_size" else \
        cells[factor].to_numpy(float)
    cols = [np.ones(len(cells)), x]
    if fixed is not None:
        levels = sorted(cells[fixed].unique())
        cols += [(cells[fixed].to_numpy() == lv).astype(float) for lv in levels[1:]]
    return np.column_stack(cols)


def design_powers(spec: GeneralizationSpec, reps: int = 2000, seed: int = 0
                  ) -> dict[str, dict[str, Any]]:
    """The power of each pre-registered test beside H1 (whose power is exact:
    `design_power`), by simulation (`blockcoupling.studies.power`) from `PLANNING` at the
    effect `power_effects` names; a test the design cannot make is ``{"skipped": why}``."""
    import math

    import pandas as pd

    from blockcoupling.studies import power as pw

    P, a, seeds = PLANNING, spec.alpha, len(spec.seeds)
    slope = P["across_slope"]
    resid = math.sqrt(max(P["within_coupling_sd"] ** 2
                          - (slope * P["within_accuracy_sd"]) ** 2, 0.0))
    out: dict[str, dict[str, Any]] = {
        "W1": pw.within_power(spec.n_cells, seeds, slope, P["within_accuracy_sd"], resid,
                              alpha=a, reps=reps, seed=seed),
        "EW_at_0": pw.tost_slope_power(spec.n_cells, seeds, slope, P["within_accuracy_sd"],
                                       P["within_coupling_sd"], alpha=a, reps=reps, seed=seed),
        "PC": pw.welch_power(seeds, seeds, P["control_difference"], P["within_coupling_sd"],
                             alpha=a, reps=reps, seed=seed)}
    clean = pd.DataFrame({"n_train": spec.train_sizes, "label_noise": 0.0})
    out["S1"] = (pw.slope_power(factor_design(spec, "ln_size", cells=clean),
                                P["size_accuracy_slope"] * slope, P["size_coupling_resid_sd"],
                                alpha=a, reps=reps, seed=seed)
                 if 0.0 in spec.label_noises else {"skipped": "no clean-label cells"})
    many = len(spec.label_noises) > 1
    out["S2"] = pw.slope_power(factor_design(spec, "ln_size", "label_noise" if many else None),
                               P["pooled_size_accuracy_slope"] * slope,
                               P["pooled_coupling_resid_sd"], alpha=a, reps=reps, seed=seed)
    out["N1"] = (pw.slope_power(factor_design(spec, "label_noise", "n_train"),
                                P["noise_accuracy_slope"] * slope, P["noise_coupling_resid_sd"],
                                alpha=a, alternative="less", reps=reps, seed=seed)
                 if many else {"skipped": "one label-noise level"})
    effects = power_effects()
    for name, res in out.items():
        res["effect"] = effects[name]
    return out


def architecture(spec: Any) -> str:
    """The architecture a study's training config (``spec.train``) trains, in words."""
    from blockcoupling.studies.vit.train import model_shape

    shape, size, _ = model_shape(spec.train)
    tokens = (size // shape.patch_size) ** 2
    return (f"ViT '{spec.train.preset}' (width {shape.hidden_size}, {shape.depth} blocks, "
            f"{shape.heads} heads, {size} x {size} {spec.train.dataset} images: {tokens} "
            f"patches + [CLS])")


def describe_design(spec: GeneralizationSpec) -> list[str]:
    """The design and its power, in words (printed before any training)."""
    from blockcoupling.studies.regression import tost_power

    t = spec.train
    sizes = ", ".join(map(str, spec.train_sizes))
    noises = " / ".join(f"{100 * x:g} %" for x in spec.label_noises)
    return [
        f"{spec.n_cells} cells ({len(spec.train_sizes)} training-set sizes {sizes} x label "
        f"noise {noises}) x {len(spec.seeds)} seeds = {spec.n_runs} runs of one "
        f"architecture, {architecture(spec)}, {t.steps} AdamW steps each (drop-path {t.drop_path:g}, "
        f"weight decay {t.weight_decay:g}); coupling depth-wise at K = {t.k}, token "
        f"{t.tokens}, on {t.final_images} test images at the end",
        f"power of H1 (one-sided Pearson test over the {spec.n_cells} cell means, alpha "
        f"{spec.alpha:g}) to detect a correlation of {spec.bound:g}: "
        f"{design_power(spec):.2f} (exact; stated: {spec.power:g}); power of the "
        f"equivalence test (TOST, +-{spec.bound:g}) at a correlation of 0: "
        f"{tost_power(spec.n_cells, spec.bound, spec.alpha):.2f}",
    ]


def full_spec() -> GeneralizationSpec:
    """The full design: 8 training-set sizes (90 .. 1,437 images, 16x) x label noise 0 / 20 /
    40 % = 24 cells x 3 seeds = 72 runs of the tiny ViT on digits (`FULL_TRAIN`),
    power 0.83 to detect a cell-level correlation of 0.5 at alpha 0.05."""
    return GeneralizationSpec(note="the full design")


def quick_spec() -> GeneralizationSpec:
    """The test-suite's design: 3 sizes x 2 noise levels x 3 seeds = 18 runs of a 16-wide,
    2-block ViT on 8 x 8 digits, 96 steps at lr 2e-3 each (about 2 s per run), 64 test
    images. A smoke test: 6 cells have power 0.28 at r = 0.5 (the design check's floor
    is set to 0.25 so that it passes), not a design that can answer."""
    train = VitTrainConfig(dataset="digits", preset="tiny", hidden_size=16, depth=2, heads=2,
                           image_size=8, batch_size=32, drop_path=0.1, weight_decay=0.05,
                           steps=96, epochs=4, lr=2e-3, k=2, tokens="cls", test_limit=64,
                           eval_train_limit=64, final_images=4, monitor_images=2,
                           monitor_every=48, subset_per_seed=True)
    return GeneralizationSpec(train_sizes=(48, 96, 192), label_noises=(0.0, 0.4),
                              seeds=(0, 1, 2), train=train, power=0.25,
                              note="--quick: a smoke test (6 cells, power 0.28)")


def parse_spec(data: Mapping[str, Any]) -> GeneralizationSpec:
    """A `GeneralizationSpec` from a mapping (YAML): any of its fields; ``train`` is a
    mapping of `VitTrainConfig` fields on top of the full design's. Unknown keys and
    bad values: one line naming the key (``fields.from_mapping``)."""
    if not isinstance(data, Mapping):
        raise OptionError("generalization spec: give a mapping of train_sizes, "
                          "label_noises, seeds, train, ...")
    return from_mapping(GeneralizationSpec, data, "generalization spec")


def load_spec(path: str | Path) -> GeneralizationSpec:
    """`parse_spec` of a YAML file."""
    from blockcoupling.store.verified import load_yaml

    data = load_yaml(Path(path), "study spec", error=OptionError)
    return parse_spec(data if data is not None else {})
