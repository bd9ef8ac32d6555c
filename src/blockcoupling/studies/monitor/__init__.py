"""Measuring coupling during training: [`CouplingMonitor`][blockcoupling.studies.monitor.CouplingMonitor] for plain loops and
[`CouplingCallback`][blockcoupling.studies.monitor.CouplingCallback] for the HuggingFace ``Trainer``.

Every ``every`` steps (and/or at the explicit ``steps``) the model is measured on fixed
prompts into a sweep-layout directory, one unit per measured step, so that
``bc.open_sweep(out).summary()`` and ``blockcoupling report OUT`` show coupling against the
training step. Training is not changed: the measurement runs in eval mode without gradients
into the parameters, and the monitor puts back every module's train/eval flag, the
``requires_grad`` flags, the gradients and the random number generators (torch CPU and
CUDA, Python, NumPy) before returning, so a run with the monitor gives bit-identical losses
and weights to one without it. A measured step costs what [`blockcoupling.measure`][blockcoupling.engine.measure.measure] costs
on those prompts; restrict ``layers=`` and ``k=`` (and use few prompts) to keep it cheap.

Each measured step also gives scalars for experiment trackers (`coupling_scalars`):
``coupling/<statistic>_k<K>`` (``coupling_vs_null``: chance-corrected; ``coupling``: raw)
and ``..._se`` (std over prompts / sqrt(n)). ``CouplingMonitor(log=fn)`` calls
``fn(scalars, step)``; [`CouplingCallback`][blockcoupling.studies.monitor.CouplingCallback] gives them to the ``report_to``
integrations (TensorBoard, W&B, MLflow, ...) by its own log call;
``studies/monitor_lightning.py`` gives them to every Lightning logger. Trackers get a
measured step's scalars at that step and at no other (step 0 included). What the trainer
logs itself is not changed: the callback never calls the Trainer's ``log`` nor sets its
``control``, so the logged loss (averaged over the Trainer's logging window), its logging
steps and ``trainer.state.log_history`` are those of a run without the monitor. The training loss
(``step(..., loss=)``; the callback takes it from the Trainer's logs) is stored beside the
coupling in ``OUT/training_loss.jsonl`` and drawn on the emergence page.

Lifecycle: a monitor holds ``OUT/.lock`` until [`CouplingMonitor.close`][blockcoupling.studies.monitor.CouplingMonitor.close] (the callback
closes it at the end of training; an ``atexit`` hook closes the ones still open); a monitor
created again on the same ``out`` in the same process (a notebook cell run twice) takes the
lock over from the earlier one.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import glob
import json
import math
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import TrainerCallback

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.state import preserved
from blockcoupling.errors import BlockCouplingError
from blockcoupling.hashing import canonical_hash
from blockcoupling.runs.integrity import unit_problem
from blockcoupling.store import collection as store
from blockcoupling.store.collection import UnitRecord, collection_unit_id


def prompt_items(prompts: Any, limit: int | None, seed: int) -> tuple[list[Any], str]:
    """(prompts, prompt_set name): a spec string is loaded, a list is fingerprinted."""
    from blockcoupling.engine.measure import normalise_prompts
    from blockcoupling.prompts.sources import load_prompts

    if isinstance(prompts, str) and (prompts.startswith(("builtin:", "hf:"))
                                     or Path(prompts).is_file()):
        return load_prompts(prompts, limit=limit, seed=seed), prompts
    items = normalise_prompts(prompts)
    if not items:
        raise BlockCouplingError("the monitor needs at least one prompt")
    digest = canonical_hash([(p.prompt_id, p.text) for p in items], digits=12, compact=False,
                            strict=False)
    return items, f"prompts:{digest}"


def coupling_scalars(coupling: pd.DataFrame) -> dict[str, float]:
    """One scalar per headline statistic and measured K of a ``coupling`` table, by the
    library's rule (engine/statistic.py: depth-wise, each prompt's last token, l != l', mean
    over prompts): ``coupling/<variant>_k<K>`` and ``..._se`` (sample std over prompts /
    sqrt(n); left out for one prompt), for each of `HEADLINE_VARIANTS` measured
    (``coupling_vs_rotated``, ``coupling_vs_null``: chance-corrected; raw ``coupling``)."""
    from blockcoupling.engine.statistic import HEADLINE_VARIANTS, StatisticRule, statistic_table

    depth = coupling[(coupling["kind"] == "depth") & (coupling["orientation"] == "ujv")]
    out: dict[str, float] = {}
    for variant in HEADLINE_VARIANTS:
        ks = sorted(int(k) for k in depth.loc[depth["variant"] == variant, "k"].unique())
        if not ks or depth["layer_a"].nunique() < 2:
            continue
        for row in statistic_table(coupling, StatisticRule(n_boot=0), variants=(variant,), ks=ks).itertuples():
            name = f"coupling/{variant}_k{int(row.k)}"
            out[name] = float(row.mean)
            if math.isfinite(row.se):
                out[f"{name}_se"] = float(row.se)
    return out


#: the open monitors of this process by their resolved ``out`` (same-process take-over)
_OPEN: weakref.WeakValueDictionary[str, CouplingMonitor] = weakref.WeakValueDictionary()


@atexit.register
def _close_open_monitors() -> None:
    for mon in list(_OPEN.values()):
        mon.close()


class CouplingMonitor:
    """Measure a model during training, into the sweep-layout directory ``out``.

    ``mon = CouplingMonitor(tok, prompts, every=500, out="runs/monitor")`` then, in the loop
    (after ``optimizer.step()``), ``mon.step(model, step)``. ``prompts``: strings,
    [`Prompt`][blockcoupling.prompts.prompt.Prompt] objects, or a prompt spec such as ``"builtin:capital"``.
    ``steps``: explicit steps to measure (e.g. log-spaced), in addition to multiples of
    ``every`` (``every=None``: only ``steps``). Other keywords are [`MeasureConfig`][blockcoupling.engine.config.MeasureConfig]
    fields (``k=(10,)``, ``layers="1..8"``, ``coupling=("depth",)``). Re-running a training
    script into the same ``out`` skips the steps already measured with the same prompts and
    config (other prompts or options are other units); a step measured on other weights (a
    new training into an earlier one's ``out``) is refused unless ``overwrite=True``, and a
    step whose files are damaged is measured again. Two monitors on one ``out`` at once
    are refused (a monitor created again on the same ``out`` in this process takes over
    from the earlier one). ``on_error="warn"`` turns a failed measurement into a warning and
    a ``failed`` unit instead of an exception. ``log=fn`` is called as ``fn(scalars, step)``
    after each measured step (`coupling_scalars`; for trackers in plain loops).
    """

    def __init__(self, tokenizer: Any, prompts: Any, *, every: int | None = 500,
                 steps: Iterable[int] = (), out: str | os.PathLike[str] = "runs/monitor",
                 label: str = "monitor", config: MeasureConfig | None = None,
                 limit: int | None = None, on_error: str = "raise", overwrite: bool = False,
                 log: Callable[[dict[str, float], int], Any] | None = None,
                 **options: Any) -> None:
        from blockcoupling.validate import whole

        if on_error not in ("raise", "warn"):
            raise BlockCouplingError(f"on_error={on_error!r}: use 'raise' or 'warn'")
        self.tokenizer = tokenizer
        self.every = None if every is None else whole(every, "every", minimum=1)
        self.steps = frozenset(whole(s, "steps", minimum=0) for s in steps)
        limit = None if limit is None else whole(limit, "limit", minimum=1)
        self.overwrite = bool(overwrite)
        if self.every is None and not self.steps:
            raise BlockCouplingError("give every=N or steps=[...]: nothing would be measured")
        base = config if config is not None else MeasureConfig()
        self.config = base.replace(**options) if options else base
        self.prompts, self.prompt_set = prompt_items(prompts, limit, self.config.seed)
        from blockcoupling.runs.identity import input_hashes, local_inputs

        # a prompt file counts by its content: an edited file gives other units
        self._inputs = input_hashes(local_inputs(self.prompt_set)) \
            if not self.prompt_set.startswith("prompts:") else {}
        self.label = str(label)
        self.on_error = on_error
        self.root = Path(out)
        self.log = log
        self.last_scalars: dict[str, float] = {}
        self._hash = self.config.config_hash()
        self._lock: contextlib.ExitStack | None = None
        self._loss: Any = None  # the training-loss log, opened at the first loss
        self.open()

    def open(self) -> None:
        """Open ``out`` by the run protocol of every collection (`blockcoupling.runs.protocol`:
        no other writer, no other kind, a lost manifest rebuilt from this monitor's status
        files) and hold its lock until [`close`][blockcoupling.studies.monitor.CouplingMonitor.close] (again after a close); an open monitor of
        this process on the same ``out`` is closed first. Each opening is a session of the
        manifest."""
        from blockcoupling.runs.protocol import collection_folder

        if self._lock is not None:
            return
        key = str(self.root.resolve())
        earlier = _OPEN.get(key)
        if earlier is not None and earlier is not self:
            earlier.close()
        spec = {"monitor": {"label": self.label, "every": self.every,
                            "steps": sorted(self.steps), "prompt_set": self.prompt_set,
                            "config": json.loads(json.dumps(self.config.to_dict(),
                                                            default=str))}}
        slug = self.unit(0).unit_id.rsplit("-step0-", 1)[0]  # the rule's slug of the label
        mine = {p.stem for label in {slug, self.label}
                for p in (self.root / store.STATUS).glob(f"{glob.escape(label)}-step*.json")}
        stack = contextlib.ExitStack()
        _, manifest = stack.enter_context(collection_folder(
            self.root, "monitor", spec, unit_ids=mine, resume=True, same=lambda m: [],
            flag="out="))  # any monitor adds its units: other prompts or options are others
        try:
            manifest["sessions"].append({"started": store.now(), "executor": "monitor", **spec})
            store.write_json(self.root / store.MANIFEST, manifest)
        except BaseException:
            stack.close()
            raise
        self._lock = stack
        _OPEN[key] = self

    def should_measure(self, step: int) -> bool:
        return int(step) in self.steps or (self.every is not None and int(step) % self.every == 0)

    def unit(self, step: int) -> UnitRecord:
        """The unit of one measured step (its id is stable across re-runs)."""
        identity = ([self.label, int(step), self.prompt_set, self._hash]
                    + ([sorted(self._inputs.items())] if self._inputs else []))
        uid = collection_unit_id([(self.label, 64), (f"step{int(step)}", 24)], identity)
        earlier = f"{self.label}-step{int(step)}-{uid.rsplit('-', 1)[1]}"  # before the rule:
        if earlier != uid and store.status_path(self.root, earlier).is_file():  # label as is
            uid = earlier  # a directory written then keeps its ids (its steps are not redone)
        return UnitRecord(unit_id=uid, label=self.label, model=self.label, revision=None,
                          step=int(step), prompt_set=self.prompt_set, limit=None,
                          config=self.config.to_dict(), config_hash=self._hash,
                          inputs=dict(self._inputs))

    def record_loss(self, step: int, loss: float) -> None:
        """Store the training loss at ``step`` beside the coupling (``OUT/training_loss.jsonl``)."""
        from blockcoupling.report.emergence import loss_log  # its reader (matplotlib: lazy)

        if self._loss is None:
            self._loss = loss_log(self.root)
        self._loss.append({"step": int(step), "loss": float(loss)})

    def step(self, model: torch.nn.Module, step: int, *, force: bool = False,
             loss: float | None = None) -> Any:
        """Measure ``model`` if ``step`` is due (or ``force``); returns the Measurement, or
        None when the step is not measured (not due, or already measured). ``loss``: the
        training loss at ``step``, stored beside the coupling. The step's scalars are in
        `last_scalars` and go to ``log``."""
        from blockcoupling.store.record import measure_to_dir

        if self._lock is None:
            raise BlockCouplingError("this monitor is closed; create a new CouplingMonitor")
        self.last_scalars = {}
        if loss is not None:
            self.record_loss(step, loss)
        if not (force or self.should_measure(step)):
            return None
        u = self.unit(step)
        rec = store.read_status(self.root, u.unit_id)
        if rec is not None and rec.get("status") == "done" and self._keep(model, step, rec):
            return None
        order = store.load_manifest(self.root)
        if u.unit_id not in order["order"]:
            order["order"].append(u.unit_id)
            store.write_json(self.root / store.MANIFEST, order)
        attempts = int((rec or {}).get("attempts", 0)) + 1
        store.write_status(self.root, u, "running", attempts=attempts, pid=os.getpid(),
                           started=store.now(), message=None)
        t0 = time.perf_counter()
        meta = {"model": self.label, "revision": None, "label": self.label, "step": int(step),
                "unit_id": u.unit_id, "prompt_set": self.prompt_set}
        try:
            with preserved(model):  # the engine's model-state guard
                model.eval()  # measured without dropout; the train flags come back after
                m = measure_to_dir(model, self.tokenizer, self.prompts,
                                   store.unit_dir(self.root, u.unit_id), meta=meta,
                                   prompts_spec=self.prompt_set, resume=True, progress=False,
                                   config=self.config)
        except BlockCouplingError as err:
            store.write_status(self.root, u, "failed", message=str(err),
                               seconds=time.perf_counter() - t0, finished=store.now())
            if self.on_error == "raise":
                raise
            import warnings

            warnings.warn(f"coupling monitor, step {step}: {err}", stacklevel=2)
            return None
        store.write_status(self.root, u, "done", message=None, finished=store.now(),
                           seconds=time.perf_counter() - t0,
                           weights_hash=m.meta.get("weights_hash"), n_prompts=len(m.prompts))
        store.write_catalogue(self.root)
        if self._loss is not None:
            self._loss.mark()  # the loss log's length so far, sealed
        self.last_scalars = coupling_scalars(m.coupling)
        if self.log is not None and self.last_scalars:
            self.log(dict(self.last_scalars), int(step))
        return m

    def _keep(self, model: torch.nn.Module, step: int, rec: dict[str, Any]) -> bool:
        """Whether the done step ``rec`` stands: its files pass the integrity check and it
        was measured on these weights. Damaged files, or other weights under
        ``overwrite=True``, are removed for a new measurement; other weights otherwise are
        refused (a new training writing into an earlier one's ``out``)."""
        import shutil

        from blockcoupling.store.fingerprint import weights_hash

        problem = unit_problem(self.root, rec)
        if problem is None and rec.get("weights_hash") not in (None, weights_hash(model)):
            if not self.overwrite:
                raise BlockCouplingError(
                    f"step {step} in {self.root} was measured on other weights (an earlier "
                    "training?); pass overwrite=True to measure it again, or choose another "
                    "out=")
            problem = "other weights"
        if problem is None:
            return True
        shutil.rmtree(store.unit_dir(self.root, str(rec["unit"]["unit_id"])),
                      ignore_errors=True)
        return False

    def close(self) -> None:
        """Release the directory (another monitor may then write to it)."""
        lock, self._lock = self._lock, None
        loss, self._loss = self._loss, None  # a reopened monitor counts the log again
        if lock is not None:
            if loss is not None:
                with contextlib.suppress(OSError):
                    loss.mark()  # the loss log's length at the end, sealed
            lock.close()
            with contextlib.suppress(KeyError):
                if _OPEN.get(str(self.root.resolve())) is self:
                    del _OPEN[str(self.root.resolve())]

    def __enter__(self) -> CouplingMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if sys is None or sys.is_finalizing():  # the atexit hook has closed it already
            return
        with contextlib.suppress(Exception):
            self.close()


def _callback_handler(callback: Any) -> Any:
    """The Trainer's CallbackHandler that is calling ``callback`` (found on the call stack:
    the Trainer gives callbacks no reference to it), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if callback in (getattr(owner, "callbacks", None) or ()) and hasattr(owner, "call_event"):
            return owner
        frame = frame.f_back  # type: ignore[assignment]
    return None


class CouplingCallback(TrainerCallback):
    """A ``transformers.Trainer`` callback: ``CouplingMonitor.step(model, global_step)`` at
    the end of every optimizer step (on the main process), and at step 0 before training
    when ``at_start`` (the initialisation, as Pythia's step0). Arguments as
    [`CouplingMonitor`][blockcoupling.studies.monitor.CouplingMonitor].

    A measured step's `coupling_scalars` go to every ``report_to`` integration
    (TensorBoard, W&B, MLflow, ...) at that step and only there, by the callback's own
    ``on_log`` call to the other callbacks: the Trainer's logging is untouched (its
    loss-averaging window, its logging steps and ``trainer.state.log_history`` are those of a
    run without the callback; the scalars are in the monitor's directory,
    ``bc.open_collection(out).summary()``). The step-0 scalars are measured before training
    and logged when the integrations are ready (before the first step). The Trainer's
    ``loss`` is stored beside the coupling. The monitor is closed at the end of training (and
    opened again if training resumes)."""

    def __init__(self, tokenizer: Any, prompts: Any, *, every: int | None = 500,
                 steps: Sequence[int] = (), out: str | os.PathLike[str] = "runs/monitor",
                 at_start: bool = True, **kwargs: Any) -> None:
        self.at_start = at_start
        self.monitor = CouplingMonitor(tokenizer, prompts, every=every, steps=steps, out=out,
                                       **kwargs)
        self._start: dict[str, float] = {}  # the step-0 scalars, for the integrations
        self._emitting = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self.monitor.open()
        self._start = {}
        if self.at_start and model is not None and state.is_world_process_zero:
            if self.monitor.step(model, state.global_step, force=True) is not None:
                self._start = dict(self.monitor.last_scalars)

    def _emit(self, args: Any, state: Any, control: Any, scalars: dict[str, float]) -> None:
        """``scalars`` to the other callbacks' ``on_log`` (the ``report_to`` integrations) at
        ``state.global_step``: the monitor's own log call. The Trainer's ``log`` is not
        called and ``control`` is not touched, so its loss-averaging window, its
        ``log_history`` and its logging steps stay what they are without the monitor."""
        handler = _callback_handler(self)
        if not scalars or handler is None:
            return
        self._emitting = True
        try:
            # a copy of control: what the integrations' on_log return does not steer training
            handler.call_event("on_log", args, state, copy.deepcopy(control), logs=dict(scalars))
        finally:
            self._emitting = False

    def _log_start(self, args: Any, state: Any, control: Any) -> None:
        """The step-0 scalars to the integrations, once every callback's ``on_train_begin``
        has run (they set their writers up there)."""
        start, self._start = self._start, {}
        self._emit(args, state, control, start)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._start:
            self._log_start(args, state, control)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    **kwargs: Any) -> None:
        if model is not None and state.is_world_process_zero:
            if self.monitor.step(model, state.global_step) is not None:
                self._emit(args, state, control, dict(self.monitor.last_scalars))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs is None or not state.is_world_process_zero or self._emitting:
            return
        if isinstance(logs.get("loss"), (int, float)):
            self.monitor.record_loss(state.global_step, float(logs["loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._start:  # no step was taken: the step-0 scalars still reach the trackers
            self._log_start(args, state, control)
        store.write_catalogue(self.monitor.root)
        self.monitor.close()
