"""The training-time monitor: it measures into a sweep-layout directory and never changes
training (same seed with and without it -> bit-identical losses and weights)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers as tf

import blockcoupling as bc
from tests.helpers import child_env
from tests.helpers.monitored import PROMPTS, VOCAB, dropout_gpt2, word_tokenizer


def _train(monitor: bc.CouplingMonitor | None, steps: int = 6) -> tuple[list[float], dict]:
    model = dropout_gpt2()
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


def test_monitor_does_not_change_training(tmp_path: Path) -> None:
    base_losses, base_state = _train(None)
    mon = bc.CouplingMonitor(word_tokenizer(), PROMPTS, every=3, out=tmp_path / "mon", k=(2,),
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
    # coupling, trajectory and windowed LSS against the step, the layer graphs, the heatmaps;
    # no loss was given to this monitor: the page says so instead of drawing an empty panel
    assert page.count("<img") == 5 and "no training loss was stored" in page
    assert (tmp_path / "em_figures" / "01_coupling_vs_step.svg").is_file()


def test_monitor_numbers_are_measure_numbers_and_resume_skips(tmp_path: Path) -> None:
    model, tok = dropout_gpt2(3).eval(), word_tokenizer()
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
        third = bc.CouplingMonitor(tok, PROMPTS, every=1, out=tmp_path / "m")  # same process:
        assert mon2._lock is None  # takes the lock over
        with pytest.raises(bc.BlockCouplingError, match="closed"):
            mon2.step(model, 6)
        third.close()


def test_monitor_errors(tmp_path: Path) -> None:
    tok = word_tokenizer()
    with pytest.raises(bc.BlockCouplingError, match="every"):
        bc.CouplingMonitor(tok, PROMPTS, every=0, out=tmp_path / "a")
    with pytest.raises(bc.BlockCouplingError, match="nothing would be measured"):
        bc.CouplingMonitor(tok, PROMPTS, every=None, out=tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.txt").write_text("x")
    with pytest.raises(bc.BlockCouplingError, match="not empty"):
        bc.CouplingMonitor(tok, PROMPTS, every=1, out=tmp_path / "c")
    # a failing measurement (K larger than d) raises, or warns with on_error="warn"
    model = dropout_gpt2()
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

    model = dropout_gpt2().eval()
    cb = bc.CouplingCallback(word_tokenizer(), PROMPTS, every=2, out=tmp_path / "cb", k=(2,),
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


def _trainer_data() -> list[dict]:
    data = [{"input_ids": torch.randint(0, 12, (10,), generator=torch.Generator().manual_seed(i))}
            for i in range(16)]
    for row in data:
        row["labels"] = row["input_ids"]
    return data


def _hf_train(tmp_path: Path, callbacks: list, report_to: list[str], steps: int = 5,
              logging_steps: int = 1) -> tuple[list[float], dict, list[dict]]:
    args = tf.TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=steps,
                                per_device_train_batch_size=4, logging_steps=logging_steps,
                                save_strategy="no", report_to=report_to, seed=7,
                                use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    trainer = tf.Trainer(model=dropout_gpt2(), args=args, train_dataset=_trainer_data(),
                         callbacks=callbacks)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return (losses, {k: v.clone() for k, v in trainer.model.state_dict().items()},
            trainer.state.log_history)


def _measured(root: Path, variant: str = "coupling") -> dict[int, float]:
    """The monitor's measured steps and their headline value, recomputed from the units."""
    s = bc.open_sweep(root)
    return {int(r.step): _oracle_mean(s.open_unit(r.unit_id).coupling, variant)
            for r in s.catalogue.itertuples()}


def _report_renders(root: Path, tmp_path: Path) -> str:
    """``blockcoupling report ROOT`` of a trainer-monitored run: one line, the loss drawn."""
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    out = tmp_path / f"{root.name}.html"
    r = CliRunner().invoke(app, ["--quiet", "report", str(root), "--out", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    for fig in ("coupling_vs_step", "trajectory_vs_step", "loss_vs_step", "layer_graphs",
                "depth_heatmaps"):
        assert f'<section id="{fig}">' in page, fig
    assert "Not drawn" not in page
    return page


_RUNTIME = {"train_runtime", "train_samples_per_second", "train_steps_per_second"}


def _user_log(history: list[dict]) -> list[dict]:
    """``log_history`` without the wall-clock entries of its last row (they differ between
    any two runs)."""
    return [{k: v for k, v in h.items() if k not in _RUNTIME} for h in history]


def test_trainer_callback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The HF Trainer with CouplingCallback: units at step 0 and every 2 steps; the Trainer's
    own logging untouched (its log_history, the loss averaged over its 3-step logging window,
    equal to the last digit to the run without the callback, no extra entries); the same
    weights; the scalars in TensorBoard at exactly the measured steps (step 0 included);
    and the report of the run renders."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate "
                        "(pip install accelerate); the callback's events are tested above")
    pytest.importorskip("tensorboard", reason="report_to='tensorboard' needs tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # logging every 3 steps, measuring every 2: a measured step inside a logging window
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb0"))
    base_losses, base_state, base_history = _hf_train(tmp_path, [], ["tensorboard"], steps=6,
                                                      logging_steps=3)
    cb = bc.CouplingCallback(word_tokenizer(), PROMPTS, every=2, out=tmp_path / "cb", k=(2,),
                             orientations=("ujv",))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb1"))
    losses, state, history = _hf_train(tmp_path, [cb], ["tensorboard"], steps=6,
                                       logging_steps=3)
    assert cb.monitor._lock is None  # released at the end of training
    assert [h["step"] for h in history if "loss" in h] == [3, 6]
    assert _user_log(history) == _user_log(base_history)  # every value, to the last digit
    assert losses == base_losses
    for key in base_state:
        assert torch.equal(base_state[key], state[key]), key
    measured = _measured(tmp_path / "cb")
    assert sorted(measured) == [0, 2, 4, 6]
    # TensorBoard's event file (the Trainer prefixes "train/"): the same steps and values
    acc = EventAccumulator(str(next((tmp_path / "tb1").rglob("events.out.tfevents*")).parent))
    acc.Reload()
    assert {"train/coupling/coupling_vs_null_k2", "train/coupling/coupling_vs_null_k2_se",
            "train/coupling/coupling_k2_se"} <= set(acc.Tags()["scalars"])
    events = acc.Scalars("train/coupling/coupling_k2")
    assert [e.step for e in events] == [0, 2, 4, 6]
    assert [e.value for e in events] == pytest.approx([measured[s] for s in (0, 2, 4, 6)],
                                                      rel=1e-6)
    base_acc = EventAccumulator(str(next((tmp_path / "tb0").rglob("events.out.tfevents*")).parent))
    base_acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
        (e.step, e.value) for e in base_acc.Scalars("train/loss")]  # its own cadence, values
    assert [e.step for e in acc.Scalars("train/loss")] == [3, 6]
    # the training loss stored beside the coupling, and the report of the run
    from blockcoupling.report.emergence import read_training_loss

    assert read_training_loss(tmp_path / "cb")["loss"].tolist() == losses
    _report_renders(tmp_path / "cb", tmp_path)


def _wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of an offline W&B run, read back from its ``run-*.wandb`` file (a
    LevelDB-style log of protobuf records: 32 KiB blocks, 7-byte chunk headers, after the
    file's 7-byte header)."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, records, part = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # full, first
            part = chunk
        elif kind in (3, 4):  # middle, last
            part += chunk
        if kind in (1, 4):
            records.append(part)
    rows = []
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                         for i in rec.history.item})
    return rows


def _wait_for_wandb(run_dir: Path, limit: float = 120.0) -> None:
    """Until W&B's service says it has written the run (``wandb.finish`` can return before
    its writer has flushed the run's file on a loaded machine): an I/O wait, no timing is
    asserted."""
    import time

    log = run_dir / "logs" / "debug-internal.log"
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if log.is_file() and "stream: all finished" in log.read_text(errors="replace"):
            return
        time.sleep(0.5)


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_trainer_callback_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B (offline, no network): the scalars at the measured steps, step 0 included, on
    the Trainer's x axis train/global_step, read back from the run's file."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb, "
                                "in the test extra)")
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
                       "WANDB_SILENT": "true", "WANDB_PROJECT": "bc-test",
                       "WANDB_ERROR_REPORTING": "false", "WANDB_DISABLE_GIT": "true"}.items():
        monkeypatch.setenv(key, value)
    cb = bc.CouplingCallback(word_tokenizer(), PROMPTS, every=2, out=tmp_path / "cb", k=(2,),
                             orientations=("ujv",))
    _hf_train(tmp_path, [cb], ["wandb"])
    run_dir = Path(wandb.run.dir).parent if wandb.run is not None else None
    wandb.finish()
    run_dir = run_dir or next((tmp_path / "wandb").glob("offline-run-*"))
    _wait_for_wandb(run_dir)
    rows = _wandb_history(run_dir)
    measured = _measured(tmp_path / "cb")
    got = {int(r["train/global_step"]): r["train/coupling/coupling_k2"] for r in rows
           if "train/coupling/coupling_k2" in r}
    assert sorted(got) == [0, 2, 4], (run_dir, rows)
    assert [got[s] for s in (0, 2, 4)] == pytest.approx([measured[s] for s in (0, 2, 4)])


def _oracle_mean(cp: pd.DataFrame, variant: str) -> float:
    """Mean over prompts of the mean over l != l' at the last token (plain loops)."""
    per = []
    for _, g in cp[(cp["variant"] == variant) & (cp["kind"] == "depth")].groupby("prompt_id"):
        g = g[(g["token_out_a"] == g["token_out_a"].max()) & (g["layer_a"] != g["layer_b"])]
        g = g[g["p"] == 1.0] if variant == "coupling" else g
        per.append(sum(g["value"]) / len(g))
    return sum(per) / len(per)


def test_log_hook_loss_and_take_over(tmp_path: Path) -> None:
    """log=fn gets the scalars per measured step; loss= is stored; a monitor created again
    on the same out in this process takes over the lock."""
    model, tok = dropout_gpt2(3).eval(), word_tokenizer()
    seen: list[tuple[dict, int]] = []
    mon = bc.CouplingMonitor(tok, PROMPTS, every=2, out=tmp_path / "m", k=(2,),
                             orientations=("ujv",), log=lambda d, s: seen.append((d, s)))
    mon.step(model, 1, loss=3.5)
    m = mon.step(model, 2, loss=3.25)
    assert [s for _, s in seen] == [2]
    d = seen[0][0]
    assert d["coupling/coupling_k2"] == pytest.approx(_oracle_mean(m.coupling, "coupling"))
    assert d["coupling/coupling_vs_null_k2"] == pytest.approx(
        _oracle_mean(m.coupling, "coupling_vs_null"))
    per = [_oracle_mean(g, "coupling") for _, g in m.coupling.groupby("prompt_id")]
    se = float(pd.Series(per).std(ddof=1)) / len(per) ** 0.5
    assert d["coupling/coupling_k2_se"] == pytest.approx(se)
    again = bc.CouplingMonitor(tok, PROMPTS, every=2, out=tmp_path / "m", k=(2,),
                               orientations=("ujv",))  # a notebook cell run twice
    assert mon._lock is None and again.step(model, 2) is None  # already measured
    again.close()
    from blockcoupling.report.emergence import read_training_loss

    assert read_training_loss(tmp_path / "m").values.tolist() == [[1, 3.5], [2, 3.25]]


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_interpreter_exit_is_clean(tmp_path: Path) -> None:
    """A script that ends with monitors (and a callback) still open exits without any
    'Exception ignored' line and leaves the directory unlocked."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import blockcoupling as bc
        from tests.helpers.monitored import PROMPTS, dropout_gpt2, word_tokenizer
        tok = word_tokenizer()
        mon = bc.CouplingMonitor(tok, PROMPTS, every=1, out={str(tmp_path / "a")!r}, k=(2,))
        mon.step(dropout_gpt2().eval(), 1)
        cb = bc.CouplingCallback(tok, PROMPTS, every=1, out={str(tmp_path / "b")!r}, k=(2,))
        cb2 = bc.CouplingCallback(tok, PROMPTS, every=1, out={str(tmp_path / "b")!r}, k=(2,))
        # a training script: a Trainer run with the callback, nothing closed by hand
        import torch, transformers as tf
        data = [{{"input_ids": torch.arange(10) % 12, "labels": torch.arange(10) % 12}}] * 4
        args = tf.TrainingArguments(output_dir={str(tmp_path / "t")!r}, max_steps=2,
                                    per_device_train_batch_size=2, report_to=[],
                                    save_strategy="no", use_cpu=True, disable_tqdm=True)
        cb3 = bc.CouplingCallback(tok, PROMPTS, every=1, out={str(tmp_path / "c")!r}, k=(2,))
        tf.Trainer(model=dropout_gpt2(), args=args, train_dataset=data, callbacks=[cb3]).train()
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, env=child_env())
    assert r.returncode == 0, r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    from blockcoupling.store.collection import is_locked

    assert not any(is_locked(tmp_path / d) for d in "abc")
    assert bc.open_sweep(tmp_path / "c").catalogue["step"].tolist() == [0, 1, 2]


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_lightning_callback(tmp_path: Path) -> None:
    """The Lightning callback: the scalars in every logger at exactly the measured steps,
    step 0 included (the CSV and TensorBoard loggers read back); what the module logs
    itself the same as without the callback (steps and values); the loss stored, the lock
    released at the end, training unchanged, and the report of the run renders."""
    L = pytest.importorskip("lightning", reason="lightning is an optional dependency")
    pytest.importorskip("tensorboard", reason="Lightning's TensorBoardLogger needs tensorboard")
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from blockcoupling.studies.monitor_lightning import CouplingLightningCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = dropout_gpt2()

        def training_step(self, batch: torch.Tensor, idx: int) -> torch.Tensor:
            loss = self.model(input_ids=batch, labels=batch).loss
            self.log("train_loss", loss)  # Lightning's own cadence, beside ours
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(callbacks: list, logs: Path) -> tuple[Module, dict]:
        torch.manual_seed(5)
        data = torch.utils.data.DataLoader(torch.randint(0, 12, (10, 10)), batch_size=2)
        module = Module()
        loggers = [CSVLogger(logs, name="csv"), TensorBoardLogger(logs, name="tb")]
        trainer = L.Trainer(max_steps=5, callbacks=callbacks, logger=loggers,
                            log_every_n_steps=3, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu")
        trainer.fit(module, data)
        return module, {k: v.clone() for k, v in module.state_dict().items()}

    _, base = fit([], tmp_path / "logs0")
    cb = CouplingLightningCallback(word_tokenizer(), PROMPTS, every=2, out=tmp_path / "pl",
                                   model_attr="model", k=(2,), orientations=("ujv",))
    module, state = fit([cb], tmp_path / "logs1")
    for key in base:
        assert torch.equal(base[key], state[key]), key
    assert cb.monitor._lock is None
    measured = _measured(tmp_path / "pl")
    assert sorted(measured) == [0, 2, 4]
    # metrics.csv: a value only at a measured step, at that step, step 0 included
    csv = pd.read_csv(next((tmp_path / "logs1" / "csv").rglob("metrics.csv")))
    rows = csv[csv["coupling/coupling_k2"].notna()]
    assert rows["step"].tolist() == [0, 2, 4]
    assert rows["coupling/coupling_k2"].tolist() == pytest.approx(
        [measured[s] for s in (0, 2, 4)])
    assert rows["coupling/coupling_vs_null_k2"].notna().all()
    # Lightning's own rows (every 3 steps): the same steps and values as without the
    # callback, to the last digit, and nothing else logged at them
    base_csv = pd.read_csv(next((tmp_path / "logs0" / "csv").rglob("metrics.csv")))
    own = csv[csv["train_loss"].notna()].dropna(axis=1, how="all")
    assert own.to_dict("records") == base_csv[base_csv["train_loss"].notna()].to_dict("records")
    assert own["step"].tolist() == [2]  # Lightning logs one step behind global_step
    # TensorBoard: the same steps and values
    acc = EventAccumulator(str(next((tmp_path / "logs1" / "tb").rglob("events.out.*")).parent))
    acc.Reload()
    events = acc.Scalars("coupling/coupling_k2")
    assert [e.step for e in events] == [0, 2, 4]
    assert [e.value for e in events] == pytest.approx([measured[s] for s in (0, 2, 4)],
                                                      rel=1e-6)
    base_acc = EventAccumulator(str(next((tmp_path / "logs0" / "tb").rglob("events.out.*")).parent))
    base_acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train_loss")] == [
        (e.step, e.value) for e in base_acc.Scalars("train_loss")]
    from blockcoupling.report.emergence import read_training_loss

    assert read_training_loss(tmp_path / "pl")["step"].tolist() == [1, 2, 3, 4, 5]
    _report_renders(tmp_path / "pl", tmp_path)
