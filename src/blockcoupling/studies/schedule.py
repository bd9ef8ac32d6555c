"""The learning-rate schedule of the studies' training loops (the tiny LMs, the ViTs)."""

from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Linear warm-up from lr/warmup_steps to lr, then cosine from lr down to min_lr at
    ``total_steps`` (``min_lr = lr``: constant after the warm-up); ``step`` is 0-based."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
