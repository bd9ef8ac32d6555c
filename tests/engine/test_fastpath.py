"""The decode-step fast path for J^l_tt against float64 dense oracles.

Oracles: ``jacobian.jacobian_blocks`` (the generic batched-VJP path) and, independently,
``torch.autograd.functional.jacobian`` of the whole residual branch written out in the test.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import transformers as tf
from torch import nn

from blockcoupling.engine import fastpath, fastrecord
from blockcoupling.engine.blocks import find_blocks
from blockcoupling.engine.capture import (
    CACHE_NAMES,
    Capture,
    capture,
    replay_context,
    residual_branch,
)
from blockcoupling.engine.fastrecord import FastPathWarning
from blockcoupling.engine.jacobian import jacobian_blocks
from blockcoupling.engine.svd import randomized_topk_svd
from blockcoupling.errors import BlockCouplingError
from tests.helpers.tiny_models import CAUSAL, ENCODERS, minilm_path, tiny_inputs, tiny_model

F64 = torch.float64
# RMSNorm of the Llama family computes in float32 internally, even in a float64 model.
FLOAT32_NORM = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"}


def _tol(arch: str) -> float:
    return 1e-6 if arch in FLOAT32_NORM else 1e-8


def _padded_capture(model: nn.Module, arch: str, final_norm: bool = False) -> Capture:
    """Batch of 2 right-padded prompts: lengths 6 and 4."""
    inputs = tiny_inputs(arch, n=6, batch=2, seed=1)
    inputs["attention_mask"] = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    return capture(model, inputs, find_blocks(model), final_norm=final_norm, boundary_dtype=F64)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module", params=sorted(CAUSAL))
def causal(request: pytest.FixtureRequest) -> tuple[str, nn.Module, Capture]:
    arch = request.param
    model = tiny_model(arch, seed=3, dtype=F64)
    return arch, model, _padded_capture(model, arch)


def test_dense_jacobian_matches_generic_path(causal: tuple[str, nn.Module, Capture]) -> None:
    arch, model, cap = causal
    for prompt in (0, 1):
        n = cap.lengths[prompt]
        tokens = [n - 1, n // 2]
        for layer in range(1, cap.n_layers + 1):
            tbs = fastpath.token_branches(model, cap, layer, prompt, tokens, dtype=F64)
            assert tbs is not None, f"{arch}: fast path refused layer {layer}"
            f, x = residual_branch(model, cap, layer, prompt, dtype=F64)
            J_ref = jacobian_blocks(f, x, tokens, in_tokens=tokens)  # (2, 2, d, d)
            for i, t in enumerate(tokens):
                J = tbs[t].jacobian()
                assert J.shape == (x.shape[1], x.shape[1]) and J.dtype == F64
                assert _rel(J, J_ref[i, i]) < _tol(arch), (arch, layer, prompt, t)
                assert tbs[t].verify_error is not None and tbs[t].verify_error < _tol(arch)


def test_matmat_rmatmat_match_dense(causal: tuple[str, nn.Module, Capture]) -> None:
    arch, model, cap = causal
    t = cap.lengths[1] - 1
    tb = fastpath.token_branch(model, cap, 2, 1, t, dtype=F64, chunk_size=3)
    assert tb is not None
    f, x = residual_branch(model, cap, 2, 1, dtype=F64)
    J = jacobian_blocks(f, x, [t], in_tokens=[t])[0, 0]  # (d, d)
    g = torch.Generator().manual_seed(7)
    V = torch.randn(tb.d, 5, generator=g, dtype=F64)
    assert _rel(tb.matmat(V), J @ V) < _tol(arch)
    assert _rel(tb.rmatmat(V), J.T @ V) < _tol(arch)
    assert _rel(tb.matmat(V[:, 0]), (J @ V[:, :1])) < _tol(arch)  # a vector is one column
    # g at x is the residual branch at token t
    with torch.no_grad(), replay_context():
        assert _rel(tb.value(), f(x)[t]) < _tol(arch)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_independent_autograd_oracle(arch: str) -> None:
    """Block Jacobian from torch.autograd.functional.jacobian of F(X) - X, written here."""
    model = tiny_model(arch, seed=5, dtype=F64)
    cap = _padded_capture(model, arch)
    layer, prompt, t = 2, 0, 3
    block = find_blocks(model)
    blocks = model.get_submodule(block.blocks_path)
    call = cap.calls[layer - 1]  # type: ignore[index]
    x = call.input[prompt : prompt + 1].clone()  # (1, n, d)
    args = tuple(a[prompt : prompt + 1] if isinstance(a, torch.Tensor) and a.ndim >= 2
                 and a.shape[0] == 2 else a for a in call.args[1:])
    kwargs = {k: (v[prompt : prompt + 1] if isinstance(v, torch.Tensor) and v.ndim >= 2
                  and v.shape[0] == 2 else v) for k, v in call.kwargs.items()}

    def branch_t(xt: torch.Tensor) -> torch.Tensor:  # (d,) -> (d,)
        h = torch.cat([x[0, :t], xt[None], x[0, t + 1 :]])[None]
        with replay_context():
            out = blocks[layer - 1](h, *args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        return out[0, t] - xt

    J_ref = torch.autograd.functional.jacobian(branch_t, x[0, t].clone())  # (d, d)
    tb = fastpath.token_branch(model, cap, layer, prompt, t, dtype=F64)
    assert tb is not None
    assert _rel(tb.jacobian(), J_ref) < _tol(arch)


def test_final_norm_folded_into_last_block() -> None:
    model = tiny_model("gpt2", seed=2, dtype=F64)
    cap = _padded_capture(model, "gpt2", final_norm=True)
    L, t = cap.n_layers, cap.lengths[0] - 1
    tb = fastpath.token_branch(model, cap, L, 0, t, dtype=F64)
    assert tb is not None
    f, x = residual_branch(model, cap, L, 0, dtype=F64)
    assert _rel(tb.jacobian(), jacobian_blocks(f, x, [t], in_tokens=[t])[0, 0]) < 1e-8


@pytest.mark.parametrize("arch,config", [
    ("gemma2", dict(sliding_window=2)),  # sliding window narrower than the prompt
    ("gpt_neo", dict(window_size=2)),  # GPT-Neo local attention (layer 2 is local)
])
def test_local_attention_windows(arch: str, config: dict[str, Any]) -> None:
    cfg = CAUSAL[arch]()
    for k, v in config.items():
        setattr(cfg, k, v)
    torch.manual_seed(4)
    model = tf.AutoModel.from_config(cfg).to(F64).eval()
    # no padding: a fully padded sliding window gives NaN rows in the model itself
    cap = capture(model, tiny_inputs(arch, n=6, seed=1), find_blocks(model), boundary_dtype=F64)
    t = 5
    for layer in (1, 2):
        tb = fastpath.token_branch(model, cap, layer, 0, t, dtype=F64)
        assert tb is not None
        f, x = residual_branch(model, cap, layer, 0, dtype=F64)
        J_ref = jacobian_blocks(f, x, [t], in_tokens=[t])[0, 0]
        assert _rel(tb.jacobian(), J_ref) < _tol(arch)


def test_float32_analysis_of_float32_model() -> None:
    model64 = tiny_model("gpt_neox", seed=6, dtype=F64)
    model32 = tiny_model("gpt_neox", seed=6, dtype=torch.float32)
    cap64, cap32 = _padded_capture(model64, "gpt_neox"), _padded_capture(model32, "gpt_neox")
    tb = fastpath.token_branch(model32, cap32, 2, 0, 5, dtype=torch.float32)
    assert tb is not None and tb.dtype == torch.float32
    f, x = residual_branch(model64, cap64, 2, 0, dtype=F64)
    J64 = jacobian_blocks(f, x, [5], in_tokens=[5])[0, 0]
    assert _rel(tb.jacobian().double(), J64) < 1e-4


def test_randomized_svd_accepts_token_branch() -> None:
    model = tiny_model("llama", seed=1, dtype=F64)
    cap = _padded_capture(model, "llama")
    tb = fastpath.token_branch(model, cap, 2, 0, 5, dtype=F64)
    assert tb is not None
    top = randomized_topk_svd(tb, 3, oversample=13, n_iter=6)  # m = d: exact range
    S_ref = torch.linalg.svdvals(tb.jacobian())[:3]
    assert torch.allclose(top.S, S_ref, rtol=1e-6, atol=0)  # float32 RMSNorm inside


def test_encoders_return_none() -> None:
    for arch in ENCODERS:
        model = tiny_model(arch, dtype=F64)
        cap = capture(model, tiny_inputs(arch, n=5), find_blocks(model))
        assert fastpath.token_branch(model, cap, 1, 0, 4, dtype=F64) is None


def test_real_minilm_returns_none() -> None:
    model = tf.AutoModel.from_pretrained(minilm_path()).eval()
    inputs = {"input_ids": torch.tensor([[101, 3000, 2003, 1996, 3007, 102]])}
    cap = capture(model, inputs, find_blocks(model))
    assert fastpath.token_branch(model, cap, 1, 0, 5) is None


class _NoCacheBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + torch.tanh(self.lin(hidden_states.cumsum(dim=1)))


class _NoCacheModel(nn.Module):
    def __init__(self, d: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_NoCacheBlock(d) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def test_block_without_cache_argument_returns_none() -> None:
    torch.manual_seed(0)
    model = _NoCacheModel().double().eval()
    spec = find_blocks(model, "blocks")
    cap = capture(model, {"x": torch.randn(1, 3, 4, dtype=F64)}, spec)
    cap = dataclasses.replace(cap, spec=dataclasses.replace(cap.spec, causal=True))
    assert fastpath.token_branch(model, cap, 1, 0, 2, dtype=F64) is None


def test_wrong_fast_path_is_rejected_by_verification(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefix cache that forgets the context gives a different Jacobian: None + warning."""
    model = tiny_model("gpt2", seed=0, dtype=F64)
    cap = _padded_capture(model, "gpt2")

    def forgetful(self: Any, k: torch.Tensor, v: torch.Tensor, *a: Any, **kw: Any) -> Any:
        return k, v

    monkeypatch.setattr(fastpath._PrefixCache, "update", forgetful)
    with pytest.warns(UserWarning, match="disagrees with the generic"):
        assert fastpath.token_branch(model, cap, 1, 0, 5, dtype=F64) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tb = fastpath.token_branch(model, cap, 1, 0, 5, dtype=F64, verify=False)
    assert tb is not None  # unverified: the caller asked for it


def test_out_of_range_arguments_raise() -> None:
    model = tiny_model("gpt2", dtype=F64)
    cap = _padded_capture(model, "gpt2")
    with pytest.raises(BlockCouplingError, match="positions 0..3"):
        fastpath.token_branch(model, cap, 1, 1, 4, dtype=F64)  # padded position
    with pytest.raises(BlockCouplingError, match="layer 9"):
        fastpath.token_branch(model, cap, 9, 0, 0, dtype=F64)
    with pytest.raises(BlockCouplingError, match="prompt 2"):
        fastpath.token_branch(model, cap, 1, 2, 0, dtype=F64)
    tb = fastpath.token_branch(model, cap, 1, 0, 5, dtype=F64)
    assert tb is not None
    with pytest.raises(BlockCouplingError, match=r"shape \(d, m\)"):
        tb.matmat(torch.zeros(3, 2, dtype=F64))


# ----------------------------------------------------------------------------- by capability
@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_measure_takes_fast_path_at_every_layer_without_warning(arch: str) -> None:
    """With the installed transformers (whatever it calls the cache argument): no fallback
    warning, ``meta["fast_path"]`` True at every layer, every J_tt from the fast path."""
    import blockcoupling as bc

    model = tiny_model(arch, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastPathWarning)
        m = bc.measure(model, None, tiny_inputs(arch, n=5, batch=2), k=(2,), progress=False)
    assert m.fast_path == {1: True, 2: True, 3: True}
    assert m.meta["fast_path"] == {"1": True, "2": True, "3": True}
    assert set(m.diagnostics["method"]) == {"dense_fast"}
    assert fastrecord.describe(m.meta) == "fast path: taken at every measured layer (1-3)"


def _inner_cache_name(layer: nn.Module) -> str:
    import inspect

    return next(c for c in CACHE_NAMES if c in inspect.signature(layer.forward).parameters)


class _RenamedCacheLayer(nn.Module):
    """A decoder layer whose cache argument has a name no transformers release used: found by
    its ``Cache`` annotation (a string, as under ``from __future__ import annotations``)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.inner_name = _inner_cache_name(inner)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None,
                position_ids: Any = None, kv_store: Cache | None = None,  # noqa: F821
                position_embeddings: Any = None, **kwargs: Any) -> Any:
        for name in CACHE_NAMES:  # what the model passes under its own spelling: not ours
            kwargs.pop(name, None)
        return self.inner(hidden_states, attention_mask=attention_mask,
                          position_ids=position_ids, position_embeddings=position_embeddings,
                          **{self.inner_name: kv_store}, **kwargs)


def test_cache_argument_found_by_annotation_whatever_its_name() -> None:
    model = tiny_model("llama", seed=2, dtype=F64)
    layers = model.layers
    for i in range(len(layers)):
        layers[i] = _RenamedCacheLayer(layers[i]).eval()
    cap = _padded_capture(model, "llama")
    named, _, candidates = fastpath._named_call(
        layers[0], cap.calls[0].args[:1], cap.calls[0].kwargs)  # type: ignore[index]
    assert candidates[0] == "kv_store"
    tb = fastpath.token_branch(model, cap, 2, 0, 5, dtype=F64)
    assert tb is not None
    f, x = residual_branch(model, cap, 2, 0, dtype=F64)
    assert _rel(tb.jacobian(), jacobian_blocks(f, x, [5], in_tokens=[5])[0, 0]) < _tol("llama")


def test_refusal_is_warned_once_per_run_and_recorded_per_layer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Every layer refused (a prefix cache that forgets the context): one warning naming all
    of them, the reason per layer in meta, the same numbers as the generic path."""
    import blockcoupling as bc

    def forgetful(self: Any, k: torch.Tensor, v: torch.Tensor, *a: Any, **kw: Any) -> Any:
        return k, v

    model = tiny_model("gpt2", seed=3, dtype=F64)
    inputs = tiny_inputs("gpt2", n=5, batch=2)
    kw: dict[str, Any] = dict(k=(2,), dtype=F64, progress=False)
    generic = bc.measure(model, None, inputs, fast_path=False, **kw)
    assert set(generic.fast_path.values()) == {fastrecord.OFF}
    monkeypatch.setattr(fastpath._PrefixCache, "update", forgetful)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = bc.measure(model, None, inputs, **kw)
    said = [w for w in caught if issubclass(w.category, FastPathWarning)]
    assert len(said) == 1, [str(w.message) for w in said]
    assert "layers 1-3: disagrees with the generic Jacobian" in str(said[0].message)
    assert set(m.fast_path) == {1, 2, 3} and all(
        str(v).startswith("disagrees with the generic Jacobian") for v in m.fast_path.values())
    assert set(m.diagnostics["method"]) == {"dense"}
    np.testing.assert_allclose(m.coupling["value"], generic.coupling["value"], atol=1e-12)
    # a run directory keeps the record, and `show` states it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FastPathWarning)
        stored = bc.measure_to_dir(model, None, inputs, tmp_path / "run", **kw)
    assert bc.open_run(tmp_path / "run").fast_path == m.fast_path == stored.fast_path
    assert "fast path: generic path at layers 1-3: disagrees" in stored.summary()
    enc = bc.measure(tiny_model("bert", dtype=F64), None, tiny_inputs("bert"), **kw)
    assert set(enc.fast_path.values()) == {fastrecord.NOT_CAUSAL}


def test_a_refusal_says_why_in_words_without_the_exception_text(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A block that fails when given a cache (an internal error with library-internal text):
    the warning and meta say what failed in words, never the exception's own text."""
    import blockcoupling as bc

    def broken(self: Any, k: torch.Tensor, v: torch.Tensor, *a: Any, **kw: Any) -> Any:
        raise TypeError("_wrapped_call_impl() got multiple values for argument 'self'")

    model = tiny_model("gpt2", seed=3, dtype=F64)
    monkeypatch.setattr(fastpath._RecordingCache, "update", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = bc.measure(model, None, tiny_inputs("gpt2", n=5), k=(2,), dtype=F64,
                       progress=False)
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, FastPathWarning))
    assert "calling the block with a cache there failed: it does not accept those " \
           "arguments" in said
    for text in (said, *map(str, m.fast_path.values())):
        assert "_wrapped_call_impl" not in text and "TypeError" not in text, text
