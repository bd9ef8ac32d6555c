"""The coupling monitor as a Lightning callback (``lightning`` is an optional dependency).

``trainer = L.Trainer(callbacks=[CouplingLightningCallback(tok, prompts, every=500,
out="runs/monitor", model_attr="model")])``: at the end of every training batch whose
``trainer.global_step`` is due, the module (or its attribute ``model_attr``, e.g. the wrapped
HuggingFace model) is measured by a :class:`~blockcoupling.studies.monitor.CouplingMonitor`,
the step's :func:`~blockcoupling.studies.monitor.coupling_scalars` are logged with
``pl_module.log_dict`` (so every Lightning logger carries them), and the batch's loss (the
``loss`` of the training step's output) is stored beside the coupling.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from blockcoupling.studies.monitor import CouplingMonitor

__all__ = ["CouplingLightningCallback"]


def _loss(outputs: Any) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return float(loss.detach()) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


class CouplingLightningCallback(Callback):
    """Arguments as :class:`CouplingMonitor`; ``model_attr``: measure ``pl_module.<attr>``
    instead of the LightningModule itself; ``at_start``: measure step 0 at train start."""

    def __init__(self, tokenizer: Any, prompts: Any, *, every: int | None = 500,
                 steps: Sequence[int] = (), out: str | os.PathLike[str] = "runs/monitor",
                 model_attr: str | None = None, at_start: bool = True, **kwargs: Any) -> None:
        self.model_attr = model_attr
        self.at_start = at_start
        self.monitor = CouplingMonitor(tokenizer, prompts, every=every, steps=steps, out=out,
                                       **kwargs)

    def _model(self, pl_module: Any) -> Any:
        return getattr(pl_module, self.model_attr) if self.model_attr else pl_module

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.open()
        if self.at_start and trainer.is_global_zero:
            self.monitor.step(self._model(pl_module), trainer.global_step, force=True)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not trainer.is_global_zero:
            return
        m = self.monitor.step(self._model(pl_module), trainer.global_step, loss=_loss(outputs))
        if m is not None and self.monitor.last_scalars:
            pl_module.log_dict(self.monitor.last_scalars, on_step=True, on_epoch=False,
                               rank_zero_only=True)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.close()
