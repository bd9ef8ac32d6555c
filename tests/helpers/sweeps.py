"""Tiny seeded models with a word-level tokenizer, saved like hub folders, and the measure
settings of the sweep tests."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf

WORDS = "the a cat dog sat on mat ran far what is capital of france".split()
PROMPTS = ["the cat sat on the mat", "what is the capital of france", "a dog ran far",
           "the dog sat", "the cat ran on the mat", "a cat sat far"]
MEASURE = {"k": [2], "coupling": ["depth"], "variants": ["coupling", "coupling_vs_null"],
           "orientations": ["ujv"], "batch_size": 1}
TABLES = ("coupling", "trajectory", "token_metrics", "spectra", "prompts")


def save_model(path: Path, arch: str, seed: int) -> Path:
    """A tiny random model (2 layers, d = 32) with a word-level tokenizer, saved like a hub
    folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")
    cfg = (tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
           if arch == "gpt2" else
           tf.GPTNeoXConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                            num_attention_heads=2, vocab_size=64, max_position_embeddings=32))
    torch.manual_seed(seed)
    tf.AutoModel.from_config(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path
