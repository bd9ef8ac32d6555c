"""store/fileio: the one atomic write (files and folders) and the one directory lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockcoupling.errors import RunDirError
from blockcoupling.store.collection import is_locked, sweep_lock
from blockcoupling.store.fileio import (
    atomic_path,
    atomic_write_text,
    dir_lock,
    lock_holder,
)


def test_atomic_path_replaces_a_file_or_a_folder_whole(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    atomic_write_text(f, "old")
    with atomic_path(f) as tmp:
        tmp.write_text("new")
        assert f.read_text() == "old"  # nothing changes before the body ends
    assert f.read_text() == "new"
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "stale").write_text("x")
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        (tmp / "weights").write_text("w")
    assert sorted(p.name for p in folder.iterdir()) == ["weights"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "model"]  # no leftovers


def test_atomic_path_leaves_the_old_content_on_error(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(f) as tmp:
        tmp.write_text("half")
        raise RuntimeError("boom")
    assert f.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_one_lock_for_run_and_sweep_directories(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    with sweep_lock(root):
        assert is_locked(root) and lock_holder(root) is not None
        with pytest.raises(RunDirError, match=r"sweep directory .* in use by another sweep \(PID"):
            with sweep_lock(root, "sweep"):
                pass
        with pytest.raises(RunDirError, match="in use by another blockcoupling process"):
            with dir_lock(root):
                pass
    assert not is_locked(root) and not (root / ".lock").exists()
