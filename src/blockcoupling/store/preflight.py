"""Checks that run before a run directory is created, so a measure that cannot finish fails
at once and leaves nothing behind that refuses the corrected command.

Everything that can be checked without the expensive work is checked here: the config
against the model (K <= d, layers within 1..L, the analysis device) and every prompt (it
tokenizes, to at least one token that is not a special token, within the model's context).
"""

from __future__ import annotations

from typing import Any

import torch

from blockcoupling.engine.blocks import find_blocks
from blockcoupling.engine.causality import model_spec
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.inputs import MeasureInput, tokenize
from blockcoupling.engine.plan import MeasurePlan, plan_measure
from blockcoupling.engine.wrappers import as_module
from blockcoupling.errors import BlockCouplingError


def preflight(model: torch.nn.Module, tokenizer: Any, all_items: list[MeasureInput],
              cfg: MeasureConfig, *, model_name: str = "model") -> MeasurePlan:
    """Raise [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] for anything that would stop the run part-way;
    return the `MeasurePlan` of the checked prompts (text
    prompts by their token counts, ready-made inputs by their real positions), which holds
    the block spec (a custom module's causality and width resolved from a capture where no
    option states them) and ``all_items`` (the inputs as `normalise_inputs` returned them) for
    `iter_measure` to execute, and the byte estimates the store checks: nothing checked here
    is checked again, and nothing here is computed twice."""
    spec = find_blocks(model, cfg.blocks_path, hidden_size=cfg.hidden_size, causal=cfg.causal)
    if spec.hidden_size:  # a custom model's hidden size is known only after its first capture
        cfg.check_model(spec.num_layers, spec.hidden_size)
    elif cfg.layers is not None and max(cfg.layers) > spec.num_layers:
        cfg.check_model(spec.num_layers, max(cfg.k))
    if cfg.analysis_device is not None:
        from blockcoupling.loading import resolve_device

        resolve_device(cfg.analysis_device, "--analysis-device")
    lengths: list[int] = [_ready_length(it, model) for it in all_items if not it.is_text]
    items = [it for it in all_items if it.is_text]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    cpu = torch.device("cpu")
    for i in range(0, len(items), cfg.batch_size):
        chunk = items[i:i + cfg.batch_size]
        enc = tokenize(tokenizer, chunk, model, cpu)  # raises for empty or too long prompts
        for item, ids, mask in zip(chunk, enc["input_ids"], enc["attention_mask"], strict=True):
            real = ids[mask.bool()].tolist()
            lengths.append(len(real))
            if special and all(t in special for t in real):
                raise BlockCouplingError(
                    f"prompt {item.prompt_id!r} ({item.text[:40]!r}) has no text token, only "
                    "the tokenizer's special tokens; give it text the tokenizer knows, or "
                    "remove it"
                )
    # a custom module's causality (and width) from a capture of the first input, where no
    # option states it: the plan is made once, on the spec the run measures
    found = spec
    spec = model_spec(as_module(model), cfg, tokenizer, all_items, spec=found)
    if not found.hidden_size and spec.hidden_size:
        cfg.check_model(spec.num_layers, spec.hidden_size)  # the width that capture learnt
    return plan_measure(cfg, spec, lengths, model=model_name, items=all_items)


def _ready_length(item: Any, model: torch.nn.Module) -> int:
    """Real positions of a ready-made input: its attention mask's sum or its input ids'
    length; for images, (image_size / patch_size)^2 patches plus one [CLS] from the model's
    config (1 where the config does not say)."""
    tensors = item.tensors or {}
    if "attention_mask" in tensors:
        return int(tensors["attention_mask"].sum())
    if "input_ids" in tensors:
        return int(tensors["input_ids"].shape[-1])
    cfg = getattr(model, "config", None)
    image, patch = getattr(cfg, "image_size", None), getattr(cfg, "patch_size", None)
    if isinstance(image, int) and isinstance(patch, int) and patch > 0:
        return (image // patch) ** 2 + 1
    return 1
