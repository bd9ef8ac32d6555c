"""Typed progress events: a public way to see where a measurement spends its time.

``measure(..., on_event=callback)`` (also ``iter_measure`` and ``measure_to_dir``) calls
``callback(event)`` with one [`MeasureEvent`][blockcoupling.engine.events.MeasureEvent] per finished piece of work:

============  ==========================================================================
phase         one event per ...
============  ==========================================================================
capture       batch: the forward pass that records the block boundaries (``prompt_ids``)
trajectory    batch: the trajectory and token-metric tables of the batch
jacobian      prompt and layer: the dense Jacobian blocks of that layer (VJP/JVP batches)
svd           prompt, layer and token pair: the top-K factors of one Jacobian; ``method``
              says how (``dense``, ``matrix_free``, ``dense_fallback``, ``..._fast`` where
              the decode-step fast path supplied the Jacobian); for ``matrix_free`` the
              seconds include the operator products
coupling      prompt and layer: the coupling matrices of every Jacobian measured at that layer
tables        prompt: the coupling rows and figure arrays built from the matrices
prompt        prompt: all of the above for one prompt (capture excluded)
============  ==========================================================================

A callback must not raise (an exception propagates and stops the measurement, which still
leaves the model as it found it). Timings are wall-clock seconds (``time.perf_counter``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Phase = Literal["capture", "trajectory", "jacobian", "svd", "coupling", "tables", "prompt"]
PHASES: tuple[str, ...] = ("capture", "trajectory", "jacobian", "svd", "coupling", "tables",
                           "prompt")


@dataclass(frozen=True)
class MeasureEvent:
    """One finished piece of work (see the module docstring for the phases)."""

    phase: Phase
    seconds: float
    prompt_id: str | None = None  # None for batch phases (capture, trajectory)
    layer: int | None = None
    token_in: int | None = None
    token_out: int | None = None
    method: str | None = None  # svd events: how the Jacobian was computed
    prompt_ids: tuple[str, ...] = field(default=())  # batch phases: the batch's prompts


EventCallback = Callable[[MeasureEvent], None]


def ignore(event: MeasureEvent) -> None:
    """The default callback: does nothing."""


__all__ = ["PHASES", "EventCallback", "MeasureEvent", "Phase", "ignore"]
