"""Is a model causal? Found from its first capture when no config says so.

``find_blocks`` knows causality from a HuggingFace config, a TransformerLens ``cfg``
(``attention_dir``) or the caller's ``causal=``; otherwise (a custom ``nn.Module``) the spec
says ``causal_source="unknown"`` and `resolve_causal` decides from a capture:

1. **the attention mask the module applies**: a block called with ``is_causal=True``, or with
   a square mask (``(n, n)`` or ``(..., n, n)``) that forbids exactly the positions above the
   diagonal (``True`` = masked for a boolean mask, ``-inf`` / a large negative for an
   additive one) -> causal (``causal_source="mask"``);
2. otherwise **a probe of J's structure**: every block's residual branch is evaluated at the
   recorded input and at the input with its last token moved; a causal block's outputs at the
   earlier tokens do not change (J^l_{t1 t2} = 0 for t1 > t2) -> ``causal_source="probe"``.
   A one-token prompt cannot tell: the spec stays non-causal, ``"unknown"``.

Treating a causal model as bidirectional would store anti-causal (identically zero)
Jacobian pairs in the token-wise tables; ``pairs.kind_pairs`` leaves them out once the spec
says causal.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from blockcoupling.engine.blocks import BlockSpec, find_blocks
from blockcoupling.engine.capture import Capture, capture, residual_branch
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.inputs import MeasureInput, make_batch
from blockcoupling.engine.state import preserved

__all__ = ["is_causal_mask", "model_spec", "probe_causal", "resolve_causal"]

#: relative change at earlier tokens below which a block counts as causal in the probe
PROBE_RTOL = 1e-5


def is_causal_mask(mask: Any, n: int) -> bool:
    """Whether ``mask`` (boolean: True = masked, or additive float) forbids exactly the
    positions above the diagonal of its last two (n, n) dimensions."""
    if not isinstance(mask, Tensor) or mask.ndim < 2 or tuple(mask.shape[-2:]) != (n, n) or n < 2:
        return False
    upper = torch.ones(n, n, dtype=torch.bool, device=mask.device).triu(1)
    if mask.dtype == torch.bool:
        blocked = mask
    elif mask.is_floating_point():
        blocked = mask <= torch.finfo(mask.dtype).min / 2
    else:
        return False
    return bool((blocked == upper).all())


def _mask_says_causal(cap: Capture) -> bool:
    assert cap.calls is not None
    n = int(cap.boundaries.shape[2])
    call = cap.calls[0]
    if call.kwargs.get("is_causal") is True:
        return True
    values = list(call.args[1:]) + [v for k, v in call.kwargs.items() if "mask" in k]
    return any(is_causal_mask(v, n) for v in values)


def probe_causal(model: nn.Module, cap: Capture, prompt: int = 0) -> bool | None:
    """Whether every block's output at tokens < n-1 ignores token n-1 (None: one token)."""
    n = cap.lengths[prompt]
    if n < 2:
        return None
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in range(1, cap.n_layers + 1):
            f, x = residual_branch(model, cap, layer, prompt, dtype=torch.float32)  # (n, d)
            moved = x.clone()
            noise = torch.randn(x.shape[-1], generator=g).to(x.device, x.dtype)
            moved[n - 1] = moved[n - 1] + noise * (1.0 + float(x[n - 1].abs().max()))
            y, y2 = f(x), f(moved)  # (n', d)
            scale = 1.0 + float(y[:n].abs().max())
            if float((y[: n - 1] - y2[: n - 1]).abs().max()) > PROBE_RTOL * scale:
                return False
    return True


def resolve_causal(model: nn.Module, cap: Capture) -> BlockSpec:
    """``cap.spec`` with causality decided from the capture where it was ``"unknown"``."""
    spec = cap.spec
    if spec.causal_source != "unknown":
        return spec
    if _mask_says_causal(cap):
        return dataclasses.replace(spec, causal=True, causal_source="mask")
    verdict = probe_causal(model, cap)
    if verdict is None:
        return spec
    return dataclasses.replace(spec, causal=verdict, causal_source="probe")


def model_spec(model: nn.Module, cfg: MeasureConfig, tokenizer: Any = None,
               items: list[MeasureInput] | None = None, *, spec: BlockSpec | None = None
               ) -> BlockSpec:
    """The model's [`BlockSpec`][blockcoupling.engine.blocks.BlockSpec] under ``cfg`` (``blocks_path``, ``causal``,
    ``hidden_size``); where causality is unknown and ``items`` are given, decided from a
    capture of the first item (the model and the RNGs are left as they were). ``spec``: the
    spec already found under ``cfg`` (a plan's), so the blocks are not found again."""
    if spec is None:
        spec = find_blocks(model, cfg.blocks_path, hidden_size=cfg.hidden_size,
                           causal=cfg.causal)
    if spec.causal_source != "unknown" or not items:
        return spec
    with preserved(model):
        model.eval()
        from blockcoupling.engine.offload import input_device

        cap = capture(model, make_batch(tokenizer, items[:1], model, input_device(model)), spec)
        return resolve_causal(model, cap)
