"""The DeiT-style ViT that the study trains: transformers' BEiT with DeiT's choices.

Why BEiT: timm and torchvision do not import with the CPU-only torch wheel here, and of the
transformers vision models that build offline from a config, BEiT is the one whose options
give exactly a DeiT block stack:

- ``drop_path_rate`` with the *linear* per-block rule of timm's DeiT (block l of L drops its
  residual branch with probability ``rate * (l - 1) / (L - 1)``; Dinov2 uses one rate for all);
- ``layer_scale_init_value=0``: no LayerScale (DeiT has none);
- ``use_absolute_position_embeddings=True``, no relative position bias (DeiT's learned
  absolute positions);
- ``use_mean_pooling=False``: classify from the [CLS] token after the final LayerNorm.

Remaining differences from timm's DeiT, none of which touches the blocks' residual form:
BEiT's key projection has no bias, and [CLS] and positions start at zero (timm draws them
from N(0, 0.02^2)). The model is a `BeitForImageClassification`, so it
saves and loads with ``save_pretrained`` / ``from_pretrained`` and ``find_blocks`` finds its
blocks at ``beit.layers`` (final norm ``beit.layernorm``). Token 0 is [CLS].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from blockcoupling.errors import BlockCouplingError


@dataclass(frozen=True)
class VitShape:
    """Width, depth and patching of a ViT (the paper: DeiT-Tiny, 192 wide, 12 deep, 3 heads)."""

    hidden_size: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0
    patch_size: int = 4


#: Named shapes. ``deit-tiny`` is the paper's (arXiv v1: depth 12; the ICLR text says 24,
#: use ``--depth 24``); ``tiny`` trains on digits on two CPU cores in seconds per epoch.
PRESETS: dict[str, VitShape] = {
    "deit-tiny": VitShape(hidden_size=192, depth=12, heads=3, mlp_ratio=4.0, patch_size=4),
    "small": VitShape(hidden_size=96, depth=6, heads=3, mlp_ratio=4.0, patch_size=4),
    "tiny": VitShape(hidden_size=64, depth=4, heads=4, mlp_ratio=2.0, patch_size=4),
}


def resolve_shape(preset: str, **overrides: int | float | None) -> VitShape:
    """A preset with any non-None field replaced (e.g. ``depth=24``)."""
    if preset not in PRESETS:
        raise BlockCouplingError(
            f"unknown ViT preset {preset!r}; choose one of {', '.join(PRESETS)}"
        )
    fields = asdict(PRESETS[preset])
    fields.update({k: v for k, v in overrides.items() if v is not None})
    shape = VitShape(**fields)
    if shape.hidden_size % shape.heads:
        raise BlockCouplingError(
            f"hidden size {shape.hidden_size} is not divisible by {shape.heads} heads"
        )
    if min(shape.hidden_size, shape.depth, shape.heads, shape.patch_size) < 1:
        raise BlockCouplingError(f"ViT shape {shape} has a non-positive size")
    return shape


def build_vit(shape: VitShape, *, image_size: int, num_channels: int, num_labels: int,
              drop_path: float, seed: int = 0,
              id2label: dict[int, str] | None = None) -> torch.nn.Module:
    """A freshly initialised DeiT-style ``BeitForImageClassification`` (seeded)."""
    from transformers import BeitConfig, BeitForImageClassification

    if not 0.0 <= drop_path < 1.0:
        raise BlockCouplingError(f"drop-path rate {drop_path} must be in [0, 1)")
    if image_size % shape.patch_size:
        raise BlockCouplingError(
            f"image size {image_size} is not a multiple of the patch size {shape.patch_size}"
        )
    # num_labels, id2label, label2id go to PretrainedConfig through **kwargs
    config = BeitConfig(  # type: ignore[call-arg]
        image_size=image_size,
        patch_size=shape.patch_size,
        num_channels=num_channels,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.depth,
        num_attention_heads=shape.heads,
        intermediate_size=int(round(shape.hidden_size * shape.mlp_ratio)),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=float(drop_path),
        layer_scale_init_value=0.0,
        use_absolute_position_embeddings=True,
        use_relative_position_bias=False,
        use_shared_relative_position_bias=False,
        use_mean_pooling=False,
        num_labels=num_labels,
        id2label=id2label or {i: str(i) for i in range(num_labels)},
        label2id={v: k for k, v in (id2label or {i: str(i) for i in range(num_labels)}).items()},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = BeitForImageClassification(config)
        except (RuntimeError, TypeError, OverflowError, MemoryError) as err:
            # a width whose tensors' sizes overflow or do not fit in memory
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise BlockCouplingError(
                f"a ViT of width {shape.hidden_size} and depth {shape.depth} cannot be built "
                f"({why[:160]}); give a smaller --hidden-size or --depth") from None
    return model


def load_vit(path: str | Path) -> torch.nn.Module:
    """A trained model from a ``vit-train`` output folder (or its ``model/`` folder); the
    weights of an output folder are checked against the checksum its record holds first
    (``vit.record.read_metrics``: one line naming a damaged file and the repair)."""
    from transformers import BeitForImageClassification

    from blockcoupling.studies.vit.record import METRICS_FILE, read_metrics

    path = Path(path)
    if (path / METRICS_FILE).exists():
        read_metrics(path)
    folder = path / "model" if (path / "model" / "config.json").exists() else path
    if not (folder / "config.json").exists():
        raise BlockCouplingError(
            f"{path} holds no trained ViT (no model/config.json); run `blockcoupling vit-train "
            f"--out {path}` first"
        )
    return BeitForImageClassification.from_pretrained(folder).eval()


__all__ = ["PRESETS", "VitShape", "build_vit", "load_vit", "resolve_shape"]
