"""The run protocol's first step, one for every folder a command writes (a run directory,
a collection of any kind, a perturbation run, a study folder): open it.

`decide` says what opening the folder does, writing nothing: ``new``, ``replace`` (a start
that stored no result), ``continue`` (the same identity, with results) or ``rebuild`` (its
record lost but derivable), else one refusal line naming the way out (a file, an unwritable
folder, another writer, another kind's files, results of another identity, or results only
``--resume`` continues). `open_folder` takes the same decision again under the folder's lock
and yields it while the lock is held. A kind describes its folder once (`Layout`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from blockcoupling.errors import RunDirError
from blockcoupling.store.fileio import (
    LOCK,
    TMP_PREFIX,
    DirLock,
    disk_errors,
    lock_holder,
    remove,
)
from blockcoupling.store.verified import load_json, roll_forward

#: what opening a folder does (`decide`)
NEW, REPLACE, CONTINUE, REBUILD = "new", "replace", "continue", "rebuild"


@dataclass(frozen=True)
class Layout:
    """What a kind of folder is, in the protocol's words."""

    #: what it holds, in messages ("run directory", "sweep", "perturbation run")
    what: str
    #: the file that records its identity
    record: str
    #: the names it may hold (None: not checked); anything else is refused as another's
    files: tuple[str, ...] | None = None
    #: the flag that continues a folder holding results (None: running again continues)
    resume_flag: str | None = "--resume"
    #: the option naming the folder, in messages
    flag: str = "--out"
    #: who else may be writing it, in the busy line ("sweep": "in use by another sweep")
    writer: str = "blockcoupling process"
    #: the command that writes it, in the line naming it to another command
    made_by: str = ""
    #: what to do with it instead, in that line ("give it to vit-figures or report")
    read_by: str = ""

    def busy(self, root: Path) -> str:
        """The line when another process holds the lock (``{who}``: `` (PID n)``)."""
        return (f"{self.what} {root} is in use by another {self.writer}{{who}}; wait for it "
                f"to finish or stop it, or choose another {self.flag}")


#: every kind of folder a command writes (`identify`), the record that marks each
RUN_DIRECTORY = Layout(
    what="run directory", record="manifest.json", made_by="blockcoupling measure",
    read_by="give it to show, report, cross, correlate or difficulty")
COLLECTION = Layout(
    what="collection", record="sweep.json",
    made_by="blockcoupling sweep, vit-grid or a CouplingMonitor",
    read_by="give it to sweep-status, report, correlate, cross or vit-figures (a vit-grid)")
PERTURBATION_RUN = Layout(
    what="perturbation run", record="perturbation.json", made_by="blockcoupling perturb",
    read_by="its results are its perturbation.html and summary.csv (perturb with the same "
            "settings and --out continues it)", resume_flag=None)
VIT_TRAINING = Layout(
    what="ViT training", record="metrics.json", made_by="blockcoupling vit-train",
    read_by="give it, or the folder above it, to vit-figures or report", resume_flag=None)
LM_STUDY = Layout(
    what="lm-family study", record="study-spec.json",
    made_by="blockcoupling study lm-family",
    read_by="its results are its study.html and study.json", resume_flag=None)
GENERALIZATION_STUDY = Layout(
    what="generalization study", record="grid",
    made_by="blockcoupling study generalization",
    read_by="its results are its study.html and study.json", resume_flag=None)
#: the demo's folder (not identified by `identify`: its only file of its own, report.html,
#: is what ``blockcoupling report`` writes anywhere)
DEMO = Layout(what="demo", record="report.html", made_by="blockcoupling demo",
              read_by="open its report.html", resume_flag=None)
#: a cache of trained checkpoints (``--cache-dir``)
TRAINING_CACHE = Layout(what="training cache", record="", flag="--cache-dir",
                        resume_flag=None)
KINDS: tuple[Layout, ...] = (RUN_DIRECTORY, COLLECTION, PERTURBATION_RUN, VIT_TRAINING,
                             LM_STUDY, GENERALIZATION_STUDY)


def identify(root: Path) -> Layout | None:
    """The kind of folder ``root`` is, by the record it holds (a collection named by its
    manifest's ``kind``: "sweep collection"); None: no kind's record. Words only: nothing
    is verified (the kind's own reader does that)."""
    if not root.is_dir():
        return None
    for kind in KINDS:
        if not (root / kind.record).exists():
            continue
        if kind is COLLECTION:
            name = None
            with contextlib.suppress(RunDirError):
                name = load_json(root / kind.record, "").get("kind")
            if isinstance(name, str) and name.strip():
                return replace(kind, what=f"{name.strip()} collection")
        return kind
    return None


def another_kind(root: Path, expected: Layout, *, fix: str = "") -> RunDirError | None:
    """The one line for ``root`` holding a folder of another kind than ``expected`` (None:
    it holds none, or one of ``expected``'s kind): what it is, who wrote it, what reads it
    (``fix``: the reader's own way out instead)."""
    other = identify(root)
    if other is None or other.record == expected.record:
        return None
    return RunDirError(f"{root} is a {other.what} (written by {other.made_by}), not a "
                       f"{expected.what}; {fix or other.read_by}")


def entries(root: Path) -> list[Path]:
    """What a folder holds besides its lock and temporary files."""
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.name != LOCK and not p.name.startswith(TMP_PREFIX)]


def check_out(root: Path, layout: Layout, *, locked: bool = False) -> None:
    """The checks of a folder's place, writing nothing: ``root`` is no file, the nearest
    folder that exists is writable, and no other process holds its lock (unless ``locked``:
    the caller holds it)."""
    if root.exists() and not root.is_dir():
        raise RunDirError(f"{layout.flag} {root} is a file; choose a folder for the "
                          f"{layout.what}")
    parent = root
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"{layout.flag} {root}: {parent} is a file, not a folder; choose "
                          f"another {layout.flag}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"{layout.flag} {root}: {parent} is not writable; choose a "
                          f"{layout.flag} in a folder you can write to")
    if not locked and (pid := lock_holder(root)) is not None:
        raise RunDirError(layout.busy(root).replace("{who}", f" (PID {pid})" if pid != "?"
                                                    else ""))


def decide(root: Path, layout: Layout, *, differences: Callable[[], list[str] | None],
           has_results: Callable[[], bool], resume: bool = False, locked: bool = False,
           describe: Callable[[], str] | None = None) -> str:
    """What opening ``root`` does (`NEW`, `REPLACE`, `CONTINUE`, `REBUILD`), or one
    RunDirError line; nothing is written. ``differences()``: what differs between the
    identity the folder records and this run's (empty: the same; None: its record is lost
    or damaged but derivable; it raises, with its own line, for a record that is not);
    ``has_results()``: whether anything of value is stored; ``describe()``: words on what
    is there (`` (2 of 4 prompts stored, running)``)."""
    check_out(root, layout, locked=locked)
    held = entries(root)
    if not held:
        return NEW
    if (err := another_kind(root, layout, fix=f"choose a new or empty {layout.flag}")) is not None:
        raise RunDirError(f"{layout.flag} {err}")
    if layout.files is not None:
        foreign = sorted(p.name for p in held if p.name not in layout.files)
        if foreign:
            raise RunDirError(f"{layout.flag} {root} holds other files ({foreign[0]}"
                              f"{', ...' if len(foreign) > 1 else ''}) and no "
                              f"{layout.what}; choose a new or empty {layout.flag}")
    diffs = differences()
    results = has_results()
    if not results and (diffs or not resume):
        return REPLACE  # nothing of value: the corrected command starts afresh
    if diffs:
        raise RunDirError(
            f"cannot resume {root}: it holds a {layout.what} of another spec or other "
            f"settings ({'; '.join(diffs[:3])}{'; ...' if len(diffs) > 3 else ''}); run it "
            f"with the same ones, or choose a new {layout.flag}")
    if layout.resume_flag is not None and not resume:
        lost = f" whose {layout.record} is lost" if diffs is None else ""
        what = describe() if describe is not None else ""
        raise RunDirError(f"{root} already exists and holds a {layout.what}{lost}{what}; "
                          f"continue it with {layout.resume_flag}"
                          + (f" (it rebuilds {layout.record})" if diffs is None else "")
                          + f", or choose a new {layout.flag}")
    return REBUILD if diffs is None else CONTINUE


@contextlib.contextmanager
def open_folder(root: Path, layout: Layout, *, differences: Callable[[], list[str] | None],
                has_results: Callable[[], bool], resume: bool = False,
                describe: Callable[[], str] | None = None,
                records: Callable[[], Mapping[str, str]] | None = None) -> Iterator[str]:
    """`decide` (nothing written), then the folder made and locked, `decide` again under
    the lock, a folder to `REPLACE` (or a `NEW` one's leftovers) emptied, one to continue
    `settle`d where the kind gives ``records`` (its recorded checksums, relative path ->
    ``"sha256:<hex>"``; a kind that settles its own folder gives none); yields the decision
    while the lock is held. A folder it made that is still empty at the end is removed."""
    def again(locked: bool) -> str:
        return decide(root, layout, differences=differences, has_results=has_results,
                      resume=resume, locked=locked, describe=describe)

    again(locked=False)
    made = [p for p in (root, *root.parents) if not p.exists()]  # the folders made here
    with disk_errors(root):
        root.mkdir(parents=True, exist_ok=True)
        lock = DirLock(root, busy=layout.busy(root))
    try:
        state = again(locked=True)
        if state in (NEW, REPLACE):  # (a new one may hold a killed first write's leftovers)
            with disk_errors(root):
                clear(root)
        elif records is not None:
            with disk_errors(root):
                settle(root, records())
        yield state
    finally:
        lock.release()
        for folder in made:  # a body that failed before writing leaves no empty folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()


def settle(root: Path, recorded: Mapping[str, str] | None = None) -> None:
    """Finish or remove what killed writers left in ``root`` (the caller holds its lock): a
    temporary file holding what a record expects of its file (``recorded``: relative path
    -> ``"sha256:<hex>"``; a write whose record was committed, not its rename) is renamed
    onto it (`fileio.roll_forward`); every other temporary file or folder is removed. A
    folder of a kind inside ``root`` (a collection's units) is left to its own writer."""
    roll_forward(root, recorded or {})
    stack = [root]
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.name.startswith(TMP_PREFIX):
                remove(entry)
            elif entry.is_dir() and not entry.is_symlink() and identify(entry) is None:
                stack.append(entry)


def clear(root: Path) -> None:
    """Remove what ``root`` holds besides its lock (the caller holds it)."""
    for entry in root.iterdir():
        if entry.name == LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


__all__ = ["COLLECTION", "CONTINUE", "DEMO", "TRAINING_CACHE", "GENERALIZATION_STUDY", "KINDS", "LM_STUDY", "NEW",
           "PERTURBATION_RUN", "REBUILD", "REPLACE", "RUN_DIRECTORY", "VIT_TRAINING", "Layout",
           "another_kind", "check_out", "clear", "decide", "entries", "identify",
           "open_folder", "settle"]
