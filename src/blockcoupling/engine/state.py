"""``preserved(model)``: a measurement leaves the model and the random generators as it found them.

A measurement puts the model in eval mode (dropout off), may switch its attention
implementation to ``"eager"`` (``capture.py``) and runs seeded randomized SVDs. A training
run that is monitored between optimiser steps must not notice any of that, so everything is
recorded on entry and put back on exit, also when the measurement raises or is interrupted:

* the ``training`` flag of every submodule,
* the attention implementation (``config._attn_implementation``) and the experts
  implementation of mixture-of-experts models (``config._experts_implementation``) of every
  config reachable from a submodule,
* the ``requires_grad`` flag and the ``.grad`` tensor (the object, not a copy) of every
  parameter,
* the global random states: torch CPU, every CUDA device (where CUDA is initialised), numpy's
  legacy global generator and Python's ``random``,
* whether autograd is enabled.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn


def _configs(model: nn.Module) -> list[Any]:
    seen: dict[int, Any] = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and id(cfg) not in seen:
            seen[id(cfg)] = cfg
    return list(seen.values())


def _set_attn(model: nn.Module, cfg: Any, impl: Any) -> None:
    if getattr(cfg, "_attn_implementation", None) == impl:
        return
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter) and getattr(model, "config", None) is cfg:
        try:
            setter(impl)
        except Exception:  # noqa: BLE001 - fall back to the attribute it reads
            pass
    if getattr(cfg, "_attn_implementation", None) != impl:
        cfg._attn_implementation = impl


@contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Record the model's modes, flags and every global RNG state; restore them on exit."""
    training = [(m, m.training) for m in model.modules()]
    configs = [(cfg, cfg._attn_implementation) for cfg in _configs(model)]
    experts = [(cfg, cfg._experts_implementation) for cfg in _configs(model)
               if getattr(cfg, "_experts_implementation", None) is not None]
    params = [(p, p.requires_grad, p.grad) for p in model.parameters()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    np_rng = np.random.get_state()
    py_rng = random.getstate()
    grad_enabled = torch.is_grad_enabled()
    try:
        yield
    finally:
        torch.set_grad_enabled(grad_enabled)
        for cfg, impl in configs:
            _set_attn(model, cfg, impl)
        for cfg, impl in experts:
            if cfg._experts_implementation != impl:
                cfg._experts_implementation = impl
        for m, flag in training:
            m.training = flag
        for p, req, grad in params:
            if p.requires_grad != req:
                p.requires_grad_(req)
            if p.grad is not grad:
                p.grad = grad
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)


__all__ = ["preserved"]
