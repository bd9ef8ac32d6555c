"""Shared test helpers: tiny float64 models with their capture, and block-call oracles."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# a part per prompt (store.record.PART_SECONDS groups the cheap prompts of tiny models into
# one part): the fault tests interrupt and damage runs part by part, also in child processes;
# tests of the grouping pass part_seconds themselves
os.environ.setdefault("BLOCKCOUPLING_PART_SECONDS", "0")

from tests.helpers.tiny_models import ALL, tiny_inputs, tiny_model  # noqa: E402


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


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site built once per session from a copy of the checkout, as ``make
    docs`` builds it (the hook runs the three tutorials fresh; ``mkdocs build --strict``)."""
    import shutil
    import subprocess

    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    pytest.importorskip("material", reason="the docs extra is not installed")
    pytest.importorskip("latex2mathml", reason="the docs extra (latex2mathml) is not installed")
    here = Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("site")
    root = tmp / "repo"
    root.mkdir()
    # what the docs hook reads: the pages, the generators, the family matrix and the oldest pins
    for name in ("mkdocs.yml", "README.md", "BENCHMARKS.md", "constraints-oldest.txt",
                 "tests/helpers/families.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(here / name, root / name)
    shutil.copytree(here / "docs", root / "docs",
                    ignore=shutil.ignore_patterns("generated", "__pycache__"))
    shutil.copytree(here / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "src").symlink_to(here / "src")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", BLOCKCOUPLING_DOCS_FRESH="1",
               HF_HUB_OFFLINE="1", MPLBACKEND="Agg", BLOCKCOUPLING_CACHE=str(tmp / "cache"))
    env.pop("BLOCKCOUPLING_DOCS_TUTORIALS", None)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(tmp / "site")], cwd=root, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return tmp / "site"
