"""Block discovery: where a model keeps its transformer blocks and its final norm.

A *block* is one element of the model's ``nn.ModuleList`` of transformer layers (block l =
``blocks[l - 1]``). For HuggingFace models (base models and their task-head wrappers such as
``GPT2LMHeadModel.transformer.h`` or ``LlamaForCausalLM.model.layers``) the list is found by
attributes: the ``nn.ModuleList`` whose length equals the config's layer count
(``num_hidden_layers`` / ``n_layer`` / ``num_layers`` / ``n_layers``), the shallowest one if
several match. The final norm is looked up by name beside the block list (or one level up):
``ln_f``, ``norm``, ``final_layer_norm``, ``final_layernorm``, ``layernorm``, ... A small
registry ([`SUPPORTED_ARCHITECTURES`][blockcoupling.engine.blocks.SUPPORTED_ARCHITECTURES] and ``_REGISTRY``) records the architectures that
are tested, whether they are causal, and the exceptions (BERT-style encoders have no final
norm). Any other ``nn.Module`` works when the caller names the block list with
``blocks_path="dotted.path"``. A TransformerLens ``HookedTransformer`` is found from its ``cfg``
(``n_layers``, ``d_model``, ``attention_dir``, blocks at ``blocks``, final norm ``ln_final``).
Wrappers (nnsight, TransformerBridge, PEFT) are unwrapped first (engine/wrappers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from torch import nn

from blockcoupling.engine.wrappers import as_module
from blockcoupling.errors import ArchitectureError

__all__ = [
    "BlockSpec",
    "SUPPORTED_ARCHITECTURES",
    "find_blocks",
    "get_blocks",
    "get_module",
]


@dataclass(frozen=True)
class BlockSpec:
    """Where the blocks of a model are and what kind of model it is.

    ``hidden_size`` is 0 when it is not known before a forward pass (a custom model given by
    ``blocks_path`` without ``hidden_size``); `blockcoupling.engine.capture.capture` returns a
    spec with the value read from the first block input.
    """

    arch: str  # e.g. "gpt2", "llama", "bert", "vit", "custom"
    blocks_path: str  # dotted path from the model to its nn.ModuleList of blocks
    final_norm_path: str | None  # dotted path to the final norm, if any
    causal: bool  # decoder (causal attention) or encoder / ViT
    hidden_size: int
    num_layers: int
    # where ``causal`` comes from: "config" (HF config), "attention_dir" (TransformerLens
    # cfg), "option" (the caller), "mask" / "probe" (engine/causality.py), "unknown" (not
    # yet known: a custom module before its first capture), "given" (built by hand)
    causal_source: str = field(default="given", compare=False)


@dataclass(frozen=True)
class _ArchInfo:
    description: str
    causal: bool
    # Final-norm attribute name beside the blocks (or one level up); "" = the model has none;
    # None = search the usual names.
    final_norm: str | None = None


_REGISTRY: dict[str, _ArchInfo] = {
    "gpt2": _ArchInfo("GPT-2 (GPT2Model, GPT2LMHeadModel, ...): transformer.h, ln_f", True),
    "gpt_neo": _ArchInfo("GPT-Neo: transformer.h, ln_f", True),
    "gptj": _ArchInfo("GPT-J: transformer.h, ln_f", True),
    "gpt_neox": _ArchInfo("GPT-NeoX / Pythia: gpt_neox.layers, final_layer_norm", True),
    "opt": _ArchInfo("OPT: model.decoder.layers, decoder.final_layer_norm", True),
    "llama": _ArchInfo("Llama 2 / Llama 3 / CodeLlama / SmolLM: model.layers, norm", True),
    "mistral": _ArchInfo("Mistral: model.layers, norm", True),
    "mixtral": _ArchInfo("Mixtral (mixture of experts): model.layers, norm", True),
    "qwen2": _ArchInfo("Qwen2 / Qwen2.5: model.layers, norm", True),
    "qwen2_moe": _ArchInfo("Qwen2-MoE: model.layers, norm", True),
    "qwen3": _ArchInfo("Qwen3: model.layers, norm", True),
    "gemma": _ArchInfo("Gemma: model.layers, norm", True),
    "gemma2": _ArchInfo("Gemma 2: model.layers, norm", True),
    "gemma3_text": _ArchInfo("Gemma 3 (text): model.layers, norm", True),
    "phi": _ArchInfo("Phi-1 / Phi-1.5 / Phi-2: model.layers, final_layernorm", True),
    "phi3": _ArchInfo("Phi-3: model.layers, norm", True),
    "olmo2": _ArchInfo("OLMo 2: model.layers, norm", True),
    "stablelm": _ArchInfo("StableLM: model.layers, norm", True),
    "falcon": _ArchInfo("Falcon: transformer.h, ln_f", True),
    "mpt": _ArchInfo("MPT: transformer.blocks, norm_f", True),
    "bert": _ArchInfo("BERT: bert.encoder.layer (post-LN, no final norm)", False, ""),
    "roberta": _ArchInfo("RoBERTa: roberta.encoder.layer (post-LN, no final norm)", False, ""),
    "xlm-roberta": _ArchInfo("XLM-RoBERTa: roberta.encoder.layer (no final norm)", False, ""),
    "vit": _ArchInfo("ViT (HF ViTModel / ViTForImageClassification): layers, layernorm", False),
    "deit": _ArchInfo("DeiT: layers, layernorm", False),
}

#: arch (HF ``config.model_type``) -> human description, for ``blockcoupling models``.
#: MiniLM checkpoints (e.g. all-MiniLM-L6-v2) are ``bert``.
SUPPORTED_ARCHITECTURES: dict[str, str] = {k: v.description for k, v in _REGISTRY.items()}
"""Model types whose blocks are found by name (``blockcoupling models``): model_type -> description."""

_LAYER_COUNT_ATTRS: tuple[str, ...] = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN_SIZE_ATTRS: tuple[str, ...] = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim")
_FINAL_NORM_NAMES: tuple[str, ...] = (
    "ln_f",
    "norm",
    "final_layer_norm",
    "final_layernorm",
    "layernorm",
    "final_norm",
    "norm_f",
    "ln_out",
    "ln_final",
)
_ENCODER_TYPES: frozenset[str] = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "distilbert",
        "electra",
        "albert",
        "deberta",
        "deberta-v2",
        "mpnet",
        "camembert",
        "vit",
        "deit",
        "beit",
        "dinov2",
        "clip_vision_model",
    }
)


def get_module(model: nn.Module, dotted: str) -> nn.Module:
    """The sub-module of ``model`` at ``dotted`` (e.g. ``"transformer.h"``; ``""`` = model).

    Raises [`ArchitectureError`][blockcoupling.errors.ArchitectureError] naming the first missing attribute.
    """
    module: Any = model
    if dotted == "":
        return model
    walked: list[str] = []
    for name in dotted.split("."):
        if name.isdigit() and isinstance(module, (nn.ModuleList, nn.Sequential)):
            idx = int(name)
            if idx >= len(module):
                raise ArchitectureError(
                    f"{'.'.join(walked) or type(model).__name__} has {len(module)} entries; "
                    f"index {idx} in '{dotted}' is out of range."
                )
            module = module[idx]
        else:
            child = getattr(module, name, None)
            if not isinstance(child, nn.Module):
                raise ArchitectureError(
                    f"{type(model).__name__} has no sub-module '{dotted}' "
                    f"('{name}' missing under '{'.'.join(walked) or '<model>'}'). "
                    "Check the dotted path (print(model) shows the module names)."
                )
            module = child
        walked.append(name)
    return module


def get_blocks(model: nn.Module, spec: BlockSpec) -> list[nn.Module]:
    """The blocks of ``model`` as a list (block l = ``get_blocks(...)[l - 1]``)."""
    blocks = cast(nn.ModuleList, get_module(model, spec.blocks_path))  # found by find_blocks
    return list(blocks)


def _config_int(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _candidate_lists(model: nn.Module, num_layers: int) -> list[str]:
    """Dotted paths of every nn.ModuleList of length ``num_layers``, shallowest first."""
    found = [
        name
        for name, module in model.named_modules()
        if name and isinstance(module, nn.ModuleList) and len(module) == num_layers
    ]
    return sorted(found, key=lambda p: (p.count("."), p))


def _find_final_norm(model: nn.Module, blocks_path: str, override: str | None) -> str | None:
    """Dotted path of the final norm beside the block list or one level up, or None."""
    if override == "":
        return None
    names = (override,) if override else _FINAL_NORM_NAMES
    parts = blocks_path.split(".")
    prefixes = [".".join(parts[:-1]), ".".join(parts[:-2])] if len(parts) > 1 else [""]
    seen: set[str] = set()
    for prefix in prefixes:
        if prefix in seen:
            continue
        seen.add(prefix)
        parent = get_module(model, prefix)
        for name in names:
            child = getattr(parent, name, None)
            if isinstance(child, nn.Module):
                return f"{prefix}.{name}" if prefix else name
    return None


def _is_causal(config: Any, model_type: str | None) -> bool:
    """Causal attention? Registry first, then ``is_decoder`` and the architecture names.

    Unknown models default to non-causal: treating a causal model as an encoder only costs
    the computation of (exactly zero) blocks t1 > t2, the reverse would drop real ones.
    """
    if model_type in _REGISTRY:
        return _REGISTRY[model_type].causal
    if model_type in _ENCODER_TYPES:
        return False
    if getattr(config, "is_decoder", False) is True:
        return True
    archs = getattr(config, "architectures", None) or []
    return any("CausalLM" in a for a in archs)


def _search_blocks(model: nn.Module, config: Any, model_type: str | None) -> str:
    """The path of the shallowest nn.ModuleList as long as the config's layer count."""
    num_layers = _config_int(config, _LAYER_COUNT_ATTRS) if config is not None else None
    if num_layers is None:
        raise ArchitectureError(
            f"Cannot find the transformer blocks of {type(model).__name__}: it has no "
            f"HuggingFace config with a layer count (looked for config attributes "
            f"{', '.join(_LAYER_COUNT_ATTRS)}, to match an nn.ModuleList of that length). "
            "Pass blocks_path='dotted.path.to.ModuleList' (CLI: --blocks)."
        )
    candidates = _candidate_lists(model, num_layers)
    if not candidates:
        raise ArchitectureError(
            f"Cannot find the transformer blocks of {type(model).__name__} "
            f"(model_type={model_type!r}): no nn.ModuleList of length {num_layers} "
            f"(the config's layer count, from {', '.join(_LAYER_COUNT_ATTRS)}). "
            "Pass blocks_path='dotted.path.to.ModuleList' (CLI: --blocks)."
        )
    shallow = [c for c in candidates if c.count(".") == candidates[0].count(".")]
    if len(shallow) > 1:
        raise ArchitectureError(
            f"{type(model).__name__} has several block lists of length {num_layers}: "
            f"{', '.join(shallow)}. Pass blocks_path= one of them (CLI: --blocks)."
        )
    return candidates[0]


def _causal(config: Any, model_type: str | None, causal: bool | None) -> tuple[bool, str]:
    """Whether the blocks are causal, and what says so (`BlockSpec.causal_source`)."""
    if causal is not None:
        return causal, "option"
    if config is not None and getattr(config, "attention_dir", None) is not None:
        return str(config.attention_dir) == "causal", "attention_dir"
    if config is not None:
        return _is_causal(config, model_type), "config"
    return False, "unknown"  # found from the first capture: engine/causality.py


def find_blocks(
    model: nn.Module,
    blocks_path: str | None = None,
    *,
    final_norm_path: str | None = None,
    hidden_size: int | None = None,
    causal: bool | None = None,
) -> BlockSpec:
    """Locate the transformer blocks (and final norm) of ``model``.

    Without ``blocks_path`` the model must be a HuggingFace model (it has a ``config`` with a
    layer count); the block list is the shallowest ``nn.ModuleList`` of that length. With
    ``blocks_path`` any ``nn.Module`` works; ``hidden_size`` and ``causal`` come from the
    config when there is one, else from the keywords (hidden size 0 = read at capture time,
    causal False by default). ``final_norm_path`` overrides the final-norm search.
    """
    model = as_module(model)
    config = getattr(model, "config", None)
    tl_cfg = getattr(model, "cfg", None)
    if config is None and getattr(tl_cfg, "attention_dir", None) is not None:
        config = tl_cfg  # TransformerLens: n_layers, d_model, attention_dir
    model_type: str | None = getattr(config, "model_type", None) if config is not None else None
    info = _REGISTRY.get(model_type) if model_type else None

    if blocks_path is None:
        blocks_path = _search_blocks(model, config, model_type)

    blocks = get_module(model, blocks_path)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)) or len(blocks) == 0:
        raise ArchitectureError(
            f"blocks_path '{blocks_path}' is a {type(blocks).__name__}, not a non-empty "
            "nn.ModuleList / nn.Sequential of blocks. Pass the path of the list of layers."
        )

    if final_norm_path is not None:
        get_module(model, final_norm_path)  # validate
        norm_path: str | None = final_norm_path
    elif config is not None:
        norm_path = _find_final_norm(model, blocks_path, info.final_norm if info else None)
    else:
        norm_path = None

    if hidden_size is None:
        hidden_size = (_config_int(config, _HIDDEN_SIZE_ATTRS) if config is not None else None) or 0
    causal, source = _causal(config, model_type, causal)
    arch = model_type if model_type else (
        "transformer_lens" if config is tl_cfg and config is not None else "custom")
    return BlockSpec(
        arch=arch,
        blocks_path=blocks_path,
        final_norm_path=norm_path,
        causal=bool(causal),
        hidden_size=int(hidden_size),
        num_layers=len(blocks),
        causal_source=source,
    )
