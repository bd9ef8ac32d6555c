"""The training-time monitor: it measures into a sweep-layout directory and never changes
training (same seed with and without it -> bit-identical losses and weights)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers as tf

import blockcoupling as bc

PROMPTS = ["the cat sat on the mat", "a dog ran far away"]
VOCAB = 64


def _model(seed: int = 0) -> tf.GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
                        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2)  # dropout: uses the RNG
    return tf.GPT2LMHeadModel(cfg)


class _Tok:
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


def _train(monitor: bc.CouplingMonitor | None, steps: int = 6) -> tuple[list[float], dict]:
    model = _model()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1234)
    losses = []
    if monitor is not None:
        monitor.step(model, 0)
    for step in range(1, steps + 1):
        x = torch.randint(0, VOCAB, (4, 12))  # data from the global RNG
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if monitor is not None:
            monitor.step(model, step)
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def _tokenizer() -> object:
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:  # pragma: no cover
        return _Tok()
    words = "the a cat dog sat on mat ran far away".split()
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")


def test_monitor_does_not_change_training(tmp_path: Path) -> None:
    base_losses, base_state = _train(None)
    mon = bc.CouplingMonitor(_tokenizer(), PROMPTS, every=3, out=tmp_path / "mon", k=(2,),
                             variants=("coupling", "coupling_vs_null"), orientations=("ujv",))
    losses, state = _train(mon)
    mon.close()
    assert losses == base_losses  # bit-identical, not approximately
    assert base_state.keys() == state.keys()
    for key in base_state:
        assert torch.equal(base_state[key], state[key]), key
    # one unit per measured step (0, 3, 6), read back as a sweep
    s = bc.open_sweep(tmp_path / "mon")
    assert s.catalogue["step"].tolist() == [0, 3, 6]
    assert set(s.catalogue["status"]) == {"done"}
    summ = s.summary()
    assert summ["step"].tolist() == [0, 3, 6]
    assert summ["coupling_vs_null_mean"].notna().all() and summ["lss"].notna().all()
    # the weights changed between measured steps
    assert summ["weights_hash"].nunique() == 3
    cp = s.coupling
    assert set(cp["step"]) == {0, 3, 6} and set(cp["k"]) == {2}
    # the emergence report of a monitor directory (the CLI's report SWEEP_DIR)
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    html = tmp_path / "em.html"
    r = CliRunner().invoke(app, ["--quiet", "report", str(tmp_path / "mon"), "--out", str(html)])
    assert r.exit_code == 0, r.output
    page = html.read_text()
    assert page.count("<img") == 4 and "Not drawn" not in page
    assert (tmp_path / "em_figures" / "01_coupling_vs_step.svg").is_file()


def test_monitor_numbers_are_measure_numbers_and_resume_skips(tmp_path: Path) -> None:
    model, tok = _model(3).eval(), _tokenizer()
    with bc.CouplingMonitor(tok, PROMPTS, every=None, steps=[5], out=tmp_path / "m",
                            k=(2,), orientations=("ujv",)) as mon:
        assert mon.step(model, 4) is None  # not due
        got = mon.step(model, 5)
        assert got is not None
        assert mon.step(model, 5) is None  # already measured
    ref = bc.measure(model, tok, PROMPTS, k=(2,), orientations=("ujv",), progress=False)
    pd.testing.assert_series_equal(got.coupling["value"], ref.coupling["value"],
                                   check_names=False)
    # a second monitor on the same directory continues it (same unit id, nothing remeasured)
    with bc.CouplingMonitor(tok, PROMPTS, every=None, steps=[5], out=tmp_path / "m",
                            k=(2,), orientations=("ujv",)) as mon2:
        assert mon2.step(model, 5) is None
        with pytest.raises(bc.BlockCouplingError, match="in use"):
            bc.CouplingMonitor(tok, PROMPTS, every=1, out=tmp_path / "m")


def test_monitor_errors(tmp_path: Path) -> None:
    tok = _tokenizer()
    with pytest.raises(bc.BlockCouplingError, match="every"):
        bc.CouplingMonitor(tok, PROMPTS, every=0, out=tmp_path / "a")
    with pytest.raises(bc.BlockCouplingError, match="nothing would be measured"):
        bc.CouplingMonitor(tok, PROMPTS, every=None, out=tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.txt").write_text("x")
    with pytest.raises(bc.BlockCouplingError, match="not empty"):
        bc.CouplingMonitor(tok, PROMPTS, every=1, out=tmp_path / "c")
    # a failing measurement (K larger than d) raises, or warns with on_error="warn"
    model = _model()
    with bc.CouplingMonitor(tok, PROMPTS, every=1, out=tmp_path / "d", k=(64,)) as mon, \
            pytest.raises(bc.BlockCouplingError, match="hidden size"):
        mon.step(model, 1)
    with bc.CouplingMonitor(tok, PROMPTS, every=1, out=tmp_path / "e", k=(64,),
                            on_error="warn") as mon, pytest.warns(UserWarning, match="step 2"):
        assert mon.step(model, 2) is None
    st = bc.open_sweep(tmp_path / "e").catalogue
    assert st["status"].tolist() == ["failed"] and "hidden size" in st["message"][0]


def test_callback_events(tmp_path: Path) -> None:
    """The callback on the Trainer's events (without a Trainer): step 0 at train begin, then
    every 2 optimizer steps, only on the main process."""
    from transformers import TrainerControl, TrainerState

    model = _model().eval()
    cb = bc.CouplingCallback(_tokenizer(), PROMPTS, every=2, out=tmp_path / "cb", k=(2,),
                             orientations=("ujv",))
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(None, state, control, model=model)
    for step in (1, 2, 3):
        state.global_step = step
        cb.on_step_end(None, state, control, model=model)
    state.global_step, state.is_world_process_zero = 4, False
    cb.on_step_end(None, state, control, model=model)  # not the main process: nothing
    cb.on_train_end(None, state, control)
    cb.monitor.close()
    assert bc.open_sweep(tmp_path / "cb").catalogue["step"].tolist() == [0, 2]


def test_trainer_callback(tmp_path: Path) -> None:
    """The HF Trainer with CouplingCallback: units at step 0 and every 2 steps, and the same
    losses and weights as without the callback."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate "
                        "(pip install accelerate); the callback's events are tested above")
    tok = _tokenizer()
    data = [{"input_ids": torch.randint(0, 12, (10,), generator=torch.Generator().manual_seed(i))}
            for i in range(16)]
    for row in data:
        row["labels"] = row["input_ids"]

    def train(callbacks: list) -> tuple[list[float], dict]:
        args = tf.TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=4,
                                    per_device_train_batch_size=4, logging_steps=1,
                                    save_strategy="no", report_to=[], seed=7,
                                    use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
        trainer = tf.Trainer(model=_model(), args=args, train_dataset=data, callbacks=callbacks)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return losses, {k: v.clone() for k, v in trainer.model.state_dict().items()}

    base_losses, base_state = train([])
    cb = bc.CouplingCallback(tok, PROMPTS, every=2, out=tmp_path / "cb", k=(2,),
                             orientations=("ujv",))
    losses, state = train([cb])
    cb.monitor.close()
    assert losses == base_losses
    for key in base_state:
        assert torch.equal(base_state[key], state[key]), key
    s = bc.open_sweep(tmp_path / "cb")
    assert s.catalogue["step"].tolist() == [0, 2, 4]
