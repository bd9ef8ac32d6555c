"""Run directories: round trip, incremental parts, resume, SIGKILL safety, lock, bad dirs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import SCHEMAS, TABLES, Measurement
from blockcoupling.errors import RunDirError
from blockcoupling.store import RunWriter, is_run_dir, open_run, weights_hash
from tests.helpers import child_env
from tests.helpers.store_parts import CONFIG, META, PROMPT_IDS, PROMPTS, make_part


def reference(ids: list[str] = PROMPT_IDS) -> Measurement:
    """The oracle: all prompts measured in memory, in prompt order."""
    return Measurement.concat([make_part([pid]) for pid in ids], config=CONFIG, meta=dict(META))


def assert_same(got: Measurement, want: Measurement) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(got.table(name), want.table(name), check_exact=True)
    assert sorted(got.arrays) == sorted(want.arrays)
    for key, value in want.arrays.items():
        assert got.arrays[key].dtype == value.dtype
        np.testing.assert_array_equal(got.arrays[key], value)
    assert got.config == want.config


def write_run(root: Path, groups: list[list[str]], *, finalize: bool = True,
              resume: bool = False) -> Measurement | None:
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=resume) as w:
        for group in groups:
            w.write_part(make_part(group))
        return w.finalize(timings={"total_s": 1.5}) if finalize else None


# ---------------------------------------------------------------------------- round trip
def test_round_trip_equals_in_memory_measurement(tmp_path: Path) -> None:
    root = tmp_path / "run"
    returned = write_run(root, [PROMPT_IDS])
    got = open_run(root)
    want = reference()
    assert_same(got, want)
    assert_same(returned, want)
    # p is NaN for variants without p, and stays NaN (not 0 or a string)
    assert got.coupling.loc[got.coupling["variant"] == "released_norm", "p"].isna().all()
    assert got.coupling.loc[got.coupling["variant"] == "coupling", "p"].eq(1.0).all()
    assert pd.isna(got.prompts.loc[2, "label"])
    for key, value in META.items():
        assert got.meta[key] == value
    assert got.meta["status"] == "complete"
    assert got.meta["timings"] == {"total_s": 1.5}

    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["format"] == "blockcoupling-run" and manifest["format_version"] == 2
    assert manifest["status"] == "complete"
    assert MeasureConfig.from_dict(manifest["config"]) == CONFIG
    assert manifest["model"] == "tiny/gpt2" and manifest["revision"] == "abc123"
    assert manifest["dtype"] == "float32" and manifest["seed"] == 0
    assert set(manifest["versions"]) >= {"blockcoupling", "torch", "transformers", "numpy",
                                         "pandas", "pyarrow", "python", "platform"}
    assert [p["prompt_id"] for p in manifest["prompts"]] == PROMPT_IDS
    assert manifest["prompts"][2]["label"] is None
    assert manifest["missing_prompt_ids"] == []
    assert not (root / "parts").exists()
    assert is_run_dir(root)


def test_parquet_files_are_plain_and_typed(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_run(root, [PROMPT_IDS[:3]])
    arrow_types = {"string": pa.string(), "int32": pa.int32(), "float64": pa.float64()}
    for name in TABLES:
        table = pq.read_table(root / f"{name}.parquet")
        assert table.schema.metadata is None or b"pandas" not in table.schema.metadata
        assert table.column_names == list(SCHEMAS[name])
        for col, dtype in SCHEMAS[name].items():
            assert table.schema.field(col).type == arrow_types[dtype], (name, col)
        assert pd.read_parquet(root / f"{name}.parquet").shape[0] == table.num_rows
    p = pq.read_table(root / "coupling.parquet").column("p")
    assert p.null_count == len(p) // 2  # released_norm rows: empty p, as DEFINITIONS.md says
    with np.load(root / "arrays.npz", allow_pickle=False) as z:
        assert set(z.files) == {f"A/{pid}/{o}" for pid in PROMPT_IDS[:3] for o in ("ujv", "vju")}



def test_tables_read_the_same_in_polars_and_duckdb(tmp_path: Path) -> None:
    import duckdb
    import polars as pl

    root = tmp_path / "run"
    write_run(root, [PROMPT_IDS[:3]])
    for name in TABLES:
        path = root / f"{name}.parquet"
        want = pd.read_parquet(path)
        got_pl = pl.read_parquet(path)
        assert got_pl.columns == list(SCHEMAS[name]) and got_pl.height == len(want)
        n_db = duckdb.sql(f"select count(*) from read_parquet('{path}')").fetchall()[0][0]
        assert n_db == len(want)
    path = root / "coupling.parquet"
    want = pd.read_parquet(path)["value"].to_numpy()
    np.testing.assert_array_equal(pl.read_parquet(path)["value"].to_numpy(), want)
    rows = duckdb.sql(f"select value from read_parquet('{path}')").fetchnumpy()["value"]
    np.testing.assert_array_equal(rows, want)


# ---------------------------------------------------------------------------- incremental
def test_incremental_parts_open_unfinished_then_finalize(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS) as w:
        w.write_part(make_part(["p0", "p1"]))
        w.write_part(make_part(["p2"]))
        assert w.done_prompt_ids() == {"p0", "p1", "p2"}
        assert len(list((root / "parts").glob("part-*"))) == 2
        partial = open_run(root)
        assert partial.meta["status"] == "running"
        assert_same(partial, reference(["p0", "p1", "p2"]))
        for group in (["p3", "p4", "p5"], ["p6"], ["p7"]):
            w.write_part(make_part(group))
        final = w.finalize()
        with pytest.raises(ValueError, match="finalized"):
            w.write_part(make_part(["p0"]))
    assert_same(final, reference())
    assert_same(open_run(root), reference())


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.permutations(PROMPT_IDS), st.lists(st.integers(1, 3), min_size=8, max_size=8))
def test_any_partition_and_order_of_parts_gives_the_same_run(order: list[str],
                                                             sizes: list[int]) -> None:
    groups, i = [], 0
    for size in sizes:
        if i < len(order):
            groups.append(order[i:i + size])
            i += size
    with tempfile.TemporaryDirectory() as tmp:
        write_run(Path(tmp) / "run", groups)
        assert_same(open_run(Path(tmp) / "run"), reference())


# ---------------------------------------------------------------------------- resume
def test_resume_skips_done_prompts_without_duplicates(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_run(root, [["p0", "p1"], ["p2"]], finalize=False)
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        done = w.done_prompt_ids()
        assert done == {"p0", "p1", "p2"}
        with pytest.raises(ValueError, match="already written"):
            w.write_part(make_part(["p2", "p3"]))
        for pid in PROMPT_IDS:
            if pid not in done:
                w.write_part(make_part([pid]))
        got = w.finalize()
    assert_same(got, reference())
    keys = ["prompt_id", "layer_a", "layer_b", "variant"]
    assert not got.coupling.duplicated(keys).any()
    assert got.prompts["prompt_id"].tolist() == PROMPT_IDS

    # resuming a complete run: everything is done, finalizing again changes nothing
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        assert w.done_prompt_ids() == set(PROMPT_IDS)
        again = w.finalize()
    assert_same(again, reference())
    assert_same(open_run(root), reference())


def test_resume_with_another_batch_size_is_refused_with_the_option_to_use(tmp_path: Path) -> None:
    """Batch composition changes float32 rounding: batch_size is part of the identity."""
    root = tmp_path / "run"
    write_run(root, [["p0"]], finalize=False)
    with pytest.raises(RunDirError, match="batch_size: run has 2, now 5.*--batch-size 2"):
        RunWriter(root, config=CONFIG.replace(batch_size=5), meta=META, prompts=PROMPTS,
                  resume=True)
    with pytest.raises(RunDirError, match="chunk_size: run has None, now 7.*resume without --chunk-size"):
        RunWriter(root, config=CONFIG.replace(chunk_size=7), meta=META, prompts=PROMPTS,
                  resume=True)


def test_resume_with_a_different_config_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_run(root, [["p0"]], finalize=False)
    cfg = CONFIG.replace(k=(3,), tokens="all")
    with pytest.raises(RunDirError) as err:
        RunWriter(root, config=cfg, meta=META, prompts=PROMPTS, resume=True)
    msg = str(err.value)
    assert "k: run has [2], now [3]" in msg and "tokens:" in msg and "new --out" in msg
    assert "batch_size" not in msg
    with pytest.raises(RunDirError, match="weights_hash"):
        RunWriter(root, config=CONFIG, meta={**META, "weights_hash": "sha256-full:11"},
                  prompts=PROMPTS, resume=True)
    other = PROMPTS.copy()
    other.loc[3, "text"] = "changed"
    with pytest.raises(RunDirError, match="prompts differ.*p3"):
        RunWriter(root, config=CONFIG, meta=META, prompts=other, resume=True)
    # the refused attempts left the run intact and unlocked
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        assert w.done_prompt_ids() == {"p0"}


def test_existing_directory_without_resume_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_run(root, [["p0"]], finalize=False)
    with pytest.raises(RunDirError, match="continue it with --resume, or choose a new --out"):
        RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS)
    (tmp_path / "empty").mkdir()
    with RunWriter(tmp_path / "empty", config=CONFIG, meta=META, prompts=PROMPTS) as w:
        assert w.done_prompt_ids() == set()


# ---------------------------------------------------------------------------- SIGKILL
def child_code(root: Path, *, kill_at: tuple[str, ...] = (), sleep: float = 0.0,
               finalize: bool = False) -> str:
    """A writer process: writes one part per prompt (resuming), then optionally finalizes.
    With ``kill_at`` it SIGKILLs itself when it fsyncs a file whose path contains all those
    strings, i.e. in the middle of writing a part or the consolidated tables."""
    return textwrap.dedent(f"""
        import os, signal, sys, time
        import tests.helpers.store_parts as t
        import blockcoupling.store as store
        real_fsync = os.fsync
        def fsync(fd):
            target = os.readlink(f"/proc/self/fd/{{fd}}")
            if {kill_at!r} and all(s in target for s in {kill_at!r}):
                os.kill(os.getpid(), signal.SIGKILL)
            real_fsync(fd)
        os.fsync = fsync
        with store.RunWriter({str(root)!r}, config=t.CONFIG, meta=t.META, prompts=t.PROMPTS,
                             resume=True) as w:
            for pid in t.PROMPT_IDS:
                if pid in w.done_prompt_ids():
                    continue
                w.write_part(t.make_part([pid]))
                print("wrote", pid, flush=True)
                time.sleep({sleep!r})
            if {finalize!r}:
                w.finalize()
    """)


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    env = child_env(OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)


def finish_in_process(root: Path) -> Measurement:
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        for pid in PROMPT_IDS:
            if pid not in w.done_prompt_ids():
                w.write_part(make_part([pid]))
        return w.finalize()


def test_sigkill_from_outside_then_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    root = tmp_path / "run"
    env = child_env(OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", child_code(root, sleep=0.05)],
                            stdout=subprocess.PIPE, text=True, env=env)
    written = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        written += line.startswith("wrote")
        if written == 3:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    partial = open_run(root)  # an unfinished, killed run is readable
    assert partial.meta["status"] == "running"
    done = partial.prompts["prompt_id"].tolist()
    assert done[:3] == PROMPT_IDS[:3] and len(done) < len(PROMPT_IDS)
    assert_same(partial, reference(done))
    got = finish_in_process(root)
    assert_same(got, reference())
    uninterrupted = tmp_path / "clean"
    write_run(uninterrupted, [[pid] for pid in PROMPT_IDS])
    assert_same(open_run(root), open_run(uninterrupted))


def test_sigkill_inside_a_part_and_inside_finalize_then_resume(tmp_path: Path) -> None:
    root = tmp_path / "run"
    # 1) die inside the 4th part: after its coupling/trajectory/token_metrics files
    res = run_child(child_code(root, kill_at=(".tmp-part-000004-", "spectra.parquet")))
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert res.stdout.split() == ["wrote", "p0", "wrote", "p1", "wrote", "p2"]
    leftovers = [p for p in (root / "parts").iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and (leftovers[0] / "token_metrics.parquet").exists()
    assert open_run(root).prompts["prompt_id"].tolist() == PROMPT_IDS[:3]
    # 2) resume, write the rest, die inside finalize (consolidated tables go to temporary
    #    files first, in TABLES order: coupling, trajectory, token_metrics are written)
    res = run_child(child_code(root, kill_at=(".tmp-spectra.parquet",), finalize=True))
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert res.stdout.split()[1::2] == PROMPT_IDS[3:]
    assert not any(p.name.startswith(".tmp-") for p in (root / "parts").iterdir())
    assert any(p.name.startswith(".tmp-token_metrics.parquet") for p in root.iterdir())
    assert not (root / "coupling.parquet").exists()  # nothing renamed before the commit
    assert json.loads((root / "manifest.json").read_text())["status"] == "running"
    assert_same(open_run(root), reference())
    # 3) resume again: nothing left to compute, finalize completes
    got = finish_in_process(root)
    assert_same(got, reference())
    assert got.meta["status"] == "complete" and not (root / "parts").exists()


def test_parts_left_over_after_finalize_are_not_counted_twice(tmp_path: Path) -> None:
    """A kill after finalize committed the manifest but before it deleted the parts."""
    root = tmp_path / "run"
    write_run(root, [["p0", "p1"], ["p2"]], finalize=False)
    shutil.copytree(root / "parts", tmp_path / "saved")
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        w.finalize()
    shutil.copytree(tmp_path / "saved", root / "parts")
    assert_same(open_run(root), reference(["p0", "p1", "p2"]))
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        assert w.done_prompt_ids() == {"p0", "p1", "p2"}
        assert not (root / "parts" / "part-000001").exists()  # cleaned up under the lock
        w.write_part(make_part(["p3"]))
        assert (root / "parts" / "part-000003").exists()  # numbering continues
        assert_same(open_run(root), reference(["p0", "p1", "p2", "p3"]))


# ---------------------------------------------------------------------------- lock
def test_second_process_is_refused_while_a_writer_holds_the_lock(tmp_path: Path) -> None:
    root = tmp_path / "run"
    code = textwrap.dedent(f"""
        import tests.helpers.store_parts as t
        from blockcoupling.errors import RunDirError
        from blockcoupling.store.writer import RunWriter
        try:
            with RunWriter({str(root)!r}, config=t.CONFIG, meta=t.META, prompts=t.PROMPTS,
                           resume=True) as w:
                print("acquired", sorted(w.done_prompt_ids()))
        except RunDirError as err:
            print("refused:", err)
    """)
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS) as w:
        w.write_part(make_part(["p0"]))
        res = run_child(code)
        assert res.returncode == 0, res.stderr
        assert "refused:" in res.stdout and "in use" in res.stdout
        assert f"PID {os.getpid()}" in res.stdout
        with pytest.raises(RunDirError, match="in use"):  # also within one process
            RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True)
    # released on close (flock conflicts between two open files even in one process)
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        assert w.done_prompt_ids() == {"p0"}


# ---------------------------------------------------------------------------- bad directories
def test_missing_path_and_foreign_directory(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="no run directory at"):
        open_run(tmp_path / "nope")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("a,b\n")
    with pytest.raises(RunDirError, match="not a blockcoupling run directory"):
        open_run(foreign)
    with pytest.raises(RunDirError, match="not a blockcoupling run directory"):
        RunWriter(foreign, config=CONFIG, meta=META, prompts=PROMPTS, resume=True)
    (foreign / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(RunDirError, match="belongs to something else"):
        open_run(foreign)
    assert not is_run_dir(foreign) and not is_run_dir(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        open_run(tmp_path / "file")


def test_corrupt_manifest(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_run(root, [["p0"]])
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(text[: len(text) // 2])
    with pytest.raises(RunDirError, match="manifest.json is not valid JSON.*new --out"):
        open_run(root)
    with pytest.raises(RunDirError, match="corrupt"):
        RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True)
    assert not is_run_dir(root)


def test_truncated_part_is_reported_and_can_be_recomputed(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_run(root, [["p0", "p1"], ["p2"]], finalize=False)
    bad = root / "parts" / "part-000001" / "coupling.parquet"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(RunDirError) as err:
        open_run(root)
    assert str(bad) in str(err.value) and "Delete the part directory" in str(err.value)
    with pytest.raises(RunDirError, match="Delete the part directory"):
        RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True)
    # following the advice recomputes exactly the lost prompts
    shutil.rmtree(bad.parent)
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS, resume=True) as w:
        assert w.done_prompt_ids() == {"p2"}
    assert_same(finish_in_process(root), reference())


def test_missing_table_in_a_complete_run(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_run(root, [["p0"]])
    (root / "spectra.parquet").unlink()
    with pytest.raises(RunDirError, match="spectra.parquet is missing") as err:
        open_run(root)
    # the parts were merged and deleted: --resume cannot rebuild it, and the message says so
    assert "cannot rebuild it" in str(err.value) and "new --out" in str(err.value)


# ---------------------------------------------------------------------------- weights hash
def _expected_full_hash(model: torch.nn.Module) -> str:
    """Independent oracle: sha256 over name|shape|dtype lines and numpy value bytes."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode())
        h.update(t.detach().numpy().astype(t.detach().numpy().dtype).tobytes())
    return "sha256-full:" + h.hexdigest()


def test_weights_hash() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    twin.load_state_dict(model.state_dict())
    h = weights_hash(model)
    assert h == _expected_full_hash(model)
    assert weights_hash(twin) == h
    with torch.no_grad():
        twin[0].weight[2, 1] += 1e-6
    assert weights_hash(twin) != h
    assert weights_hash(model.double()).startswith("sha256-full:")
    assert weights_hash(model) != h  # dtype is part of the fingerprint
    sampled = weights_hash(model, max_full_bytes=0)
    assert sampled.startswith("sha256-sampled:") and sampled == weights_hash(model, max_full_bytes=0)
    with torch.no_grad():
        model[0].weight[0, 0] += 1.0  # the first element is always in the sample
    assert weights_hash(model, max_full_bytes=0) != sampled
    assert weights_hash(model.to(torch.bfloat16)).startswith("sha256-full:")


# ---------------------------------------------------------------------------- lock file, progress
def test_no_lock_file_is_left_and_progress_is_counted(tmp_path: Path) -> None:
    from blockcoupling.store import run_progress

    root = tmp_path / "run"
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS) as w:
        w.write_part(make_part(["p0", "p1"]))
        live = run_progress(root)
        assert live.writer_pid == str(os.getpid()) and "in progress" in live.describe(root)
    assert not (root / ".lock").exists()  # released and removed on close
    progress = run_progress(root)
    assert (progress.status, progress.done, progress.total, progress.writer_pid) == (
        "running", 2, 8, None)
    assert "INCOMPLETE: 2 of 8 prompts" in progress.describe(root)
    finish_in_process(root)
    assert not (root / ".lock").exists()
    assert run_progress(root).finished and "complete: 8 of 8" in run_progress(root).describe(root)


def test_a_run_without_results_is_replaced_by_a_new_writer(tmp_path: Path) -> None:
    root = tmp_path / "run"
    RunWriter(root, config=CONFIG.replace(k=(3,)), meta=META, prompts=PROMPTS).close()
    with RunWriter(root, config=CONFIG, meta=META, prompts=PROMPTS) as w:  # no resume needed
        assert w.done_prompt_ids() == set()
    assert json.loads((root / "manifest.json").read_text())["config"]["k"] == [2]


# ---------------------------------------------------------------------------- parts of measure_to_dir
def test_measure_to_dir_groups_cheap_prompts_into_parts_and_keeps_them_on_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part holds the prompts measured since the last one (part_seconds): every prompt its
    own part at 0, one part for all at infinity, the same values either way; prompts measured
    before an interruption are written before it propagates, and a resume adds the rest."""
    import blockcoupling as bc
    import blockcoupling.store.writer as writer
    from tests.helpers.tiny_models import tiny_inputs, tiny_model

    model, inputs = tiny_model("gpt2"), tiny_inputs("gpt2", n=4, batch=4)
    opts = dict(coupling=("depth",), k=(2,), batch_size=1, progress=False)
    monkeypatch.setattr(writer.RunWriter, "finalize", lambda self, **kw: self.close())
    for seconds, n_parts in ((0.0, 4), (float("inf"), 1)):
        bc.measure_to_dir(model, None, inputs, tmp_path / f"p{n_parts}", part_seconds=seconds,
                          **opts)
        assert len(list((tmp_path / f"p{n_parts}" / "parts").glob("part-*"))) == n_parts
    monkeypatch.undo()
    a, b = open_run(tmp_path / "p4"), open_run(tmp_path / "p1")
    assert len(a.coupling) > 0 and a.coupling["value"].equals(b.coupling["value"])

    _interrupt_after_two_parts(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        bc.measure_to_dir(model, None, inputs, tmp_path / "cut", part_seconds=float("inf"),
                          **opts)
    monkeypatch.undo()
    assert open_run(tmp_path / "cut").prompts["prompt_id"].nunique() == 2
    bc.measure_to_dir(model, None, inputs, tmp_path / "cut", resume=True, **opts)
    c = open_run(tmp_path / "cut")
    assert c.meta["status"] == "complete" and c.coupling["value"].equals(a.coupling["value"])


def test_the_default_part_time_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """BLOCKCOUPLING_PART_SECONDS sets the default part time (the tests set 0); unset: 5 s; a
    value that is not a number of seconds is one line."""
    from blockcoupling.errors import BlockCouplingError
    from blockcoupling.store.record import PART_SECONDS, PART_SECONDS_ENV, default_part_seconds

    monkeypatch.setenv(PART_SECONDS_ENV, "0")
    assert default_part_seconds() == 0.0
    monkeypatch.delenv(PART_SECONDS_ENV)
    assert default_part_seconds() == PART_SECONDS == 5.0
    for bad in ("-1", "nan", "soon"):
        monkeypatch.setenv(PART_SECONDS_ENV, bad)
        with pytest.raises(BlockCouplingError, match="give a number of seconds"):
            default_part_seconds()


def test_a_run_begun_before_a_variant_existed_resumes_with_its_own_variants(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: a variant added by the recipe (docs/DESIGN.md, "Recipe: add a coupling
    variant": ``hashed=False``) is on by default from then on; a partial run begun before it
    (its recorded variants lack it: ``coupling_vs_rotated`` was added so) resumes with the
    variants its recorded config asked for, to the run an uninterrupted measurement of those
    gives (the new variant for the remaining prompts only would be a wrong table), and one
    line says so. A difference in a variant that is part of the identity is refused as
    before."""
    import blockcoupling as bc
    from blockcoupling.engine.names import VARIANTS
    from blockcoupling.engine.variants import REGISTRY
    from tests.helpers.tiny_models import tiny_inputs, tiny_model

    before = tuple(v for v in VARIANTS if REGISTRY[v].hashed)  # the default before them
    added = [v for v in VARIANTS if v not in before]
    assert added == ["coupling_vs_rotated"]
    model, inputs = tiny_model("gpt2"), tiny_inputs("gpt2", n=4, batch=4)
    opts = dict(coupling=("depth",), k=(2,), batch_size=1, progress=False)
    whole = bc.measure_to_dir(model, None, inputs, tmp_path / "whole", variants=before,
                              part_seconds=0.0, **opts)
    _interrupt_after_two_parts(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        bc.measure_to_dir(model, None, inputs, tmp_path / "cut", variants=before,
                          part_seconds=0.0, **opts)
    monkeypatch.undo()
    with pytest.raises(RunDirError, match="variants: run has"):  # an identity variant missing
        bc.measure_to_dir(model, None, inputs, tmp_path / "cut", resume=True,
                          variants=before[1:], **opts)
    with pytest.warns(UserWarning, match=r"cut: resumed with the variants it began with.*"
                      r"coupling_vs_rotated is not measured in this run.*new --out"):
        cut = bc.measure_to_dir(model, None, inputs, tmp_path / "cut", resume=True,
                                part_seconds=0.0, **opts)  # the default: every variant now
    assert cut.meta["status"] == "complete"
    assert tuple(cut.config.variants) == before
    assert set(cut.coupling["variant"]) == set(before)
    pd.testing.assert_frame_equal(cut.coupling, whole.coupling)


def _interrupt_after_two_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `measure_to_dir` stop with a KeyboardInterrupt after its second part (a Ctrl-C
    between parts), until ``monkeypatch.undo()``."""
    import blockcoupling.store.record as record

    real = record.iter_measure

    def interrupted(*args: object, **kw: object):  # type: ignore[no-untyped-def]
        for i, part in enumerate(real(*args, **kw)):  # type: ignore[arg-type]
            if i == 2:
                raise KeyboardInterrupt
            yield part

    monkeypatch.setattr(record, "iter_measure", interrupted)
