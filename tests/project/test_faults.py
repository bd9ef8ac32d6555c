"""Fault injection: kills, signals, a full disk and tampered run directories.

A run is killed (SIGKILL) at a seeded random occurrence of each named point of a run
(capture, block calls, Jacobian SVDs, part writes and commits, the manifest, consolidation),
then continued with ``--resume``; the result must equal an uninterrupted run bit for bit:
every table and every array, no duplicate, nothing lost, no lock left. SIGINT and SIGTERM
stop a run cleanly; a full disk (a small tmpfs where one can be mounted, an injected
``OSError`` everywhere) is a one-line error after which ``--resume`` finishes the run.
Tampered run directories are detected by ``show``, ``report``, ``--resume`` and ``open_run``.

The kill points are drawn from ``BLOCKCOUPLING_FAULT_SEED`` (default 20261122) and printed;
to replay a failure, run the failing test with the seed it printed.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from blockcoupling.errors import RunDirError
from blockcoupling.store import open_run
from tests.helpers.faults import SEED, child, one_error_line
from tests.helpers.tiny_runs import (
    KILL_POINTS,
    POINTS,
    assert_clean_finished,
    assert_identical_runs,
    cli,
    install_probes,
    save_tiny_lm,
    write_prompts,
)


@dataclass
class Setup:
    base: Path
    args: list[str]  # the measure command without --out
    ref: Path  # an uninterrupted run of it
    counts: Counter[str]  # how often each point occurs in that run


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    base = tmp_path_factory.mktemp("faults")
    model = save_tiny_lm(base / "model")
    prompts = write_prompts(base / "prompts.txt")
    # 4 prompts in 2 batches; depth and self coupling; one prompt keeps its K x K matrices
    args = ["--quiet", "measure", "--model", str(model), "--prompts", str(prompts), "--k", "2,4",
            "--coupling", "depth,self", "--batch-size", "2"]
    counts: Counter[str] = Counter()
    uninstall = install_probes(lambda point: counts.update([point]))
    try:
        r = cli(*args, "--out", str(base / "ref"))
    finally:
        uninstall()
    assert r.exit_code == 0, r.output
    assert all(counts[p] > 0 for p in POINTS), counts
    return Setup(base, args, base / "ref", counts)


def replay(point: str, nth: int, total: int) -> str:
    return (f"kill point: {point} #{nth} of {total} (replay with "
            f"BLOCKCOUPLING_FAULT_SEED={SEED} pytest tests/project/test_faults.py -k {point})")


# ---------------------------------------------------------------------------- SIGKILL
@pytest.mark.parametrize("point", [p if p == "part_commit" else pytest.param(p, marks=pytest.mark.slow)
                                   for p in KILL_POINTS])  # CI: every point (-m "slow or not slow")
def test_sigkill_at_a_random_point_then_resume_is_bit_identical(setup: Setup, point: str,
                                                                 tmp_path: Path) -> None:
    total = setup.counts[point]
    nth = random.Random(f"{SEED}/{point}").randint(1, total)
    info = replay(point, nth, total)
    print(info)
    out = tmp_path / "run"
    res = child(point, nth, "SIGKILL", [*setup.args, "--out", str(out)])
    assert res.returncode == -signal.SIGKILL, f"{info}\n{res.stderr[-3000:]}"
    # whatever the kill left is either readable or refused with one clear line
    shown = cli("show", str(out))
    assert "Traceback" not in shown.output, f"{info}\n{shown.output}"
    if shown.exit_code == 0:
        status = shown.output.splitlines()[0]
        assert "INCOMPLETE" in status or "complete: 4 of 4" in status, f"{info}\n{status}"
    else:
        one_error_line(shown.output)
    r = cli(*setup.args, "--out", str(out), "--resume")
    assert r.exit_code == 0, f"{info}\n{r.output}"
    assert_identical_runs(out, setup.ref)
    assert_clean_finished(out)


# ---------------------------------------------------------------------------- SIGINT, SIGTERM
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigint_and_sigterm_stop_cleanly_and_resume_is_bit_identical(
        setup: Setup, sig: signal.Signals, code: int, tmp_path: Path) -> None:
    """The signal is delivered to this process, inside a Jacobian, as a user's Ctrl-C or a
    scheduler's ``kill`` would be (in-process: no new interpreter to start).

    Independent of what earlier tests left in this process: the signal goes to this (the
    main) thread with ``signal.raise_signal``, so its Python handler runs inside the probe
    (``os.kill`` of the process may be taken by any of the threads earlier tests started, and
    the interrupt then lands wherever the main thread happens to be), and the handlers are the
    defaults for the test's duration (an in-process ``ray.init`` of an earlier test leaves its
    own SIGTERM handler, ``sys.exit(15)``, installed for good)."""
    total = setup.counts["jacobian"]
    nth = random.Random(f"{SEED}/{sig.name}").randint(total // 3, 2 * total // 3)
    info = replay("jacobian", nth, total) + f" with {sig.name}"
    print(info)
    out = tmp_path / "run"
    seen = Counter()

    def trip(point: str) -> None:
        if point == "jacobian":
            seen.update([point])
            if seen[point] == nth:
                signal.raise_signal(sig)

    handlers = {s: signal.signal(s, h) for s, h in ((signal.SIGINT, signal.default_int_handler),
                                                     (signal.SIGTERM, signal.SIG_DFL))}
    uninstall = install_probes(trip)
    try:
        r = cli(*setup.args, "--out", str(out))
    finally:
        uninstall()
        for s, h in handlers.items():
            signal.signal(s, h)
    assert seen["jacobian"] >= nth, f"{info}: the run took only {seen['jacobian']} Jacobians"
    assert r.exit_code == code, f"{info}\n{r.output}"
    assert "Traceback" not in r.output and "--resume" in r.output, r.output
    assert not (out / ".lock").exists()  # a clean stop releases the lock
    shown = cli("show", str(out))
    assert shown.exit_code == 0 and "INCOMPLETE" in shown.output, shown.output
    assert " of 4 prompts" in shown.output
    r = cli(*setup.args, "--out", str(out), "--resume")
    assert r.exit_code == 0, r.output
    assert_identical_runs(out, setup.ref)
    assert_clean_finished(out)


# ---------------------------------------------------------------------------- full disk
def test_disk_full_injected_is_one_line_and_resume_finishes(setup: Setup, tmp_path: Path) -> None:
    out = tmp_path / "run"
    total = setup.counts["part_write"]
    nth = random.Random(f"{SEED}/enospc").randint(2, total)
    print(replay("part_write", nth, total) + " with ENOSPC")
    seen = Counter()

    def trip(point: str) -> None:
        if point == "part_write":
            seen.update([point])
            if seen[point] == nth:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "parts"))

    uninstall = install_probes(trip)
    try:
        r = cli(*setup.args, "--out", str(out))
    finally:
        uninstall()
    assert r.exit_code == 1
    line = one_error_line(r.output)
    assert "no space left" in line and "--resume" in line and "safe" in line
    r = cli(*setup.args, "--out", str(out), "--resume")
    assert r.exit_code == 0, r.output
    assert_identical_runs(out, setup.ref)
    assert_clean_finished(out)


def _mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True)
    return res.returncode == 0


def test_disk_full_on_a_small_tmpfs(setup: Setup, tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not _mount_tmpfs(mnt, "48k"):
        pytest.skip("cannot mount a tmpfs here (not root); the injected ENOSPC test covers it")
    try:
        out = mnt / "run"
        r = cli(*setup.args, "--out", str(out))
        assert r.exit_code == 1, r.output
        line = one_error_line(r.output)
        assert "no space left" in line, line
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        r = cli(*setup.args, "--out", str(out), "--resume")
        assert r.exit_code == 0, r.output
        assert_identical_runs(out, setup.ref)
        assert_clean_finished(out)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# ---------------------------------------------------------------------------- tampering
@pytest.fixture(scope="module")
def partial(setup: Setup) -> Path:
    """The run interrupted (Ctrl-C) after two committed parts: 2 of 4 prompts."""
    out = setup.base / "partial"
    seen = Counter()

    def trip(point: str) -> None:
        if point == "part_commit":
            seen.update([point])
            if seen[point] == 3:
                raise KeyboardInterrupt

    uninstall = install_probes(trip)
    try:
        r = cli(*setup.args, "--out", str(out))
    finally:
        uninstall()
    assert r.exit_code == 130, r.output
    return out


def _edit_manifest(run: Path, change: object) -> None:
    path = run / "manifest.json"
    data = json.loads(path.read_text())
    change(data)  # type: ignore[operator]
    path.write_text(json.dumps(data, indent=2))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _first_part(run: Path) -> Path:
    return sorted((run / "parts").glob("part-*"))[0]


TAMPERING = {
    # name: (which run, how it is damaged, what the message must say)
    "duplicated part directory": (
        "partial", lambda run, other: shutil.copytree(_first_part(run), run / "parts" / "part-000099"),
        "stored twice"),
    "part copied into a finished run": (
        "complete", lambda run, other: shutil.copytree(_first_part(other), run / "parts" / "part-000077"),
        "stored twice"),
    "truncated part table": (
        "partial", lambda run, other: _truncate(_first_part(run) / "coupling.parquet"),
        "Delete the part directory"),
    "bit flipped in a part's arrays": (
        "partial", lambda run, other: _flip_byte(_first_part(run) / "arrays.npz"),
        "checksum does not match"),
    "part.json edited": (
        "partial", lambda run, other: (_first_part(run) / "part.json").write_text(
            (_first_part(run) / "part.json").read_text().replace("prompts-0000", "prompts-0003")),
        "part.json"),
    "manifest: another k": (
        "partial", lambda run, other: _edit_manifest(run, lambda m: m["config"].update(k=[3])),
        "changed after blockcoupling wrote it"),
    "manifest: consolidated null": (
        "complete", lambda run, other: _edit_manifest(run, lambda m: m.update(consolidated=None)),
        "changed after blockcoupling wrote it"),
    "manifest: a prompt removed": (
        "complete", lambda run, other: _edit_manifest(run, lambda m: m["prompts"].pop()),
        "changed after blockcoupling wrote it"),
    "truncated consolidated table": (
        "complete", lambda run, other: _truncate(run / "coupling.parquet"),
        "cannot rebuild it"),
    "random bytes as arrays.npz": (
        "complete", lambda run, other: (run / "arrays.npz").write_bytes(os.urandom(256)),
        "checksum does not match"),
    "consolidated table deleted": (
        "complete", lambda run, other: (run / "trajectory.parquet").unlink(),
        "is missing"),
}


CONSOLIDATED_DAMAGE = {"truncated consolidated table", "random bytes as arrays.npz",
                       "consolidated table deleted"}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampered_run_is_detected_by_every_reader(setup: Setup, partial: Path, case: str,
                                                  tmp_path: Path) -> None:
    which, damage, expected = TAMPERING[case]
    run = tmp_path / "run"
    source, other = (partial, setup.ref) if which == "partial" else (setup.ref, partial)
    shutil.copytree(source, run)
    damage(run, other)
    with pytest.raises(RunDirError, match=expected):
        open_run(run)
    for args in (["show", str(run)],
                 ["report", str(run), "--out", str(tmp_path / "r.html")],
                 [*setup.args, "--out", str(run), "--resume"]):
        r = cli(*args)
        assert r.exit_code == 1, (args[0], r.output)
        line = one_error_line(r.output)
        assert expected in line, (args[0], line)
        if case in CONSOLIDATED_DAMAGE:
            # the parts are gone: the message must not send the user to --resume
            assert "new --out" in line and "cannot rebuild" in line


def test_following_the_advice_for_a_damaged_part_recovers_the_run(setup: Setup, partial: Path,
                                                                   tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(partial, run)
    part = _first_part(run)
    _truncate(part / "spectra.parquet")
    r = cli("show", str(run))
    assert r.exit_code == 1 and f"Delete the part directory {part}" in r.output
    shutil.rmtree(part)
    r = cli("show", str(run))
    assert r.exit_code == 0 and "INCOMPLETE: 1 of 4 prompts" in r.output, r.output
    r = cli(*setup.args, "--out", str(run), "--resume")
    assert r.exit_code == 0, r.output
    assert_identical_runs(run, setup.ref)
    assert_clean_finished(run)


def test_show_says_how_far_an_interrupted_run_got(partial: Path) -> None:
    r = cli("show", str(partial))
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert "INCOMPLETE: 2 of 4 prompts" in first and "--resume" in first


def test_a_crash_before_the_first_result_never_blocks_the_next_command(setup: Setup,
                                                                       tmp_path: Path) -> None:
    """A run directory left 'running' without any result is replaced by the next measure."""
    out = tmp_path / "run"

    class Crash(BaseException):
        pass

    def trip(point: str) -> None:
        if point == "capture":
            raise Crash

    uninstall = install_probes(trip)
    try:
        with pytest.raises(Crash):
            cli(*setup.args, "--out", str(out))
    finally:
        uninstall()
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"
    r = cli(*setup.args, "--out", str(out))  # no --resume needed: nothing would be lost
    assert r.exit_code == 0, r.output
    assert_identical_runs(out, setup.ref)
    assert_clean_finished(out)
