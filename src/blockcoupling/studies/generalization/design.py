"""The design of ``blockcoupling study generalization``, fixed before any data are seen.

**Question**: across models of ONE architecture (so width, depth, K and the chance level are
the same for every run), does coupling above chance rise with generalisation (test accuracy)?

**Manipulation**: generalisation is moved by the data, not by the model: the training-set
size (``train_sizes``, nested seeded subsets of the training split, `blockcoupling.
studies.vit.data.load_image_data`) crossed with label noise (``label_noises``: that fraction
of the training labels replaced by another class; the test labels stay clean), each cell
trained from ``seeds`` (initialisation, order and noise draw). Every run takes the same number
of optimiser steps (``VitTrainConfig.steps``), so the optimisation budget does not vary with
the data size. The default is the tiny ViT on scikit-learn's digits (offline).

**Comparison point**: each run's final measurement (``final_images`` test images); the
positive control (every cell above chance under every null in ``variants``) is checked there,
and where it fails at the monitored checkpoint of matched steps where it holds (the latest
one; ``monitor_every`` counts steps), and the study says so.

**Tests** (one-sided as the paper's claim; ``HYPOTHESES``): the cell is the unit of the
primary test (its seeds are averaged: cell means are independent), H1 Pearson r > 0 over the
cells, the equivalence test E1 (TOST against ``bound``, the smallest correlation of interest),
and H1b over runs with a random intercept per cell (statsmodels MixedLM). The design's power
(exact, `blockcoupling.studies.regression.correlation_power`) must reach the stated
``power``, checked before any training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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

HYPOTHESES: dict[str, str] = {
    "H1": "Across the cells of the design (training-set size x label noise, one fixed "
          "architecture), the cell-mean coupling above chance at the comparison point rises "
          "with the cell-mean test accuracy: Pearson r > 0, one-sided p < alpha (the cell is "
          "the unit; its seeds are averaged). The paper's claim at toy scale.",
    "E1": "Equivalence: the cell-level correlation lies within (-bound, +bound), the smallest "
          "effect of interest: both one-sided tests on Fisher's z (TOST) p < alpha.",
    "H1b": "Across runs with a random intercept per cell (statsmodels MixedLM, REML): the "
           "slope of coupling above chance on test accuracy > 0, one-sided Wald test.",
    "C": "Positive control: in every cell, coupling above chance under each null (each "
         "variant of the spec) at the comparison point: the seed-level one-sided t-test of "
         "mean > 0, p < alpha. Where it fails at the end, the tests are made at the latest "
         "monitored checkpoint (matched steps) where it holds, and the study says so.",
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


def _train(name: str, value: Any) -> VitTrainConfig:
    if isinstance(value, VitTrainConfig):
        return value
    if not isinstance(value, Mapping):
        raise OptionError(f"{name}: give a mapping of training options (VitTrainConfig "
                          "fields), e.g. {dataset: digits, steps: 230}")
    given = [k for k in _DESIGN_FIELDS if k in value]
    if given:
        raise OptionError(f"{name}.{given[0]} is set by the design (train_sizes, "
                          "label_noises, seeds); give it at the top level")
    with key_names(f"{name}."):  # a training key is named as the spec writes it
        return VitTrainConfig.from_dict({**asdict(FULL_TRAIN), **dict(value)})


#: the full design's training config (every run): the tiny ViT (width 64, 4 blocks, 16 x 16
#: digits: 16 patches + [CLS]), drop-path 0.1, weight decay 0.05, 230 AdamW steps (10 epochs
#: of the whole split), warm-up 1/10 of the steps, K = 10 at [CLS], 32 final test images,
#: 4 monitored images every 46 steps
FULL_TRAIN = VitTrainConfig(dataset="digits", preset="tiny", drop_path=0.1, weight_decay=0.05,
                            steps=230, epochs=10, warmup_epochs=1.0, k=10, tokens="cls",
                            final_images=32, monitor_images=4, monitor_every=46)


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


def architecture(spec: GeneralizationSpec) -> str:
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
                           monitor_every=48)
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
