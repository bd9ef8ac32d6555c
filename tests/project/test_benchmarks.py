"""The benchmarks still run and still agree with their oracles (no timing is asserted): each
script's smoke mode on tiny shapes, its results saved outside the repository. A benchmark that
no longer runs (a variant added to the engine and not to the benchmark's oracle) fails here,
not on the quiet machine or the lent GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(tmp_path: Path, script: str, *args: str) -> list[dict]:
    env = dict(os.environ, BLOCKCOUPLING_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, env=env, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = sorted(tmp_path.glob("*.json"))
    assert saved, proc.stdout[-2000:]
    return json.loads(saved[-1].read_text())


def _agreements(records: list[dict]) -> list[float]:
    return [r["agreement"]["max_abs_diff"] for r in records
            if isinstance(r.get("agreement"), dict) and "max_abs_diff" in r["agreement"]]


def test_bench_depth_smoke_agrees_with_its_oracle(tmp_path: Path) -> None:
    records = _run(tmp_path, "bench_depth.py", "--small", "--repeats", "1", "--prompts", "2",
                   "--oracle", "fast64", "--no-generic")
    diffs = _agreements(records)
    assert diffs and max(diffs) < 1e-4, diffs


def test_bench_gpu_llama_smoke_runs_on_the_cpu(tmp_path: Path) -> None:
    records = _run(tmp_path, "bench_gpu_llama.py", "--small", "--device", "cpu")
    diffs = _agreements(records)
    assert diffs and max(diffs) < 1e-3, diffs
