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
    records = _run(tmp_path, "bench_gpu_llama.py", "--small", "--device", "cpu",
                   "--iterate-anywhere")
    diffs = _agreements(records)
    # the exact routes agree to float32 level; the randomized top-K and the released
    # algorithm's float32 route are approximations (measured 2e-3 and 1.8e-2 here): the
    # smoke test checks that every route runs and is compared, not the GPU row's bound
    assert len(diffs) >= 3 and sorted(diffs)[2] < 1e-5 and max(diffs) < 0.05, diffs
    # what the next GPU run reads: the top-K's routes and its time split, with the
    # iteration on (forced here) and off, and where item 6's tables ran
    split = {r["method"]: r["phases"]["split"] for r in records
             if r.get("record") == "method" and "split" in r.get("phases", {})}
    assert set(split) == {"measure_split", "measure_eigh"}, split
    assert "gram-iter" in split["measure_split"]["routes"], split
    assert set(split["measure_eigh"]["routes"]) == {"gram-eigh"}, split
    for s in split.values():
        assert s["eigensolve_s"] > 0 and s["jacobian_s"] > 0 and s["rest_s"] > 0, s
    assert [r["tables_on"] for r in records if r.get("record") == "item6"] == [["cpu"]]


def test_bench_gpu_llama_next_gpu_command_runs_on_the_cpu(tmp_path: Path) -> None:
    """The next GPU command (BENCHMARKS.md, "To measure next") at the smoke test's shape: item
    4 on the trained-spectrum model (with the float64 oracle and the released algorithm) and
    then on the flat one, whose ratio is against the first model's released algorithm."""
    records = _run(tmp_path, "bench_gpu_llama.py", "--small", "--items", "4", "--spectrum",
                   "trained", "flat", "--baselines", "first", "--methods", "measure",
                   "measure_split", "measure_eigh", "--iterate-anywhere")
    assert [r["spectrum"] for r in records if r.get("record") == "config"] == [
        "trained", "flat"]
    methods = {(r["method"], r["spectrum"]): r for r in records if r.get("record") == "method"}
    assert set(methods) == {("released", "trained"), *(
        (m, k) for m in ("measure", "measure_split", "measure_eigh") for k in ("trained", "flat"))}
    for (method, kind), r in methods.items():
        if method == "released":
            continue
        assert r["speedup_vs_released"] > 0 and r["released_on"] == "trained", r
        # the oracle ran on the first model only
        assert (r["agreement"] is not None) == (kind == "trained"), r
        if kind == "trained":
            assert r["agreement"]["max_abs_diff"] < 1e-5, r


def test_bench_spectra_builds_models_with_the_trained_decay(tmp_path: Path) -> None:
    """`benchmarks/spectrum.py`: the random models built with the trained decay have Jacobian
    spectra nearer the trained profile than their flat twins, and the pretrained MiniLM's
    spectra are measured."""
    records = _run(tmp_path, "bench_spectra.py", "--trained", "minilm", "--random",
                   "gpt2-small", "llama-small")
    got = {(r["model"], r["kind"]): r for r in records if r.get("record") == "spectrum"}
    assert set(got) == {("minilm", "trained"), ("gpt2-small", "flat"),
                        ("gpt2-small", "trained"), ("llama-small", "flat"),
                        ("llama-small", "trained")}, set(got)
    for name in ("gpt2-small", "llama-small"):
        flat, trained = got[(name, "flat")], got[(name, "trained")]
        assert trained["rms_log_vs_trained"] < flat["rms_log_vs_trained"], (flat, trained)
    assert got[("minilm", "trained")]["d"] == 384 and got[("minilm", "trained")]["gap"]


def test_bench_throughput_smoke_splits_the_call(tmp_path: Path) -> None:
    """Issue 43 item 3: the per-prompt record splits the call into capture, trajectory tables,
    prompts and the rest, and counts the Python calls per prompt (the narrow shape with its
    blocks overridden, as the outside-time and 1,024-prompt commands of BENCHMARKS.md)."""
    records = _run(tmp_path, "bench_throughput.py", "--shape", "narrow", "--layers", "2",
                   "--ns", "2", "--count-calls", "2", "--spectrum", "trained")
    (config,) = [r for r in records if r.get("record") == "config"]
    assert (config["shape"], config["layers"]) == ("narrow", 2), config
    (call,) = [r for r in records if r.get("record") == "call"]
    assert call["trajectory_s"] > 0 and call["capture_s"] > 0, call
    assert call["outside_with_trajectory_s"] >= call["outside_s"], call
    (calls,) = [r for r in records if r.get("record") == "calls"]
    assert calls["python_calls"] > 0 and calls["most_called"], calls


def test_bench_sweep_smoke_reports_the_measuring_share(tmp_path: Path) -> None:
    records = _run(tmp_path, "bench_sweep.py", "--checkpoints", "2", "--prompts", "2",
                   "--executors", "local")
    (summary,) = [r for r in records if r.get("record") == "summary_local"]
    assert summary["units"] == 2 and 0 < summary["measuring_share"] <= 1, summary
    assert all(summary["unit_totals_s"][p] > 0 for p in ("load", "measure", "write")), summary


def test_bench_gpu_llama_item8_splits_the_jacobian_phase(tmp_path: Path) -> None:
    """Item 8 (the Jacobian phase against its GEMM floor): the floor is counted and timed, and
    the build check runs on the first prompt of a call only, not on every prompt."""
    records = _run(tmp_path, "bench_gpu_llama.py", "--small", "--items", "8", "--repeats", "1",
                   "--prompts", "2")
    (rec,) = [r for r in records if r.get("record") == "item8"]
    assert rec["floor"]["seconds_per_prompt"] > 0 and rec["floor"]["gflop_per_block"] > 0, rec
    first, later = rec["per_prompt"]
    assert first["check_s"]["median"] > 0 and later["check_s"]["median"] == 0, rec
    for p in (first, later):
        assert 0 < p["dense_j_s"]["median"] <= p["jacobian_s"]["median"], p
    assert rec["per_block_one_prompt_call"]["syncs"] > 0 and rec["fast_dense_jacobians_s"] > 0


def test_bench_gram_iter_smoke_compares_both_routes(tmp_path: Path) -> None:
    records = _run(tmp_path, "bench_gram_iter.py", "--ks", "10", "--repeats", "1",
                   "--models", "gpt2-small", "llama-small", "decay", "--lobpcg-iters", "5")
    rows = [r for r in records if r.get("record") == "topk"]
    assert {(r["matrix"], r["spectrum"]) for r in rows} == {
        ("gpt2-small", "flat"), ("gpt2-small", "trained"), ("llama-small", "flat"),
        ("llama-small", "trained"), ("decay", "10/sqrt(i)")}, rows
    for r in rows:
        assert r["eigh"]["route"] != "gram-iter", r  # forced off
        assert r["eigh"]["max_ds_rel"] < 1e-6 and r["iter"]["max_ds_rel"] < 1e-6, r
        # the products the iteration spent, and whether it fell back to the eigh
        assert r["iter"]["products"] > 0 and r["iter"]["fell_back"] == (
            r["iter"]["route"] != "gram-iter"), r
    # the decaying spectrum is where the iteration is certified
    assert any(r["iter"]["route"] == "gram-iter" for r in rows if r["matrix"] == "decay"), rows


def test_the_guard_fails_on_a_forced_fallback(tmp_path: Path) -> None:
    """Issue 34 item 3, checked by forcing it: with the decode-step fast path refused for every
    block (as a renamed cache argument did), `benchmarks/guard_fastpath.py` exits 1 and names
    the families that fell back."""
    script = tmp_path / "forced.py"
    script.write_text(
        "import runpy, sys\n"
        "import blockcoupling.engine.fastpath as fp\n"
        "fp.token_branches = lambda *a, **k: None  # every block refuses the fast path\n"
        f"sys.argv = [{str(BENCH / 'guard_fastpath.py')!r}, '--repeats', '1']\n"
        f"runpy.run_path({str(BENCH / 'guard_fastpath.py')!r}, run_name='__main__')\n")
    env = dict(os.environ, BLOCKCOUPLING_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=900, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "gpt2" in out.lower() and "fast" in out.lower(), out[-3000:]
