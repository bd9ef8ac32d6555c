"""Block discovery on every tiny architecture, task-head wrappers, custom models, errors."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from torch import nn

from blockcoupling.engine.blocks import (
    SUPPORTED_ARCHITECTURES,
    BlockSpec,
    find_blocks,
    get_blocks,
    get_module,
)
from blockcoupling.errors import ArchitectureError
from tests.helpers.tiny_models import ALL, CAUSAL, D, minilm_path, tiny_model

FINAL_NORM = {
    "gpt2": "ln_f",
    "gpt_neo": "ln_f",
    "gptj": "ln_f",
    "falcon": "ln_f",
    "gpt_neox": "final_layer_norm",
    "opt": "decoder.final_layer_norm",
    "llama": "norm",
    "mistral": "norm",
    "qwen2": "norm",
    "qwen3": "norm",
    "gemma": "norm",
    "gemma2": "norm",
    "phi": "final_layernorm",
    "bert": None,
    "vit": "layernorm",
}


@pytest.mark.parametrize("arch", sorted(ALL))
def test_find_blocks_every_tiny_arch(arch: str) -> None:
    model = tiny_model(arch)
    spec = find_blocks(model)
    assert spec.arch == model.config.model_type
    assert spec.num_layers == 3 and spec.hidden_size == D
    assert spec.causal == (arch in CAUSAL)
    assert spec.final_norm_path == FINAL_NORM[arch]
    blocks = get_module(model, spec.blocks_path)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == 3
    assert get_blocks(model, spec) == list(blocks)
    if spec.final_norm_path is not None:
        norm = get_module(model, spec.final_norm_path)
        assert "norm" in type(norm).__name__.lower()
    assert arch in SUPPORTED_ARCHITECTURES


@pytest.mark.parametrize(
    ("cls", "arch", "blocks", "norm"),
    [
        (tf.GPT2LMHeadModel, "gpt2", "transformer.h", "transformer.ln_f"),
        (tf.LlamaForCausalLM, "llama", "model.layers", "model.norm"),
        (tf.OPTForCausalLM, "opt", "model.decoder.layers", "model.decoder.final_layer_norm"),
        (tf.GPTNeoXForCausalLM, "gpt_neox", "gpt_neox.layers", "gpt_neox.final_layer_norm"),
        (tf.BertForMaskedLM, "bert", "bert.encoder.layer", None),
        # transformers 5 moved ViT's blocks up from vit.encoder.layer (4.x)
        (tf.ViTForImageClassification, "vit", "vit.layers|vit.encoder.layer", "vit.layernorm"),
    ],
)
def test_task_head_wrappers(cls: type, arch: str, blocks: str, norm: str | None) -> None:
    torch.manual_seed(0)
    spec = find_blocks(cls(ALL[arch]()))
    assert spec.blocks_path in blocks.split("|") and spec.final_norm_path == norm
    assert spec.num_layers == 3 and spec.hidden_size == D


def test_real_minilm_is_a_bert_encoder() -> None:
    model = tf.AutoModel.from_pretrained(minilm_path())
    spec = find_blocks(model)
    assert spec == BlockSpec("bert", "encoder.layer", None, False, 384, 6)


class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Module()
        self.body.stack = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.norm = nn.LayerNorm(4)


def test_custom_model_with_blocks_path() -> None:
    model = _Custom()
    spec = find_blocks(model, blocks_path="body.stack")
    assert spec == BlockSpec("custom", "body.stack", None, False, 0, 2)
    spec2 = find_blocks(
        model, blocks_path="body.stack", final_norm_path="norm", hidden_size=4, causal=True
    )
    assert (spec2.final_norm_path, spec2.hidden_size, spec2.causal) == ("norm", 4, True)
    assert get_module(model, "body.stack.1") is model.body.stack[1]


def test_unknown_model_asks_for_blocks_path() -> None:
    with pytest.raises(ArchitectureError, match="blocks_path") as err:
        find_blocks(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    assert "num_hidden_layers" in str(err.value)  # names what was looked for


def test_bad_blocks_path() -> None:
    with pytest.raises(ArchitectureError, match="no sub-module"):
        find_blocks(_Custom(), blocks_path="body.nope")
    with pytest.raises(ArchitectureError, match="not a non-empty"):
        find_blocks(_Custom(), blocks_path="norm")
    with pytest.raises(ArchitectureError, match="out of range"):
        get_module(_Custom(), "body.stack.7")


def test_hf_config_without_matching_list() -> None:
    model = tiny_model("llama")
    model.config.num_hidden_layers = 5  # no ModuleList of length 5
    with pytest.raises(ArchitectureError, match="blocks_path"):
        find_blocks(model)


def test_ambiguous_lists_refused() -> None:
    model = _Custom()
    model.config = tf.PretrainedConfig()
    model.config.num_hidden_layers = 2
    model.other = nn.Module()
    model.other.stack = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
    with pytest.raises(ArchitectureError, match="several"):
        find_blocks(model)
    assert find_blocks(model, blocks_path="other.stack").blocks_path == "other.stack"
