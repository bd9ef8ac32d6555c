"""The fault campaign over every kind of file blockcoupling stores and reads back.

Each stored-file kind (a run's manifest, part record, tables, arrays and stored bases; a
collection's manifest, status files, unit tables and training-loss log; the tiny-LM cache's
log, checksums and checkpoints; the lm-family study's records; a ViT training's record,
weights and checkpoint) is damaged every way a file can be (truncated, a byte flipped,
deleted, emptied, replaced by a folder, made unreadable; a JSON file also replaced by
another type and by a deeply nested structure), then read by the command or function that
reads it. Each must give exactly one error line that names the file and the command that
repairs it: never a traceback, never a value read as if nothing happened.

The artefacts are built once per module (tiny models, a few seconds each); each case damages
a copy. ``store/verified.py`` is the one reader all of them go through.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import blockcoupling as bc
from blockcoupling.errors import BlockCouplingError
from tests.helpers.tiny_runs import PROMPTS, cli, install_probes, save_tiny_lm, write_prompts

#: every way a stored file is damaged; the last three only for JSON files
FAULTS = ("truncated", "flipped", "deleted", "empty", "a folder", "unreadable")
JSON_FAULTS = ("another type", "a string", "deeply nested")


class Killed(Exception):
    """A kill at a chosen point (the unfinished run's)."""


def damage(path: Path, fault: str) -> None:
    """Damage the file ``path`` as ``fault`` says."""
    data = path.read_bytes()
    if fault == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif fault == "flipped":
        flipped = bytearray(data)
        i = len(data) // 2
        while chr(flipped[i]) in " \n\t,:{}[]\"":  # a byte of content, not of layout
            i += 1
        flipped[i] ^= 0x01
        path.write_bytes(bytes(flipped))
    elif fault == "deleted":
        path.unlink()
    elif fault == "empty":
        path.write_bytes(b"")
    elif fault == "a folder":
        path.unlink()
        path.mkdir()
        (path / "x").write_text("x")
    elif fault == "unreadable":
        path.chmod(0)
    elif fault == "another type":
        path.write_text("[1, 2, 3]\n")
    elif fault == "a string":
        path.write_text('"done"\n')
    elif fault == "deeply nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:  # pragma: no cover
        raise AssertionError(fault)


# ---------------------------------------------------------------------------- the artefacts
class Artefacts:
    """The artefacts the kinds damage, each built once, when a case first asks for it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._built: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self._built:
            self._built[name] = BUILDERS[name](self, self.base / name)
        return self._built[name]

    def measure(self, out: Path, *extra: str) -> Any:
        prompts = write_prompts(self.base / "prompts.txt", PROMPTS[:2])
        return cli("-q", "measure", "--model", str(self["lm"]), "--prompts", str(prompts),
                   "--k", "2", "--coupling", "depth", *extra, "--out", str(out))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Artefacts:
    return Artefacts(tmp_path_factory.mktemp("stored"))


def _run(art: Artefacts, out: Path) -> Path:
    r = art.measure(out, "--save-bases", "--save-jacobians")
    assert r.exit_code == 0, r.output
    return out


def _unfinished(art: Artefacts, out: Path) -> Path:
    """A run killed before its parts were consolidated."""
    def stop(point: str) -> None:
        if point == "consolidate":
            raise Killed

    art["lm"]  # built before the probes are in place
    uninstall = install_probes(stop)
    try:
        art.measure(out)
    finally:
        uninstall()
    assert sorted((out / "parts").glob("part-*/part.json"))
    return out


def _monitor(art: Artefacts, root: Path) -> Path:
    from blockcoupling.loading import load_model

    model, tok = load_model(str(art["lm"]), device="cpu")
    with bc.CouplingMonitor(tok, PROMPTS[:2], every=1, out=root, k=(2,), coupling=("depth",)) as mon:
        mon.step(model, 0, loss=2.5)
        mon.step(model, 1, loss=2.25)
    return root


def _tiny_lm(art: Artefacts, cache: Path) -> Path:
    from blockcoupling.studies.tiny_lm import TinyLMConfig, tiny_lm_dir, train_tiny_lm

    cfg = TinyLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=4,
                       max_steps=4, checkpoints=(0, 4), warmup_steps=1, val_windows=2)
    train_tiny_lm(cfg, cache, progress=False, monitor=False)
    assert tiny_lm_dir(cfg, cache).parent == cache
    return cache


def _study_records(art: Artefacts, out: Path) -> Path:
    from blockcoupling.store.verified import write_sealed
    from blockcoupling.studies.lm_study import quick_spec
    from blockcoupling.studies.lm_study.run import SPEC_FILE, TRAINED_FILE

    write_sealed(out / SPEC_FILE, quick_spec().to_dict())
    write_sealed(out / TRAINED_FILE, {"a-s0": "0" * 16})
    return out


VIT = dict(preset="tiny", hidden_size=16, depth=2, heads=2, image_size=8, train_limit=64,
           test_limit=16, batch_size=32, k=2, monitor_images=1, final_images=2,
           monitor_every=0)


def _vit(art: Artefacts, out: Path) -> Path:
    from blockcoupling.studies.vit.train import VitTrainConfig, train_vit

    train_vit(VitTrainConfig(**VIT, epochs=1), out, progress=False, threads=1)
    return out


def _vit_interrupted(art: Artefacts, out: Path) -> Path:
    """A training killed after its first epoch: a checkpoint to resume from."""
    from blockcoupling.studies.vit.train import VitTrainConfig, train_vit

    def stop(row: dict[str, Any]) -> None:
        if row["epoch"] == 1:
            raise Killed

    with pytest.raises(Killed):
        train_vit(VitTrainConfig(**VIT, epochs=2), out, progress=False, threads=1,
                  on_epoch=stop)
    assert (out / "checkpoint.pt").is_file()
    return out


def _perturb(art: Artefacts, out: Path) -> Path:
    r = _perturb_command(art, out)
    assert r.exit_code == 0, r.output
    return out


def _perturb_command(art: Artefacts, out: Path) -> Any:
    prompts = write_prompts(art.base / "prompts.txt", PROMPTS[:2])
    return cli("-q", "perturb", "--model", str(art["lm"]), "--prompts", str(prompts),
               "--levels", "0.1", "--draws", "2", "--out", str(out))


BUILDERS: dict[str, Callable[[Artefacts, Path], Path]] = {
    "lm": lambda art, out: save_tiny_lm(out), "run": _run, "unfinished": _unfinished,
    "monitor": _monitor, "lmcache": _tiny_lm, "study": _study_records, "vit": _vit,
    "vit_interrupted": _vit_interrupted, "perturb": _perturb}


# ---------------------------------------------------------------------------- the readers
Read = Callable[[Any, Path], Any]  # (the artefacts, the damaged copy) -> what it read


def _cli(*args: str) -> Read:
    """A command of the CLI on the damaged copy (``{}`` in an argument: its path)."""
    def read(built: Artefacts, root: Path) -> Any:
        return cli(*(a.replace("{}", str(root)) for a in args))
    return read


def _api(fn: Read) -> Read:
    return fn


def _summary(built: Artefacts, root: Path) -> Any:
    return bc.open_sweep(root).summary()


def _loss(built: Artefacts, root: Path) -> Any:
    from blockcoupling.report.emergence import read_training_loss

    return read_training_loss(root)


def _training_log(built: Artefacts, root: Path) -> Any:
    from blockcoupling.studies.tiny_lm import TinyLMConfig, training_log

    cfg = TinyLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=4,
                       max_steps=4, checkpoints=(0, 4), warmup_steps=1, val_windows=2)
    return training_log(cfg, root)


def _checkpoint(built: Artefacts, root: Path) -> Any:
    from blockcoupling.studies.tiny_lm import load_checkpoint

    return load_checkpoint(next(root.glob("*/step-000004")))


def _spec_check(built: Artefacts, root: Path) -> Any:
    from blockcoupling.studies.lm_study.run import _stored_spec

    return _stored_spec(root)


def _trained(built: Artefacts, root: Path) -> Any:
    from blockcoupling.studies.lm_study.run import _trained as trained

    return trained(root)


def _metrics(built: Artefacts, root: Path) -> Any:
    from blockcoupling.studies.vit.train import read_metrics

    return read_metrics(root)


def _resume_training(built: Artefacts, root: Path) -> Any:
    from blockcoupling.studies.vit.train import VitTrainConfig, train_vit

    return train_vit(VitTrainConfig(**VIT, epochs=2), root, progress=False, threads=1)


def _read_perturbation(built: Artefacts, root: Path) -> Any:
    from blockcoupling.studies.perturbation import read_perturbation

    return read_perturbation(root)


def _perturb_again(built: Artefacts, root: Path) -> Any:
    """The same perturb command again: a damaged part is measured again, to the same rows."""
    from blockcoupling.studies.perturbation import read_perturbation

    r = _perturb_command(built, root)
    if r.exit_code == 0:
        got = read_perturbation(root).rows
        want = read_perturbation(built["perturb"]).rows
        import pandas as pd

        pd.testing.assert_frame_equal(got, want, check_exact=True)
    return r


@dataclass(frozen=True)
class Kind:
    """One kind of stored file: where it is, who reads it, what the line must name."""

    name: str
    artefact: str  # the key of ``built``
    file: str  # relative to the artefact; a glob for names with ids
    read: Read
    repair: str  # a regular expression the line must match: the command that repairs it
    json: bool = False
    #: faults after which reading on is right (the file is derivable and rebuilt)
    rebuilt: tuple[str, ...] = ()


RUN_REPAIR = r"new --out|--resume|backup"
PERTURB_REPAIR = r"blockcoupling perturb command"
COLLECTION_REPAIR = r"--resume|CouplingMonitor|the same"
KINDS = (
    Kind("run manifest", "run", "manifest.json", _cli("show", "{}"), RUN_REPAIR, json=True),
    Kind("run table", "run", "coupling.parquet", _cli("show", "{}"), RUN_REPAIR),
    Kind("run prompts table", "run", "prompts.parquet", _cli("show", "{}"), RUN_REPAIR),
    Kind("run arrays", "run", "arrays.npz", _cli("show", "{}"), RUN_REPAIR),
    Kind("stored bases and Jacobians", "run", "bases/*.safetensors", _cli("show", "{}"),
         RUN_REPAIR),
    Kind("stored bases read by cross", "run", "bases/*.safetensors",
         _cli("-q", "cross", "{}", "{}"), RUN_REPAIR),
    Kind("part record", "unfinished", "parts/part-*/part.json", _cli("show", "{}"),
         r"Delete the part directory .*--resume", json=True),
    Kind("part table", "unfinished", "parts/part-*/coupling.parquet", _cli("show", "{}"),
         r"Delete the part directory .*--resume"),
    Kind("collection manifest", "monitor", "sweep.json", _cli("sweep-status", "{}"),
         COLLECTION_REPAIR, json=True),
    Kind("collection status", "monitor", "status/*step1*.json", _cli("sweep-status", "{}"),
         COLLECTION_REPAIR, json=True),
    Kind("collection unit table", "monitor", "units/*step1*/coupling.parquet", _api(_summary),
         COLLECTION_REPAIR),
    Kind("training-loss log", "monitor", "training_loss.jsonl", _api(_loss), r"Delete .*\.seal"),
    Kind("tiny-LM training log", "lmcache", "*/training.json", _api(_training_log),
         r"run the same command again", json=True),
    Kind("tiny-LM checksums", "lmcache", "*/checksums.json", _api(_training_log),
         r"run the same command again", json=True),
    Kind("tiny-LM checkpoint weights", "lmcache", "*/step-000004/model.safetensors",
         _api(_checkpoint), r"Run the same command again"),
    Kind("tiny-LM checkpoint config", "lmcache", "*/step-000004/config.json", _api(_checkpoint),
         r"Run the same command again", json=True),
    Kind("lm-family study spec", "study", "study-spec.json", _api(_spec_check),
         r"study lm-family", json=True, rebuilt=("deleted",)),  # written again; the sweep's
    Kind("lm-family trained record", "study", "trained.json", _api(_trained),  # spec checks
         r"study lm-family", json=True, rebuilt=("deleted",)),  # measured again where needed
    Kind("ViT training record", "vit", "metrics.json", _api(_metrics), r"vit-grid command",
         json=True),
    Kind("ViT trained weights", "vit", "model/model.safetensors", _api(_metrics),
         r"vit-grid command"),
    Kind("ViT checkpoint", "vit_interrupted", "checkpoint.pt", _api(_resume_training),
         r"run the same command again", rebuilt=("deleted",)),
    Kind("perturbation settings", "perturb", "perturbation.json", _api(_read_perturbation),
         PERTURB_REPAIR, json=True),
    Kind("perturbation table", "perturb", "perturbation.parquet", _api(_read_perturbation),
         PERTURB_REPAIR),
    Kind("perturbation ledger", "perturb", "checksums.json", _api(_read_perturbation),
         PERTURB_REPAIR, json=True),
    Kind("perturbation part", "perturb", "parts/00001.parquet", _api(_perturb_again),
         PERTURB_REPAIR, rebuilt=FAULTS),  # measured again, to the same rows
)

#: the faults every default run tries on every kind; the others in the slow set (CI: all)
QUICK = ("flipped", "truncated", "a folder", "deeply nested")
CASES = [pytest.param(kind, fault, id=f"{kind.name}-{fault}",
                      marks=() if fault in QUICK else pytest.mark.slow)
         for kind in KINDS for fault in (*FAULTS, *(JSON_FAULTS if kind.json else ()))]


def _outcome(result: Any) -> str | None:
    """The one error line of a reader's result (a CLI result, or the message of the
    BlockCouplingError an API reader raised), None if it read on without complaint."""
    if isinstance(result, BlockCouplingError):
        return str(result)
    if hasattr(result, "exit_code"):
        out = result.output
        assert "Traceback" not in out, out
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            repr(result.exception), out)
        if result.exit_code == 0:
            return None
        lines = [ln for ln in out.strip().splitlines() if ln.strip()]
        assert result.exit_code in (1, 2) and len(lines) == 1, out
        assert lines[0].startswith("error: "), out
        return lines[0]
    return None


def _unreadable_for_root(monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
    """Root reads a file of mode 0: its reads are refused here as the kernel refuses a user's
    (PermissionError from every way a reader opens it)."""
    import builtins

    def refuse(path: Any) -> None:
        if Path(os.fsdecode(path)).absolute() == target.absolute():
            raise PermissionError(13, "Permission denied", str(path))

    real_open, real_read_bytes, real_read_text = builtins.open, Path.read_bytes, Path.read_text

    def fake_open(file: Any, *a: Any, **k: Any) -> Any:
        if isinstance(file, (str, bytes, os.PathLike)):
            refuse(file)
        return real_open(file, *a, **k)

    def read_bytes(self: Path) -> bytes:
        refuse(self)
        return real_read_bytes(self)

    def read_text(self: Path, *a: Any, **k: Any) -> str:
        refuse(self)
        return real_read_text(self, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "read_text", read_text)


@pytest.mark.parametrize(("kind", "fault"), CASES)
def test_every_stored_file_fault_is_one_line_naming_the_file_and_its_repair(
        built: Artefacts, tmp_path: Path, kind: Kind, fault: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / kind.artefact
    shutil.copytree(built[kind.artefact], root)
    matches = sorted(root.glob(kind.file))
    assert matches, kind.file
    target = matches[0]
    damage(target, fault)
    if fault == "unreadable" and os.geteuid() == 0:
        _unreadable_for_root(monkeypatch, target)
    try:
        try:
            result = kind.read(built, root)
        except BlockCouplingError as err:
            result = err
        line = _outcome(result)
    finally:
        if target.exists() and fault == "unreadable":
            target.chmod(0o644)
    if line is None:
        assert fault in kind.rebuilt, f"{kind.name}, {fault}: read on as if nothing happened"
        return
    assert "\n" not in line, line
    assert str(target) in line, f"the line does not name {target}: {line}"
    assert re.search(kind.repair, line), f"the line names no repair ({kind.repair}): {line}"


def test_a_status_file_copied_under_another_name_is_one_line(built: Artefacts,
                                                            tmp_path: Path) -> None:
    """Before: a status file copied to another name (sealed, so its content was intact)
    listed its unit twice, and ``sweep-status`` ended in a traceback."""
    root = tmp_path / "monitor"
    shutil.copytree(built["monitor"], root)
    first = sorted((root / "status").glob("*.json"))[0]
    copy = root / "status" / "zz-copy.json"
    shutil.copy(first, copy)
    line = _outcome(cli("sweep-status", str(root)))
    assert line is not None and str(copy) in line and "--resume" in line, line
    with pytest.raises(BlockCouplingError, match="copied or renamed"):
        bc.open_sweep(root).summary()


# ---------------------------------------------------------------------------- every read
#: every call in src/ that reads a file, by module and call, with what it reads: (a) a file
#: blockcoupling wrote, read through ``store/verified.py`` against its recorded checksum;
#: (b) a user's input, checked for what it is with one line; (c) the package's own data. A
#: new read is added here with its class, or goes through the reader.
READS: dict[tuple[str, str], str] = {
    ("store/verified.py", "*"): "a: the reader itself",
    ("store/integrity.py", "read_bytes"): "a: checksums compared (verify_complete, "
                                          "damaged_files, roll_forward)",
    ("store/integrity.py", "read_metadata"): "a: bytes verify_complete checked",
    ("store/reader.py", "read_table"): "a: bytes store.verified.verified_bytes returned",
    ("store/tables.py", "read_table"): "a: bytes the caller verified",
    ("store/tables.py", "load"): "a: np.load of bytes the caller verified (no pickles)",
    ("store/collection.py", "read_json"): "a: collection records (store.verified.load_sealed)",
    ("runs/protocol.py", "read_json"): "a: the same (store.collection.read_json)",
    ("store/fileio.py", "open"): "the writer's lock and fsync (no content trusted)",
    ("store/fileio.py", "pread"): "the PID in a lock file, for a message",
    ("store/bases.py", "open"): "fsync of a copied file",
    ("studies/vit/train.py", "load"): "a: torch.load of a payload load_sealed_bytes verified",
    ("studies/vit/record.py", "read_bytes"): "a: the saved model, against its recorded checksum",
    ("studies/vit/model.py", "from_pretrained"): "a: after read_metrics verified the weights "
                                                 "(b: a bare model folder a user gives)",
    ("studies/vit/kind.py", "read_text"): "a, an older format: grid.json of the old layout, "
                                          "read by the upgrade; unreadable = rebuilt from the "
                                          "trainings' verified records",
    ("studies/vit/kind.py", "loads"): "a, an older format: the same",
    ("studies/tiny_lm.py", "from_pretrained"): "a: after check_checkpoint (the cache's ledger)",
    ("studies/lm_study/run.py", "from_pretrained"): "a: after check_checkpoint (the cache's ledger)",
    ("studies/lm_study/run.py", "read_text"): "a: prompts.txt compared with what it must hold, "
                                          "rewritten when it differs (never trusted)",
    ("studies/demo.py", "from_pretrained"): "c: the MiniLM of an installed package",
    ("runs/executor.py", "open"): "a worker's stderr captured to a temporary file",
    ("runs/executor.py", "read_text"): "the same capture, read back in the same call",
    ("runs/identity.py", "read_bytes"): "b: the content hash of a user's local inputs",
    ("loading.py", "from_pretrained"): "b: the user's model (its weights hash recorded)",
    ("prompts/files.py", "*"): "b: prompt files (.txt, .jsonl, .csv), one line each fault",
    ("prompts/sources.py", "load_file"): "b: the same",
    ("prompts/benchmarks.py", "*"): "b: local rows of an hf: dataset, one line",
    ("prompts/builtin.py", "*"): "c: the builtin prompt sets shipped with the package",
    ("studies/scores.py", "read_csv"): "b: a score CSV",
    ("studies/lmeval.py", "*"): "b: lm-evaluation-harness results",
    ("studies/vit/data.py", "open"): "b: the images of an image folder",
}
_READ_CALLS = {"read_text", "read_bytes", "open", "load", "loads", "read_parquet", "read_table",
               "read_metadata", "read_csv", "read_json", "safe_load", "load_file", "safe_open",
               "from_pretrained", "pread"}


def _reads(source: str) -> list[tuple[int, str]]:
    """(line, call) of every call in ``source`` that reads a file."""
    import ast

    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
        if name not in _READ_CALLS:
            continue
        base = ast.unparse(fn.value) if isinstance(fn, ast.Attribute) else ""
        if name in ("load", "loads") and base not in ("json", "np", "torch", "yaml", "pickle"):
            continue  # another object's load (a BasisSource, a module attribute)
        if name == "open" and base not in ("", "os", "Image", "io"):
            continue  # Path.open is read_text's twin: caught by its own name below
        if name == "loads" and node.args and "json.dumps" in ast.unparse(node.args[0]):
            continue  # a round trip in memory, no file
        out.append((node.lineno, name))
    return out


def test_every_read_of_a_file_is_classified_and_stored_files_go_through_the_reader() -> None:
    src = Path(bc.__file__).resolve().parent
    unlisted = []
    for path in sorted(src.rglob("*.py")):
        module = path.relative_to(src).as_posix()
        for line, call in _reads(path.read_text(encoding="utf-8")):
            if (module, call) not in READS and (module, "*") not in READS:
                unlisted.append(f"{module}:{line}: {call}")
    assert not unlisted, (
        "files read outside store/verified.py: read a file blockcoupling wrote through the "
        "verified reader (its checksum recorded when written), or list a user's input in "
        "READS with its one-line check:\n" + "\n".join(unlisted))


def test_the_read_inventory_can_fail() -> None:
    assert _reads("data = json.loads(Path('x').read_text())") == [(1, "loads"), (1, "read_text")]
    assert _reads("x = json.loads(json.dumps(y))\nsrc.load(k)") == []
