"""DeiT's training regularisers, implemented on image tensors (torchvision and timm do not
import with the CPU-only torch here). Every draw comes from the caller's generators, so a
training epoch seeded by (seed, epoch) is reproducible.

- `crop_flip` - random crop after 4 pixels of zero padding, and (``flip=True``) a
  horizontal flip with probability 1/2. This is *not* RandAugment (DeiT's policy of 2 random
  photometric/geometric operations of magnitude 9); it is the standard CIFAR crop-and-flip.
- `random_erase` - timm's random erasing ("pixel" mode): with probability ``prob`` an
  image gets one rectangle of 2-33 % of its area, aspect ratio log-uniform in [0.3, 3.3],
  filled with N(0, 1) noise (the images are normalised per channel).
- `mix_batch` - Mixup (Beta(alpha, alpha) convex mix of two images and their targets)
  and CutMix (a box of area 1 - lambda pasted from another image; lambda is then the kept
  area); with both on, each batch uses one of them with probability 1/2 (timm's switch).
- `smooth_targets` - label smoothing: ``(1 - eps) * one_hot + eps / classes``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

#: ``augment`` choices: none; crop (pad 4, random crop); crop-flip (and a horizontal flip)
AUGMENTS: tuple[str, ...] = ("none", "crop", "crop-flip")


def crop_flip(x: Tensor, g: torch.Generator, *, flip: bool = True, pad: int = 4) -> Tensor:
    """(n, C, H, W) -> (n, C, H, W): a random crop of the zero-padded images, then (``flip``)
    a horizontal flip of each image with probability 1/2."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=g)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=g)
    rows = dy[:, None] + torch.arange(h)[None, :]  # (n, h)
    cols = dx[:, None] + torch.arange(w)[None, :]  # (n, w)
    idx = torch.arange(n)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if flip:
        mask = torch.rand(n, generator=g) < 0.5
        out[mask] = out[mask].flip(-1)
    return out.contiguous()


def random_erase(x: Tensor, g: torch.Generator, prob: float) -> Tensor:
    """(n, C, H, W) -> a copy where each image, with probability ``prob``, has one random
    rectangle replaced by N(0, 1) noise (timm's RandomErasing, mode "pixel", 10 tries)."""
    if prob <= 0:
        return x
    out = x.clone()
    n, c, h, w = x.shape
    hit = torch.rand(n, generator=g) < prob
    for i in torch.nonzero(hit).flatten().tolist():
        for _ in range(10):
            area = h * w * float(torch.empty(1).uniform_(0.02, 1 / 3, generator=g))
            log_ratio = float(torch.empty(1).uniform_(math.log(0.3), math.log(1 / 0.3),
                                                      generator=g))
            eh = int(round(math.sqrt(area * math.exp(log_ratio))))
            ew = int(round(math.sqrt(area / math.exp(log_ratio))))
            if 0 < eh < h and 0 < ew < w:
                top = int(torch.randint(0, h - eh + 1, (1,), generator=g))
                left = int(torch.randint(0, w - ew + 1, (1,), generator=g))
                out[i, :, top:top + eh, left:left + ew] = torch.randn(c, eh, ew, generator=g)
                break
    return out


def smooth_targets(y: Tensor, classes: int, eps: float) -> Tensor:
    """(n,) int labels -> (n, classes) targets ``(1 - eps) * one_hot + eps / classes``."""
    one_hot = torch.nn.functional.one_hot(y, classes).float()
    return one_hot * (1.0 - eps) + eps / classes if eps > 0 else one_hot


def mix_batch(x: Tensor, targets: Tensor, *, mixup: float, cutmix: float, g: torch.Generator,
              rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    """Mixup or CutMix of a batch with a random permutation of itself; ``(x, targets)``
    unchanged when both alphas are 0."""
    if mixup <= 0 and cutmix <= 0:
        return x, targets
    use_cutmix = cutmix > 0 and (mixup <= 0 or rng.random() < 0.5)
    alpha = cutmix if use_cutmix else mixup
    lam = float(rng.beta(alpha, alpha))
    perm = torch.randperm(len(x), generator=g)
    if use_cutmix:
        h, w = x.shape[-2:]
        ch, cw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        cy, cx = int(rng.integers(h)), int(rng.integers(w))
        y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, h)
        x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, w)
        x = x.clone()
        x[:, :, y0:y1, x0:x1] = x[perm][:, :, y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)  # the area actually kept
    else:
        x = lam * x + (1 - lam) * x[perm]
    return x, lam * targets + (1 - lam) * targets[perm]


__all__ = ["AUGMENTS", "crop_flip", "mix_batch", "random_erase", "smooth_targets"]
