"""The coupling monitor as a Lightning callback (``lightning`` is an optional dependency).

``trainer = L.Trainer(callbacks=[CouplingLightningCallback(tok, prompts, every=500,
out="runs/monitor", model_attr="model")])``: at the end of every training batch whose
``trainer.global_step`` is due, the module (or its attribute ``model_attr``, e.g. the wrapped
HuggingFace model) is measured by a [`CouplingMonitor`][blockcoupling.studies.monitor.CouplingMonitor],
the step's `coupling_scalars` go to every logger of the
trainer (``trainer.loggers``: CSV, TensorBoard, W&B, ...) at that step and at no other (step 0,
measured at train start, included), and the batch's loss (the ``loss`` of the training step's
output) is stored beside the coupling.

The scalars go to the loggers directly, not through ``pl_module.log``: Lightning logs what
``self.log`` received at its own logging cadence, one step behind ``global_step``, and repeats
the last value at later logging steps, so a tracker would show values where nothing was
measured.
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
    """Arguments as [`CouplingMonitor`][blockcoupling.studies.monitor.CouplingMonitor]; ``model_attr``: measure ``pl_module.<attr>``
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

    def _log(self, trainer: Any, step: int) -> None:
        if self.monitor.last_scalars:
            for logger in trainer.loggers:
                logger.log_metrics(dict(self.monitor.last_scalars), step=int(step))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.open()
        if self.at_start and trainer.is_global_zero:
            if self.monitor.step(self._model(pl_module), trainer.global_step,
                                 force=True) is not None:
                self._log(trainer, trainer.global_step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not trainer.is_global_zero:
            return
        step = trainer.global_step  # optimizer steps taken: the monitor's step
        if self.monitor.step(self._model(pl_module), step, loss=_loss(outputs)) is not None:
            self._log(trainer, step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for logger in trainer.loggers:
            logger.save()
        self.monitor.close()
