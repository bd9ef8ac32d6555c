"""Low-level file I/O of run directories: atomic writes, checksums, the writer's lock, and
operating-system errors turned into messages that say what to do.

`atomic_write_bytes` / `atomic_write_text` / `atomic_path` are the one way to replace a file
(or folder) whole: the old one or the new one, never a mix. `DirLock` is the one lock of every
folder with one writer: an exclusive, non-blocking ``flock`` on ``DIR/.lock`` holding the
writer's PID, removed on release. `disk_errors` turns an ``OSError`` into a
[`RunDirError`][blockcoupling.errors.RunDirError] naming the path and the way out.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.jsonsafe import dumps

TMP_PREFIX = ".tmp-"
LOCK = ".lock"


# ---------------------------------------------------------------------------- checksums
def sha256_bytes(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------- durable writes
def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    """Write and ``fsync`` ``data`` (no rename; for files inside a temporary directory)."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def temp_path(path: Path) -> Path:
    """The temporary sibling a write of ``path`` goes through (``.tmp-<name>-<pid>``)."""
    return path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")


def write_temp(path: Path, data: bytes) -> Path:
    """Durably write ``data`` to the temporary sibling of ``path``; return that sibling."""
    tmp = temp_path(path)
    write_file(tmp, data)
    return tmp


def temp_candidates(path: Path) -> list[Path]:
    """Temporary siblings of ``path`` left by any writer process."""
    prefix = f"{TMP_PREFIX}{path.name}-"
    if not path.parent.is_dir():
        return []
    return sorted(p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.is_file())


def commit_temp(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and one ``os.replace`` (a folder
    at ``path`` is refused before anything is written; a failed write leaves no temporary
    file behind)."""
    check_output_file(path)
    tmp = temp_path(path)
    try:
        write_file(tmp, data)
        commit_temp(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def check_output_file(path: Path) -> None:
    """One line where an output file's path is a folder (a rename onto it would fail
    naming the temporary file)."""
    if path.is_dir() and not path.is_symlink():
        raise BlockCouplingError(f"{path} is a folder, not a file; give the path of a file "
                                 "to write (a new name, or an existing file to replace)")


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any) -> Path:
    """``data`` made JSON-safe (``blockcoupling.jsonsafe``: NaN -> null) and written
    atomically to ``path`` as indented JSON, its folders made; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, dumps(data) + "\n")
    return out


def remove(path: Path) -> None:
    """Remove a file or a folder (and its contents), if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` for a writer that needs a path (``torch.save``,
    ``save_pretrained``, ``to_parquet``): a file or a folder written there replaces ``path``
    whole when the body ends (a folder at ``path`` is removed just before the rename); if the
    body raises, ``path`` is left as it was and the sibling is removed."""
    tmp = temp_path(path)
    remove(tmp)
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        elif path.is_dir():  # a folder cannot be replaced by one rename
            shutil.rmtree(path)
        commit_temp(tmp, path)
    finally:
        remove(tmp)


# ---------------------------------------------------------------------------- OS errors
def describe_os_error(err: OSError, root: Path) -> str:
    """One sentence for an operating-system error met while writing run directory ``root``."""
    where = err.filename or root
    if err.errno == errno.ENOSPC or err.errno == errno.EDQUOT:
        return (
            f"no space left on the device while writing {where}. The prompts finished before "
            f"are safe in {root}: free some space, then run the same command again with --resume"
        )
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"cannot write {where} ({err.strerror}); choose a --out on a writable disk, or "
            "fix the folder's permissions"
        )
    if err.errno in (errno.ENOTDIR, errno.EEXIST) and not root.is_dir():
        return (
            f"cannot create the run directory {root}: a part of that path is a file, not a "
            "folder; choose another --out"
        )
    return f"cannot write {where} ({err.strerror or err}); check the disk and the path of --out"


@contextlib.contextmanager
def disk_errors(root: Path) -> Iterator[None]:
    """Re-raise ``OSError`` as [`RunDirError`][blockcoupling.errors.RunDirError] with a message that says what to do."""
    try:
        yield
    except RunDirError:
        raise
    except OSError as err:
        raise RunDirError(describe_os_error(err, root)) from err


# ---------------------------------------------------------------------------- lock
def _write_pid(fd: int) -> None:
    """Write this process's PID into the lock file just taken (`lock_holder` reads it)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


class DirLock:
    """The exclusive writer lock of a directory: ``filelock``'s ``flock`` on ``DIR/.lock``,
    taken without waiting, holding the writer's PID. ``busy`` is the message when another
    process holds it (``{who}`` becomes `` (PID n)``). Released, the file is removed (while
    still held: a writer that opened the old file sees it replaced and tries again)."""

    def __init__(self, root: Path, *, busy: str | None = None) -> None:
        import filelock

        self.root = root
        self.path = root / LOCK
        busy = busy or (f"run directory {root} is in use by another blockcoupling "
                        "process{who}; wait for it to finish or stop it, or choose a new --out")
        self._lock: Any = filelock.FileLock(self.path, timeout=0, on_acquired=_write_pid)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            holder = lock_holder(root)
            raise RunDirError(busy.replace("{who}", f" (PID {holder})" if holder not in (
                None, "?") else "")) from None
        except OSError as err:
            raise RunDirError(f"cannot lock {self.path}: {err.strerror or err}") from err

    def release(self) -> None:
        """Remove ``.lock`` (while still holding it) and release it."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self._lock.release(force=True)
        self._lock = None


@contextlib.contextmanager
def dir_lock(root: Path, *, busy: str | None = None) -> Iterator[DirLock]:
    """Hold `DirLock` on ``root`` (created if missing) for the body."""
    root.mkdir(parents=True, exist_ok=True)
    lock = DirLock(root, busy=busy)
    try:
        yield lock
    finally:
        lock.release()


def lock_holder(root: Path) -> str | None:
    """The PID of a live writer of ``root`` (as written in its lock), or None if none holds it.
    Reads only: a missing ``.lock`` is not created."""
    import filelock

    try:
        fd = os.open(root / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            free = filelock.lock_descriptor(fd, blocking=False)
        except OSError:
            free = False
        if free:
            filelock.unlock_descriptor(fd)
            return None
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            return os.pread(fd, 64, 0).decode().strip() or "?"
        return "?"
    finally:
        os.close(fd)
