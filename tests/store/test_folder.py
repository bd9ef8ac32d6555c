"""The run protocol's first step (``store/folder.py``), the same for every folder a command
writes: what opening a folder does, decided with nothing written, and taken again under
the folder's lock, which a second process cannot take."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from blockcoupling.errors import RunDirError
from blockcoupling.store.fileio import lock_holder
from blockcoupling.store.folder import (
    COLLECTION,
    CONTINUE,
    KINDS,
    NEW,
    REBUILD,
    REPLACE,
    RUN_DIRECTORY,
    Layout,
    another_kind,
    decide,
    identify,
    open_folder,
    settle,
)

TOY = Layout(what="toy run", record="toy.json", files=("toy.json", "parts"))


def _identity(root: Path, spec: dict) -> dict[str, Callable]:
    """A toy kind's identity: its record's spec; results: any part."""
    def differences() -> list[str] | None:
        try:
            stored = json.loads((root / "toy.json").read_text())
        except FileNotFoundError:
            return None if (root / "parts").is_dir() else []
        return [f"{k}: stored {stored.get(k)!r}, now {v!r}" for k, v in spec.items()
                if stored.get(k) != v]

    return {"differences": differences,
            "has_results": lambda: any((root / "parts").glob("*"))}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _run(root: Path, spec: dict, resume: bool = False, layout: Layout = TOY) -> str:
    with open_folder(root, layout, resume=resume, **_identity(root, spec)) as state:
        if state != CONTINUE:
            (root / "toy.json").write_text(json.dumps(spec))
        (root / "parts").mkdir(exist_ok=True)
        (root / "parts" / "p1").write_text("a result")
    return state


def test_each_decision_and_each_refusal(tmp_path: Path) -> None:
    root = tmp_path / "run"
    assert decide(root, TOY, **_identity(root, {"n": 2})) == NEW and not root.exists()
    assert _run(root, {"n": 2}) == NEW
    assert not (root / ".lock").exists()  # released and removed
    before = _files(root)
    with pytest.raises(RunDirError, match="already exists and holds a toy run; continue it "
                                          "with --resume, or choose a new --out"):
        _run(root, {"n": 2})
    with pytest.raises(RunDirError, match=r"cannot resume .* another spec or other settings "
                                          r"\(n: stored 2, now 4\)"):
        _run(root, {"n": 4}, resume=True)
    assert _files(root) == before  # a refusal writes nothing
    assert _run(root, {"n": 2}, resume=True) == CONTINUE
    (root / "toy.json").unlink()  # its record lost, derivable: rebuilt on resume
    with pytest.raises(RunDirError, match="whose toy.json is lost; continue it with --resume"):
        _run(root, {"n": 2})
    assert _run(root, {"n": 2}, resume=True) == REBUILD
    (root / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"holds other files \(notes.txt\) and no toy run"):
        _run(root, {"n": 2}, resume=True)
    (root / "notes.txt").unlink()
    for p in (root / "parts").iterdir():
        p.unlink()  # no result stored: another spec replaces it, without --resume
    (root / "old").mkdir()
    assert _run(root, {"n": 4}, layout=Layout(what="toy run", record="toy.json")) == REPLACE
    assert not (root / "old").exists() and json.loads((root / "toy.json").read_text()) == {
        "n": 4}


def test_the_place_is_checked_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match="is a file; choose a folder for the toy run"):
        _run(tmp_path / "file", {"n": 1})
    with pytest.raises(RunDirError, match="is a file, not a folder"):
        _run(tmp_path / "file" / "run", {"n": 1})
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o500)
        with pytest.raises(RunDirError, match="is not writable"):
            _run(locked / "run", {"n": 1})


def _hold(root: str, ready: multiprocessing.synchronize.Event,
          done: multiprocessing.synchronize.Event) -> None:
    with open_folder(Path(root), TOY, **_identity(Path(root), {"n": 1})):
        ready.set()
        done.wait(30)


def test_a_second_writer_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    root = tmp_path / "run"
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(root), ready, done))
    proc.start()
    try:
        assert ready.wait(60)
        pid = lock_holder(root)
        assert pid == str(proc.pid)
        with pytest.raises(RunDirError, match=rf"toy run .* is in use by another blockcoupling "
                                              rf"process \(PID {proc.pid}\)"):
            _run(root, {"n": 1})
        with pytest.raises(RunDirError, match="in use"):  # also with nothing decided yet
            decide(root, TOY, **_identity(root, {"n": 1}))
    finally:
        done.set()
        proc.join(60)
    assert lock_holder(root) is None and _run(root, {"n": 1}, resume=True) == NEW


@pytest.mark.parametrize("kind", KINDS, ids=[k.what for k in KINDS])
def test_a_folder_of_another_kind_is_named_by_what_wrote_it(kind: Layout, tmp_path: Path) -> None:
    """Every kind's folder given where another kind is read or written: one line naming
    what it is and who wrote it, never the words of a damaged folder of the reader's own
    kind; a folder of the reader's own kind, or of none, is left to the reader."""
    root = tmp_path / "f"
    root.mkdir()
    (root / kind.record).write_text(json.dumps({"kind": "sweep"}))
    assert identify(root) is not None and identify(root).record == kind.record
    assert another_kind(root, kind) is None
    for reader in (k for k in KINDS if k.record != kind.record):
        err = another_kind(root, reader)
        assert err is not None and f"not a {reader.what}" in str(err), err
        assert kind.made_by in str(err) and "backup" not in str(err), err
        with pytest.raises(RunDirError, match=f"written by {kind.made_by}.*choose a new or "
                           "empty --out"):
            decide(root, reader, **_identity(root, {}))
    assert identify(tmp_path / "missing") is None and another_kind(tmp_path, TOY) is None


def test_a_collection_is_named_by_its_kind(tmp_path: Path) -> None:
    (tmp_path / COLLECTION.record).write_text(json.dumps({"kind": "vit-grid"}))
    assert identify(tmp_path).what == "vit-grid collection"
    (tmp_path / COLLECTION.record).write_text("{not json")  # words only: never a traceback
    assert identify(tmp_path).what == "collection"


def test_settle_finishes_recorded_writes_and_removes_the_rest(tmp_path: Path) -> None:
    """What killed writers left: a temporary file holding what the record expects is
    renamed onto its file; every other temporary file or folder goes; a folder of another
    kind inside (a collection's unit) is left to its own writer."""
    from blockcoupling.store.fileio import sha256_bytes, temp_path

    (tmp_path / "parts").mkdir()
    temp_path(tmp_path / "parts" / "a").write_bytes(b"new")  # recorded, not renamed
    (tmp_path / "parts" / "a").write_bytes(b"old")
    temp_path(tmp_path / "parts" / "b").write_bytes(b"half")  # never recorded
    temp_path(tmp_path / "dir").mkdir()
    unit = tmp_path / "units" / "u1"
    unit.mkdir(parents=True)
    (unit / RUN_DIRECTORY.record).write_text("{}")
    temp_path(unit / "x").write_bytes(b"the unit's own")
    settle(tmp_path, {"parts/a": sha256_bytes(b"new")})
    assert (tmp_path / "parts" / "a").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.rglob(".tmp-*")) == [temp_path(unit / "x").name]
