"""Causality and width for any model, and model wrappers accepted as they are (issue 20).

The same GPT-2 weights as (a) HF ``GPT2Model``, (b) a causal ``nn.TransformerEncoder`` with a
causal mask and (c) a TransformerLens-shaped module (``.cfg.attention_dir``, ``.blocks``,
``forward(input)``) give equal token-wise tables without an anti-causal pair.
"""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import torch
import transformers as tf
from torch import nn
from torch.nn import functional as F

from blockcoupling import measure
from blockcoupling.engine.blocks import find_blocks
from blockcoupling.engine.causality import is_causal_mask
from blockcoupling.engine.wrappers import (
    forward_inputs,
    forward_signature,
    original_module,
    unwrap_model,
    without_bridges,
)
from blockcoupling.errors import ArchitectureError
from tests.helpers.tiny_models import EncoderStack

D, H, L, V = 16, 2, 3, 64
KEYS = ["prompt_id", "kind", "layer_a", "layer_b", "token_in_a", "token_out_a", "token_in_b",
        "token_out_b", "k", "variant", "p", "orientation"]
KINDS = ("self", "fixed_input", "fixed_output", "depth")


def gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=L, n_embd=D, n_head=H, vocab_size=V, n_positions=32)
    return tf.GPT2Model(cfg).eval()


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")  # GPT-2's gelu_new


def _linear(conv: nn.Module) -> nn.Linear:
    """An nn.Linear equal to a GPT-2 Conv1D (weight (in, out))."""
    w = conv.weight.detach()
    lin = nn.Linear(w.shape[0], w.shape[1])
    lin.weight.data.copy_(w.T)
    lin.bias.data.copy_(conv.bias.detach())
    return lin


class CausalEncoderLM(nn.Module):
    """GPT-2's weights in a pre-LN ``nn.TransformerEncoder`` run with a causal mask; the
    forward takes its token ids as ``tokens`` (not ``input_ids``)."""

    def __init__(self, g: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.ln_f = (copy.deepcopy(m) for m in (g.wte, g.wpe, g.ln_f))
        layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.0, activation=gelu_tanh,
                                           batch_first=True, norm_first=True,
                                           layer_norm_eps=g.config.layer_norm_epsilon)
        self.encoder = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        for mine, theirs in zip(self.encoder.layers, g.h, strict=True):
            attn, mlp = theirs.attn, theirs.mlp
            mine.self_attn.in_proj_weight.data.copy_(attn.c_attn.weight.detach().T)
            mine.self_attn.in_proj_bias.data.copy_(attn.c_attn.bias.detach())
            mine.self_attn.out_proj.weight.data.copy_(attn.c_proj.weight.detach().T)
            mine.self_attn.out_proj.bias.data.copy_(attn.c_proj.bias.detach())
            mine.linear1.load_state_dict(_linear(mlp.c_fc).state_dict())
            mine.linear2.load_state_dict(_linear(mlp.c_proj).state_dict())
            mine.norm1.load_state_dict(theirs.ln_1.state_dict())
            mine.norm2.load_state_dict(theirs.ln_2.state_dict())
        self.eval()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, n) -> (B, n, D)
        n = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(n))
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        return self.ln_f(self.encoder(x, mask=mask, is_causal=True))


class TLBlock(nn.Module):
    """A TransformerLens-shaped block (``forward(resid_pre)``) computing a GPT-2 block; its
    causal mask is built inside (no mask argument to see)."""

    def __init__(self, b: nn.Module) -> None:
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(b.ln_1), copy.deepcopy(b.ln_2)
        self.qkv, self.o = _linear(b.attn.c_attn), _linear(b.attn.c_proj)
        self.fc1, self.fc2 = _linear(b.mlp.c_fc), _linear(b.mlp.c_proj)

    def forward(self, resid_pre: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:  # (B, n, D) -> (B, n, D)
        B, n, _ = resid_pre.shape
        q, k, v = (t.view(B, n, H, D // H).transpose(1, 2)
                   for t in self.qkv(self.ln1(resid_pre)).split(D, -1))
        s = (q @ k.transpose(-1, -2)) / (D // H) ** 0.5  # (B, H, n, n)
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, n, D)
        x = resid_pre + self.o(a)
        return x + self.fc2(gelu_tanh(self.fc1(self.ln2(x))))


class HookedLike(nn.Module):
    """Shaped like TransformerLens's HookedTransformer: ``cfg`` (``n_layers``, ``d_model``,
    ``attention_dir``), ``embed``, ``pos_embed``, ``blocks``, ``ln_final``, ``forward(input)``."""

    def __init__(self, g: nn.Module, with_cfg: bool = True) -> None:
        super().__init__()
        if with_cfg:
            self.cfg = SimpleNamespace(n_layers=L, d_model=D, n_ctx=32, attention_dir="causal",
                                       normalization_type="LN", model_name="hooked-like")
        self.embed, self.pos_embed = copy.deepcopy(g.wte), copy.deepcopy(g.wpe)
        self.blocks = nn.ModuleList(TLBlock(b) for b in g.h)
        self.ln_final = copy.deepcopy(g.ln_f)
        self.eval()

    def forward(self, input: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:  # (B, n) -> (B, n, D)
        x = self.embed(input) + self.pos_embed(torch.arange(input.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.ln_final(x)


def ids(n: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, V, (1, n), generator=g)}


def run(model: object, inputs: dict[str, torch.Tensor] | None = None, **kw: object) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return measure(model, None, ids() if inputs is None else inputs, coupling=KINDS, k=(2, 4), tokens="all",
                       dtype=torch.float64, progress=False, **kw)


def table(m: object) -> pd.DataFrame:
    df = m.coupling  # type: ignore[attr-defined]
    return df.sort_values(KEYS).reset_index(drop=True)


def test_same_weights_give_equal_token_wise_tables_without_anti_causal_pairs() -> None:
    g = gpt2()
    hf = run(g)
    enc = run(CausalEncoderLM(g), blocks_path="encoder.layers")
    tl = run(HookedLike(g))
    ref = table(hf)
    assert hf.meta["causal"] and hf.meta["causal_source"] == "config"
    assert enc.meta["causal"] and enc.meta["causal_source"] == "mask"
    assert tl.meta["causal"] and tl.meta["causal_source"] == "attention_dir"
    assert enc.meta["hidden_size"] == tl.meta["hidden_size"] == D
    assert tl.meta["blocks_path"] == "blocks" and tl.meta["model"] == "hooked-like"
    for m in (hf, enc, tl):
        df = table(m)
        assert set(df["kind"]) == set(KINDS)
        assert not (df["token_in_a"] > df["token_out_a"]).any()
        assert not (df["token_in_b"] > df["token_out_b"]).any()
        pd.testing.assert_frame_equal(df[KEYS], ref[KEYS])
        assert df["value"].isna().sum() == ref["value"].isna().sum() == 0
        assert (df["value"] - ref["value"]).abs().max() < 1e-4
    n = 5  # fixed_input: for input t1, outputs t2, t2' >= t1 on 3 layers, 2 K, ...
    per = table(hf).query("kind == 'fixed_input' and k == 2 and variant == 'coupling' "
                          "and orientation == 'ujv'")
    assert len(per) == L * sum((n - t) ** 2 for t in range(n))


def test_causality_from_a_probe_of_j_and_overrides() -> None:
    g = gpt2()
    probe = run(HookedLike(g, with_cfg=False), blocks_path="blocks")
    assert probe.meta["causal"] is True and probe.meta["causal_source"] == "probe"
    assert probe.meta["hidden_size"] == D
    torch.manual_seed(0)
    enc = run(EncoderStack(2).eval(), {"x": torch.randn(1, 5, 8)}, blocks_path="layers",
              hidden_size=8)
    assert enc.meta["causal"] is False and enc.meta["causal_source"] == "probe"
    forced = run(HookedLike(g), causal=False)
    assert forced.meta["causal"] is False and forced.meta["causal_source"] == "option"
    df = forced.coupling
    assert (df.query("kind == 'fixed_input'")["token_in_a"]
            > df.query("kind == 'fixed_input'")["token_out_a"]).any()


def test_causal_and_hidden_size_options_keep_earlier_hashes() -> None:
    from blockcoupling.engine.config import MeasureConfig

    base = MeasureConfig()
    assert MeasureConfig.parse(causal="auto").config_hash() == base.config_hash()
    assert MeasureConfig.parse(causal="true").config_hash() != base.config_hash()
    assert MeasureConfig.parse(hidden_size="16").hidden_size == 16


def test_is_causal_mask() -> None:
    n = 4
    assert is_causal_mask(nn.Transformer.generate_square_subsequent_mask(n), n)
    assert is_causal_mask(torch.ones(n, n, dtype=torch.bool).triu(1), n)
    assert not is_causal_mask(torch.zeros(n, n), n)
    assert not is_causal_mask(torch.ones(n, n, dtype=torch.bool).triu(2), n)


def test_forward_inputs_renames_to_the_forwards_argument() -> None:
    tokens = torch.ones(2, 3, dtype=torch.long)
    ones = torch.ones(2, 3, dtype=torch.long)
    out = forward_inputs(HookedLike(gpt2()), {"input_ids": tokens, "attention_mask": ones})
    assert set(out) == {"input", "attention_mask"} and out["input"] is tokens
    enc = CausalEncoderLM(gpt2())
    assert set(forward_inputs(enc, {"input_ids": tokens, "attention_mask": ones})) == {"tokens"}
    padded = ones.clone()
    padded[0, 2] = 0
    with pytest.raises(ArchitectureError, match="batch_size=1"):
        forward_inputs(enc, {"input_ids": tokens, "attention_mask": padded})
    g = gpt2()
    assert forward_inputs(g, {"input_ids": tokens}) == {"input_ids": tokens}


def test_bridge_like_and_nnsight_like_wrappers_are_unwrapped() -> None:
    g = gpt2()

    class Bridge(nn.Module):  # TransformerLens 4: the HF model at .original_model
        def __init__(self) -> None:
            super().__init__()
            self.original_model = g

    class Envoy:  # nnsight >= 0.4: not an nn.Module, the HF model at ._module
        _module = g

    ref = table(run(g))
    for wrapper, name in ((Bridge(), "transformer_bridge"), (Envoy(), "nnsight")):
        assert find_blocks(wrapper).blocks_path == "h"  # type: ignore[arg-type]
        m = run(wrapper)
        assert m.meta["wrapper"] == name and m.meta["causal"] is True
        pd.testing.assert_frame_equal(table(m), ref)
    with pytest.raises(ArchitectureError, match="not a torch nn.Module"):
        unwrap_model(object())


def test_real_nnsight_language_model() -> None:
    nnsight = pytest.importorskip("nnsight", reason="nnsight is an optional test dependency")
    from tests.helpers.tiny_models import minilm_path

    g = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=L, n_embd=D, n_head=H, vocab_size=V,
                                         n_positions=32)).eval()
    tok = tf.AutoTokenizer.from_pretrained(minilm_path())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = nnsight.LanguageModel(g, tokenizer=tok)
    from blockcoupling.engine.fastrecord import FastPathWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", FastPathWarning)
        m = run(lm)
    assert m.meta["wrapper"] == "nnsight" and m.meta["blocks_path"] == "transformer.h"
    assert m.fast_path == {1: True, 2: True, 3: True}  # nnsight's forward controllers
    pd.testing.assert_frame_equal(table(m), table(run(g)))


def test_real_peft_model_is_measured_as_loaded() -> None:
    peft = pytest.importorskip("peft", reason="peft is an optional test dependency")
    g = gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(copy.deepcopy(g), peft.LoraConfig(
            target_modules=["c_attn"], r=2, init_lora_weights=False))
    m = run(pm)
    assert m.meta["wrapper"] == "peft" and m.meta["adapters"].endswith("active, not merged")
    assert m.meta["adapter_names"] == ["default"]
    assert m.meta["blocks_path"] == "h"
    assert (table(m)["value"] - table(run(g))["value"]).abs().max() > 1e-6  # adapters act


def test_real_hooked_transformer() -> None:
    tl = pytest.importorskip("transformer_lens", reason="transformer-lens is optional")
    from importlib.metadata import version

    if int(version("transformer-lens").split(".")[0]) >= 4:  # removed in 4.0 (test_interop.py)
        pytest.skip("HookedTransformer is TransformerLens 3.x (make test-interop: .venv-tl3)")
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=D, n_ctx=16, d_head=8, n_heads=2,
                                     d_vocab=V, act_fn="gelu_new", normalization_type="LN")
    torch.manual_seed(0)
    model = tl.HookedTransformer(cfg).eval()
    m = run(model)
    assert m.meta["blocks_path"] == "blocks" and m.meta["causal_source"] == "attention_dir"
    assert m.meta["causal"] is True and m.meta["hidden_size"] == D
    assert "weights_processed" not in m.meta
    folded = tl.HookedTransformer(tl.HookedTransformerConfig(
        n_layers=2, d_model=D, n_ctx=16, d_head=8, n_heads=2, d_vocab=V, act_fn="gelu_new",
        normalization_type="LNPre")).eval()
    with pytest.warns(UserWarning, match="fold_ln"):
        unwrap_model(folded)
    model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    with pytest.warns(UserWarning, match="fold_ln, center_writing_weights"):
        processed = measure(model, None, ids(), k=(2,), progress=False)
    assert processed.meta["weights_processed"] == ["fold_ln", "center_writing_weights"]


def test_stored_tables_describe_themselves(tmp_path: object) -> None:
    """Parquet key-value metadata and SCHEMA.md: columns with meaning and unit, variant
    directions, indexing, the sweep unit; the run opens as before."""
    import json
    from pathlib import Path

    import pyarrow.parquet as pq

    from blockcoupling.store.reader import open_run
    from blockcoupling.store.record import measure_to_dir
    from blockcoupling.store.schema import COLUMNS

    out = Path(str(tmp_path)) / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measure_to_dir(gpt2(), None, ids(), out, k=(2,), progress=False,
                       meta={"unit_id": "u-1", "label": "tiny", "step": 3, "revision": None})
    for name in COLUMNS:
        md = pq.read_schema(out / f"{name}.parquet").metadata
        desc = json.loads(md[b"blockcoupling.schema"])
        assert desc["table"] == name and set(desc["columns"]) == set(COLUMNS[name])
        assert desc["variants"]["offdiag_ratio"].startswith("lower = more coupled")
        assert "1-based" in desc["indexing"]
        assert json.loads(md[b"blockcoupling.unit"]) == {"unit_id": "u-1", "label": "tiny",
                                                          "step": 3}
    cp = pd.read_parquet(out / "coupling.parquet")  # one unit's file read alone
    assert set(cp["unit_id"]) == {"u-1"} and set(cp["label"]) == {"tiny"}
    assert set(cp["step"]) == {3} and "revision" not in cp  # revision None: no column
    pr = pd.read_parquet(out / "prompts.parquet")
    assert set(pr["unit_id"]) == {"u-1"} and set(pr["label"]) == {""}  # the prompt's label
    text = (out / "SCHEMA.md").read_text()
    assert "| `value` |" in text and "`coupling_vs_null` | higher = more coupled" in text
    assert "`unit_id` = u-1" in text
    assert len(open_run(out).coupling) > 0


def test_forward_signature_drops_the_self_of_a_forward_object() -> None:
    """nnsight installs an object as each module's forward whose signature is the class's
    unbound forward (``self`` first): the call's signature is the forward's without it."""
    import functools

    class Controller:  # as nnsight's: the unbound forward's metadata, called with the args
        def __init__(self, module: nn.Module) -> None:
            functools.update_wrapper(self, type(module).forward)
            self.module = module

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return type(self.module).forward(self.module, *args, **kwargs)

    block = gpt2().h[0]
    plain = list(forward_signature(block).parameters)
    block.forward = Controller(block)
    assert list(forward_signature(block).parameters) == plain and plain[0] == "hidden_states"


def test_without_bridges_gives_the_original_modules_in_shallow_copies() -> None:
    """A TransformerLens-4-style envelope (a bridge component holding the original module,
    bridges in place of its children): the copy has the originals, shares their tensors, and
    the user's module is unchanged."""

    class Bridge(nn.Module):
        def __init__(self, original: nn.Module) -> None:
            super().__init__()
            self._original_component = original

        @property
        def original_component(self) -> nn.Module:
            return self._original_component

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self._original_component(*args, **kwargs)

    Bridge.__module__ = "transformer_lens.model_bridge.generalized_components.base"
    block = gpt2().h[0]
    ln, attn = block.ln_1, block.attn
    block.ln_1, block.attn.c_attn = Bridge(ln), Bridge(attn.c_attn)
    wrapped = Bridge(block)
    plain = without_bridges(wrapped)
    assert original_module(wrapped) is block and type(plain) is type(block)
    assert plain.ln_1 is ln and type(plain.attn.c_attn).__name__ == "Conv1D"
    assert plain.attn.c_attn.weight is attn.c_attn.original_component.weight  # shared
    assert isinstance(block.ln_1, Bridge) and isinstance(block.attn.c_attn, Bridge)  # unchanged
    x = torch.randn(1, 4, D)
    first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
    torch.testing.assert_close(first(plain(x)), first(wrapped(x)))
    assert without_bridges(ln) is ln  # no bridge: the module itself
