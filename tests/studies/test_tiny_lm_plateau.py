"""The tiny LM's stopping rule: train until the held-out loss plateaus (checked at step 0 and
the powers of two, from ``min_steps``, capped at ``max_steps``), with a constant learning rate
after the warm-up, the whole held-out split as validation set and a training-data limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import tiny_lm

BASE = dict(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=4, warmup_steps=2,
            val_windows=0, lr_schedule="constant", lr=1e-2, train_chars=5_000)


def _cfg(tol: float, min_steps: int, cap: int) -> tiny_lm.TinyLMConfig:
    return tiny_lm.TinyLMConfig(**BASE, max_steps=cap, min_steps=min_steps, plateau_tol=tol,
                                checkpoints=tiny_lm.doubling_checkpoints(cap))


def _log(cfg: tiny_lm.TinyLMConfig, root: Path) -> dict:
    return json.loads((tiny_lm.tiny_lm_dir(cfg, root) / "training.json").read_text())


def test_doubling_checkpoints_and_the_criterion() -> None:
    assert tiny_lm.doubling_checkpoints(16) == (0, 1, 2, 4, 8, 16)
    assert tiny_lm.doubling_checkpoints(1) == (0, 1)
    with pytest.raises(BlockCouplingError, match="power of two"):
        tiny_lm.doubling_checkpoints(24)
    c = tiny_lm.plateau_check({4: 2.0, 8: 1.97}, 8, 0.02)
    assert c["rel_improvement"] == pytest.approx(0.015) and c["reached"] and c["half"] == 4
    assert not tiny_lm.plateau_check({4: 2.0, 8: 1.95}, 8, 0.02)["reached"]
    assert tiny_lm.plateau_check({4: 2.0, 8: 2.1}, 8, 0.02)["reached"]  # a rise: no improvement


def test_stops_at_the_first_check_that_meets_the_criterion(tmp_path: Path) -> None:
    # tol 0.99: any check meets it, so the run stops at min_steps and saves nothing later
    cfg = _cfg(0.99, 4, 16)
    ckpts = tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False, monitor=False)
    log = _log(cfg, tmp_path)
    assert [s for s, _ in ckpts] == [0, 1, 2, 4] and log["end_step"] == 4
    assert log["plateau"]["reached"] and log["plateau"]["step"] == 4
    assert len(log["train_loss"]) == 4 and sorted(map(int, log["checkpoints"])) == [0, 1, 2, 4]
    assert not (tiny_lm.tiny_lm_dir(cfg, tmp_path) / tiny_lm.checkpoint_name(8)).exists()
    losses = {int(s): v["val_loss"] for s, v in log["checkpoints"].items()}
    assert log["plateau"]["rel_improvement"] == pytest.approx((losses[2] - losses[4]) / losses[2])
    # reused from the cache: the same checkpoints, no training
    assert tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False, monitor=False) == ckpts


def test_the_cap_is_honoured_and_every_check_obeys_the_rule(tmp_path: Path) -> None:
    cfg = _cfg(1e-6, 4, 16)  # a loss still falling at every check: the cap ends the run
    ckpts = tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False, monitor=False)
    log = _log(cfg, tmp_path)
    assert log["end_step"] == 16 == ckpts[-1][0] and len(log["train_loss"]) == 16
    assert not log["plateau"]["reached"] and log["plateau"]["step"] == 16
    losses = {int(s): v["val_loss"] for s, v in log["checkpoints"].items()}
    for s in (4, 8, 16):  # no earlier check met the criterion (else it would have stopped)
        assert (losses[s // 2] - losses[s]) / losses[s // 2] >= 1e-6


def test_whole_split_validation_and_data_limit(tmp_path: Path) -> None:
    cfg = _cfg(0.99, 4, 16)
    val = tiny_lm._encode(tiny_lm.build_tokenizer(tiny_lm.corpus_text()),
                          tiny_lm.held_out_text(cfg))
    chunk = tiny_lm.validation_chunk(cfg, val)  # (W, 17): every token after the first once
    assert chunk.shape[1] == 17 and chunk.shape[0] == (len(val) - 17) // 16 + 1
    assert torch.equal(chunk[1:, 0], chunk[:-1, -1])  # windows overlap by one token
    assert torch.equal(chunk[:, 1:].reshape(-1), val[1: 1 + 16 * chunk.shape[0]])
    ckpts = tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False, monitor=False)
    log = _log(cfg, tmp_path)
    assert log["n_train_tokens"] == 5_000  # the first 5,000 characters of the training split
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(ckpts[-1][1]).eval()
    ev = tiny_lm.held_out_scores(model, chunk)
    assert ev["val_loss"] == pytest.approx(log["checkpoints"]["4"]["val_loss"], rel=1e-6)
    assert ev["accuracy"] == pytest.approx(log["checkpoints"]["4"]["val_accuracy"], rel=1e-6)


def test_constant_schedule_and_unchanged_cache_key() -> None:
    cfg = _cfg(0.02, 4, 16)
    assert [tiny_lm._lr_at(cfg, s) for s in (0, 1, 2, 15, 1000)] == [5e-3, 1e-2, 1e-2, 1e-2, 1e-2]
    # the fields added for the rule change no existing cache key while left at their defaults
    plain = tiny_lm.TinyLMConfig()
    assert plain.cache_key() == tiny_lm.TinyLMConfig(plateau_tol=None, min_steps=0).cache_key()
    assert cfg.cache_key() != tiny_lm.TinyLMConfig(**{**cfg.to_dict(), "plateau_tol": 0.03,
                                                      "checkpoints": cfg.checkpoints}).cache_key()


@pytest.mark.parametrize("kw, match", [
    (dict(plateau_tol=0.0), "plateau_tol must be a finite number > 0 and < 1"),
    (dict(plateau_tol=1.5), "plateau_tol must be a finite number > 0 and < 1"),
    (dict(checkpoints=(0, 4, 8, 16)), "powers of two"),
    (dict(max_steps=24, checkpoints=(0, 1, 2, 4, 8, 16, 24)), "must be a power of two"),
    (dict(min_steps=1), "min_steps=1 must be in 2..max_steps"),
    (dict(min_steps=32), "min_steps=32 must be in 2..max_steps"),
    (dict(lr_schedule="linear"), "lr_schedule must be cosine or constant"),
    (dict(train_chars=0), "train_chars must be a whole number >= 1"),
])
def test_bad_values_are_one_clear_error(kw: dict, match: str) -> None:
    args = {**BASE, "max_steps": 16, "min_steps": 4, "plateau_tol": 0.02,
            "checkpoints": (0, 1, 2, 4, 8, 16), **kw}
    with pytest.raises(BlockCouplingError, match=match):
        tiny_lm.TinyLMConfig(**args)


def test_a_plateau_run_cannot_have_the_monitor(tmp_path: Path) -> None:
    with pytest.raises(BlockCouplingError, match="monitor=False"):
        tiny_lm.train_tiny_lm(_cfg(0.02, 4, 16), tmp_path, progress=False, monitor=True)
    assert not any(tmp_path.iterdir())  # refused before anything was trained or written
