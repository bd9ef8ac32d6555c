"""Models dispatched by accelerate (``device_map``, offload) and quantized models, one block at a
time.

A model loaded with ``device_map="auto"`` (or ``dispatch_model``) carries accelerate hooks
(``AlignDevicesHook``): a block whose weights are offloaded to the CPU or to disk holds them on
the ``meta`` device and its hook loads them for each forward call only. The forward pass that
records the blocks' calls (``capture``) runs through those hooks unchanged. To replay and
differentiate one block, `materialize` returns a *hook-free copy* of that block with its
weights loaded (from the hook's weights map) onto its execution device: the model itself is
never changed, and only one block's weights are ever materialised at once.

A quantized block (bitsandbytes ``Linear4bit`` / ``Linear8bitLt``, torchao tensor subclasses) is
dequantized in that copy (`dequantized`): every quantized linear layer becomes a plain
``nn.Linear`` holding its dequantized weight, so the analysis runs in its own dtype on exactly
the function the quantized model computes (up to the rounding of the dequantized product).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from blockcoupling.errors import BlockCouplingError


def _hooks(module: nn.Module) -> Iterator[tuple[nn.Module, Any]]:
    """(submodule, AlignDevicesHook) pairs of ``module`` (SequentialHooks unwrapped)."""
    for mod in module.modules():
        hook = getattr(mod, "_hf_hook", None)
        if hook is None:
            continue
        for h in getattr(hook, "hooks", None) or (hook,):
            yield mod, h


def has_hooks(module: nn.Module) -> bool:
    return any(hasattr(m, "_hf_hook") for m in module.modules())


def execution_device(module: nn.Module) -> torch.device | None:
    """Where accelerate runs ``module`` (its first hook's ``execution_device``), if hooked."""
    for _, h in _hooks(module):
        dev = getattr(h, "execution_device", None)
        if dev is not None:
            return torch.device(dev if not isinstance(dev, int) else f"cuda:{dev}")
    return None


def _strip(module: nn.Module) -> None:
    """Undo ``add_hook_to_module`` on a copy whose hooks were copied as None."""
    from accelerate.hooks import _accelerate_added_attributes

    for mod in module.modules():
        d = mod.__dict__
        if "_old_forward" in d:
            mod.forward = d.pop("_old_forward")
        d.pop("_hf_hook", None)
        for attr in _accelerate_added_attributes:
            d.pop(attr, None)


def input_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: its accelerate hook's execution device (a dispatched
    model, also one offloaded entirely, whose weights all wait on ``meta``), else the device
    of its first weight that is not on ``meta``, else the CPU."""
    if has_hooks(model):
        dev = execution_device(model)
        if dev is not None:
            return dev
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def materialize(module: nn.Module) -> nn.Module:
    """``module`` itself, or (accelerate-hooked or quantized) a plain copy with every weight
    loaded on its execution device, quantized layers dequantized. One block at a time: the
    offloaded weights are loaded into ``module`` by its hooks, copied, and put back on
    ``meta`` before returning."""
    quantized = is_quantized(module)
    if not has_hooks(module) and not quantized:
        return module
    offloaded = [(m, h) for m, h in _hooks(module) if getattr(h, "offload", False)]
    memo: dict[int, Any] = {id(h): None for m in module.modules()
                            if (h := getattr(m, "_hf_hook", None)) is not None}
    for _, h in _hooks(module):  # never copy a hook's state (the whole model's weights map)
        memo[id(h)] = None
    try:
        for m, h in offloaded:
            h.pre_forward(m)  # loads its weights from the weights map onto execution_device
        out = copy.deepcopy(module, memo)
    finally:
        for m, h in offloaded:
            h.post_forward(m, None)  # back to meta
    _strip(out)
    if any(t.device.type == "meta" for t in list(out.parameters()) + list(out.buffers())):
        raise BlockCouplingError(
            "a block still has weights on the meta device after loading its offloaded weights; "
            "load the model with device_map and offload_folder through transformers/accelerate")
    return dequantized(out) if quantized else out


# ---------------------------------------------------------------------------- quantized
def _quantized_kind(mod: nn.Module) -> str | None:
    name = type(mod).__name__
    if name in ("Linear4bit", "Linear8bitLt"):
        return "bitsandbytes"
    w = getattr(mod, "weight", None)
    if isinstance(mod, nn.Linear) and w is not None and type(w) not in (nn.Parameter, torch.Tensor):
        return "torchao"  # a tensor subclass (AffineQuantizedTensor, ...)
    if isinstance(mod, nn.Linear) and w is not None and not w.is_floating_point():
        return "int"
    return None


def is_quantized(module: nn.Module) -> bool:
    return any(_quantized_kind(m) is not None for m in module.modules())


def quantization(model: nn.Module) -> str | None:
    """How the model's weights are quantized (``bitsandbytes``, ``torchao``), or None."""
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    if qc is not None:
        method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
        return str(getattr(method, "value", method))
    kinds = {k for m in model.modules() if (k := _quantized_kind(m)) is not None}
    return ",".join(sorted(kinds)) or None


def _dequantized_weight(mod: Any) -> torch.Tensor:
    """The float weight (out, in) of a quantized linear layer."""
    w: Any = mod.weight
    if type(mod).__name__ in ("Linear4bit", "Linear8bitLt"):
        import bitsandbytes.functional as bnbf

        if type(mod).__name__ == "Linear4bit":
            return bnbf.dequantize_4bit(w.data, w.quant_state).float()
        scb: Any = getattr(w, "SCB", None)
        scb = scb if scb is not None else mod.state.SCB  # (out,) row scales of the int8 rows
        return w.data.float() * scb.float()[:, None] / 127.0
    if hasattr(w, "dequantize"):
        return w.dequantize().float()
    raise BlockCouplingError(
        f"cannot dequantize {type(mod).__name__} with weight {type(w).__name__}; blockcoupling "
        "dequantizes bitsandbytes and torchao layers")


def dequantized(block: nn.Module) -> nn.Module:
    """``block`` (a copy the caller owns) with every quantized linear layer replaced by an
    ``nn.Linear`` holding its dequantized weight (float32; the analysis casts it)."""
    for name, mod in list(block.named_modules()):
        if _quantized_kind(mod) is None:
            continue
        W = _dequantized_weight(mod)  # (out, in)
        lin = nn.Linear(W.shape[1], W.shape[0], bias=mod.bias is not None, device=W.device,
                        dtype=torch.float32)
        with torch.no_grad():
            lin.weight.copy_(W)
            if mod.bias is not None:
                lin.bias.copy_(mod.bias.detach().float())
        parent, _, child = name.rpartition(".")
        setattr(block.get_submodule(parent) if parent else block, child, lin)
    return block


# ---------------------------------------------------------------------------- meta
def describe(model: nn.Module, dtype: torch.dtype) -> dict[str, Any]:
    """What ``meta`` says about how the model was held: its accelerate device map (where it
    was dispatched), the quantization and the dtype each block is dequantized to."""
    out: dict[str, Any] = {}
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        out["device_map"] = {str(k): str(v) for k, v in device_map.items()}
    quant = quantization(model)
    if quant:
        out["quantization"] = quant
        out["dequantized_to"] = str(dtype).removeprefix("torch.")
    return out


def peak_memory() -> dict[str, int]:
    """Peak memory of this process so far: ``cpu_max_rss_bytes`` (Linux/macOS) and, where
    CUDA is in use, ``cuda_max_allocated_bytes`` (``torch.cuda.max_memory_allocated``)."""
    out: dict[str, int] = {}
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["cpu_max_rss_bytes"] = int(rss if sys.platform == "darwin" else rss * 1024)
    except (ImportError, OSError):
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


__all__ = ["dequantized", "describe", "peak_memory", "execution_device", "has_hooks",
           "input_device", "is_quantized", "materialize",
           "quantization"]
