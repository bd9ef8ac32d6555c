"""The coupling term of a ViT training (``VitTrainConfig.coupling_term``): the loss adds
``-strength x`` the blocks' depth-wise traceless alignment at the headline token
(`blockcoupling.engine.surrogate`), so a positive strength raises coupling and a negative one
lowers it; 0 trains as without it and only records it.

At each step the alignment is estimated on the first ``coupling_term_images`` images of the
batch (before augmentation) with ``coupling_term_directions`` Haar-random directions drawn
from a generator of its own (seeded by the run's seed and the step), so the batches, the
drop-path draws and the initialisation are the same in every arm of a seed. At the end of
each epoch the exact alignment (all d directions) of the monitored test images is recorded
with the weight norm.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from blockcoupling.errors import BlockCouplingError

__all__ = ["CouplingTerm", "weight_norm"]


def weight_norm(model: nn.Module) -> float:
    """The L2 norm of all the model's parameters together."""
    with torch.no_grad():
        return math.sqrt(sum(float((p.double() ** 2).sum()) for p in model.parameters()))


class CouplingTerm:
    """The term of one training: its strength, images, directions and token position."""

    def __init__(self, model: nn.Module, strength: float, images: int, directions: int,
                 tokens: str, seed: int) -> None:
        from blockcoupling.engine.blocks import find_blocks, get_blocks

        if tokens == "all":
            raise BlockCouplingError("the coupling term is defined at one token: train with "
                                     "--tokens cls or last")
        self.model = model
        self.blocks = get_blocks(model, find_blocks(model))
        self.strength, self.images, self.seed = float(strength), int(images), int(seed)
        config: Any = model.config
        self.d = int(config.hidden_size)
        self.patches = int(config.image_size // config.patch_size) ** 2
        self.directions = min(int(directions), self.d)
        self.token = 0 if tokens == "cls" else -1

    def _alignment(self, x: Tensor, frame: Tensor) -> Tensor:
        from blockcoupling.engine.surrogate import depth_alignment, mean_offdiagonal

        def forward() -> None:
            self.model(pixel_values=x)

        token = self.token if self.token >= 0 else self.patches  # last: the patches + [CLS]
        return mean_offdiagonal(depth_alignment(self.model, self.blocks, forward, token, frame))

    def loss(self, x: Tensor, step: int) -> tuple[Tensor | None, float]:
        """(the term to add to the loss, or None at strength 0; the estimate's value)."""
        if self.strength == 0.0:
            return None, math.nan
        from blockcoupling.engine.surrogate import random_frame

        g = torch.Generator().manual_seed(self.seed * 1_000_033 + 7 * step + 3)
        frame = random_frame(self.d, self.directions, g)
        value = self._alignment(x[: self.images], frame)
        return -self.strength * value, float(value.detach())

    def exact(self, x: Tensor) -> float:
        """The exact alignment (every direction) of the images ``x``, without a graph."""
        with torch.no_grad():
            return float(self._alignment(x, torch.eye(self.d)))

    def record(self, x: Tensor) -> dict[str, Any]:
        """What an epoch row records: the exact alignment of ``x`` and the weight norm."""
        return {"alignment": self.exact(x), "weight_norm": weight_norm(self.model)}
