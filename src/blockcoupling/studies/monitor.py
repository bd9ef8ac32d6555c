"""Measuring coupling during training: :class:`CouplingMonitor` for plain loops and
:class:`CouplingCallback` for the HuggingFace ``Trainer``.

Every ``every`` steps (and/or at the explicit ``steps``) the model is measured on fixed
prompts into a sweep-layout directory, one unit per measured step, so that
``bc.open_sweep(out).summary()`` and ``blockcoupling report OUT`` show coupling against the
training step. Training is not changed: the measurement runs in eval mode without gradients
into the parameters, and the monitor puts back every module's train/eval flag, the
``requires_grad`` flags, the gradients and the random number generators (torch CPU and
CUDA, Python, NumPy) before returning, so a run with the monitor gives bit-identical losses
and weights to one without it. A measured step costs what :func:`blockcoupling.measure` costs
on those prompts; restrict ``layers=`` and ``k=`` (and use few prompts) to keep it cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.state import preserved
from blockcoupling.errors import BlockCouplingError
from blockcoupling.hashing import canonical_hash
from blockcoupling.studies.sweep import store
from blockcoupling.studies.sweep.units import Unit, config_hash


def _prompt_items(prompts: Any, limit: int | None, seed: int) -> tuple[list[Any], str]:
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


class CouplingMonitor:
    """Measure a model during training, into the sweep-layout directory ``out``.

    ``mon = CouplingMonitor(tok, prompts, every=500, out="runs/monitor")`` then, in the loop
    (after ``optimizer.step()``), ``mon.step(model, step)``. ``prompts``: strings,
    :class:`~blockcoupling.Prompt` objects, or a prompt spec such as ``"builtin:capital"``.
    ``steps``: explicit steps to measure (e.g. log-spaced), in addition to multiples of
    ``every`` (``every=None``: only ``steps``). Other keywords are :class:`MeasureConfig`
    fields (``k=(10,)``, ``layers="1..8"``, ``coupling=("depth",)``). Re-running a training
    script into the same ``out`` skips the steps already measured with the same prompts and
    config (other prompts or options are other units). Two monitors on one ``out`` at once
    are refused. ``on_error="warn"`` turns a
    failed measurement into a warning and a ``failed`` unit instead of an exception.
    """

    def __init__(self, tokenizer: Any, prompts: Any, *, every: int | None = 500,
                 steps: Iterable[int] = (), out: str | os.PathLike[str] = "runs/monitor",
                 label: str = "monitor", config: MeasureConfig | None = None,
                 limit: int | None = None, on_error: str = "raise", **options: Any) -> None:
        if every is not None and (isinstance(every, bool) or int(every) < 1):
            raise BlockCouplingError(f"every={every!r}: measure every N >= 1 steps (or None "
                                     "with explicit steps=)")
        if on_error not in ("raise", "warn"):
            raise BlockCouplingError(f"on_error={on_error!r}: use 'raise' or 'warn'")
        self.tokenizer = tokenizer
        self.every = None if every is None else int(every)
        self.steps = frozenset(int(s) for s in steps)
        if self.every is None and not self.steps:
            raise BlockCouplingError("give every=N or steps=[...]: nothing would be measured")
        base = config if config is not None else MeasureConfig()
        self.config = base.replace(**options) if options else base
        self.prompts, self.prompt_set = _prompt_items(prompts, limit, self.config.seed)
        self.label = str(label)
        self.on_error = on_error
        self.root = Path(out)
        self._hash = config_hash(self.config)
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(store.sweep_lock(self.root))
        try:
            self._init_manifest()
        except BaseException:
            self.close()
            raise

    def _init_manifest(self) -> None:
        spec = {"monitor": {"label": self.label, "every": self.every,
                            "steps": sorted(self.steps), "prompt_set": self.prompt_set,
                            "config": json.loads(json.dumps(self.config.to_dict(),
                                                            default=str))}}
        if store.is_sweep_dir(self.root):
            manifest = store.load_manifest(self.root)
            if manifest.get("kind") != "monitor":
                raise BlockCouplingError(f"{self.root} holds a {manifest.get('kind')}, not a "
                                         "monitor directory; choose another out=")
        else:
            others = [p for p in self.root.iterdir() if p.name != store.LOCK]
            if others:
                raise BlockCouplingError(f"{self.root} is not empty and is not a monitor "
                                         "directory; choose another out=")
            manifest = store.new_manifest("monitor", spec)
        manifest["sessions"].append({"started": store.now(), "executor": "monitor", **spec})
        store.write_json(self.root / store.MANIFEST, manifest)

    def should_measure(self, step: int) -> bool:
        return int(step) in self.steps or (self.every is not None and int(step) % self.every == 0)

    def unit(self, step: int) -> Unit:
        """The unit of one measured step (its id is stable across re-runs)."""
        digest = canonical_hash([self.label, int(step), self.prompt_set, self._hash],
                                digits=12, compact=False, strict=False)
        return Unit(unit_id=f"{self.label}-step{int(step)}-{digest}", label=self.label,
                    model=self.label, revision=None, step=int(step),
                    prompt_set=self.prompt_set, limit=None, config=self.config.to_dict(),
                    config_hash=self._hash)

    def step(self, model: torch.nn.Module, step: int, *, force: bool = False) -> Any:
        """Measure ``model`` if ``step`` is due (or ``force``); returns the Measurement, or
        None when the step is not measured (not due, or already measured)."""
        from blockcoupling.store.record import measure_to_dir

        if self._lock is None:
            raise BlockCouplingError("this monitor is closed; create a new CouplingMonitor")
        if not (force or self.should_measure(step)):
            return None
        u = self.unit(step)
        rec = store.read_status(self.root, u.unit_id)
        if rec is not None and rec.get("status") == "done":
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
        return m

    def close(self) -> None:
        """Release the directory (another monitor may then write to it)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None  # type: ignore[assignment]

    def __enter__(self) -> CouplingMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class CouplingCallback(TrainerCallback):
    """A ``transformers.Trainer`` callback: ``CouplingMonitor.step(model, global_step)`` at
    the end of every optimizer step (on the main process), and at step 0 before training
    when ``at_start`` (the initialisation, as Pythia's step0). Arguments as
    :class:`CouplingMonitor`."""

    def __init__(self, tokenizer: Any, prompts: Any, *, every: int | None = 500,
                 steps: Sequence[int] = (), out: str | os.PathLike[str] = "runs/monitor",
                 at_start: bool = True, **kwargs: Any) -> None:
        self.at_start = at_start
        self.monitor = CouplingMonitor(tokenizer, prompts, every=every, steps=steps, out=out,
                                       **kwargs)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if self.at_start and model is not None and state.is_world_process_zero:
            self.monitor.step(model, state.global_step, force=True)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    **kwargs: Any) -> None:
        if model is not None and state.is_world_process_zero:
            self.monitor.step(model, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        store.write_catalogue(self.monitor.root)
