"""Which layers took the decode-step fast path (engine/fastpath.py), and why the others did not.

One record per run, ``meta["fast_path"]``: layer (a string key, as JSON stores it) -> ``True``
where ``J^l_tt`` came from the fast path, else the reason it did not, one line. Reasons that
are a property of the run, not a failure (an encoder, the option off, no ``J^l_tt`` at a
layer), start with one of `NOT_ATTEMPTED`: recorded, never warned about; `fallback_warning`
is the one warning of a run, naming every refused layer and its reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = [
    "FAST_PATH_KEY",
    "FastPathWarning",
    "NOT_ATTEMPTED",
    "OFF",
    "NOT_CAUSAL",
    "NO_DIAGONAL",
    "describe",
    "fallback_layers",
    "fallback_warning",
    "fast_path_layers",
    "layer_ranges",
    "to_meta",
]

FAST_PATH_KEY = "fast_path"
OFF = "off (fast_path=False)"
NOT_CAUSAL = "not causal (an encoder): no decode step"
NO_DIAGONAL = "not used (no J^l_tt measured at this layer)"
#: reasons recorded for a layer where the fast path was not tried: never a fallback
NOT_ATTEMPTED: tuple[str, ...] = (OFF, NOT_CAUSAL, NO_DIAGONAL)

Record = Mapping[int, "bool | str"]


class FastPathWarning(UserWarning):
    """A causal model's fast path was refused at some layers: their J^l_tt take the generic
    path (same values, slower). Given once per run; ``meta["fast_path"]`` records each layer."""


def to_meta(record: Record) -> dict[str, bool | str]:
    """The record as ``meta`` stores it: string layer keys in layer order (JSON-safe)."""
    return {str(layer): record[layer] for layer in sorted(record)}


def fast_path_layers(meta: Mapping[str, Any]) -> dict[int, bool | str]:
    """layer -> ``True`` | reason, from a run's ``meta`` (empty where nothing was recorded:
    a run without Jacobians, or written before this record existed)."""
    raw = meta.get(FAST_PATH_KEY) or {}
    return {int(k): (True if v is True else str(v)) for k, v in dict(raw).items()}


def fallback_layers(record: Record) -> dict[int, str]:
    """The layers whose fast path was tried and refused: layer -> reason."""
    return {layer: str(v) for layer, v in record.items()
            if v is not True and not str(v).startswith(NOT_ATTEMPTED)}


def layer_ranges(layers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    out: list[str] = []
    for layer in sorted(layers):
        if out and out[-1].split("-")[-1] == str(layer - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{layer}"
        else:
            out.append(str(layer))
    return ", ".join(out)


def _grouped(record: Mapping[int, str]) -> str:
    """``"layers 1-3: <kind> (layer 1: <detail>); layer 5: <reason>"``: layers grouped by
    the kind of their reason (its text before the first ``": "``; the details, such as a
    relative error, differ from layer to layer), with the first layer's detail."""
    groups: dict[str, list[int]] = {}
    for layer, why in sorted(record.items()):
        groups.setdefault(why.split(": ", 1)[0], []).append(layer)
    parts = []
    for kind, layers in groups.items():
        first = record[layers[0]]
        words = "layer" if len(layers) == 1 else "layers"
        if len(layers) == 1 or first == kind:
            parts.append(f"{words} {layer_ranges(layers)}: {first}")
        else:
            parts.append(f"{words} {layer_ranges(layers)}: {kind} (layer {layers[0]}: "
                         f"{first.split(': ', 1)[1]})")
    return "; ".join(parts)


def describe(meta: Mapping[str, Any]) -> str | None:
    """One line for humans: the fast path per layer (None where nothing was recorded)."""
    record = fast_path_layers(meta)
    if not record:
        return None
    taken = [la for la, v in record.items() if v is True]
    others = {la: str(v) for la, v in record.items() if v is not True}
    if not others:
        return f"fast path: taken at every measured layer ({layer_ranges(taken)})"
    head = (f"fast path: taken at layers {layer_ranges(taken)}; generic path at "
            if taken else "fast path: generic path at ")
    return head + _grouped(others)


def fallback_warning(record: Record, arch: str, *, stacklevel: int = 2) -> None:
    """Warn once for the refused layers of ``record`` (nothing when there are none)."""
    refused = fallback_layers(record)
    if not refused:
        return
    warnings.warn(
        f"the fast path for J^l_tt of this {arch} model was refused ({_grouped(refused)}); "
        "those Jacobians take the generic path (same values, slower). meta['fast_path'] "
        "records every layer.", FastPathWarning, stacklevel=stacklevel + 1)
