"""Training one DeiT-style ViT with stochastic depth, and measuring its coupling as it trains.

[`train_vit`][blockcoupling.studies.vit.train.train_vit] is a pure function of ``(VitTrainConfig, out_dir)`` (the seed is in the
config): the same config gives the same model, metrics and coupling, and a finished output
folder is returned untouched (idempotent), so a grid runner may call it again and again.
An interrupted training resumes from its last finished epoch (``checkpoint.pt``).

The recipe follows the paper (DEFINITIONS.md, "Training and ViTs"): AdamW at 5e-4 (no
weight decay on biases, norms, [CLS] and positions, as timm's DeiT), a per-step linear
warm-up then a cosine decay, mixup (alpha 0.8) where it fits (CIFAR-10; off by default on the
tiny digits images), random crops and flips on CIFAR-10, the epoch count an option.

Output folder ``OUT``::

    OUT/model/              the trained model (save_pretrained; load with load_vit(OUT)
                            or BeitForImageClassification.from_pretrained(OUT / "model"))
    OUT/metrics.json        config, status, per-epoch train/test loss and accuracy, learning
                            rate, mean depth-wise coupling of the monitored images, timings
    OUT/coupling/epoch-NNNN run directories (open_run) measured during training on the
                            first ``monitor_images`` test images (epoch 0 = initialisation)
    OUT/coupling/final/     the trained model measured on the first ``final_images`` test images
    OUT/checkpoint.pt       only while training is unfinished (deleted when complete)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from blockcoupling import validate
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, identity, opt, parse_given
from blockcoupling.hashing import canonical_hash
from blockcoupling.store.fileio import atomic_path
from blockcoupling.store.folder import VIT_TRAINING, decide, open_folder
from blockcoupling.studies.schedule import lr_at
from blockcoupling.studies.vit.augment import (
    AUGMENTS,
    crop_flip,
    mix_batch,
    random_erase,
    smooth_targets,
)
from blockcoupling.studies.vit.data import DATASETS, ImageData, load_image_data
from blockcoupling.studies.vit.model import PRESETS, build_vit, resolve_shape
from blockcoupling.studies.vit.record import (  # noqa: F401 - the record's names, as before
    DAMAGED_HINT,
    FORMAT,
    METRICS_FILE,
    MODEL_WEIGHTS,
    _load_metrics,
    _model_sha256,
    _write_json,
    metrics_problem,
    read_metrics,
)
from blockcoupling.validate import number, one_value, whole

CLS_TOKEN = 0  # BEiT puts [CLS] at position 0
TOKENS = ("cls", "last", "all")  # the headline token choices (``tokens``)
#: each choice as a token rule of ``engine.statistic`` ([CLS] is position 0: the first measured)
STATISTIC_TOKENS: dict[str, str] = {"cls": "first", "last": "last", "all": "all"}
LR_SCALINGS = ("none", "linear")


def _one_k(name: str, value: Any) -> int:
    """``--k``: the option takes a comma-separated list in every command; here a list of one."""
    return one_value(value, "--k", int)


_W, _N = whole, number  # the range rules of the fields (blockcoupling.validate)


def _preset(value: Any, name: str) -> str:
    """A model shape of `PRESETS`, or a recipe of `RECIPES` (``paper``)."""
    return str(validate.choice(value, name, choices=(*PRESETS, *RECIPES)))


def _folder(value: Any, name: str) -> Any:
    """A folder path (text or a ``Path``)."""
    if not isinstance(value, (str, Path)):
        raise validate.OptionError(f"{name} must be a folder path, not {value!r}")
    return value


def _notes(value: Any, name: str) -> Any:
    """Free-form notes: a mapping."""
    if not isinstance(value, dict):
        raise validate.OptionError(f"{name} must be a mapping of notes, not {value!r}")
    return value


def _augment(value: Any, name: str) -> Any:
    """An augmentation of `AUGMENTS` (True/False: the older on/off form)."""
    return value if isinstance(value, bool) else validate.choice(
        value, name, choices=AUGMENTS, hint="tensor crops and flips; RandAugment is not available")


@dataclass(frozen=True)
class VitTrainConfig:
    """Everything that determines one training run (and so its output).

    Each field is declared once (``blockcoupling.fields.opt``): its help and flag make the
    options of ``vit-train`` and ``vit-grid``, its range rule is checked here (the CLI, the
    grid's YAML and the Python API all build this record), and every field enters
    [`key`][blockcoupling.studies.vit.train.VitTrainConfig.key]."""

    dataset: str = opt("digits", "digits (offline, scikit-learn; the default) or cifar10.",
                       cli=True, check=validate.rule(validate.choice, choices=DATASETS))
    drop_path: float = opt(0.1, "Stochastic-depth rate (linear over blocks, as DeiT).", cli=True,
                           check=(_N, {"minimum": 0, "below": 1}))
    weight_decay: float = opt(0.05, "AdamW weight decay.", cli=True, check=(_N, {"minimum": 0}))
    epochs: int = opt(5, "Training epochs, per run in a grid (the paper: 500).", cli=True,
                      check=validate.COUNT)
    steps: int | None = opt(None, "Train for exactly this many optimiser steps instead of "
                            "--epochs (runs on different --train-limit then take the same "
                            "steps): the last epoch stops early; the warm-up is the fraction "
                            "warmup-epochs/epochs of the steps and --monitor-every counts steps "
                            "(the coupling is measured at the end of the epoch in which each "
                            "multiple falls).", cli=True, hashed="if_set",
                            check=validate.COUNT)
    label_noise: float | None = opt(None, "Fraction of the training labels replaced by another "
                                    "class drawn at random (seeded by --seed; exactly "
                                    "round(fraction x images) labels are wrong; the test labels "
                                    "stay clean). 0 is the same as unset.", cli=True,
                                    hashed="if_set", check=(_N, {"minimum": 0, "below": 1}))
    preset: str = opt("tiny", "Model shape: tiny, small, deit-tiny (192 wide, 12 deep, 3 heads); "
                      "or the recipe 'paper' (DeiT-Tiny, CIFAR-10, 500 epochs, 30 warm-up, AdamW "
                      "5e-4 cosine, mixup 0.8, crop-flip; other options override it).", cli=True,
                      check=validate.rule(_preset))
    hidden_size: int | None = opt(None, "Override the preset's width.", cli=True,
                                  check=validate.COUNT)
    depth: int | None = opt(None, "Override the preset's depth (the ICLR text: 24).", cli=True,
                            check=validate.COUNT)
    heads: int | None = opt(None, "Override the preset's heads.", cli=True,
                            check=validate.COUNT)
    image_size: int | None = opt(None, "Image side in pixels (default 16 digits, 32 CIFAR-10).",
                                 cli=True, check=validate.COUNT)
    lr: float = opt(5e-4, "Peak learning rate.", cli=True, check=(_N, {"above": 0}))
    min_lr: float = opt(1e-5, "Final learning rate of the cosine decay.",
                        check=(_N, {"minimum": 0}))
    batch_size: int = opt(64, "Images per step.", cli=True, check=validate.COUNT)
    warmup_epochs: float = opt(1.0, "Linear warm-up length in epochs (the paper: 30).", cli=True,
                               check=(_N, {"minimum": 0}))
    mixup: float | None = opt(None, "Mixup alpha (default 0.8 on CIFAR-10, 0 on digits).",
                              cli=True, check=(_N, {"minimum": 0}))
    augment: str | bool | None = opt(
        None, "none, crop (pad 4, random crop) or crop-flip (and a horizontal flip); tensor "
        "operations, NOT RandAugment. Default: crop-flip on CIFAR-10, none on digits.", cli=True,
        check=validate.rule(_augment))
    cutmix: float = opt(0.0, "CutMix Beta alpha (0 = off; DeiT: 1.0; with --mixup too, one of "
                        "them per batch).", cli=True, check=(_N, {"minimum": 0}))
    label_smoothing: float = opt(0.0, "Label smoothing epsilon (DeiT: 0.1).", cli=True,
                                 check=(_N, {"minimum": 0, "below": 1}))
    random_erasing: float = opt(0.0, "Random-erasing probability per image (DeiT: 0.25).",
                                cli=True, check=(_N, {"minimum": 0, "maximum": 1}))
    lr_scaling: str = opt("none", "none, or linear: lr and min lr times batch-size/512 (DeiT's "
                          "rule).", cli=True,
                          check=validate.rule(validate.choice, choices=LR_SCALINGS))
    tokens: str = opt("cls", "Headline token of the coupling: cls ([CLS], default), last (the "
                      "last patch, the authors' released code), all. The final measurement also "
                      "reports [CLS] and last.", cli=True,
                      check=validate.rule(validate.choice, choices=TOKENS))
    seed: int = opt(0, "Seed of the initialisation, order and augmentation.", cli=True,
                    check=validate.SEED)
    data_dir: str | None = opt(None, "CIFAR-10 folder: DIR/train/<class>/*.png, "
                               "DIR/test/<class>/*.png.", cli=True,
                               check=validate.rule(_folder))
    train_limit: int | None = opt(None, "Use a seeded subset of the training split.", cli=True,
                                  check=validate.COUNT)
    subset_per_seed: bool = opt(False, "Draw the --train-limit subset with the run's --seed (a "
                                "fresh subset per seed and size) instead of the one fixed "
                                "permutation every run shares (then seeds hold the same images "
                                "and smaller subsets are prefixes of larger ones).", cli=True,
                                hashed="if_changed", check=(validate.flag, {}))
    test_limit: int | None = opt(None, "Use a seeded subset of the test split.", cli=True,
                                 check=validate.COUNT)
    coupling_term: float | None = opt(
        None, "Add -strength x the blocks' depth-wise traceless alignment at the headline token "
        "(engine.surrogate, a differentiable estimate of coupling from Jacobian-vector "
        "products) to the training loss: > 0 raises coupling, < 0 lowers it, 0 records it "
        "each epoch without adding it.", cli=True, hashed="if_set", check=(_N, {}))
    coupling_term_images: int = opt(4, "Images of each batch the coupling term is estimated "
                                    "on.", check=validate.COUNT, hashed="if_changed")
    coupling_term_directions: int = opt(8, "Random directions of the coupling term's "
                                        "estimate (Jacobian-vector products per block).",
                                        check=validate.COUNT, hashed="if_changed")
    eval_train_limit: int | None = opt(5000, "Clean (eval-mode) train accuracy on this many.",
                                       check=validate.COUNT)
    monitor_images: int = opt(4, "Test images measured during training.", cli=True,
                              check=validate.COUNT)
    monitor_every: int = opt(1, "Measure every N epochs (0: only at the end; the paper 10).",
                             cli=True, check=validate.COUNT0)
    final_images: int = opt(16, "Test images measured on the trained model.", cli=True,
                            check=validate.COUNT)
    k: int = opt(10, "Top-K of the coupling: one value (the option takes a comma-separated list "
                 "in every command; here a list of one).", cli=True, parse=_one_k,
                 check=validate.COUNT)
    extra: dict[str, Any] = opt(help="Free-form notes (part of the key).",
                                default_factory=dict, check=validate.rule(_notes))

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise validate.OptionError(msg)

        check_fields(self, prefix="training option ")  # 5.0 epochs -> 5
        if self.label_noise is not None and float(self.label_noise) == 0.0:
            object.__setattr__(self, "label_noise", None)  # no noise: the default's identity
        if isinstance(self.augment, bool):  # the older on/off form
            object.__setattr__(self, "augment", "crop-flip" if self.augment else "none")
        if self.min_lr > self.lr:
            bad(f"learning rates lr={self.lr}, min_lr={self.min_lr}: need min_lr <= lr")
        resolve_shape(self.preset, hidden_size=self.hidden_size, depth=self.depth,
                      heads=self.heads)

    def steps_per_epoch(self, n_train: int) -> int:
        """Optimiser steps of one epoch over ``n_train`` images."""
        return math.ceil(n_train / self.batch_size)

    def total_steps(self, n_train: int) -> int:
        """Optimiser steps of the whole training on ``n_train`` images: ``steps``, or
        ``epochs`` full epochs."""
        return self.steps if self.steps is not None else \
            self.steps_per_epoch(n_train) * self.epochs

    def epochs_for(self, n_train: int) -> int:
        """Epochs trained on ``n_train`` images (with ``steps``: the last may be partial)."""
        return math.ceil(self.total_steps(n_train) / self.steps_per_epoch(n_train))

    def warmup_steps(self, n_train: int) -> int:
        """Linear warm-up steps: ``warmup_epochs`` epochs, or with ``steps`` the same fraction
        ``warmup_epochs / epochs`` of the steps."""
        if self.steps is not None:
            return int(round(self.steps * self.warmup_epochs / self.epochs))
        return int(round(self.warmup_epochs * self.steps_per_epoch(n_train)))

    def measured_epochs(self, n_train: int | None = None) -> tuple[int, ...]:
        """The epochs whose coupling is measured during training (0: the initialisation):
        every ``monitor_every``-th and the last; none with ``monitor_every=0``. With
        ``steps``, ``monitor_every`` counts steps: the epochs in which each multiple of it
        ends (and 0 and the last), so runs on different data sizes are measured at matched
        steps (within one epoch). ``n_train``: the training images (default: the split's
        size, `split_sizes`)."""
        if self.monitor_every == 0:
            return ()
        n = n_train if n_train is not None else split_sizes(self)[0]
        last = self.epochs_for(n)
        if self.steps is not None:
            spe = self.steps_per_epoch(n)
            marks = range(self.monitor_every, self.steps + 1, self.monitor_every)
            return tuple(sorted({0, last, *(math.ceil(m / spe) for m in marks)}))
        return tuple(e for e in range(last + 1) if e % self.monitor_every == 0 or e == last)

    @property
    def mixup_alpha(self) -> float:
        return self.mixup if self.mixup is not None else (0.8 if self.dataset == "cifar10" else 0.0)

    @property
    def augmentation(self) -> str:
        """The augmentation in effect (``augment``, or crop-flip on CIFAR-10, none on digits)."""
        if self.augment is not None:
            return str(self.augment)
        return "crop-flip" if self.dataset == "cifar10" else "none"

    @property
    def lr_scale(self) -> float:
        """The factor of the learning rates: batch_size / 512 under the linear rule, else 1."""
        return self.batch_size / 512 if self.lr_scaling == "linear" else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VitTrainConfig:
        """A config from options; ``preset: paper`` starts from `RECIPES` ``["paper"]``
        (the given options override it)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise validate.OptionError(
                f"unknown training option(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        recipe = RECIPES.get(str(data.get("preset")), {})
        return cls(**{**recipe, **{k: v for k, v in data.items() if k != "preset"
                                   or not recipe}})

    @classmethod
    def from_options(cls, **options: Any) -> VitTrainConfig:
        """[`from_dict`][blockcoupling.studies.vit.train.VitTrainConfig.from_dict] of the options that are not None (a CLI's unset options); the
        values of fields with a parser (``k``: ``"10"``) go through it."""
        return cls.from_dict(parse_given(cls, {k: v for k, v in options.items()
                                               if v is not None}))

    def replace(self, **changes: Any) -> VitTrainConfig:
        return replace(self, **changes)

    def key(self) -> str:
        """A short hash of the config (names a run in a grid; checks resumes)."""
        return canonical_hash(identity(self), digits=12, compact=False, strict=False,
                              default=str)


#: named training recipes (``preset``); ``paper``: the paper's DeiT-Tiny on CIFAR-10 (500
#: epochs, 30 warm-up, AdamW 5e-4 with a cosine decay, mixup 0.8, crops and flips). Its cost
#: is estimated (``estimate_cost``), not run, on a CPU.
RECIPES: dict[str, dict[str, Any]] = {
    "paper": {"dataset": "cifar10", "preset": "deit-tiny", "epochs": 500, "warmup_epochs": 30.0,
              "lr": 5e-4, "min_lr": 1e-5, "mixup": 0.8, "augment": "crop-flip",
              "monitor_every": 10},
}


# ---------------------------------------------------------------------------- schedule
def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay on weight matrices only: not on biases, norms, [CLS] and position embeddings."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name.endswith(("cls_token", "position_embeddings", "mask_token")):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------- batches
def _soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return -(targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def regularise(config: VitTrainConfig, x: Tensor, y: Tensor, classes: int, g: torch.Generator,
               rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    """A training batch ``x`` (n, C, H, W), ``y`` (n,) -> (images, soft targets (n, classes))
    after the config's regularisers, in DeiT's order: augmentation, Mixup/CutMix of the
    (smoothed) targets, random erasing."""
    if config.augmentation != "none":
        x = crop_flip(x, g, flip=config.augmentation == "crop-flip")
    targets = smooth_targets(y, classes, config.label_smoothing)
    x, targets = mix_batch(x, targets, mixup=config.mixup_alpha, cutmix=config.cutmix, g=g,
                           rng=rng)
    return random_erase(x, g, config.random_erasing), targets


def train_loss(model: torch.nn.Module, config: VitTrainConfig, x: Tensor, y: Tensor,
               classes: int, g: torch.Generator, rng: np.random.Generator) -> Tensor:
    """The training objective of one batch: soft cross-entropy after `regularise`."""
    x, targets = regularise(config, x, y, classes, g, rng)
    return _soft_cross_entropy(model(pixel_values=x).logits, targets)


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: Tensor, y: Tensor, batch_size: int = 256
             ) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) in eval mode (no drop-path)."""
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    for i in range(0, len(y), batch_size):
        logits = model(pixel_values=x[i:i + batch_size]).logits
        loss_sum += float(F.cross_entropy(logits, y[i:i + batch_size], reduction="sum"))
        correct += int((logits.argmax(-1) == y[i:i + batch_size]).sum())
    model.train(was_training)
    return loss_sum / max(len(y), 1), correct / max(len(y), 1)


# ---------------------------------------------------------------------------- coupling
def measured_tokens(tokens: str, *, both: bool = False) -> str | tuple[int, ...]:
    """The ``MeasureConfig.tokens`` that measures the headline ``tokens`` (cls, last, all),
    and with ``both`` [CLS] and the last patch as well (positions 0 and -1, one measurement)."""
    if tokens == "all":
        return "all"
    if both:
        return (CLS_TOKEN, -1)
    return tokens


def images_config(k: int, tokens: str | tuple[int, ...] = "cls") -> Any:
    """The ``MeasureConfig`` of every ViT measurement: depth-wise, K = ``k``, at ``tokens``;
    the final measurement's is ``images_config(config.k, measured_tokens(config.tokens,
    both=True))``, the config hash a ViT grid's units record."""
    from blockcoupling.engine.config import MeasureConfig

    return MeasureConfig.parse(coupling=("depth",), k=(k,), tokens=tokens)


def record_images(model: torch.nn.Module, pixel_values: Tensor, run_dir: Path, k: int, *,
                  labels: list[str] | None = None, progress: bool = False,
                  resume: bool = False, tokens: str | tuple[int, ...] = "cls",
                  headline: str = "cls") -> Any:
    """Depth-wise coupling at ``tokens`` (a ``MeasureConfig.tokens``) of each image into the
    run directory ``run_dir`` (``measure_to_dir``; the images' ids derive from their content,
    their ``label`` is their class). The run's ``meta`` states the token rule of its headline
    (``headline_tokens``: ``headline``, one of `TOKENS`, as ``engine.statistic``'s rule),
    so every reader of the run (``show``, ``report``, ``coupling_statistic``) states the
    headline that ``vit-train`` states. Returns the `blockcoupling.Measurement`."""
    from dataclasses import replace as _replace

    from blockcoupling.engine.inputs import split_tensor_inputs
    from blockcoupling.engine.statistic import HEADLINE_TOKENS_KEY
    from blockcoupling.store.record import measure_to_dir

    cfg = images_config(k, tokens)
    items = split_tensor_inputs({"pixel_values": pixel_values})
    if labels is not None:
        items = [_replace(it, label=lab) for it, lab in zip(items, labels, strict=True)]
    return measure_to_dir(model, None, items, run_dir, config=cfg, resume=resume,
                          prompts_spec="vit-test-images",
                          meta={"model": "vit-train",
                                HEADLINE_TOKENS_KEY: STATISTIC_TOKENS[headline]},
                          progress=progress)


#: the coupling metrics of a ViT epoch or final measurement (the headline statistic over the
#: images, ``engine.statistic``): the leading variant ``coupling_vs_rotated`` first (with its
#: se), then ``coupling_vs_null``, then raw c_K with its se and chance level
COUPLING_METRICS: tuple[str, ...] = ("coupling_vs_rotated", "coupling_vs_rotated_se",
                                     "coupling_vs_null", "coupling_vs_null_se", "coupling",
                                     "coupling_se", "coupling_chance")
NO_COUPLING: dict[str, float] = dict.fromkeys(COUPLING_METRICS, float("nan"))
#: the same at [CLS] and at the last patch (the final measurement measures both)
TOKEN_METRICS: tuple[str, ...] = tuple(f"{c}_{t}" for t in ("cls", "last")
                                       for c in COUPLING_METRICS)


def token_statistic(m: Any, k: int, token: str) -> dict[str, float]:
    """``COUPLING_METRICS`` of the measurement ``m`` at ``token``: ``cls`` (the rows of
    position 0), ``last`` (each image's last measured position) or ``all`` (every measured
    position, averaged within each image), by ``engine.statistic``'s one rule."""
    from blockcoupling.engine.statistic import StatisticRule, statistic_table

    rows = m.coupling
    if token == "cls" and not (rows["token_out_a"] == CLS_TOKEN).any():
        raise BlockCouplingError("this measurement has no [CLS] (position 0) rows")
    rule = StatisticRule(k=k, tokens=STATISTIC_TOKENS[token], n_boot=0)
    t = statistic_table(rows, rule, d_model=m.d_model, where="vit").set_index("variant")
    from blockcoupling.engine.statistic import HEADLINE_VARIANTS

    out = {}
    for v in HEADLINE_VARIANTS:
        out[v] = float(t.loc[v, "mean"]) if v in t.index else float("nan")
        out[f"{v}_se"] = float(t.loc[v, "se"]) if v in t.index else float("nan")
    out["coupling_chance"] = float(t.loc["coupling", "chance"])
    return {c: out[c] for c in COUPLING_METRICS}


def measure_images(model: torch.nn.Module, pixel_values: Tensor, run_dir: Path, k: int,
                   *, labels: list[str] | None = None, progress: bool = False,
                   tokens: str = "cls", both: bool = False) -> dict[str, float]:
    """`record_images` (resumed, or the finished run already in ``run_dir``) in eval
    mode with the training RNG untouched; returns the headline statistic over the images
    (depth-wise at ``tokens``, K = ``k``, p = 1, ujv, pairs l != l') as ``COUPLING_METRICS``;
    with ``both``, one measurement of [CLS] and the last patch gives ``TOKEN_METRICS`` too."""
    from blockcoupling.engine.state import preserved
    from blockcoupling.store.reader import is_run_dir, open_run, run_progress

    with preserved(model):  # the one model-state guard: modes, flags and every RNG restored
        model.eval()
        if is_run_dir(run_dir) and run_progress(run_dir).finished:
            m = open_run(run_dir)
        else:
            m = record_images(model, pixel_values, run_dir, k, labels=labels,
                              progress=progress, resume=is_run_dir(run_dir),
                              tokens=measured_tokens(tokens, both=both), headline=tokens)
    out = token_statistic(m, k, tokens)
    if both:
        for t in ("cls", "last"):
            out.update({f"{c}_{t}": v for c, v in token_statistic(m, k, t).items()})
    return out


# ---------------------------------------------------------------------------- I/O
def is_trained(out_dir: str | Path, config: VitTrainConfig | None = None) -> bool:
    """True when ``out_dir`` holds a finished, undamaged training (of ``config``, if
    given)."""
    from blockcoupling.errors import RunDirError

    out = Path(out_dir)
    try:
        data = _load_metrics(out)
    except RunDirError:
        return False
    if data.get("status") != "complete" or not (out / "model" / "config.json").exists():
        return False
    return config is None or data.get("config_key") == config.key()


# ---------------------------------------------------------------------------- training
EpochCallback = Callable[[dict[str, Any]], None]


def _data_content(config: VitTrainConfig) -> str | None:
    """The content hash of the training's image folder (None: a built-in data set)."""
    if config.data_dir is None or not Path(config.data_dir).is_dir():
        return None
    from blockcoupling.runs.identity import content_hash

    return content_hash(Path(config.data_dir))


def check_training(config: VitTrainConfig, out_dir: str | Path) -> str:
    """What training ``config`` into ``out_dir`` does to that folder
    (``store.folder.decide``), or the one line the training itself would refuse it with;
    nothing is written (``--dry-run``)."""
    out = Path(out_dir)
    return decide(out, TRAINING, resume=True, **_identity(config, out, _data_content(config)))


def train_vit(config: VitTrainConfig, out_dir: str | Path, *, progress: bool = True,
              on_epoch: EpochCallback | None = None, data: ImageData | None = None,
              threads: int | None = None) -> Path:
    """Train one ViT as ``config`` says, into ``out_dir``; returns ``out_dir``.

    Skips the work if ``out_dir`` already holds this config's finished training; resumes
    from ``checkpoint.pt`` after an interruption; refuses a folder holding another config.
    ``on_epoch`` receives each epoch's metrics row (e.g. to report progress to a sweep).
    ``data`` may be passed to share one loaded data set between runs (it must be the one
    ``config`` names). ``threads`` sets ``torch.set_num_threads`` for the call (on a shared
    machine 1 thread per run is often faster than 2 that wait on each other).
    """
    out = Path(out_dir)
    if is_trained(out, config):
        return out
    content = _data_content(config)  # a resume must see the same images
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
    try:  # the folder by the run protocol: locked, another training's refused
        with open_folder(out, TRAINING, resume=True, **_identity(config, out, content)):
            return _train(config, out, progress=progress, on_epoch=on_epoch, data=data,
                          data_content=content)
    finally:
        torch.set_num_threads(old_threads)


#: a training's folder in the run protocol's words (`blockcoupling.store.folder`): running
#: the same training again continues it
TRAINING = VIT_TRAINING


def _identity(config: VitTrainConfig, out: Path, content: str | None) -> dict[str, Any]:
    """How the protocol reads a training folder's identity: no other command's files, the
    same config and the same images as its record (`read_metrics`, verified) states."""
    def differences() -> list[str]:
        if (out / "grid.json").exists():  # an old ViT grid (other kinds: `decide` refuses them)
            raise BlockCouplingError(f"{out} holds a ViT grid (grid.json), not a training; "
                                     "choose another --out")
        if not (out / METRICS_FILE).exists():
            return []
        old = read_metrics(out)
        if old.get("config_key") != config.key():
            raise BlockCouplingError(
                f"{out} holds a training of another config (key {old.get('config_key')}, this "
                f"one {config.key()}); choose another --out or delete that folder")
        before = (old.get("data") or {}).get("content")
        if before is not None and before != content:
            raise BlockCouplingError(
                f"the images in {config.data_dir} changed since {out} started training "
                f"(content {str(before)[7:19]}, now {str(content)[7:19]}); restore them, "
                "or train into another --out")
        return []

    return {"differences": differences,
            "has_results": lambda: any((out / n).exists() for n in (METRICS_FILE,
                                                                     "checkpoint.pt"))}


def _train(config: VitTrainConfig, out: Path, *, progress: bool, on_epoch: EpochCallback | None,  # noqa: C901 - the training loop with its monitor, resume and stop rules
           data: ImageData | None, data_content: str | None) -> Path:
    t_start, cpu_start = time.perf_counter(), time.process_time()

    if data is None:
        t0 = time.perf_counter()
        data = load_image_data(config.dataset, image_size=config.image_size,
                               data_dir=config.data_dir, train_limit=config.train_limit,
                               test_limit=config.test_limit,
                               subset_seed=config.seed if config.subset_per_seed else None)
        data_seconds = time.perf_counter() - t0
    else:
        data_seconds = 0.0
    if config.label_noise is not None:  # a copy: a shared data set is left untouched
        from dataclasses import replace as _replace

        from blockcoupling.studies.vit.data import noisy_labels

        data = _replace(data, train_y=noisy_labels(data.train_y, config.label_noise,
                                                   len(data.classes), config.seed))
    shape = resolve_shape(config.preset, hidden_size=config.hidden_size, depth=config.depth,
                          heads=config.heads)
    if config.k > shape.hidden_size:
        raise BlockCouplingError(f"k={config.k} exceeds the ViT's width {shape.hidden_size}")
    model = build_vit(shape, image_size=data.image_size, num_channels=data.num_channels,
                      num_labels=len(data.classes), drop_path=config.drop_path,
                      seed=config.seed, id2label=dict(enumerate(data.classes)))
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr,
                                  betas=(0.9, 0.999))
    n_train = len(data.train_y)
    steps_per_epoch = config.steps_per_epoch(n_train)
    total_steps = config.total_steps(n_train)
    warmup_steps = config.warmup_steps(n_train)
    n_epochs = config.epochs_for(n_train)

    history: list[dict[str, Any]] = []
    start_epoch = 1
    ckpt_path = out / "checkpoint.pt"
    if ckpt_path.exists():
        ckpt = _load_checkpoint(ckpt_path)
        if ckpt.get("config_key") == config.key():
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            history = ckpt["history"]
            start_epoch = int(ckpt["epoch"]) + 1

    term = None
    if config.coupling_term is not None:
        from blockcoupling.studies.vit.coupling_term import CouplingTerm

        term = CouplingTerm(model, config.coupling_term, config.coupling_term_images,
                            config.coupling_term_directions, config.tokens, config.seed)
    mon_x = data.test_x[: config.monitor_images]
    mon_labels = [data.classes[int(y)] for y in data.test_y[: config.monitor_images]]
    eval_tr = slice(0, config.eval_train_limit)

    def record(epoch: int, row: dict[str, Any]) -> None:
        history.append(row)
        metrics = _metrics_doc(config, data, shape, history, "running", data_seconds)
        metrics["data"]["content"] = data_content
        _write_json(out / METRICS_FILE, metrics)
        if on_epoch is not None:
            on_epoch(row)

    measured = set(config.measured_epochs(n_train))

    def monitored(epoch: int) -> bool:
        return epoch in measured

    def coupling_row(epoch: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        c0 = time.process_time()
        c = measure_images(model, mon_x, out / "coupling" / f"epoch-{epoch:04d}", config.k,
                           labels=mon_labels, tokens=config.tokens)
        return {**c, "seconds_measure": time.perf_counter() - t0,
                "cpu_seconds_measure": time.process_time() - c0}

    if start_epoch == 1 and not history:  # epoch 0: the initialisation
        row: dict[str, Any] = {"epoch": 0, "lr": 0.0, "train_objective": float("nan")}
        tr_loss, tr_acc = evaluate(model, data.train_x[eval_tr], data.train_y[eval_tr])
        te_loss, te_acc = evaluate(model, data.test_x, data.test_y)
        row.update(train_loss=tr_loss, train_accuracy=tr_acc, test_loss=te_loss,
                   test_accuracy=te_acc, seconds_train=0.0, cpu_seconds_train=0.0)
        row.update(coupling_row(0) if config.monitor_every > 0 else
                   {**NO_COUPLING, "seconds_measure": 0.0, "cpu_seconds_measure": 0.0})
        if term is not None:
            row.update(term.record(mon_x), train_ce=math.nan, coupling_term=math.nan)
        record(0, row)

    bar = _progress(range(start_epoch, n_epochs + 1), progress, f"train {out.name}")
    for epoch in bar:
        # Every epoch is seeded by (seed, epoch): a resumed run equals an uninterrupted one.
        g = torch.Generator().manual_seed(config.seed * 100_003 + epoch)
        torch.manual_seed(config.seed * 100_003 + epoch)  # drop-path draws
        rng = np.random.default_rng([config.seed, epoch])
        model.train()
        t0, c0 = time.perf_counter(), time.process_time()
        perm = torch.randperm(n_train, generator=g)
        objective_sum, seen, ce_sum, term_sum = 0.0, 0, 0.0, 0.0
        for i in range(steps_per_epoch):
            step = (epoch - 1) * steps_per_epoch + i
            if step >= total_steps:  # --steps: the last epoch stops early
                break
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total_steps, warmup_steps,
                                    config.lr * config.lr_scale, config.min_lr * config.lr_scale)
            idx = perm[i * config.batch_size:(i + 1) * config.batch_size]
            x, y = data.train_x[idx], data.train_y[idx]
            loss = train_loss(model, config, x, y, len(data.classes), g, rng)
            if term is not None:
                ce_sum += loss.item() * len(y)
                added, value = term.loss(x, step)
                term_sum += value * len(y)
                if added is not None:
                    loss = loss + added
            if not torch.isfinite(loss):
                raise BlockCouplingError(
                    f"the training loss became {float(loss)} at epoch {epoch}, step {i}; "
                    "lower --lr or raise --warmup-epochs"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            objective_sum += loss.item() * len(y)
            seen += len(y)
        seconds_train = time.perf_counter() - t0
        cpu_seconds_train = time.process_time() - c0
        tr_loss, tr_acc = evaluate(model, data.train_x[eval_tr], data.train_y[eval_tr])
        te_loss, te_acc = evaluate(model, data.test_x, data.test_y)
        row = {"epoch": epoch, "lr": optimizer.param_groups[0]["lr"],
               "train_objective": objective_sum / max(seen, 1), "train_loss": tr_loss,
               "train_accuracy": tr_acc, "test_loss": te_loss, "test_accuracy": te_acc,
               "seconds_train": seconds_train, "cpu_seconds_train": cpu_seconds_train,
               "seconds_eval": time.perf_counter() - t0 - seconds_train}
        if term is not None:  # the objective's parts, the exact alignment, the weight norm
            row.update(train_ce=ce_sum / max(seen, 1), coupling_term=term_sum / max(seen, 1),
                       **term.record(mon_x))
        row.update(coupling_row(epoch) if monitored(epoch) else
                   {**NO_COUPLING, "seconds_measure": 0.0, "cpu_seconds_measure": 0.0})
        if epoch < n_epochs:  # the checkpoint first: a finished epoch is never lost
            _save_checkpoint(ckpt_path, config, model, optimizer, [*history, row], epoch)
        record(epoch, row)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(test_acc=f"{te_acc:.3f}", coupling=f"{row['coupling']:.3f}")

    # The trained model, then its final measurement, then the "complete" status.
    _save_model(model, out / "model")
    t0 = time.perf_counter()
    final = measure_images(model, data.test_x[: config.final_images], out / "coupling" / "final",
                           config.k, labels=[data.classes[int(y)]
                                             for y in data.test_y[: config.final_images]],
                           tokens=config.tokens, both=True)
    final_seconds = time.perf_counter() - t0
    if term is not None:  # the exact alignment of the final images and the weight norm
        final.update(term.record(data.test_x[: config.final_images]))
    metrics = _metrics_doc(config, data, shape, history, "complete", data_seconds)
    metrics["data"]["content"] = data_content
    metrics["final"] = {**{k: history[-1][k] for k in ("train_loss", "train_accuracy",
                                                       "test_loss", "test_accuracy")},
                        **final, "seconds_measure": final_seconds,
                        "images": int(min(config.final_images, len(data.test_y)))}
    metrics["seconds_total"] = time.perf_counter() - t_start  # this session's (a resumed
    metrics["cpu_seconds_total"] = time.process_time() - cpu_start  # run: since its resume)
    metrics["model_sha256"] = _model_sha256(out)
    _write_json(out / METRICS_FILE, metrics)
    ckpt_path.unlink(missing_ok=True)
    return out


#: the full splits' sizes (train, test), for estimates without the data
SPLIT_SIZES: dict[str, tuple[int, int]] = {"digits": (1437, 360), "cifar10": (50000, 10000)}


def split_sizes(config: VitTrainConfig) -> tuple[int, int, int]:
    """(train, test, evaluated per epoch) image counts of ``config``: the full splits'
    `SPLIT_SIZES`, or the limits."""
    n_train, n_test = SPLIT_SIZES[config.dataset]
    n_train = min(n_train, config.train_limit or n_train)
    n_test = min(n_test, config.test_limit or n_test)
    return n_train, n_test, n_test + min(n_train, config.eval_train_limit or n_train)


def model_shape(config: VitTrainConfig) -> tuple[Any, int, int]:
    """(VitShape, image side, channels) of the model ``config`` trains."""
    from blockcoupling.studies.vit.data import DEFAULT_IMAGE_SIZE

    shape = resolve_shape(config.preset, hidden_size=config.hidden_size, depth=config.depth,
                          heads=config.heads)
    size = config.image_size or DEFAULT_IMAGE_SIZE[config.dataset]
    return shape, size, 1 if config.dataset == "digits" else 3


def estimate_cost(config: VitTrainConfig, *, steps: int = 3, threads: int | None = None
                  ) -> dict[str, Any]:
    """The cost of training ``config`` here, from a short measured run: ``steps`` timed
    training steps (after one untimed) of its model, batch size and regularisers on random
    images of its data set's shape, and one timed eval batch; scaled to the full epochs
    (split sizes from `SPLIT_SIZES`, or the limits). The coupling measurements are not
    counted. Nothing is written; the data set need not be present."""
    if steps < 1:
        raise BlockCouplingError("steps must be at least 1")
    n_train, n_test, n_eval = split_sizes(config)
    shape, size, channels = model_shape(config)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_vit(shape, image_size=size, num_channels=channels, num_labels=10,
                              drop_path=config.drop_path, seed=config.seed)
            optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay),
                                          lr=config.lr * config.lr_scale)
            g = torch.Generator().manual_seed(config.seed)
            rng = np.random.default_rng(config.seed)
            batch = min(config.batch_size, n_train)
            x = torch.randn(batch, channels, size, size, generator=g)
            y = torch.randint(0, 10, (batch,), generator=g)
            model.train()
            times, cpu_times = [], []
            for _ in range(steps + 1):
                t0, c0 = time.perf_counter(), time.process_time()
                loss = train_loss(model, config, x, y, 10, g, rng)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                times.append(time.perf_counter() - t0)
                cpu_times.append(time.process_time() - c0)
            eval_x = torch.randn(min(256, n_eval), channels, size, size, generator=g)
            t0 = time.perf_counter()
            evaluate(model, eval_x, torch.zeros(len(eval_x), dtype=torch.long))
            eval_per_image = (time.perf_counter() - t0) / len(eval_x)
    finally:
        torch.set_num_threads(old_threads)
    step_s = float(np.mean(times[1:]))
    steps_per_epoch = config.steps_per_epoch(n_train)
    epoch_s = step_s * steps_per_epoch + eval_per_image * n_eval
    cpu_step_s = float(np.mean(cpu_times[1:]))
    epochs, total = config.epochs_for(n_train), config.total_steps(n_train)
    seconds = step_s * total + eval_per_image * n_eval * epochs
    return {"config": config.to_dict(), "threads": torch.get_num_threads() if threads is None
            else int(threads), "measured_steps": steps, "seconds_per_step": step_s,
            "steps_per_epoch": steps_per_epoch, "eval_images_per_epoch": n_eval,
            "seconds_per_epoch": epoch_s, "epochs": epochs,
            "seconds_total": seconds, "hours_total": seconds / 3600,
            "cpu_seconds_per_step": cpu_step_s,
            "cpu_hours_training": cpu_step_s * total / 3600,
            "not_counted": "coupling measurements (monitor_every, final), data loading"}


def _progress(it: range, enabled: bool, desc: str) -> Any:
    if not enabled:
        return it
    from blockcoupling.progress import bar

    return bar(it, desc=desc, unit="epoch")


def _metrics_doc(config: VitTrainConfig, data: ImageData, shape: Any, history: list[dict[str, Any]],
                 status: str, data_seconds: float) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "status": status,
        "config": config.to_dict(),
        "config_key": config.key(),
        "model": {**asdict(shape), "arch": "beit (DeiT-style)",
                  "tokens": {"cls": "cls (position 0)", "last": "last patch",
                             "all": "all positions"}[config.tokens],
                  "image_size": data.image_size, "num_channels": data.num_channels},
        "data": {"name": data.name, "train": len(data.train_y), "test": len(data.test_y),
                 "label_noise": config.label_noise or 0.0,
                 "wrong_labels": int(round((config.label_noise or 0.0) * len(data.train_y))),
                 "steps": config.total_steps(len(data.train_y)),
                 "classes": list(data.classes), "seconds_load": data_seconds},
        "regularisers": {"augment": config.augmentation, "mixup": config.mixup_alpha,
                         "cutmix": config.cutmix, "label_smoothing": config.label_smoothing,
                         "random_erasing": config.random_erasing,
                         "lr": config.lr * config.lr_scale,
                         "min_lr": config.min_lr * config.lr_scale},
        "threads": torch.get_num_threads(),
        "reproducibility": reproducibility(config),
        "epochs": history,
    }


def reproducibility(config: VitTrainConfig) -> dict[str, Any]:
    """What a bit-identical rerun needs: the seeds, torch's thread count (the float sums of
    a training step depend on it: the same config at another thread count gives slightly
    different weights) and the library versions."""
    import platform

    import transformers

    return {"seed": config.seed, "epoch_seed": "seed * 100003 + epoch (torch and numpy)",
            "init_seed": config.seed, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "note": "bit-reproducible only at the same torch thread count and versions"}


def _save_checkpoint(path: Path, config: VitTrainConfig, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer, history: list[dict[str, Any]],
                     epoch: int) -> None:
    """The resume point, sealed (``store.verified.sealed_bytes``: its checksum inside it)."""
    import io

    from blockcoupling.store.fileio import atomic_write_bytes
    from blockcoupling.store.verified import sealed_bytes

    sink = io.BytesIO()
    torch.save({"config_key": config.key(), "epoch": epoch, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "history": history}, sink)
    atomic_write_bytes(path, sealed_bytes(sink.getvalue()))


def _load_checkpoint(path: Path) -> dict[str, Any]:
    """The resume point `_save_checkpoint` wrote, verified (one written before checkpoints
    were sealed is read as it is), or one line: a damaged checkpoint is deleted by hand and
    the training starts again from its first epoch."""
    import io

    from blockcoupling.store.verified import load_sealed_bytes, stored_error

    hint = (f"Delete {path} and run the same command again: the training starts again from "
            "its first epoch (bit-identically)")
    payload = load_sealed_bytes(path, hint)
    try:  # our own file, verified (a sealed one) or of an older blockcoupling: not a user's
        ckpt = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as err:  # torch / pickle raise many types for a damaged file
        raise stored_error(path, f"is not a readable checkpoint ({type(err).__name__})",
                           hint) from err
    if not isinstance(ckpt, dict) or not {"epoch", "model", "optimizer", "history"} <= set(ckpt):
        raise stored_error(path, "is not a vit-train checkpoint", hint)
    return ckpt


def _save_model(model: Any, folder: Path) -> None:
    from blockcoupling.loading import save_model

    with atomic_path(folder) as tmp:
        save_model(model, tmp)


__all__ = ["COUPLING_METRICS", "RECIPES", "STATISTIC_TOKENS", "TOKENS", "TOKEN_METRICS", "VitTrainConfig",
           "check_training", "estimate_cost", "evaluate", "is_trained", "lr_at", "measure_images",
           "measured_tokens", "param_groups", "read_metrics", "record_images", "regularise",
           "reproducibility", "token_statistic", "train_loss", "train_vit"]
