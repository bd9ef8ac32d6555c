"""One hashing recipe (blockcoupling.hashing) and the stored hashes it must keep.

The golden values were computed by the recipes written out by hand before they were merged
into ``canonical_hash``: run directories, sweep unit ids, the ViT grid's run keys and the tiny
LM's cache are found again by these hashes, so they must never change.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.hashing import canonical_hash, canonical_json
from blockcoupling.store.manifest import digest_of
from blockcoupling.studies.monitor import prompt_items
from blockcoupling.studies.sweep.units import unit_id
from blockcoupling.studies.tiny_lm import TinyLMConfig
from blockcoupling.studies.vit.train import VitTrainConfig


def test_recipe_is_sha256_of_sorted_json() -> None:
    value = {"b": [1, 2.5, None], "a": "é"}
    text = '{"a":"\\u00e9","b":[1,2.5,null]}'
    assert canonical_json(value) == text
    assert canonical_hash(value) == hashlib.sha256(text.encode()).hexdigest()
    assert canonical_hash(value, digits=12) == canonical_hash(value)[:12]
    assert canonical_json(value, compact=False) == json.dumps(value, sort_keys=True)
    assert canonical_json(value, ascii=False) == '{"a":"é","b":[1,2.5,null]}'
    with pytest.raises(ValueError):
        canonical_hash({"x": math.nan})
    assert canonical_json({"x": math.nan}, strict=False) == '{"x":NaN}'
    assert canonical_json({"x": {1}}, default=str) == '{"x":"{1}"}'


def test_stored_hashes_are_unchanged() -> None:
    assert MeasureConfig().config_hash() == (
        "c7e3b0cac7a5436914a9ed01f1a4d4d3bd37fb98a9c119e1dcac6d0bee62923a")
    assert MeasureConfig.parse(k="3", p="2,inf", coupling="depth,self").config_hash() == (
        "67a53ed5b44db80948260fa2d31d7d3b05fc46465da40e468be2602a5b45496f")
    assert digest_of({"label": "modèle ü", "x": [1.5, 2], "digest": "zz", "n": None}) == (
        "sha256:8a6e09d42ce3a46e3ddcb18044d0cc3ef6c3630db29f59c7e25d3e78bd7d5533")
    assert unit_id(model="m/é", revision=None, prompt_set="builtin:x", limit=3, cfg_hash="abc",
                   label="Lé", step=5, prompt_texts=("a", "ß")) == "L-step5-x-899d0f2089da"
    assert VitTrainConfig().key() == "748982d1a605"  # issue 19: tokens, regularisers, lr_scaling
    assert TinyLMConfig().cache_key() == "4fa28df2f9da7ad5"
    # the quick demo model and one with every field added later (cached checkpoints' names)
    assert TinyLMConfig.quick().cache_key() == "90d3cc437bc3a67e"
    assert TinyLMConfig(max_steps=64, checkpoints=(0, 1, 2, 4, 8, 16, 32, 64), plateau_tol=0.05,
                        min_steps=4, val_windows=0, train_chars=1000,
                        lr_schedule="constant").cache_key() == "85058d9100a0c697"
    assert prompt_items(["é one", "two"], None, 0)[1] == "prompts:cba1847c229e"
