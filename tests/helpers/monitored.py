"""A tiny GPT-2 with dropout (its training uses the RNG) and a word-level tokenizer: the
training-time monitor's tests."""

from __future__ import annotations

import torch
import transformers as tf

PROMPTS = ["the cat sat on the mat", "a dog ran far away"]
VOCAB = 64


def dropout_gpt2(seed: int = 0) -> tf.GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
                        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2)  # dropout: uses the RNG
    return tf.GPT2LMHeadModel(cfg)


class CharTokenizer:
    """A minimal tokenizer: characters -> ids (enough for measure)."""

    pad_token_id = 0
    padding_side = "right"

    def __call__(self, texts: list[str], return_tensors: str = "pt", padding: bool = True,
                 **_: object) -> dict[str, torch.Tensor]:
        ids = [[1 + (ord(c) % (VOCAB - 1)) for c in t][:16] for t in texts]
        n = max(map(len, ids))
        mask = [[1] * len(x) + [0] * (n - len(x)) for x in ids]
        ids = [x + [0] * (n - len(x)) for x in ids]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def word_tokenizer() -> object:
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:  # pragma: no cover
        return CharTokenizer()
    words = "the a cat dog sat on mat ran far away".split()
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")
