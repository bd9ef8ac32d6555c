"""The interop tier: the real wrapper packages, each in the environment `make test-interop` builds.

TransformerLens 3 (``HookedTransformer``) and 4 (``TransformerBridge``) cannot share one
environment: ``.venv-tl3`` holds TransformerLens 3.x, ``.venv-tl4`` TransformerLens 4.x with
nnsight and PEFT (CI runs both). In any other environment the tests of a package that is
missing skip. Every wrapped model is measured against the same weights loaded plainly.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers as tf

import blockcoupling as bc
from blockcoupling.engine.fastrecord import FastPathWarning
from blockcoupling.errors import ArchitectureError

IDS = {"input_ids": torch.tensor([[2, 3, 4, 5, 6, 7]])}


def _major(package: str) -> int | None:
    """The installed major version of ``package`` (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version(package).split(".")[0])
    except PackageNotFoundError:
        return None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.tiny_runs import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("interop") / "tiny-gpt2")


def _run(model: object, **options: object) -> bc.Measurement:
    return bc.measure(model, None, IDS, k=(2,), progress=False, **options)  # type: ignore[arg-type]


def _fast(model: object, **options: object) -> bc.Measurement:
    """``model`` measured with no fast-path warning, every layer's J^l_tt on the fast path."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastPathWarning)
        m = _run(model, **options)
    assert m.fast_path and all(v is True for v in m.fast_path.values()), m.fast_path
    return m


def _same_as_oracle(model: object, oracle: torch.nn.Module | None = None) -> None:
    """In float64 the wrapped model on the fast path gives the values of the float64 oracle,
    the wrapped model itself on the generic path (autodiff through the whole prompt), to
    rounding; and those of ``oracle`` (the same weights, plain) to what the wrapper's own
    float32 forward changes in the block inputs (the bridge computes attention its own way:
    3e-9 here)."""
    got = _coupling(_fast(model, dtype=torch.float64))
    generic = _run(model, dtype=torch.float64, fast_path=False)
    pd.testing.assert_series_equal(got, _coupling(generic), atol=1e-12, rtol=0)
    if oracle is not None:
        pd.testing.assert_series_equal(got, _coupling(_fast(oracle, dtype=torch.float64)),
                                       atol=1e-7, rtol=0)


def _coupling(m: bc.Measurement) -> pd.Series:
    return m.coupling.query("variant == 'coupling'")["value"].reset_index(drop=True)


def _plain(path: Path) -> torch.nn.Module:
    return tf.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


# ---------------------------------------------------------------------- TransformerLens 4
tl4 = pytest.mark.skipif(_major("transformer-lens") != 4, reason="needs TransformerLens 4.x "
                         "(make test-interop: .venv-tl4)")


@tl4
def test_bridge_boot_transformers_equals_the_plain_model(model_dir: Path) -> None:
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(model_dir), device="cpu")
    m = _fast(bridge)  # the bridge's envelopes are looked through: the HF blocks' fast path
    assert m.meta["wrapper"] == "transformer_bridge" and m.meta["causal"] is True
    assert m.meta["bridge_compatibility_mode"] is False and set(m.fast_path) == {1, 2, 3}
    pd.testing.assert_series_equal(_coupling(m), _coupling(_run(_plain(model_dir))),
                                   atol=1e-5, rtol=0)
    _same_as_oracle(bridge, _plain(model_dir))
    # compatibility mode without weight processing: the same numbers, recorded
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    again = _fast(bridge)
    assert again.meta["bridge_compatibility_mode"] is True
    pd.testing.assert_series_equal(_coupling(again), _coupling(m), atol=1e-5, rtol=0)
    # a hook that changes the first block's activations: that layer on the generic path
    # (through the hook), said in words; the values those of the generic path everywhere
    hook = bridge.original_model.transformer.h[0].attn.hook_out
    hook.add_hook(lambda x, hook: 2 * x)
    with pytest.warns(FastPathWarning, match=r"layer 1: the block inside the wrapper's "
                      "BlockBridge computes another output.*a hook that changes activations"):
        hooked = _run(bridge, dtype=torch.float64)
    assert hooked.fast_path == {1: hooked.fast_path[1], 2: True, 3: True}
    pd.testing.assert_series_equal(
        _coupling(hooked), _coupling(_run(bridge, dtype=torch.float64, fast_path=False)),
        atol=1e-12, rtol=0)
    hook.remove_hooks()


@tl4
def test_bridge_with_processed_weights_is_refused(model_dir: Path, tmp_path: Path) -> None:
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(model_dir), device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True)  # fold_ln, centring: weights change
    with pytest.raises(ArchitectureError, match="weights were processed.*freshly booted"):
        _run(bridge)
    with pytest.raises(ArchitectureError, match="weights were processed"):
        bc.measure_to_dir(bridge, None, IDS, tmp_path / "run", k=(2,), progress=False)
    assert not (tmp_path / "run").exists()  # nothing written


@tl4
def test_bridge_boot_native() -> None:
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_native(
        {"d_model": 16, "d_head": 8, "n_layers": 2, "n_ctx": 16, "n_heads": 2, "d_mlp": 32,
         "d_vocab": 64, "act_fn": "gelu_new", "normalization_type": "LN"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FastPathWarning)
        m = _run(bridge)
    assert m.meta["wrapper"] == "transformer_bridge" and m.meta["causal"] is True
    assert m.meta["hidden_size"] == 16 and m.meta["num_layers"] == 2
    assert len(m.coupling) > 0 and m.coupling["value"].notna().all()


# ---------------------------------------------------------------------- TransformerLens 3
@pytest.mark.skipif(_major("transformer-lens") != 3, reason="needs TransformerLens 3.x "
                    "(make test-interop: .venv-tl3)")
def test_hooked_transformer_3(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformer_lens as tl

    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=16, d_head=8, n_heads=2,
                                     d_vocab=64, act_fn="gelu_new", normalization_type="LN")
    torch.manual_seed(0)
    model = tl.HookedTransformer(cfg).eval()
    from blockcoupling.engine import structured

    steps: list[bool] = []
    real = structured.output_step
    monkeypatch.setattr(structured, "output_step",
                        lambda *a, **kw: steps.append((out := real(*a, **kw)) is not None) or out)
    m = _fast(model)  # its blocks' own key-value cache entry gives the decode step, and
    assert steps and all(steps)  # its J^l_tt comes from the block's structure (GEMMs)
    monkeypatch.setattr(structured, "output_step", real)
    assert m.meta["causal_source"] == "attention_dir" and "weights_processed" not in m.meta
    _same_as_oracle(model)
    rotary = tl.HookedTransformer(tl.HookedTransformerConfig(
        n_layers=2, d_model=16, n_ctx=16, d_head=8, n_heads=2, d_vocab=64, act_fn="silu",
        normalization_type="RMS", positional_embedding_type="rotary")).eval()
    _same_as_oracle(rotary)  # rotary positions: the query rotated at its own position
    model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    with pytest.warns(UserWarning, match="fold_ln"):
        processed = _run(model)
    assert processed.meta["weights_processed"] == ["fold_ln", "center_writing_weights"]


# ---------------------------------------------------------------------- nnsight, PEFT
@pytest.mark.skipif(_major("nnsight") is None, reason="needs nnsight")
def test_nnsight_loaded_and_lazy(model_dir: Path) -> None:
    import nnsight

    tok = tf.AutoTokenizer.from_pretrained(model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = nnsight.LanguageModel(str(model_dir), tokenizer=tok)
        loaded = nnsight.LanguageModel(str(model_dir), tokenizer=tok, dispatch=True)
        wrapped = nnsight.LanguageModel(_plain(model_dir), tokenizer=tok)
    with pytest.raises(ArchitectureError, match="loaded lazily.*dispatch=True"):
        _run(lazy)
    with pytest.raises(ArchitectureError, match="dispatch=True"):
        bc.measure_to_dir(lazy, None, IDS, model_dir.parent / "lazy-run", k=(2,), progress=False)
    assert not (model_dir.parent / "lazy-run").exists()  # nothing written
    ref = _coupling(_run(_plain(model_dir)))
    for lm in (loaded, wrapped):
        m = _fast(lm)  # nnsight's forward controllers called as the modules' own forwards
        assert m.meta["wrapper"] == "nnsight" and set(m.fast_path) == {1, 2, 3}
        pd.testing.assert_series_equal(_coupling(m), ref, atol=1e-5, rtol=0)
    _same_as_oracle(wrapped, _plain(model_dir))


@pytest.mark.skipif(_major("peft") is None, reason="needs peft")
def test_peft_adapters_measured_as_loaded_and_merged_equals_active(model_dir: Path) -> None:
    import peft

    base = _plain(model_dir)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(base, peft.LoraConfig(target_modules=["c_attn"], r=2,
                                                        init_lora_weights=False))
    m = _run(pm)
    assert m.meta["wrapper"] == "peft" and m.meta["adapters"].endswith("active, not merged")
    assert m.fast_path == {1: True, 2: True, 3: True}
    merged = _run(pm.merge_and_unload())  # the same function as the active adapters
    pd.testing.assert_series_equal(_coupling(merged), _coupling(m), atol=1e-5, rtol=0)
