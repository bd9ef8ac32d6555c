"""measure() leaves the model and every random generator as it found them (engine/state.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import transformers as tf

import blockcoupling as bc
from blockcoupling.engine.state import preserved


def _tiny_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2)
    return tf.GPT2LMHeadModel(cfg)


def _train(steps: int, measure_between: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A few AdamW steps with dropout on; the batches are drawn from numpy, python's random and
    torch's global generators, so any generator a measurement leaves moved changes them."""
    model = _tiny_lm()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    probe = {"input_ids": torch.arange(6)[None] % 50}
    losses = []
    for _ in range(steps):
        n = 4 + random.randrange(3) + int(np.random.randint(0, 2))
        ids = torch.randint(0, 50, (2, n))
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if measure_between:
            bc.measure(model, None, probe, k=(2,), coupling=("depth",), method="matrix_free",
                       svd_tol=None, progress=False)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_training_with_measurements_between_steps_is_bit_identical() -> None:
    plain_losses, plain_weights = _train(3, measure_between=False)
    losses, weights = _train(3, measure_between=True)
    assert losses == plain_losses  # bit-identical: dropout stayed on, the generators unmoved
    for name, w in plain_weights.items():
        assert torch.equal(weights[name], w), name


def test_state_is_restored_on_error_and_attention_implementation() -> None:
    model = _tiny_lm()
    model.train()
    model.transformer.h[0].eval()  # a mixed state is kept as it was
    model.lm_head.weight.requires_grad_(False)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with pytest.raises(bc.BlockCouplingError, match="larger than the model's hidden size"):
        bc.measure(model, None, {"input_ids": torch.arange(5)[None]}, k=(500,), progress=False)
    assert model.training and not model.transformer.h[0].training
    assert model.transformer.h[1].training and model.transformer.h[1].attn.training
    assert not model.lm_head.weight.requires_grad
    assert torch.equal(torch.get_rng_state(), before)

    impl = model.config._attn_implementation
    with preserved(model):
        other = "eager" if impl != "eager" else "sdpa"
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(other)
        else:  # transformers < 4.54
            model.config._attn_implementation = other
        model.eval()
        torch.rand(3)
        np.random.rand()
    assert model.config._attn_implementation == impl and model.training
    assert torch.equal(torch.get_rng_state(), before)
