"""The design of ``blockcoupling study intervention``, fixed before any data are seen.

**Question**: does changing coupling change generalisation? Every other study here is
correlational (coupling and accuracy are both outcomes of a manipulated factor). Here the
manipulation is coupling itself: one architecture and one data set (the tiny ViT on digits,
the generalization study's training), trained with an added loss term ``-strength x`` the
blocks' depth-wise traceless alignment at [CLS] (`blockcoupling.engine.surrogate`: a
differentiable estimate from Jacobian-vector products, `blockcoupling.studies.vit.
coupling_term`), at ``strengths`` in both directions and 0, each from ``seeds``. A seed's
arms share the initialisation, the batches and the drop-path draws (the term draws its
directions from a generator of its own), so arms are compared within seeds (paired).

**Measured**: the coupling actually reached, by the engine (``variant``: the headline
``coupling_vs_rotated``, depth-wise, K of the config, at [CLS], on ``final_images`` test
images), the test accuracy on the whole test split, and what else the term changes: the
training cross-entropy, the weight norm, the surrogate itself, and the trajectory metrics
(LSS, expodistance, equidistance CV) of the final measurement.

**Tests** (`HYPOTHESES`, level ``alpha``): H1 the manipulation check (coupling rises with
strength, every adjacent pair of arms, paired one-sided t-tests: an intersection-union test,
monotone only when all reject); H2 the strongest raising arm has higher test accuracy than 0;
H3 the strongest lowering arm has lower test accuracy than 0 (paired one-sided t-tests);
E2, E3 the same differences inside +-``bound`` (TOST). The power of each by simulation
(`blockcoupling.studies.power`) from `PLANNING`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blockcoupling import validate
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, from_mapping, opt
from blockcoupling.studies.generalization.design import train_parser
from blockcoupling.studies.vit.train import VitTrainConfig
from blockcoupling.validate import OptionError, number

__all__ = ["FULL_TRAIN", "HYPOTHESES", "PLANNING", "InterventionSpec", "describe_design",
           "design_powers", "full_spec", "load_spec", "parse_spec", "quick_spec"]

#: the fields the design sets per run
_DESIGN_FIELDS = ("coupling_term", "seed")

#: planning values of the power simulations, fixed before this design's data: the seed sd of
#: test accuracy of the generalization study's first run at the full digits split (3 seeds:
#: 0.928, 0.856, 0.869), taken as the sd of a paired difference (a correlation of 0.5 between
#: two arms of one seed); the reached coupling's seed sd (the same run, 0.0070) and the
#: smallest step between adjacent arms the manipulation check is powered for.
PLANNING: dict[str, float] = {"accuracy_difference_sd": 0.038, "coupling_difference_sd": 0.010,
                              "coupling_step": 0.02}

HYPOTHESES: dict[str, str] = {
    "H1": "Manipulation check: the coupling reached (the variant, measured by the engine) "
          "rises with the strength of the term: for every pair of adjacent strengths the "
          "paired one-sided t-test (over seeds) of the higher arm minus the lower > 0 has "
          "p < alpha. Monotone only when every pair rejects (an intersection-union test: no "
          "correction needed). Spearman's rho over all runs is reported beside it.",
    "H2": "Raising coupling raises accuracy: test accuracy at the largest positive strength "
          "minus at 0 > 0, paired one-sided t-test over seeds, p < alpha.",
    "H3": "Lowering coupling lowers accuracy: test accuracy at the most negative strength "
          "minus at 0 < 0, paired one-sided t-test over seeds, p < alpha.",
    "E2": "Equivalence for H2's difference: inside +-bound (accuracy), both one-sided paired "
          "t-tests (TOST) p < alpha.",
    "E3": "Equivalence for H3's difference: inside +-bound, TOST p < alpha.",
}

#: the full design's training (every arm): the generalization study's training on the whole
#: digits split (1,437 images, clean labels): the tiny ViT, drop-path 0.1, weight decay 0.05,
#: 230 AdamW steps, K = 10 at [CLS] on 32 test images; the term on 4 images x 8 directions
FULL_TRAIN = VitTrainConfig(dataset="digits", preset="tiny", drop_path=0.1, weight_decay=0.05,
                            steps=230, epochs=10, warmup_epochs=1.0, k=10, tokens="cls",
                            final_images=32, monitor_images=4, monitor_every=46,
                            coupling_term_images=4, coupling_term_directions=8)


def _floats(name: str, value: Any) -> tuple[float, ...]:
    items = value if isinstance(value, list | tuple) else [value]
    return tuple(number(v, name) for v in items)


def _ints(name: str, value: Any) -> tuple[int, ...]:
    from blockcoupling.engine.config import parse_ints

    return parse_ints(name, value)


_train = train_parser(lambda: FULL_TRAIN, _DESIGN_FIELDS, "strengths, seeds")


@dataclass(frozen=True)
class InterventionSpec:
    """The design (declared once with ``fields.opt``; the rules across fields below)."""

    strengths: tuple[float, ...] = opt((-1.0, -0.1, 0.0, 0.1, 1.0), "Strengths of the "
                                       "coupling term (> 0 raises coupling, < 0 lowers it); "
                                       "0 and at least one of each sign.", parse=_floats)
    seeds: tuple[int, ...] = opt(tuple(range(8)), "Seeds per arm (at least 3).", parse=_ints,
                                 check=validate.SEED)
    train: VitTrainConfig = opt(help="The training config of every run (VitTrainConfig "
                                "fields; coupling_term and seed come from the design).",
                                parse=_train, default_factory=lambda: FULL_TRAIN)
    variant: str = opt("coupling_vs_rotated", "The coupling the manipulation check reads (the "
                       "headline's leading variant).")
    alpha: float = opt(0.05, "The tests' level (one-sided; TOST: each side).",
                       check=(number, {"above": 0.0, "below": 0.5}))
    bound: float = opt(0.04, "The smallest accuracy difference of interest (H2, H3's power; "
                       "E2, E3's bounds).", check=(number, {"above": 0.0, "below": 1.0}))
    note: str = opt("", "What this spec is for (printed with the plan).")

    def __post_init__(self) -> None:
        from blockcoupling.engine.names import VARIANTS

        check_fields(self, dashes=False)
        for name in ("strengths", "seeds"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise BlockCouplingError(f"{name} repeats a value: {list(values)}")
        if 0.0 not in self.strengths or min(self.strengths) >= 0 or max(self.strengths) <= 0:
            raise BlockCouplingError("strengths: give 0 and at least one positive and one "
                                     f"negative strength (got {list(self.strengths)})")
        if len(self.seeds) < 3:
            raise BlockCouplingError(f"{len(self.seeds)} seed(s) per arm; the paired tests need "
                                     "at least 3")
        if self.variant not in VARIANTS:
            raise BlockCouplingError(f"variant: {self.variant!r} is not a coupling variant")
        if self.train.steps is None:
            raise BlockCouplingError("train.steps: give the optimiser steps of every run")
        if self.train.tokens == "all":
            raise BlockCouplingError("train.tokens: the term is defined at one token (cls or "
                                     "last)")

    @property
    def arms(self) -> tuple[float, ...]:
        return tuple(sorted(self.strengths))

    @property
    def n_runs(self) -> int:
        return len(self.strengths) * len(self.seeds)

    def grid(self) -> dict[str, Any]:
        """The design's runs as one ViT grid on ``train``: the keywords of ``run_grid`` (what
        the study trains) and of ``vit.plan.plan_grid`` (what ``--dry-run`` plans)."""
        return {"drop_paths": (self.train.drop_path,), "weight_decays": (self.train.weight_decay,),
                "seeds": self.seeds, "coupling_terms": self.arms}

    def configs(self) -> list[VitTrainConfig]:
        """Every run's training config, in the grid's order (strength, seed)."""
        from blockcoupling.studies.vit.grid import grid_configs

        return grid_configs(self.train, **self.grid())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["train"] = self.train.to_dict()
        return d


def design_powers(spec: InterventionSpec, reps: int = 2000, seed: int = 0
                  ) -> dict[str, dict[str, Any]]:
    """The power of each test by simulation from `PLANNING`: H1 per adjacent pair at a
    step of ``coupling_step`` (and of the whole intersection-union test when every step is
    that size), H2/H3 at a difference of ``bound``, E2/E3 at a difference of 0."""
    from blockcoupling.studies import power as pw

    n, a, P = len(spec.seeds), spec.alpha, PLANNING
    pair = pw.paired_power(n, P["coupling_step"], P["coupling_difference_sd"], alpha=a,
                           reps=reps, seed=seed)
    steps = len(spec.strengths) - 1
    out = {"H1_pair": {**pair, "effect": f"a step of {P['coupling_step']:g} in {spec.variant} "
                                         "between adjacent arms"},
           "H1_all": {"power": pair["power"] ** steps, "effect": f"every one of the {steps} "
                      f"steps {P['coupling_step']:g} (independent pairs: the pair's power to "
                      f"the {steps}th)", "model": pair["model"], "reps": pair["reps"]}}
    for name, alt in (("H2", "greater"), ("H3", "less")):
        sign = 1.0 if alt == "greater" else -1.0
        out[name] = {**pw.paired_power(n, sign * spec.bound, P["accuracy_difference_sd"],
                                       alpha=a, alternative=alt, reps=reps, seed=seed),
                     "effect": f"an accuracy difference of {sign * spec.bound:+g}"}
    tost = pw.paired_tost_power(n, spec.bound, P["accuracy_difference_sd"], alpha=a, reps=reps,
                                seed=seed)
    out["E2_at_0"] = {**tost, "effect": "an accuracy difference of 0"}
    out["E3_at_0"] = dict(out["E2_at_0"])
    return out


def describe_design(spec: InterventionSpec) -> list[str]:
    """The design in words (printed before any training)."""
    from blockcoupling.studies.generalization.design import architecture

    t = spec.train
    return [f"{len(spec.strengths)} arms (strengths of the coupling term "
            f"{', '.join(f'{s:+g}' for s in spec.arms)}) x {len(spec.seeds)} seeds = "
            f"{spec.n_runs} runs of one architecture, {architecture(spec)}, {t.steps} AdamW "
            f"steps each on {t.train_limit or 'every'} training image(s) (drop-path "
            f"{t.drop_path:g}, weight decay {t.weight_decay:g}; the term on "
            f"{t.coupling_term_images} images x {t.coupling_term_directions} directions per "
            f"step); {spec.variant} depth-wise at K = {t.k}, token {t.tokens}, on "
            f"{t.final_images} test images at the end"]


def full_spec() -> InterventionSpec:
    """The full design: 5 arms (-1, -0.1, 0, 0.1, 1) x 8 seeds = 40 runs of the tiny ViT on
    the whole digits split (`FULL_TRAIN`)."""
    return InterventionSpec(note="the full design")


def quick_spec() -> InterventionSpec:
    """The test-suite's design: 3 arms (-1, 0, 1) x 3 seeds = 9 runs of a 16-wide, 2-block
    ViT on 8 x 8 digits, 60 steps at lr 2e-3 (seconds each): a smoke test."""
    train = VitTrainConfig(dataset="digits", preset="tiny", hidden_size=16, depth=2, heads=2,
                           image_size=8, batch_size=32, drop_path=0.1, weight_decay=0.05,
                           steps=60, epochs=2, lr=2e-3, k=2, tokens="cls", train_limit=256,
                           eval_train_limit=64, final_images=4,
                           monitor_images=2, monitor_every=0, coupling_term_images=2,
                           coupling_term_directions=4)
    return InterventionSpec(strengths=(-1.0, 0.0, 1.0), seeds=(0, 1, 2), train=train,
                            note="--quick: a smoke test (3 seeds per arm)")


def parse_spec(data: Mapping[str, Any]) -> InterventionSpec:
    """An `InterventionSpec` from a mapping (YAML): any of its fields; ``train`` on top of
    the full design's. Unknown keys and bad values: one line naming the key."""
    if not isinstance(data, Mapping):
        raise OptionError("intervention spec: give a mapping of strengths, seeds, "
                                 "train, ...")
    return from_mapping(InterventionSpec, data, "intervention spec")


def load_spec(path: str | Path) -> InterventionSpec:
    """`parse_spec` of a YAML file."""
    from blockcoupling.store.verified import load_yaml

    data = load_yaml(Path(path), "study spec", error=OptionError)
    return parse_spec(data if data is not None else {})
