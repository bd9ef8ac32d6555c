"""Model wrappers accepted as they are: the nn.Module that is measured, and how it is called.

Researchers hold their models in wrappers: nnsight's ``LanguageModel`` (an ``Envoy``, not an
``nn.Module``; the HuggingFace model is its ``_module``), TransformerLens 4's
``TransformerBridge`` (the HuggingFace model is its ``original_model``), PEFT's ``PeftModel``
(``get_base_model()``: the model with its adapter layers in place). `unwrap_model` is
the one place that knows them: every entry point of the engine (``find_blocks``,
``measure``, ``iter_measure``, ``build_meta``, ``measure_to_dir``) measures the module it
returns, and ``build_meta`` records `Unwrapped.meta` (what was unwrapped and how).

A TransformerBridge whose weights were processed (``enable_compatibility_mode()`` with its
default processing, or ``process_weights()``) is refused, as TransformerLens's JacobianLens
refuses it: the wrapped model's weights changed; compatibility mode without processing is
measured and recorded (``meta["bridge_compatibility_mode"]``). The bridge puts a
``BlockBridge`` (hooks, its own attention) around each HuggingFace block and bridges in place
of the block's norms, attention, MLP and linear layers: the fast path looks through them
(`without_bridges`: the HuggingFace modules inside, in shallow copies) and checks the result
against the bridge's recorded output (a hook that changes activations sends that layer to the
generic path, through the hook, and the warning says so). nnsight installs an intervention
controller as each module's ``forward``; `forward_signature` reads the call signature
through it. An nnsight model loaded lazily (weights on the meta device) is refused with
one line: load it with ``dispatch=True``.

PEFT adapters are measured **as loaded**: active adapters stay active and unmerged (merging
would change the user's model); ``meta["adapters"]`` says so. A model whose adapters were
merged (``merge_and_unload()``) is a plain model.

TransformerLens's ``HookedTransformer`` is itself an ``nn.Module``: its blocks, width and
causality come from its ``cfg`` (engine/blocks.py) and its input name (``input``) from
`forward_inputs`; its blocks' key-value cache entry (``past_kv_cache_entry``) gives the fast
path's decode step (engine/fastpath.py). TransformerLens's default weight processing (``fold_ln``,
``center_writing_weights``) changes the residual stream the blocks see, so coupling differs
from the original model's: `unwrap_model` warns where it finds it applied and records
it in ``meta["weights_processed"]``.

`forward_inputs` passes ready-made inputs under the forward's own argument names (a
module whose ``forward(tokens)`` or ``forward(input)`` takes the token ids gets them there).
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from blockcoupling.errors import ArchitectureError

__all__ = ["Unwrapped", "as_module", "forward_inputs", "forward_signature", "original_module",
           "tl_processing", "unwrap_model", "without_bridges"]


@dataclass(frozen=True)
class Unwrapped:
    """The module to measure and what was done to reach it (``meta`` goes into run meta)."""

    module: nn.Module
    meta: dict[str, Any] = field(default_factory=dict)


def _is_peft(model: Any) -> bool:
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def _peft_meta(model: Any) -> dict[str, Any]:
    names = getattr(model, "active_adapters", None)
    if callable(names):  # older PEFT: a method
        names = names()
    active = [str(n) for n in (names or [])]
    layers = [m for m in model.modules() if hasattr(m, "merged") and hasattr(m, "disable_adapters")]
    merged = any(bool(m.merged) for m in layers)
    disabled = bool(layers) and all(bool(m.disable_adapters) for m in layers)
    state = "merged into the weights" if merged else (
        "disabled (base weights only)" if disabled else "active, not merged")
    return {"wrapper": "peft", "adapters": f"measured as loaded: {state}",
            "adapter_names": active}


def _unwrap(model: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The module inside ``model`` and what was unwrapped (no weight checks)."""
    meta: dict[str, Any] = {}
    for _ in range(4):  # wrappers of wrappers (a PEFT model inside nnsight, ...)
        if _is_peft(model):
            meta = {**_peft_meta(model), **meta}
            model = model.get_base_model()
            continue
        if not isinstance(model, nn.Module) and isinstance(getattr(model, "_module", None),
                                                           nn.Module):
            meta.setdefault("wrapper", "nnsight")
            model = model._module  # nnsight 0.4+: Envoy._module is the wrapped torch module
            continue
        inner = getattr(model, "original_model", None)
        if isinstance(inner, nn.Module) and inner is not model:
            meta.setdefault("wrapper", "transformer_bridge")
            meta.update(_bridge_state(model))
            model = inner  # TransformerLens 4: the HuggingFace model the bridge hooks into
            continue
        break
    if not isinstance(model, nn.Module):
        raise ArchitectureError(
            f"{type(model).__name__} is not a torch nn.Module nor a wrapper blockcoupling knows "
            "(nnsight LanguageModel, TransformerLens HookedTransformer / TransformerBridge, "
            "PEFT); pass the torch module itself.")
    return model, meta


def _bridge_state(bridge: Any) -> dict[str, Any]:
    """A TransformerBridge's state: compatibility mode (hook aliases) is recorded; processed
    weights (``enable_compatibility_mode()``'s default, ``process_weights()``) change the
    wrapped model's weights, hence every coupling: refused, as TransformerLens's own
    JacobianLens refuses them."""
    if getattr(bridge, "_weights_processed", False) is True:
        raise ArchitectureError(
            "this TransformerBridge's weights were processed (enable_compatibility_mode() or "
            "process_weights(): fold_ln, centring), which changes every coupling; pass a "
            "freshly booted TransformerBridge.boot_transformers(...), or one in "
            "enable_compatibility_mode(no_processing=True)")
    return {"bridge_compatibility_mode": bool(getattr(bridge, "compatibility_mode", False))}


def _lazy(model: nn.Module, meta: dict[str, Any]) -> None:
    """nnsight loads ``LanguageModel(path)`` lazily: its weights wait on the meta device until
    its first trace. Refused with what to pass (an accelerate-dispatched model, whose offloaded
    weights also wait there, is measured block by block: engine/offload.py)."""
    if meta.get("wrapper") != "nnsight" or getattr(model, "hf_device_map", None):
        return
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ArchitectureError(
            "this nnsight model was loaded lazily (its weights are not loaded yet: they are on "
            "the meta device); load it with dispatch=True, e.g. LanguageModel(path, "
            "dispatch=True), or call its dispatch_model() first")


def unwrap_model(model: Any) -> Unwrapped:
    """The ``nn.Module`` to measure inside ``model`` (``model`` itself if it is one already),
    with what was unwrapped and, for a TransformerLens model, the weight processing found
    (warned about). Raises [`ArchitectureError`][blockcoupling.errors.ArchitectureError] for an object that is no module and no
    known wrapper."""
    module, meta = _unwrap(model)
    _lazy(module, meta)
    processed = tl_processing(module)
    if processed:
        meta["weights_processed"] = processed
        warnings.warn(
            "TransformerLens weight processing (" + ", ".join(processed) + ") changes the "
            "residual stream the blocks see, so coupling differs from the original model's; "
            "load with HookedTransformer.from_pretrained_no_processing(...) to measure the "
            "original weights.", stacklevel=3)
    return Unwrapped(module, meta)


def _bridged(module: nn.Module) -> nn.Module | None:
    """The module a TransformerLens 4 bridge component wraps (its ``original_component``),
    or None for any other module."""
    if not type(module).__module__.startswith("transformer_lens.model_bridge"):
        return None
    inner = getattr(module, "original_component", None)
    return inner if isinstance(inner, nn.Module) else None


def original_module(module: nn.Module) -> nn.Module:
    """The module inside the TransformerLens 4 bridge components around ``module`` (``module``
    itself where it is no bridge): what its class is, e.g. for the fast path's structured
    Jacobians."""
    inner = _bridged(module)
    while inner is not None:
        module, inner = inner, _bridged(inner)
    return module


def without_bridges(module: nn.Module) -> nn.Module:
    """``module`` as the wrapped library defines it: every TransformerLens 4 bridge component
    in it (the ``BlockBridge`` around a HuggingFace block, the bridges the bridge puts in
    place of its norms, attention, MLP and linear layers) replaced by the original module it
    wraps, in shallow copies: parameters and buffers are shared, the user's modules are not
    changed. ``module`` itself where it holds no bridge. The copy computes the original
    model's function without the bridge's hook points (a hook that changes values is then
    not applied: the fast path checks the copy's output against the recorded one)."""
    module = original_module(module)
    if all(_bridged(m) is None for m in module.modules()):
        return module
    clone = copy.copy(module)  # a new module object sharing its tensors
    clone._modules = {name: None if child is None else without_bridges(child)
                      for name, child in module._modules.items()}
    return clone


def as_module(model: Any) -> nn.Module:
    """The ``nn.Module`` to measure inside ``model`` (cheap: for repeated look-ups); a wrapper
    in a state that cannot be measured (processed bridge weights, a lazy nnsight model) is
    refused here too."""
    module, meta = _unwrap(model)
    _lazy(module, meta)
    return module


def tl_processing(model: nn.Module) -> list[str]:
    """TransformerLens weight processing visible in a ``HookedTransformer``: ``fold_ln``
    (``cfg.normalization_type`` LNPre / RMSPre) and ``center_writing_weights`` (every
    residual write, W_E and each W_O / W_out, has zero mean over d_model)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or getattr(cfg, "attention_dir", None) is None:
        return []
    out = []
    if str(getattr(cfg, "normalization_type", "")) in ("LNPre", "RMSPre"):
        out.append("fold_ln")
    writes: list[Tensor] = []
    embed = getattr(getattr(model, "embed", None), "W_E", None)
    if isinstance(embed, Tensor):
        writes.append(embed)
    for block in getattr(model, "blocks", []) or []:
        for owner, name in ((getattr(block, "attn", None), "W_O"),
                            (getattr(block, "mlp", None), "W_out")):
            w = getattr(owner, name, None)
            if isinstance(w, Tensor):
                writes.append(w)
    if writes:
        with torch.no_grad():
            centred = all(float(w.float().mean(-1).abs().max()) <= 1e-6 * (
                1.0 + float(w.float().abs().max())) for w in writes)
        if centred:
            out.append("center_writing_weights")
    return out


def forward_signature(module: nn.Module) -> inspect.Signature:
    """The signature ``module(...)`` is called with: that of ``module.forward`` without
    ``self``. nnsight installs its ``Controller`` as each module's ``forward`` (an object,
    not a bound method), whose signature is the class's unbound ``forward`` (``self``
    first); the ``self`` is dropped here. Raises TypeError / ValueError where Python cannot
    tell the signature."""
    fn = module.forward
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name == "self" and not inspect.ismethod(fn):
        sig = sig.replace(parameters=params[1:])
    return sig


def _signature(module: nn.Module) -> inspect.Signature | None:
    try:
        return forward_signature(module)
    except (TypeError, ValueError):
        return None


def forward_inputs(module: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` under the names ``module.forward`` takes.

    A forward with ``**kwargs`` or taking every name gets them unchanged. Otherwise the main
    input (``input_ids``, else ``pixel_values``, else the only tensor) is passed under the
    forward's first parameter that no input names (``input`` for TransformerLens, ``x``,
    ``tokens``, ...); an ``attention_mask`` or ``token_type_ids`` the forward does not take is
    dropped when it changes nothing (all ones / all zeros), else an error says what to do.
    """
    sig = _signature(module)
    if sig is None or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return dict(inputs)
    params = [p for p in sig.parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = {p.name for p in params}
    if set(inputs) <= names:
        return dict(inputs)
    out = {k: v for k, v in inputs.items() if k in names}
    main = next((k for k in ("input_ids", "pixel_values") if k in inputs), None)
    if main is None and len(inputs) == 1:
        main = next(iter(inputs))
    free = [p.name for p in params if p.name not in inputs]
    if main is not None and main not in names:
        if not free:
            raise ArchitectureError(
                f"{type(module).__name__}.forward takes no argument for the input "
                f"{main!r}; pass inputs under one of its parameters ({', '.join(sorted(names))}).")
        out[free[0]] = inputs[main]
    for name, value in inputs.items():
        if name in names or name == main:
            continue
        neutral = 1 if name == "attention_mask" else 0
        if isinstance(value, Tensor) and bool((value == neutral).all()):
            continue  # nothing is lost: no padding / a single segment
        raise ArchitectureError(
            f"{type(module).__name__}.forward takes no {name!r}, and the inputs need it "
            "(padded prompts of different lengths); use batch_size=1 or prompts of one length.")
    return out
