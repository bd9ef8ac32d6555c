"""Capture: boundaries against HF hidden_states, recorded calls, padding, replay, errors."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from blockcoupling.engine.blocks import find_blocks, get_blocks, get_module
from blockcoupling.engine.capture import capture, residual_branch
from blockcoupling.errors import ArchitectureError, BlockCouplingError, NumericalError, ReplayError
from tests.helpers.tiny_models import ALL, D, tiny_inputs, tiny_model


def _hooks(model: nn.Module, spec) -> list[tuple[int, ...]]:
    """Ids of the hooks on every block (HF installs some of its own)."""
    return [tuple(b._forward_pre_hooks) + tuple(b._forward_hooks) for b in get_blocks(model, spec)]


def _has_cache(obj: object) -> bool:
    from transformers.cache_utils import Cache

    if isinstance(obj, (tuple, list)):
        return any(_has_cache(o) for o in obj)
    if isinstance(obj, dict):
        return any(_has_cache(o) for o in obj.values())
    return isinstance(obj, Cache)


@pytest.mark.parametrize("arch", sorted(ALL))
def test_boundaries_match_hf_hidden_states(arch: str) -> None:
    """x^0..x^{L-1} are HF's hidden_states; the last one is after the final norm, except ViT."""
    model = tiny_model(arch, dtype=torch.float64)
    spec = find_blocks(model)
    inputs = tiny_inputs(arch, n=5, batch=2)
    hs = model(**inputs, output_hidden_states=True).hidden_states
    hooks_before = _hooks(model, spec)
    cap = capture(model, inputs, spec, boundary_dtype=torch.float64)
    L = spec.num_layers
    assert cap.boundaries.shape == (L + 1, 2, hs[0].shape[1], D)
    for layer in range(L):
        torch.testing.assert_close(cap.boundaries[layer], hs[layer], rtol=0, atol=0)
    if spec.final_norm_path is not None:
        capn = capture(model, inputs, spec, final_norm=True, boundary_dtype=torch.float64)
        torch.testing.assert_close(capn.boundaries[:L], cap.boundaries[:L], rtol=0, atol=0)
        assert not torch.allclose(capn.boundaries[L], cap.boundaries[L])
        norm = get_module(model, spec.final_norm_path)
        with torch.no_grad():
            torch.testing.assert_close(
                capn.boundaries[L], norm(cap.calls[-1].output), rtol=0, atol=0
            )
        last = capn if arch != "vit" else cap  # HF ViT's last hidden state is before its layernorm
        torch.testing.assert_close(last.boundaries[L], hs[L], rtol=0, atol=0)
    else:
        torch.testing.assert_close(cap.boundaries[L], hs[L], rtol=0, atol=0)
    # recorded calls: caches stripped, use_cache off, boundaries = block inputs / outputs
    for layer, call in enumerate(cap.calls, start=1):
        assert not _has_cache(call.args) and not _has_cache(call.kwargs)
        assert call.kwargs.get("use_cache", False) is False
        torch.testing.assert_close(call.output, cap.boundaries[layer], rtol=0, atol=0)
    # default boundaries are float32 on the CPU; hooks are gone
    cap32 = capture(model, inputs, spec)
    assert cap32.boundaries.dtype == torch.float32 and cap32.boundaries.device.type == "cpu"
    assert cap32.valid.all() and cap32.lengths == [hs[0].shape[1]] * 2
    assert _hooks(model, spec) == hooks_before


@pytest.mark.parametrize("arch", sorted(ALL))
def test_replay_reproduces_block_outputs(arch: str, tiny64) -> None:
    model, spec, cap = tiny64(arch)
    for layer in range(1, spec.num_layers + 1):
        f, x = residual_branch(model, cap, layer, 0, dtype=torch.float64)
        assert x.shape == (cap.boundaries.shape[2], D) and x.dtype == torch.float64
        with torch.no_grad():
            y = f(x)
        torch.testing.assert_close(y + x, cap.calls[layer - 1].output[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x, cap.calls[layer - 1].input[0], rtol=0, atol=0)


def test_residual_branch_other_dtype_copies_block() -> None:
    model = tiny_model("llama", dtype=torch.float64)
    spec = find_blocks(model)
    cap = capture(model, tiny_inputs("llama"), spec)
    f, x = residual_branch(model, cap, 2, 0, dtype=torch.float32)
    assert x.dtype == torch.float32 and f(x).dtype == torch.float32
    assert all(p.dtype == torch.float64 for p in model.parameters())  # user model untouched


def test_padding_valid_and_left_padding_refused() -> None:
    model = tiny_model("gpt2")
    spec = find_blocks(model)
    ids = tiny_inputs("gpt2", n=6, batch=2)["input_ids"]
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    cap = capture(model, {"input_ids": ids, "attention_mask": mask}, spec)
    assert cap.lengths == [6, 4]
    assert cap.valid.tolist() == mask.bool().tolist()
    with pytest.raises(BlockCouplingError, match="padding_side"):
        capture(model, {"input_ids": ids, "attention_mask": mask.flip(1)}, spec)


def test_final_norm_refused_without_norm() -> None:
    model = tiny_model("bert")
    with pytest.raises(ArchitectureError, match="final_norm=False"):
        capture(model, tiny_inputs("bert"), find_blocks(model), final_norm=True)


def test_training_mode_switched_to_eval_with_warning() -> None:
    model = tiny_model("gpt2").train()
    spec = find_blocks(model)
    with pytest.warns(UserWarning, match="eval"):
        cap = capture(model, tiny_inputs("gpt2"), spec)
    assert not model.training
    model.train()
    with pytest.raises(BlockCouplingError, match="eval"):
        residual_branch(model, cap, 1, 0)


def test_attention_implementation() -> None:
    model = tiny_model("llama")
    assert model.config._attn_implementation == "sdpa"
    capture(model, tiny_inputs("llama"), find_blocks(model))
    assert model.config._attn_implementation == "sdpa"  # sdpa is kept (math backend at replay)
    model.config._attn_implementation = "flex_attention"  # simulate a fused implementation
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        cap = capture(model, tiny_inputs("llama"), find_blocks(model))
    assert model.config._attn_implementation == "eager"
    f, x = residual_branch(model, cap, 1, 0)
    assert f(x).shape == x.shape


def test_hooks_removed_when_forward_fails() -> None:
    model = tiny_model("gpt2")
    spec = find_blocks(model)
    before = _hooks(model, spec)
    with pytest.raises(IndexError):
        capture(model, {"input_ids": torch.tensor([[1000]])}, spec)
    assert _hooks(model, spec) == before


# ----------------------------------------------------------------------------- custom models


class _Block(nn.Module):
    def __init__(self, d: int, poison: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.poison = poison

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        y = h + torch.tanh(self.lin(h))
        return y * float("nan") if self.poison else y


class _Counter(nn.Module):
    """A block whose output depends on a global call counter (not replayable)."""

    calls = 0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        _Counter.calls += 1
        return h * (1.0 + _Counter.calls)


class _Toy(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.layers:
            x = b(x)
        return x


def test_custom_model_hidden_size_read_at_capture() -> None:
    torch.manual_seed(0)
    model = _Toy([_Block(6), _Block(6)]).double().eval()
    spec = find_blocks(model, blocks_path="layers")
    assert spec.hidden_size == 0
    x = torch.randn(1, 3, 6, dtype=torch.float64)
    cap = capture(model, {"x": x}, spec)
    assert cap.spec.hidden_size == 6
    f, x0 = residual_branch(model, cap, 2, 0, dtype=torch.float64)
    with torch.no_grad():
        h1 = model.layers[0](x[0])
        expected = torch.tanh(model.layers[1].lin(h1))
    torch.testing.assert_close(f(x0), expected, rtol=0, atol=1e-15)


def test_nan_block_output_names_layer() -> None:
    model = _Toy([_Block(4), _Block(4, poison=True), _Block(4)]).eval()
    spec = find_blocks(model, blocks_path="layers")
    with pytest.raises(NumericalError, match="layer 2"):
        capture(model, {"x": torch.randn(1, 3, 4)}, spec)


def test_replay_mismatch_raises() -> None:
    model = _Toy([_Block(4), _Counter()]).eval()
    spec = find_blocks(model, blocks_path="layers")
    cap = capture(model, {"x": torch.randn(1, 3, 4)}, spec)
    residual_branch(model, cap, 1, 0)  # the ordinary block replays fine
    with pytest.raises(ReplayError, match="block 2"):
        residual_branch(model, cap, 2, 0)
    f, x = residual_branch(model, cap, 2, 0, check=False)  # the check can be skipped
    assert f(x).shape == x.shape


def test_out_of_range_layer_and_prompt() -> None:
    model = tiny_model("gpt2")
    cap = capture(model, tiny_inputs("gpt2"), find_blocks(model))
    with pytest.raises(BlockCouplingError, match="layers 1..3"):
        residual_branch(model, cap, 0, 0)
    with pytest.raises(BlockCouplingError, match="prompts 0..0"):
        residual_branch(model, cap, 1, 1)
    cap_nc = capture(model, tiny_inputs("gpt2"), find_blocks(model), keep_calls=False)
    assert cap_nc.calls is None
    with pytest.raises(BlockCouplingError, match="keep_calls"):
        residual_branch(model, cap_nc, 1, 0)
