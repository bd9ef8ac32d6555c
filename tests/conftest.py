"""Shared test helpers: tiny float64 models with their capture, and block-call oracles."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models importable in any import mode

from tiny_models import ALL, tiny_inputs, tiny_model  # noqa: E402


def call_block_oracle(
    block: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], hidden: int | str
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Straightforward oracle: ``h (1, n, d) -> block(h, recorded call)[0] - h``."""

    def g(h: torch.Tensor) -> torch.Tensor:
        if isinstance(hidden, int):
            a = args[:hidden] + (h,) + args[hidden + 1 :]
            out = block(*a, **kwargs)
        else:
            out = block(*args, **{**kwargs, hidden: h})
        out = out[0] if isinstance(out, tuple) else out
        return out - h

    return g


@pytest.fixture(scope="session")
def tiny64() -> Callable[[str], tuple[torch.nn.Module, Any, Any]]:
    """Cached factory ``arch -> (float64 model, spec, capture of 5 tokens / 4 patches + CLS)``."""
    from blockcoupling.engine.blocks import find_blocks
    from blockcoupling.engine.capture import capture

    cache: dict[str, tuple[torch.nn.Module, Any, Any]] = {}

    def make(arch: str) -> tuple[torch.nn.Module, Any, Any]:
        if arch not in cache:
            assert arch in ALL
            model = tiny_model(arch, dtype=torch.float64)
            spec = find_blocks(model)
            cap = capture(model, tiny_inputs(arch, n=5), spec)
            cache[arch] = (model, spec, cap)
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def ray_cluster() -> Any:
    """ONE small local Ray cluster for the whole test session (2 CPUs, a 200 MB object store,
    no dashboard); yields its address. Skipped only where ray is not installed."""
    ray = pytest.importorskip(
        "ray", reason="ray is not installed: the sweep tests need pip install 'blockcoupling[sweep]'")
    from blockcoupling.studies.sweep import start_ray

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download; workers get it too
    started = not ray.is_initialized()
    address = start_ray(num_cpus=2)
    yield address
    if started:
        ray.shutdown()
