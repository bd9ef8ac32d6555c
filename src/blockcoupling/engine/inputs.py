"""What a measurement runs on: one input type for text prompts and ready-made model inputs.

[`MeasureInput`][blockcoupling.engine.inputs.MeasureInput] is one example: a stable id (``prompt_id`` in every result table), the
text shown in tables and reports, a label for grouping, and either the text that the tokenizer
turns into model inputs or the ready-made model inputs themselves (``tensors``: one row of
``input_ids``/``attention_mask``/``token_type_ids`` or ``pixel_values``, without the batch
dimension). `normalise_inputs` accepts

* strings (ids ``p00000``, ``p00001``, ...), [`blockcoupling.Prompt`][blockcoupling.prompts.prompt.Prompt] objects (anything
  with ``prompt_id`` and ``text``), ``(prompt_id, text)`` pairs;
* a dict of batched tensors, e.g. ``{"pixel_values": (B, C, H, W)}`` or
  ``{"input_ids": (B, n), "attention_mask": (B, n)}``, split into B examples whose ids are
  derived from their content: ``input-{i:05d}-{sha256 of the row's tensors[:10]}`` (position
  and content: stable across processes, so a run directory can be resumed with the same
  inputs, and a resume with different tensors is refused because the ids differ);
* a list of [`MeasureInput`][blockcoupling.engine.inputs.MeasureInput].

`make_batch` turns a list of examples into one model-input dict (text: tokenized,
right-padded; tensors: stacked, token ids right-padded with ``attention_mask`` 0).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from blockcoupling.errors import BlockCouplingError

TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class MeasureInput:
    """One example to measure: id, display text, label, and text or ready-made tensors."""

    prompt_id: str
    text: str
    label: str = ""
    tensors: Mapping[str, Tensor] | None = field(default=None, compare=False, repr=False)

    @property
    def is_text(self) -> bool:
        return self.tensors is None


def content_id(index: int, row: Mapping[str, Tensor]) -> str:
    """``input-{index:05d}-{hash}``: sha256 over each tensor's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(row):
        t = row[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"input-{index:05d}-{h.hexdigest()[:10]}"


#: the form of `content_id`: the position, then the first hex digits of the content's sha256
_CONTENT_ID = re.compile(r"input-\d{5,}-([0-9a-f]{10})")


def content_of_id(prompt_id: str) -> str | None:
    """The content hash a `content_id` carries (None for any other id): what identifies a
    ready-made input across runs, whatever its position."""
    match = _CONTENT_ID.fullmatch(prompt_id)
    return match.group(1) if match else None


def _describe(row: Mapping[str, Tensor]) -> str:
    if "pixel_values" in row:
        return f"<image {'x'.join(str(s) for s in row['pixel_values'].shape)}>"
    if "input_ids" in row:
        mask = row.get("attention_mask")
        n = int(mask.sum()) if mask is not None else int(row["input_ids"].shape[-1])
        return f"<{n} token ids>"
    return "<" + ", ".join(sorted(row)) + ">"


def split_tensor_inputs(inputs: Mapping[str, Any]) -> list[MeasureInput]:
    """A dict of batched tensors (B, ...) -> B examples with content-derived ids."""
    if not inputs:
        raise BlockCouplingError("the input dict is empty; pass e.g. {'pixel_values': images}")
    sizes = set()
    for name, v in inputs.items():
        if not isinstance(v, Tensor) or v.ndim < 1:
            raise BlockCouplingError(
                f"input {name!r} is not a batched tensor; ready-made inputs are a dict of "
                "tensors with the batch as the first dimension")
        sizes.add(int(v.shape[0]))
    if len(sizes) != 1:
        raise BlockCouplingError(
            f"the input tensors have different batch sizes {sorted(sizes)}; give every tensor "
            "the same first dimension")
    B = sizes.pop()
    if B == 0:
        raise BlockCouplingError("no inputs were given (batch size 0)")
    out = []
    for i in range(B):
        row = {name: v[i] for name, v in inputs.items()}
        if "attention_mask" in row and int(row["attention_mask"].sum()) == 0:
            raise BlockCouplingError(f"input {i} has an all-zero attention_mask (no tokens)")
        out.append(MeasureInput(content_id(i, row), _describe(row), "", row))
    return out


def normalise_inputs(prompts: Any) -> list[MeasureInput]:
    """Strings, Prompt objects, (id, text) pairs, MeasureInputs, or a dict of batched tensors."""
    if isinstance(prompts, Mapping):
        items = split_tensor_inputs(prompts)
    else:
        if isinstance(prompts, str):
            prompts = [prompts]
        items = []
        for i, p in enumerate(prompts):
            if isinstance(p, MeasureInput):
                items.append(p)
            elif isinstance(p, str):
                items.append(MeasureInput(f"p{i:05d}", p, ""))
            elif isinstance(p, tuple) and len(p) == 2:
                items.append(MeasureInput(str(p[0]), str(p[1]), ""))
            elif hasattr(p, "text") and hasattr(p, "prompt_id"):
                items.append(MeasureInput(str(p.prompt_id), str(p.text),
                                          str(getattr(p, "label", ""))))
            else:
                raise BlockCouplingError(
                    f"prompt {i} has type {type(p).__name__}; pass strings, Prompt objects or "
                    "(prompt_id, text) pairs (for images pass a dict of model inputs)"
                )
    if not items:
        raise BlockCouplingError("no prompts were given")
    ids = [it.prompt_id for it in items]
    if len(set(ids)) != len(ids):
        raise BlockCouplingError("prompt ids must be unique; two prompts share an id")
    for it in items:
        if it.is_text and not it.text.strip():
            raise BlockCouplingError(f"prompt {it.prompt_id!r} is empty; remove it or give it text")
    if len({it.is_text for it in items}) > 1:
        raise BlockCouplingError("mix of text prompts and ready-made tensors; measure them "
                                 "in separate calls")
    return items


def context_length(model: torch.nn.Module) -> int | None:
    cfg = getattr(model, "config", None) or getattr(model, "cfg", None)  # HF, TransformerLens
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def check_lengths(items: Sequence[MeasureInput], lengths: Sequence[int],
                  model: torch.nn.Module) -> None:
    """Every example has at least one token and fits the model's context (the one check)."""
    ctx = context_length(model)
    for it, n in zip(items, lengths, strict=True):
        if n == 0:
            raise BlockCouplingError(f"prompt {it.prompt_id!r} tokenizes to no tokens")
        if ctx is not None and n > ctx:
            raise BlockCouplingError(
                f"prompt {it.prompt_id!r} has {n} tokens, more than the model's context of "
                f"{ctx}; shorten it"
            )


def tokenize(tokenizer: Any, items: Sequence[MeasureInput], model: torch.nn.Module,
             device: torch.device) -> dict[str, Tensor]:
    """Right-padded batch (so real positions are 0..n_b-1 and position ids are natural)."""
    if tokenizer is None:
        raise BlockCouplingError("text prompts need a tokenizer; pass the model's tokenizer")
    old_side = getattr(tokenizer, "padding_side", None)
    added_pad = False
    if getattr(tokenizer, "pad_token", "x") is None:
        eos = getattr(tokenizer, "eos_token", None) or getattr(tokenizer, "unk_token", None)
        if eos is None:
            raise BlockCouplingError("the tokenizer has no pad, eos or unk token to pad a batch with")
        tokenizer.pad_token = eos
        added_pad = True
    try:
        if old_side is not None:
            tokenizer.padding_side = "right"
        enc = tokenizer([it.text for it in items], return_tensors="pt", padding=True)
    finally:
        if old_side is not None:
            tokenizer.padding_side = old_side
        if added_pad:
            tokenizer.pad_token = None
    out = {k: v for k, v in dict(enc).items() if k in TEXT_KEYS}
    if "attention_mask" not in out:
        out["attention_mask"] = torch.ones_like(out["input_ids"])
    check_lengths(items, out["attention_mask"].sum(dim=1).tolist(), model)
    return {k: v.to(device) for k, v in out.items()}


def stack_tensors(items: Sequence[MeasureInput], model: torch.nn.Module,
                  device: torch.device) -> dict[str, Tensor]:
    """Ready-made rows -> one batch; token-id rows of different lengths are right-padded."""
    rows = [it.tensors for it in items]
    assert all(r is not None for r in rows)
    names = set(rows[0])  # type: ignore[arg-type]
    if any(set(r) != names for r in rows):  # type: ignore[arg-type]
        raise BlockCouplingError("every ready-made input must have the same tensor names")
    out: dict[str, Tensor] = {}
    if "input_ids" in names:
        width = max(int(r["input_ids"].shape[-1]) for r in rows)  # type: ignore[index]
        for name in names | {"attention_mask"}:
            padded = []
            for r in rows:
                t = r[name] if name in r else torch.ones_like(r["input_ids"])  # type: ignore[index,operator]
                pad = width - int(t.shape[-1])
                padded.append(torch.nn.functional.pad(t, (0, pad)) if pad else t)
            out[name] = torch.stack(padded)
        check_lengths(items, out["attention_mask"].sum(dim=1).tolist(), model)
    else:
        for name in names:
            shapes = {tuple(r[name].shape) for r in rows}  # type: ignore[index]
            if len(shapes) > 1:
                raise BlockCouplingError(f"input {name!r} has rows of different shapes {shapes}")
            out[name] = torch.stack([r[name] for r in rows])  # type: ignore[index]
    return {k: v.to(device) for k, v in out.items()}


def make_batch(tokenizer: Any, items: Sequence[MeasureInput], model: torch.nn.Module,
               device: torch.device) -> dict[str, Tensor]:
    """One batch of model inputs for ``items`` (all text or all ready-made tensors)."""
    if items[0].is_text:
        return tokenize(tokenizer, items, model, device)
    return stack_tensors(items, model, device)


__all__ = ["MeasureInput", "content_id", "content_of_id", "make_batch", "normalise_inputs", "split_tensor_inputs",
           "tokenize"]
