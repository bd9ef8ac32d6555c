"""The fault campaign of every command, tried as a hostile new user would (issue 40).

Every case is classified by one rule. **OK**: success with the correct output (the same
numbers as a reference run, whatever order the inputs came in), or a refusal that is exactly
one error line saying what to do, exit 1 (`BlockCouplingError`) or 2 (a usage error of the
command line), no traceback, no temporary file named, nothing written or changed in the
output folder, and a state some command gets out of. **BAD**: anything else (a traceback,
exit 0 with a wrong or silently changed number, a line naming a temporary file, a folder left
that no command continues).

The cases: bad and out-of-range options (0, negatives, above 2^63, NaN, wrong types, device
names this build lacks), cross-option rules, inputs in another order (prompt, rating and score
files, run directories), edited and truncated files each command wrote, a SIGKILL mid-write
then the same command again, a second writer on a folder in use, a changed spec in a used
folder, ``--json-out`` into a new folder, JSON missing values (null, never "nan"), malformed
score files and a disk refusal that states its margin.

A case still BAD is marked ``xfail(strict=True)`` in `BAD` below with its class (protocol,
reader, options, joins, JSON dialect, other): the suite stays green, the list stays visible,
and a fix turns its xfail into a failure that says to remove it from the list.

The artefacts (tiny random models, runs, a perturbation, a sweep, a ViT training) are built
once per module in a few seconds of CPU; every case that changes a folder works on a copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from tests.helpers import child_env
from tests.helpers.faults import SEED
from tests.helpers.tiny_runs import (
    PROMPTS,
    TINY_VIT,
    cli,
    e2h_arc_rows,
    save_tiny_lm,
    write_prompts,
)

BIG = str(2**64)  # above every 64-bit integer

#: the cases still BAD on main: case id -> "class: what happens" (xfail, strict)
BAD: dict[str, str] = {
}


def cases(rows: list[tuple[Any, ...]]) -> list[Any]:
    """``pytest.param`` of each row (its first item is the case id), xfail where `BAD` lists
    the case."""
    out = []
    for row in rows:
        cid = row[0]
        marks = [pytest.mark.xfail(strict=True, reason=BAD[cid])] if cid in BAD else []
        out.append(pytest.param(*row, id=cid, marks=marks))
    return out


# ---------------------------------------------------------------------------- the rule
def snapshot(path: Path) -> dict[str, str] | None:
    """Every file and folder under ``path`` with its content hash (None: ``path`` missing)."""
    if not path.exists():
        return None
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    out = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def without_costs(d: Any) -> Any:
    """``d`` without its wall-clock entries (every key naming seconds), at any depth."""
    if isinstance(d, dict):
        return {k: without_costs(v) for k, v in d.items() if "seconds" not in k}
    if isinstance(d, list):
        return [without_costs(v) for v in d]
    return d


def tail(text: str, n: int = 700) -> str:
    """The end of a command's output, for a failure's message."""
    return text if len(text) <= n else "..." + text[-n:]


def lines_of(text: str) -> list[str]:
    return [ln for ln in text.strip().splitlines() if ln.strip()]


def assert_refused(r: Any, *, unchanged: dict[Path, dict[str, str] | None] | None = None,
                   says: tuple[str, ...] = ()) -> str:
    """The OK form of a refusal: exit 1 with exactly one ``error:`` line, the last (warnings
    aside; what was printed before it is allowed), or exit 2 with click's one ``Error:`` line, no traceback, no temporary file named, and every
    folder of ``unchanged`` as it was (missing ones still missing). Returns the error line."""
    output = r.output
    assert "Traceback" not in output, f"a traceback:\n{tail(output)}"
    exc = r.exception
    assert exc is None or isinstance(exc, SystemExit), f"raised {exc!r}\n{tail(output)}"
    assert r.exit_code in (1, 2), f"exit {r.exit_code}:\n{tail(output)}"
    assert ".tmp" not in output, f"names a temporary file:\n{tail(output)}"
    errors = [ln for ln in lines_of(output) if ln.lower().startswith("error")]
    assert len(errors) == 1, f"{len(errors)} error lines:\n{tail(output)}"
    if r.exit_code == 1:  # lines printed before the refusal are allowed; none after it
        after = lines_of(output)[lines_of(output).index(errors[0]) + 1:]
        after = [ln for ln in after if not ln.lower().startswith("warning")]
        assert not after, f"the error goes on over several lines:\n{tail(output)}"
    for piece in says:
        assert piece.lower() in errors[0].lower(), f"does not say {piece!r}:\n{tail(output)}"
    for path, before in (unchanged or {}).items():
        assert snapshot(path) == before, f"{path} changed by a refused command:\n{tail(output)}"
    return errors[0]


def assert_ok(r: Any) -> str:
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        f"{r.exception!r}\n{r.output}"
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output and ".tmp" not in r.output, r.output
    return r.output


def strict_json(text: str) -> Any:
    """JSON of the one dialect: no NaN / Infinity tokens, no "nan" / "inf" strings for a
    missing or infinite number (null)."""
    def bad_constant(name: str) -> Any:
        raise AssertionError(f"JSON holds the token {name}")

    data = json.loads(text, parse_constant=bad_constant)

    def walk(x: Any, where: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")
        elif isinstance(x, str):
            assert x.strip().lower() not in ("nan", "inf", "-inf", "infinity", "-infinity",
                                             "none", "null"), f"{where} = {x!r}"
    walk(data, "$")
    return data


# ---------------------------------------------------------------------------- the artefacts
class Stop(Exception):
    """A kill at a chosen point, in this process."""


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three tiny LMs (other weights), their runs (bases stored; Jacobians for two), a run on
    the prompts in reverse order, a rated run, a perturbation, a two-model sweep and a ViT
    training; with the counts of ``os.replace`` in the perturbation (its kill points)."""
    from tests.helpers.tiny_models import tiny_model

    b = tmp_path_factory.mktemp("campaign")
    lm = [save_tiny_lm(b / "lm0")]
    for seed in (1, 2):
        d = b / f"lm{seed}"
        shutil.copytree(lm[0], d)
        tiny_model("gpt2", seed=seed).save_pretrained(d)
        lm.append(d)
    prompts = write_prompts(b / "p.txt")
    write_prompts(b / "p_rev.txt", PROMPTS[::-1])
    measure = ["--k", "2,4", "--coupling", "depth"]
    for i, m in enumerate(lm):
        extra = ["--save-bases", *(["--save-jacobians"] if i < 2 else [])]
        assert_ok(cli("-q", "measure", "-m", str(m), "--prompts", str(prompts), *measure,
                      *extra, "-o", str(b / f"run{i}")))
    (b / "scores.csv").write_text("model,score\na,10\nb,20\nc,15\n")
    rows = e2h_arc_rows(b / "e2h_arc.jsonl")
    assert_ok(cli("-q", "measure", "-m", str(lm[0]), "--prompts", f"hf:e2h-arc@{rows}",
                  "--limit", "6", "--k", "2", "-o", str(b / "rated")))
    with counted_moves() as replaces:
        assert_ok(cli("-q", "perturb", *perturb_args(lm[0], prompts, b / "pert")))
    spec = {"models": [{"label": "a", "model": str(lm[0])}, {"label": "b", "model": str(lm[1])}],
            "prompts": [str(prompts)],
            "measure": {"k": [2], "coupling": ["depth"], "variants": ["coupling",
                        "coupling_vs_null"], "orientations": ["ujv"], "batch_size": 1}}
    (b / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert_ok(cli("-q", "sweep", str(b / "spec.yaml"), "-o", str(b / "sweep"), "--executor",
                  "local"))
    assert_ok(cli("-q", "vit-train", "-o", str(b / "vits" / "v0"), *vit_args()))
    assert_ok(cli("-q", *_vit_grid()({}, b / "grid")))
    return {"b": b, "lm": lm, "prompts": prompts, "rows": rows, "spec": spec,
            "replaces": replaces[0]}


@contextlib.contextmanager
def counted_moves() -> Iterator[list[int]]:
    """Count the ``os.replace`` and ``os.rename`` calls of the body (the kill points of
    `_killed_child`)."""
    seen = [0]
    real = os.replace, os.rename

    def counting(fn: Callable[..., None]) -> Callable[..., None]:
        def move(*a: Any, **k: Any) -> None:
            seen[0] += 1
            fn(*a, **k)
        return move

    os.replace, os.rename = counting(real[0]), counting(real[1])  # type: ignore[assignment]
    try:
        yield seen
    finally:
        os.replace, os.rename = real  # type: ignore[assignment]


def perturb_args(model: Path, prompts: Path, out: Path, *extra: str) -> list[str]:
    return ["-m", str(model), "--prompts", str(prompts), "--levels", "0.1,1", "--draws", "2",
            "-o", str(out), *extra]


def vit_args(**over: Any) -> list[str]:
    out = []
    for k, v in {**TINY_VIT, "epochs": 1, **over}.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def hold_lock() -> Iterator[Callable[[Path], None]]:
    """Take a folder's writer lock as another process would (an flock on DIR/.lock)."""
    from blockcoupling.store.fileio import DirLock

    held: list[Any] = []

    def take(root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        held.append(DirLock(root))

    yield take
    for lock in held:
        lock.release()


# ---------------------------------------------------------------------------- options
Argv = Callable[[dict[str, Any], Path], list[str]]


def _measure(*extra: str) -> Argv:
    return lambda fx, o: ["measure", "-m", str(fx["lm"][0]), "--prompts", str(fx["prompts"]),
                          "--k", "2", "--coupling", "depth", "-o", str(o), *extra]


def _perturb(*extra: str) -> Argv:
    return lambda fx, o: ["perturb", *perturb_args(fx["lm"][0], fx["prompts"], o, *extra)]


def _difficulty(*extra: str) -> Argv:
    return lambda fx, o: ["difficulty", str(fx["b"] / "rated"), "--n-boot", "50",
                          "--json-out", str(o / "d.json"), *extra]


def _correlate(*extra: str, runs: tuple[int, ...] = (0, 1, 2)) -> Argv:
    return lambda fx, o: ["correlate", *[str(fx["b"] / f"run{i}") for i in runs], "--scores",
                          str(fx["b"] / "scores.csv"), "--labels", "a,b,c"[:2 * len(runs) - 1],
                          "--json-out", str(o / "c.json"), *extra]


def _cross(*extra: str, runs: tuple[str, ...] = ("run0", "run1")) -> Argv:
    return lambda fx, o: ["cross", *[str(fx["b"] / r) for r in runs], "--json-out",
                          str(o / "x.json"), *extra]


def _floor(*extra: str, scores: str = "paper") -> Argv:
    return lambda fx, o: ["chance-floor", "--scores",
                          scores if scores == "paper" else str(fx["b"] / scores),
                          "--json-out", str(o / "f.json"), *extra]


def _vit_train(*extra: str) -> Argv:
    return lambda fx, o: ["vit-train", "-o", str(o), *vit_args(), *extra]


def _vit_grid(*extra: str) -> Argv:
    return lambda fx, o: ["vit-grid", "-o", str(o), "--executor", "local", "--drop-path", "0",
                          "--weight-decay", "0.05", *vit_args(), *extra]


def _lm_family(*extra: str) -> Argv:
    return lambda fx, o: ["study", "lm-family", "-o", str(o), "--dry-run", *extra]


def _generalization(*extra: str) -> Argv:
    return lambda fx, o: ["study", "generalization", "-o", str(o), "--dry-run", *extra]


def _sweep(change: Callable[[dict[str, Any]], None], *extra: str) -> Argv:
    def argv(fx: dict[str, Any], o: Path) -> list[str]:
        spec = json.loads(json.dumps(fx["spec"]))
        change(spec)
        path = o.parent / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        return ["sweep", str(path), "-o", str(o), "--executor", "local", *extra]
    return argv


def _sweep_at(out: Callable[[dict[str, Any], Path], Path],
              change: Callable[[dict[str, Any]], None], *extra: str) -> Argv:
    """`_sweep` (its spec beside ``o``) into the folder ``out(fx, o)``."""
    def argv(fx: dict[str, Any], o: Path) -> list[str]:
        args = _sweep(change, *extra)(fx, o)
        args[args.index("-o") + 1] = str(out(fx, o))
        return args
    return argv


def _model(**keys: Any) -> Callable[[dict[str, Any]], None]:
    return lambda spec: spec["models"][0].update(keys)


def _top(**keys: Any) -> Callable[[dict[str, Any]], None]:
    return lambda spec: spec.update(keys)


def _measure_key(**keys: Any) -> Callable[[dict[str, Any]], None]:
    return lambda spec: spec["measure"].update(keys)


def _nothing(spec: dict[str, Any]) -> None:
    return None


OPTIONS: dict[str, Argv] = {
    # measure
    "measure:batch-size=0": _measure("--batch-size", "0"),
    "measure:batch-size=-1": _measure("--batch-size", "-1"),
    "measure:seed=-1": _measure("--seed", "-1"),
    "measure:seed=2^64": _measure("--seed", BIG),
    "measure:init-seed-without-init-random": _measure("--init-seed", "3"),
    "measure:init-seed=2^64": _measure("--init", "random", "--init-seed", BIG),
    "measure:init=bogus": _measure("--init", "bogus"),
    "measure:device=hip": _measure("--device", "hip"),
    "measure:device=xla": _measure("--device", "xla"),
    "measure:device=mps": _measure("--device", "mps"),
    "measure:device=cuda:7": _measure("--device", "cuda:7"),
    "measure:device=tpu": _measure("--device", "tpu"),
    "measure:analysis-device=xla": _measure("--analysis-device", "xla"),
    "measure:k=0": _measure("--k", "0"),
    "measure:k=nan": _measure("--k", "nan"),
    "measure:k=2^64": _measure("--k", BIG),
    "measure:limit=0": _measure("--limit", "0"),
    "measure:limit=-1": _measure("--limit", "-1"),
    "measure:hidden-size=0": _measure("--hidden-size", "0"),
    "measure:dtype=float8": _measure("--dtype", "float8"),
    "measure:layers=0..9": _measure("--layers", "0..9"),
    "measure:tokens=99": _measure("--tokens", "99"),
    "measure:p=nan": _measure("--p", "nan"),
    "measure:max-memory-without-device-map": _measure("--max-memory", "cpu=1GiB"),
    "measure:offload-folder-without-device-map": _measure("--offload-folder", "/tmp/x"),
    "measure:quantize=8bit": _measure("--quantize", "8bit"),
    "measure:dry-run+batch-size=0": _measure("--dry-run", "--batch-size", "0"),
    "measure:dry-run+seed=2^64": _measure("--dry-run", "--seed", BIG),
    "measure:dry-run+device=hip": _measure("--dry-run", "--device", "hip"),
    "measure:dry-run+init-seed-without-init-random": _measure("--dry-run", "--init-seed", "3"),
    # perturb
    "perturb:draws=0": _perturb("--draws", "0"),
    "perturb:draws=-3": _perturb("--draws", "-3"),
    "perturb:draws=abc": _perturb("--draws", "abc"),
    "perturb:batch-size=0": _perturb("--batch-size", "0"),
    "perturb:batch-size=-1": _perturb("--batch-size", "-1"),
    "perturb:seed=-1": _perturb("--seed", "-1"),
    "perturb:seed=2^64": _perturb("--seed", BIG),
    "perturb:token=99": _perturb("--token", "99"),
    "perturb:token=-99": _perturb("--token", "-99"),
    "perturb:limit=0": _perturb("--limit", "0"),
    "perturb:levels=nan": _perturb("--levels", "0.1,nan"),
    "perturb:levels=inf": _perturb("--levels", "inf"),
    "perturb:levels=-0.1": _perturb("--levels", "-0.1"),
    "perturb:levels=0": _perturb("--levels", "0"),
    "perturb:levels=empty": _perturb("--levels", ""),
    "perturb:levels=abc": _perturb("--levels", "abc"),
    "perturb:init-seed-without-init-random": _perturb("--init-seed", "3"),
    "perturb:init-seed=2^64": _perturb("--init", "random", "--init-seed", BIG),
    "perturb:device=hip": _perturb("--device", "hip"),
    "perturb:device=xla": _perturb("--device", "xla"),
    "perturb:device=cuda:7": _perturb("--device", "cuda:7"),
    "perturb:dtype=float8": _perturb("--dtype", "float8"),
    "perturb:prompts=missing": lambda fx, o: ["perturb", *perturb_args(
        fx["lm"][0], fx["b"] / "missing.txt", o)],
    # difficulty
    "difficulty:n-boot=-5": _difficulty("--n-boot", "-5"),
    "difficulty:seed=-1": _difficulty("--seed", "-1"),
    "difficulty:seed=2^64": _difficulty("--seed", BIG),
    "difficulty:k=0": _difficulty("--k", "0"),
    "difficulty:k=3-not-measured": _difficulty("--k", "3"),
    "difficulty:k=abc": _difficulty("--k", "abc"),
    "difficulty:k=2,4": _difficulty("--k", "2,4"),
    "difficulty:ratings=hf:nonsense": _difficulty("--ratings", "hf:nonsense"),
    "difficulty:ratings=missing-file": lambda fx, o: [*_difficulty()(fx, o), "--ratings",
                                                      f"hf:e2h-arc@{fx['b'] / 'no.jsonl'}"],
    "difficulty:unrated-run": lambda fx, o: ["difficulty", str(fx["b"] / "run0"),
                                             "--json-out", str(o / "d.json")],
    # correlate
    "correlate:k=0": _correlate("--k", "0"),
    "correlate:k=2,x": _correlate("--k", "2,x"),
    "correlate:k=2,-1": _correlate("--k", "2,-1"),
    "correlate:k=2,99": _correlate("--k", "2,99"),
    "correlate:k=2^64": _correlate("--k", BIG),
    "correlate:n-boot=-5": _correlate("--n-boot", "-5"),
    "correlate:seed=-1": _correlate("--seed", "-1"),
    "correlate:seed=2^64": _correlate("--seed", BIG),
    "correlate:p=3": _correlate("--p", "3"),
    "correlate:p=nan": _correlate("--p", "nan"),
    "correlate:orientation=xyz": _correlate("--orientation", "xyz"),
    "correlate:variant=bogus": _correlate("--variant", "bogus"),
    "correlate:tokens=bogus": _correlate("--tokens", "bogus"),
    "correlate:labels-count": _correlate("--labels", "a,b"),
    "correlate:labels-duplicate": _correlate("--labels", "a,a,b"),
    "correlate:scores=missing": lambda fx, o: [*_correlate()(fx, o), "--scores",
                                               str(fx["b"] / "missing.csv")],
    "correlate:one-run": _correlate(runs=(0,)),
    # cross
    "cross:k=0": _cross("--k", "0"),
    "cross:k=2,4": _cross("--k", "2,4"),
    "cross:k=99": _cross("--k", "99"),
    "cross:p=nan": _cross("--p", "nan"),
    "cross:p=3": _cross("--p", "3"),
    "cross:variant=bogus": _cross("--variant", "bogus"),
    "cross:orientation=xyz": _cross("--orientation", "xyz"),
    "cross:one-run": _cross(runs=("run0",)),
    "cross:model-a-with-three-runs": lambda fx, o: [*_cross(runs=("run0", "run1", "run2"))(
        fx, o), "--model-a", str(fx["lm"][0])],
    "cross:run-without-bases": _cross(runs=("rated", "run1")),
    "cross:run-b-without-jacobians-of-a": _cross(runs=("run2", "run1")),
    "cross:missing-run": _cross(runs=("run0", "nothing")),
    # chance-floor
    "chance-floor:k-rule=0": _floor("--k-rule", "0"),
    "chance-floor:k-rule=-5": _floor("--k-rule", "-5"),
    "chance-floor:k-rule=nan": _floor("--k-rule", "nan"),
    "chance-floor:k-rule=abc": _floor("--k-rule", "abc"),
    "chance-floor:k-rule=2^64": _floor("--k-rule", BIG),
    "chance-floor:k-rule=d/0": _floor("--k-rule", "d/0"),
    "chance-floor:scores=missing": _floor(scores="missing.csv"),
    "chance-floor:d_model=0": _floor(scores="floor_d0.csv"),
    "chance-floor:d_model=-16": _floor(scores="floor_dneg.csv"),
    "chance-floor:d_model=abc": _floor(scores="floor_dabc.csv"),
    "chance-floor:d_model=1.5": _floor(scores="floor_dfrac.csv"),
    # show, report, sweep-status, vit-figures, collection upgrade
    "show:missing": lambda fx, o: ["show", str(o)],
    "show:a-file": lambda fx, o: ["show", str(fx["prompts"])],
    "report:sort=bogus": lambda fx, o: ["report", str(fx["b"] / "run0"), "--sort", "bogus",
                                        "-o", str(o / "r.html")],
    "report:labels-count": lambda fx, o: ["report", str(fx["b"] / "run0"), str(fx["b"] / "run1"),
                                          "--labels", "a", "-o", str(o / "r.html")],
    "report:sort=score-without-scores": lambda fx, o: ["report", str(fx["b"] / "run0"),
                                                       "--sort", "score", "-o", str(o / "r.html")],
    "report:missing-run": lambda fx, o: ["report", str(fx["b"] / "nothing"), "-o",
                                         str(o / "r.html")],
    "sweep-status:missing": lambda fx, o: ["sweep-status", str(o)],
    "sweep-status:a-run": lambda fx, o: ["sweep-status", str(fx["b"] / "run0")],
    "vit-figures:missing": lambda fx, o: ["vit-figures", str(fx["b"] / "nothing"), "-o", str(o)],
    "vit-figures:a-run": lambda fx, o: ["vit-figures", str(fx["b"] / "run0"), "-o", str(o)],
    "vit-figures:a-sweep": lambda fx, o: ["vit-figures", str(fx["b"] / "sweep"), "-o", str(o)],
    "collection-upgrade:missing": lambda fx, o: ["collection", "upgrade", str(o)],
    "collection-upgrade:a-file": lambda fx, o: ["collection", "upgrade", str(fx["prompts"])],
    # sweep (spec keys and options)
    "sweep:quantize=8bit": _sweep(_model(quantize="8bit")),
    "sweep:max_memory-without-device_map": _sweep(_model(max_memory="cpu=1GiB")),
    "sweep:device=hip": _sweep(_model(device="hip")),
    "sweep:device=xla": _sweep(_model(device="xla")),
    "sweep:init_seed-without-init-random": _sweep(_model(init_seed=3)),
    "sweep:init_seed=2^64": _sweep(_model(init="random", init_seed=2**64)),
    "sweep:seed=2^64": _sweep(_top(seed=2**64)),
    "sweep:limit=0": _sweep(_top(limit=0)),
    "sweep:measure.batch_size=0": _sweep(_measure_key(batch_size=0)),
    "sweep:measure.k=nan": _sweep(_measure_key(k=[float("nan")])),
    "sweep:measure.device=hip": _sweep(_measure_key(analysis_device="hip")),
    "sweep:retries=-1": _sweep(_nothing, "--retries", "-1"),
    "sweep:cluster-cpus=0": _sweep(_nothing, "--cluster-cpus", "0"),
    "sweep:connect-timeout=nan": _sweep(_nothing, "--connect-timeout", "nan"),
    "sweep:connect-timeout=-1": _sweep(_nothing, "--connect-timeout", "-1"),
    "sweep:executor=bogus": _sweep(_nothing, "--executor", "bogus"),
    "sweep:dry-run+quantize=8bit": _sweep(_model(quantize="8bit"), "--dry-run"),
    "sweep:dry-run+executor=bogus": _sweep(_nothing, "--dry-run", "--executor", "bogus"),
    # vit-train
    "vit-train:epochs=0": _vit_train("--epochs", "0"),
    "vit-train:seed=-1": _vit_train("--seed", "-1"),
    "vit-train:seed=2^64": _vit_train("--seed", BIG),
    "vit-train:k=0": _vit_train("--k", "0"),
    "vit-train:k=2,4": _vit_train("--k", "2,4"),
    "vit-train:threads=0": _vit_train("--threads", "0"),
    "vit-train:threads=-1": _vit_train("--threads", "-1"),
    "vit-train:dataset=bogus": _vit_train("--dataset", "bogus"),
    "vit-train:steps=0": _vit_train("--steps", "0"),
    "vit-train:lr=nan": _vit_train("--lr", "nan"),
    "vit-train:drop-path=1.5": _vit_train("--drop-path", "1.5"),
    "vit-train:label-noise=1.5": _vit_train("--label-noise", "1.5"),
    "vit-train:hidden-size=2^64": _vit_train("--hidden-size", BIG),
    "vit-train:batch-size=0": _vit_train("--batch-size", "0"),
    "vit-train:dry-run+epochs=0": _vit_train("--dry-run", "--epochs", "0"),
    "vit-train:dry-run+threads=0": _vit_train("--dry-run", "--threads", "0"),
    # vit-grid
    "vit-grid:seeds=-1": _vit_grid("--seeds", "-1"),
    "vit-grid:seeds=2^64": _vit_grid("--seeds", BIG),
    "vit-grid:seeds=0,0": _vit_grid("--seeds", "0,0"),
    "vit-grid:cpus-per-run=0": _vit_grid("--cpus-per-run", "0"),
    "vit-grid:executor=bogus": _vit_grid("--executor", "bogus"),
    "vit-grid:drop-path=empty": _vit_grid("--drop-path", ""),
    "vit-grid:drop-path=nan": _vit_grid("--drop-path", "nan"),
    "vit-grid:threads=0": _vit_grid("--threads", "0"),
    "vit-grid:dry-run+threads=0": _vit_grid("--dry-run", "--threads", "0"),
    "vit-grid:dry-run+executor=bogus": _vit_grid("--dry-run", "--executor", "bogus"),
    "vit-grid:spec-with-drop-path": lambda fx, o: [*_vit_grid("--dry-run")(fx, o), "--spec",
                                                   str(fx["b"] / "grid.yaml")],
    # study lm-family (every case with --dry-run: a missed refusal must not train)
    "lm-family:quick-with-runs": _lm_family("--quick", "--runs", "SPEC"),
    "lm-family:executor=bogus": _lm_family("--quick", "--executor", "bogus"),
    "lm-family:runs=missing": _lm_family("--runs", "MISSING"),
    "lm-family:runs=deeply-nested": _lm_family("--runs", "NESTED"),
    "lm-family:runs-k=0": _lm_family("--runs", "K0"),
    # study generalization (--dry-run too)
    "generalization:quick-with-spec": _generalization("--quick", "--spec", "GSPEC"),
    "generalization:executor=bogus": _generalization("--quick", "--executor", "bogus"),
    "generalization:cluster-cpus=0": _generalization("--quick", "--cluster-cpus", "0"),
    "generalization:spec=missing": _generalization("--spec", "MISSING"),
    "generalization:spec-seeds=-1": _generalization("--spec", "GSEEDS"),
    "generalization:spec-train_sizes=2^64": _generalization("--spec", "GBIG"),
    "generalization:out-is-a-file": lambda fx, o: _generalization("--quick")(
        fx, fx["b"] / "p.txt"),
    "lm-family:out-is-a-file": lambda fx, o: _lm_family("--quick")(fx, fx["b"] / "p.txt"),
    # --dry-run checks --out as the run does (the run's own checks: runs.protocol.checks_only)
    "sweep:dry-run+out-is-a-file": _sweep_at(lambda fx, o: _write(o.parent / "afile", "x"),
                                             _nothing, "--dry-run"),
    "sweep:dry-run+out-of-another-spec": _sweep_at(lambda fx, o: fx["b"] / "sweep", _top(seed=7),
                                                   "--dry-run", "--resume"),
    "sweep:dry-run+out-holds-results": _sweep_at(lambda fx, o: fx["b"] / "sweep", _nothing,
                                                 "--dry-run"),
    "sweep:dry-run+out-is-a-vit-grid": _sweep_at(lambda fx, o: fx["b"] / "grid", _nothing,
                                                 "--dry-run"),
    "sweep:dry-run+out-is-a-perturbation": _sweep_at(lambda fx, o: fx["b"] / "pert", _nothing,
                                                     "--dry-run"),
    "vit-grid:dry-run+out-is-a-file": lambda fx, o: _vit_grid("--dry-run")(
        fx, _write(o.parent / "afile", "x")),
    "vit-grid:dry-run+out-is-a-sweep": lambda fx, o: _vit_grid("--dry-run")(fx, fx["b"] / "sweep"),
    "vit-grid:dry-run+out-of-another-base": lambda fx, o: _vit_grid("--dry-run", "--lr", "0.01")(
        fx, fx["b"] / "grid"),
    "vit-grid:dry-run+out-is-a-perturbation": lambda fx, o: _vit_grid("--dry-run")(
        fx, fx["b"] / "pert"),
    "vit-train:dry-run+out-is-a-file": lambda fx, o: _vit_train("--dry-run")(
        fx, _write(o.parent / "afile", "x")),
    "vit-train:dry-run+out-is-a-vit-grid": lambda fx, o: _vit_train("--dry-run")(
        fx, fx["b"] / "grid"),
    "generalization:dry-run+out-is-a-run": lambda fx, o: _generalization("--quick")(
        fx, fx["b"] / "run0"),
    # demo: its folder by the run protocol, every input checked before anything is measured
    "demo:out-is-a-file": lambda fx, o: _demo(_write(o.parent / "afile", "x")),
    "demo:out-is-a-perturbation": lambda fx, o: _demo(fx["b"] / "pert"),
    "demo:out-is-a-run": lambda fx, o: _demo(fx["b"] / "run0"),
    "demo:out-holds-other-files": lambda fx, o: _demo(_write(_mkdir(o.parent / "notes") / "n.txt",
                                                             "x").parent),
    "demo:cache-dir-is-a-file": lambda fx, o: [*_demo(o), "--cache-dir",
                                               str(_write(o.parent / "afile", "x"))],
    "demo:executor=bogus": lambda fx, o: [*_demo(o), "--executor", "bogus"],
}


def _demo(out: Path) -> list[str]:
    return ["demo", "--quick", "--no-family", "--executor", "local", "-o", str(out)]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _spec_files(fx: dict[str, Any], where: Path) -> dict[str, str]:
    """The spec files the study and grid cases name (written into ``where``)."""
    from blockcoupling.studies.generalization import quick_spec as g_quick
    from blockcoupling.studies.lm_study import quick_spec

    lm = quick_spec().to_dict()
    g = g_quick().to_dict()
    files = {
        "SPEC": lm, "K0": {**lm, "k": 0}, "GSPEC": g, "GSEEDS": {**g, "seeds": [-1, 0, 1]},
        "GBIG": {**g, "train_sizes": [2**64, 10, 20]},
    }
    out = {}
    for name, data in files.items():
        path = where / f"{name}.yaml"
        path.write_text(yaml.safe_dump(json.loads(json.dumps(data, default=list))))
        out[name] = str(path)
    (where / "nested.yaml").write_text("[" * 50_000 + "]" * 50_000)
    out["NESTED"] = str(where / "nested.yaml")
    out["MISSING"] = str(where / "missing.yaml")
    return out


@pytest.fixture(scope="module")
def option_files(fx: dict[str, Any]) -> dict[str, str]:
    b = fx["b"]
    for name, d in (("floor_d0", "0"), ("floor_dneg", "-16"), ("floor_dabc", "abc"),
                    ("floor_dfrac", "1.5")):
        (b / f"{name}.csv").write_text(
            "model,score,d_model\nm1,10,64\nm2,20,128\nm3,30,256\nm4,25," + d + "\n")
    (b / "grid.yaml").write_text(yaml.safe_dump({"drop_path": [0.0], "weight_decay": [0.05],
                                                 "train": {"epochs": 1}}))
    return _spec_files(fx, b)


@pytest.mark.parametrize("cid", cases([(c,) for c in OPTIONS]))
def test_bad_option_is_one_line_and_writes_nothing(cid: str, fx: dict[str, Any],
                                                   option_files: dict[str, str],
                                                   tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [option_files.get(a, a) for a in OPTIONS[cid](fx, out)]
    watched = [fx["b"] / n for n in ("run0", "run1", "run2", "rated", "pert", "sweep", "vits",
                                     "grid")]
    before = {p: snapshot(p) for p in watched}
    r = cli(*argv)
    assert_refused(r, unchanged={out: None, **before})


# ---------------------------------------------------------------------------- inputs in another order
def json_of(*argv: str) -> Any:
    """A command's ``--json`` output, parsed leniently (the dialect has its own cases)."""
    r = cli(*argv, "--json")
    assert_ok(r)
    return json.loads(r.stdout)


def by_text(run: Path) -> pd.DataFrame:
    """A run's coupling rows keyed by prompt text (not by its position in the prompt file)."""
    from blockcoupling.store import open_run

    m = open_run(run)
    texts = m.prompts.set_index("prompt_id")["text"]
    c = m.coupling.assign(text=lambda d: d["prompt_id"].map(texts)).drop(columns="prompt_id")
    key = [k for k in c.columns if k != "value"]
    return c.sort_values(key).reset_index(drop=True)


def _measure_order(fx: dict[str, Any], tmp: Path) -> None:
    args = ["-q", "measure", "-m", str(fx["lm"][0]), "--k", "2,4", "--coupling", "depth"]
    assert_ok(cli(*args, "--prompts", str(fx["b"] / "p_rev.txt"), "-o", str(tmp / "rev")))
    pd.testing.assert_frame_equal(by_text(tmp / "rev"), by_text(fx["b"] / "run0"),
                                  check_exact=True)


def _perturb_order(fx: dict[str, Any], tmp: Path) -> None:
    assert_ok(cli("-q", "perturb", *perturb_args(fx["lm"][0], fx["b"] / "p_rev.txt",
                                                 tmp / "rev")))
    got = pd.read_csv(tmp / "rev" / "summary.csv")
    want = pd.read_csv(fx["b"] / "pert" / "summary.csv")
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def _shuffled_rows(src: Path, dst: Path) -> Path:
    rows = src.read_text().splitlines()
    random.Random(3).shuffle(rows)
    dst.write_text("\n".join(rows) + "\n")
    return dst


def _difficulty_order(fx: dict[str, Any], tmp: Path) -> None:
    run = str(fx["b"] / "rated")
    want = json_of("difficulty", run, "--ratings", f"hf:e2h-arc@{fx['rows']}")
    shuffled = _shuffled_rows(fx["rows"], tmp / "e2h_arc.jsonl")
    got = json_of("difficulty", run, "--ratings", f"hf:e2h-arc@{shuffled}")
    for d in (got, want):
        d.pop("ratings")
    assert got == want


def _by_label(d: Any) -> Any:
    """A correlate result with its per-model rows in label order (their order is the input's)."""
    if isinstance(d, dict):
        return {k: _by_label(v) for k, v in d.items()}
    if isinstance(d, list) and d and all(isinstance(x, dict) and "label" in x for x in d):
        return sorted((_by_label(x) for x in d), key=lambda x: x["label"])
    return d


def _correlate_runs_order(fx: dict[str, Any], tmp: Path) -> None:
    r = [str(fx["b"] / f"run{i}") for i in range(3)]
    scores = str(fx["b"] / "scores.csv")
    want = json_of("correlate", *r, "--scores", scores, "--labels", "a,b,c", "--k", "2")
    got = json_of("correlate", r[2], r[0], r[1], "--scores", scores, "--labels", "c,a,b",
                  "--k", "2")
    assert _by_label(got) == _by_label(want)


def _correlate_scores_order(fx: dict[str, Any], tmp: Path) -> None:
    r = [str(fx["b"] / f"run{i}") for i in range(3)]
    (tmp / "s.csv").write_text("model,score\nc,15\na,10\nb,20\n")
    want = json_of("correlate", *r, "--scores", str(fx["b"] / "scores.csv"), "--labels",
                   "a,b,c", "--k", "2")
    got = json_of("correlate", *r, "--scores", str(tmp / "s.csv"), "--labels", "a,b,c",
                  "--k", "2")
    got.pop("scores")
    want.pop("scores")
    assert got == want


def _correlate_k_order(fx: dict[str, Any], tmp: Path) -> None:
    r = [str(fx["b"] / f"run{i}") for i in range(3)]
    args = ["correlate", *r, "--scores", str(fx["b"] / "scores.csv"), "--labels", "a,b,c"]
    want = json_of(*args, "--k", "2,4")
    got = json_of(*args, "--k", "4,2")
    assert got == want


def _floor_order(fx: dict[str, Any], tmp: Path) -> None:
    (tmp / "a.csv").write_text("model,score,d_model\nm1,10,64\nm2,20,128\nm3,30,256\n"
                               "m4,25,512\nm5,40,1024\n")
    (tmp / "b.csv").write_text("model,score,d_model\nm4,25,512\nm1,10,64\nm5,40,1024\n"
                               "m3,30,256\nm2,20,128\n")
    want = json_of("chance-floor", "--scores", str(tmp / "a.csv"))
    got = json_of("chance-floor", "--scores", str(tmp / "b.csv"))
    for d in (got, want):
        d.pop("scores")
        d["models"] = sorted(d["models"], key=lambda m: m["model"])
    assert got == want


def _cross_order(fx: dict[str, Any], tmp: Path) -> None:
    r = [str(fx["b"] / f"run{i}") for i in range(3)]
    want = json_of("cross", r[0], r[1], r[2])
    got = json_of("cross", r[1], r[0], r[2])
    for d in (got, want):
        for name in ("coupling", "angles"):
            d[name] = sorted(d[name], key=lambda x: json.dumps(x, sort_keys=True))
    assert got == want


def _sweep_order(fx: dict[str, Any], tmp: Path) -> None:
    import blockcoupling as bc

    spec = json.loads(json.dumps(fx["spec"]))
    spec["models"] = spec["models"][::-1]
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert_ok(cli("-q", "sweep", str(tmp / "spec.yaml"), "-o", str(tmp / "s"), "--executor",
                  "local"))
    got, want = bc.open_sweep(tmp / "s").summary(), bc.open_sweep(fx["b"] / "sweep").summary()
    key = [c for c in want.columns if c in ("label", "unit_id", "variant", "k")]
    pd.testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                  want.sort_values(key).reset_index(drop=True), check_exact=True)


def _windows_file(src: Path, dst: Path, *, bom: bool = True) -> Path:
    """``src`` as a Windows editor saves it: CRLF line ends, and a UTF-8 byte-order mark."""
    text = src.read_text().replace("\n", "\r\n")
    dst.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return dst


def _measure_windows(fx: dict[str, Any], tmp: Path) -> None:
    args = ["-q", "measure", "-m", str(fx["lm"][0]), "--k", "2,4", "--coupling", "depth"]
    win = _windows_file(fx["prompts"], tmp / "p.txt")
    r = cli(*args, "--prompts", str(win), "-o", str(tmp / "win"))
    if r.exit_code != 0:
        assert_refused(r, unchanged={tmp / "win": None})
        return
    pd.testing.assert_frame_equal(by_text(tmp / "win"), by_text(fx["b"] / "run0"),
                                  check_exact=True)


def _correlate_windows(fx: dict[str, Any], tmp: Path) -> None:
    r = [str(fx["b"] / f"run{i}") for i in range(3)]
    args = ["--labels", "a,b,c", "--k", "2"]
    want = json_of("correlate", *r, "--scores", str(fx["b"] / "scores.csv"), *args)
    got = json_of("correlate", *r, "--scores", str(_windows_file(fx["b"] / "scores.csv",
                                                                 tmp / "s.csv")), *args)
    for d in (got, want):
        d.pop("scores")
    assert got == want


def _difficulty_windows(fx: dict[str, Any], tmp: Path) -> None:
    run = str(fx["b"] / "rated")
    want = json_of("difficulty", run, "--ratings", f"hf:e2h-arc@{fx['rows']}")
    win = _windows_file(fx["rows"], tmp / "e2h_arc.jsonl", bom=False)
    got = json_of("difficulty", run, "--ratings", f"hf:e2h-arc@{win}")
    for d in (got, want):
        d.pop("ratings")
    assert got == want


def _measure_jsonl_bom(fx: dict[str, Any], tmp: Path) -> None:
    path = tmp / "p.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"text": p}) + "\n"
                                                for p in PROMPTS).encode())
    assert_ok(cli("-q", "measure", "-m", str(fx["lm"][0]), "--k", "2,4", "--coupling", "depth",
                  "--prompts", str(path), "-o", str(tmp / "j")))
    pd.testing.assert_frame_equal(by_text(tmp / "j"), by_text(fx["b"] / "run0"),
                                  check_exact=True)


ORDER: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "measure:jsonl-prompt-file-with-a-bom": _measure_jsonl_bom,
    "measure:prompt-file-saved-on-windows": _measure_windows,
    "correlate:score-file-saved-on-windows": _correlate_windows,
    "difficulty:ratings-file-with-crlf": _difficulty_windows,
    "measure:prompt-file-reversed": _measure_order,
    "perturb:prompt-file-reversed": _perturb_order,
    "difficulty:ratings-file-shuffled": _difficulty_order,
    "correlate:run-dirs-reordered": _correlate_runs_order,
    "correlate:score-rows-reordered": _correlate_scores_order,
    "correlate:k-list-reordered": _correlate_k_order,
    "chance-floor:score-rows-reordered": _floor_order,
    "cross:first-runs-swapped": _cross_order,
    "sweep:models-reordered": _sweep_order,
}


@pytest.mark.parametrize("cid", cases([(c,) for c in ORDER]))
def test_inputs_in_another_order_give_identical_results(cid: str, fx: dict[str, Any],
                                                        tmp_path: Path) -> None:
    ORDER[cid](fx, tmp_path)


# ---------------------------------------------------------------------------- edited and truncated stored files
def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2
    while chr(data[i]) in " \n\t,:{}[]\"":
        i += 1
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def nest(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def edit_json(path: Path, change: Callable[[Any], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _first(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert found, f"no {pattern} under {folder}"
    return found[0]


def ok_or_refused(r: Any, same: Callable[[], None], unchanged: dict[Path, Any] | None = None
                  ) -> None:
    """Either success with the reference's numbers (``same()`` asserts them) or one error
    line and nothing changed."""
    if r.exit_code == 0 and r.exception is None:
        assert_ok(r)
        same()
    else:
        assert_refused(r, unchanged=unchanged)


def _pert_same(out: Path, ref: Path) -> Callable[[], None]:
    def same() -> None:
        pd.testing.assert_frame_equal(pd.read_parquet(out / "perturbation.parquet"),
                                      pd.read_parquet(ref / "perturbation.parquet"),
                                      check_exact=True)
        assert (out / "summary.csv").read_text() == (ref / "summary.csv").read_text()
    return same


def _perturb_damaged(damage: Callable[[Path], None]) -> Callable[[dict[str, Any], Path], None]:
    def case(fx: dict[str, Any], tmp: Path) -> None:
        out = copy(fx["b"] / "pert", tmp / "pert")
        damage(out)
        before = snapshot(out)
        r = cli("-q", "perturb", *perturb_args(fx["lm"][0], fx["prompts"], out))
        ok_or_refused(r, _pert_same(out, fx["b"] / "pert"), {out: before})
    return case


def _other_part(out: Path) -> None:
    shutil.copy(out / "parts" / "00001.parquet", out / "parts" / "00000.parquet")


def _settings_edited_to_other_levels(fx: dict[str, Any], tmp: Path) -> None:
    """The settings edited to other levels, then the command of those levels: the rows must
    be of those levels (a fresh run's), never the stored rows relabelled."""
    out = copy(fx["b"] / "pert", tmp / "pert")
    edit_json(out / "perturbation.json", lambda d: d.update(levels=[0.2, 2.0]))
    before = snapshot(out)
    r = cli("-q", "perturb", *perturb_args(fx["lm"][0], fx["prompts"], out, "--levels",
                                           "0.2,2"))
    fresh = tmp / "fresh"
    assert_ok(cli("-q", "perturb", *perturb_args(fx["lm"][0], fx["prompts"], fresh,
                                                 "--levels", "0.2,2")))
    ok_or_refused(r, _pert_same(out, fresh), {out: before})


def _run_read(cmd: Callable[[dict[str, Any], Path], list[str]], run: str,
              damage: Callable[[Path], None]) -> Callable[[dict[str, Any], Path], None]:
    """Damage a copy of run ``run`` (``damage(copy)``), then the reading command must refuse
    in one line (it cannot know the right numbers)."""
    def case(fx: dict[str, Any], tmp: Path) -> None:
        runs = {n: copy(fx["b"] / n, tmp / n) if n == run else fx["b"] / n
                for n in ("run0", "run1", "run2", "rated")}
        damage(runs[run])
        assert_refused(cli(*cmd({**fx, "runs": runs}, tmp)), unchanged={tmp / "out": None})
    return case


def _correlate_cmd(fx: dict[str, Any], tmp: Path) -> list[str]:
    return ["correlate", *[str(fx["runs"][f"run{i}"]) for i in range(3)], "--scores",
            str(fx["b"] / "scores.csv"), "--labels", "a,b,c", "--k", "2", "--json-out",
            str(tmp / "out" / "c.json")]


def _cross_cmd(fx: dict[str, Any], tmp: Path) -> list[str]:
    return ["cross", str(fx["runs"]["run0"]), str(fx["runs"]["run1"]), "--json-out",
            str(tmp / "out" / "x.json")]


def _show_cmd(fx: dict[str, Any], tmp: Path) -> list[str]:
    return ["show", str(fx["runs"]["run0"])]


def _difficulty_cmd(fx: dict[str, Any], tmp: Path) -> list[str]:
    return ["difficulty", str(fx["runs"]["rated"]), "--json-out", str(tmp / "out" / "d.json")]


def _report_cmd(fx: dict[str, Any], tmp: Path) -> list[str]:
    return ["report", str(fx["runs"]["run0"]), "-o", str(tmp / "out" / "r.html")]


def _bases_file(run: Path) -> Path:
    return _first(run / "bases", "**/*.safetensors") if list((run / "bases").glob(
        "**/*.safetensors")) else _first(run / "bases", "**/*.*")


def _sweep_status_truncated(fx: dict[str, Any], tmp: Path) -> None:
    out = copy(fx["b"] / "sweep", tmp / "sweep")
    status = _first(out / "status", "*.json")
    truncate(status)
    r = cli("sweep-status", str(out))
    if r.exit_code == 0:
        assert_ok(r)
        assert status.stem in r.output and "damaged" in r.output.lower(), r.output
    else:
        assert_refused(r)
    resume = ["-q", "sweep", str(fx["b"] / "spec.yaml"), "-o", str(out), "--executor",
              "local", "--resume"]
    r = cli(*resume)
    if r.exit_code != 0:  # the way out the line names: delete the file, then resume
        line = assert_refused(r)
        assert str(status) in line and "delete" in line.lower(), line
        status.unlink()
        r = cli(*resume)
    assert_ok(r)
    import blockcoupling as bc

    pd.testing.assert_frame_equal(bc.open_sweep(out).summary(),
                                  bc.open_sweep(fx["b"] / "sweep").summary(), check_exact=True)


def _sweep_manifest_spec_edited(fx: dict[str, Any], tmp: Path) -> None:
    """The collection's recorded spec edited to another K by hand, then a resume with a spec
    of that K: the units measured at the old K must not stand for the new one (refused, or
    measured again)."""
    import blockcoupling as bc

    out = copy(fx["b"] / "sweep", tmp / "sweep")
    edit_json(out / "sweep.json", lambda d: d["spec"]["measure"].update(k=[4]))
    before = snapshot(out)
    r = cli("-q", *_sweep(_measure_key(k=[4]), "--resume")(fx, out))
    if r.exit_code == 0 and r.exception is None:
        assert_ok(r)
        ks = set(bc.open_sweep(out).summary()["k"])
        assert ks == {4}, f"a resume at K = 4 reports K = {sorted(ks)}"
    else:
        assert_refused(r, unchanged={out: before})


def _vit_figures_damaged(damage: Callable[[Path], None]) -> Callable[[dict[str, Any], Path], None]:
    def case(fx: dict[str, Any], tmp: Path) -> None:
        root = copy(fx["b"] / "vits", tmp / "vits")
        damage(root / "v0" / "metrics.json")
        assert_refused(cli("vit-figures", str(root), "-o", str(tmp / "figs")),
                       unchanged={tmp / "figs": None})
    return case


def _vit_metrics_number_edited(fx: dict[str, Any], tmp: Path) -> None:
    """A number of the training's record edited: vit-figures must not plot it."""
    root = copy(fx["b"] / "vits", tmp / "vits")
    metrics = root / "v0" / "metrics.json"
    text = metrics.read_text()
    data = json.loads(text)
    acc = data["final"]["test_accuracy"] if "final" in data and "test_accuracy" in data[
        "final"] else None
    assert acc is not None, sorted(data)
    data["final"]["test_accuracy"] = 0.987654321
    metrics.write_text(json.dumps(data))
    r = cli("vit-figures", str(root), "-o", str(tmp / "figs"))
    if r.exit_code == 0:
        assert "0.987654321" not in (tmp / "figs" / "vit_runs.csv").read_text(), \
            "the edited accuracy was plotted"
    else:
        assert_refused(r)


STORED: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "perturb:part-truncated": _perturb_damaged(lambda o: truncate(o / "parts" / "00001.parquet")),
    "perturb:part-flipped": _perturb_damaged(lambda o: flip(o / "parts" / "00001.parquet")),
    "perturb:part-of-another-prompt": _perturb_damaged(_other_part),
    "perturb:part-deleted": _perturb_damaged(lambda o: (o / "parts" / "00002.parquet").unlink()),
    "perturb:settings-truncated": _perturb_damaged(lambda o: truncate(o / "perturbation.json")),
    "perturb:settings-deeply-nested": _perturb_damaged(lambda o: nest(o / "perturbation.json")),
    "perturb:settings-deleted": _perturb_damaged(lambda o: (o / "perturbation.json").unlink()),
    "perturb:table-truncated": _perturb_damaged(lambda o: truncate(o / "perturbation.parquet")),
    "perturb:settings-edited-to-other-levels": _settings_edited_to_other_levels,
    "show:manifest-truncated": _run_read(_show_cmd, "run0",
                                         lambda r: truncate(r / "manifest.json")),
    "show:manifest-deeply-nested": _run_read(_show_cmd, "run0", lambda r: nest(r / "manifest.json")),
    "correlate:coupling-table-of-another-run": _run_read(
        _correlate_cmd, "run0", lambda r: shutil.copy(_sibling(r, "run1"),
                                                      r / "coupling.parquet")),
    "correlate:manifest-truncated": _run_read(_correlate_cmd, "run1",
                                              lambda r: truncate(r / "manifest.json")),
    "cross:bases-truncated": _run_read(_cross_cmd, "run1", lambda r: truncate(_bases_file(r))),
    "cross:bases-flipped": _run_read(_cross_cmd, "run1", lambda r: flip(_bases_file(r))),
    "cross:jacobians-truncated": _run_read(_cross_cmd, "run0", lambda r: truncate(
        r / "arrays.npz")),
    "difficulty:prompts-table-truncated": _run_read(_difficulty_cmd, "rated",
                                                    lambda r: truncate(r / "prompts.parquet")),
    "report:coupling-table-truncated": _run_read(_report_cmd, "run0",
                                                 lambda r: truncate(r / "coupling.parquet")),
    "sweep-status:status-file-truncated": _sweep_status_truncated,
    "sweep:manifest-spec-edited": _sweep_manifest_spec_edited,
    "vit-figures:metrics-truncated": _vit_figures_damaged(truncate),
    "vit-figures:metrics-deeply-nested": _vit_figures_damaged(nest),
    "vit-figures:metrics-number-edited": _vit_metrics_number_edited,
}


def _sibling(run: Path, name: str) -> Path:
    """The original of a sibling run of the module's artefacts (``run`` is a copy)."""
    return Path(os.environ["CAMPAIGN_BASE"]) / name / "coupling.parquet"


@pytest.mark.parametrize("cid", cases([(c,) for c in STORED]))
def test_edited_or_truncated_stored_file(cid: str, fx: dict[str, Any], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMPAIGN_BASE", str(fx["b"]))
    STORED[cid](fx, tmp_path)


# ---------------------------------------------------------------------------- a kill mid-write
def _killed_child(argv: list[str], nth: int) -> subprocess.CompletedProcess[str]:
    """The CLI in a new process that SIGKILLs itself at its ``nth`` ``os.replace`` or
    ``os.rename`` (a file committed: a part, a table, a summary, a page; a folder moved)."""
    import torch

    code = textwrap.dedent(f"""
        import os, signal, sys
        seen = [0]
        def killing(real):
            def move(*a, **k):
                seen[0] += 1
                if seen[0] == {nth}:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*a, **k)
            return move
        os.replace, os.rename = killing(os.replace), killing(os.rename)
        from blockcoupling.cli import main
        sys.argv = ["blockcoupling", *{argv!r}]
        main()
    """)
    env = child_env(OMP_NUM_THREADS=str(torch.get_num_threads()), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.xfail("test_perturb_killed_mid_write_resumes_bit_identically" in BAD, strict=True,
                   reason=BAD.get("test_perturb_killed_mid_write_resumes_bit_identically", ""))
def test_perturb_killed_mid_write_resumes_bit_identically(fx: dict[str, Any],
                                                           tmp_path: Path) -> None:
    """SIGKILL at a seeded file commit of ``perturb``, then the same command: the table and
    the summary equal the uninterrupted run's, bit for bit."""
    total = fx["replaces"]
    nth = random.Random(f"{SEED}/campaign/perturb").randint(1, total)
    info = f"kill at os.replace #{nth} of {total} (BLOCKCOUPLING_FAULT_SEED={SEED})"
    out = tmp_path / "pert"
    argv = ["-q", "perturb", *perturb_args(fx["lm"][0], fx["prompts"], out)]
    res = _killed_child(argv, nth)
    assert res.returncode == -signal.SIGKILL, f"{info}\n{res.stderr[-2000:]}"
    r = cli(*argv)
    assert_ok(r)
    _pert_same(out, fx["b"] / "pert")()
    assert not [p for p in out.rglob("*") if p.name.startswith(".tmp")], info


@pytest.mark.slow
def test_vit_train_killed_mid_write_resumes_bit_identically(fx: dict[str, Any],
                                                             tmp_path: Path) -> None:
    """SIGKILL at the second file commit of ``vit-train``, then the same command: the same
    final record (accuracy and coupling) as the uninterrupted training."""
    out = tmp_path / "v"
    argv = ["-q", "vit-train", "-o", str(out), *vit_args()]
    res = _killed_child(argv, 2)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert_ok(cli(*argv))
    got = json.loads((out / "metrics.json").read_text())
    want = json.loads((fx["b"] / "vits" / "v0" / "metrics.json").read_text())
    assert without_costs(got.get("final")) == without_costs(want.get("final"))


# ---------------------------------------------------------------------------- a second writer
def _unfinished_perturbation(fx: dict[str, Any], tmp: Path) -> Path:
    out = copy(fx["b"] / "pert", tmp / "pert")
    for name in ("perturbation.parquet", "summary.csv", "perturbation.html"):
        (out / name).unlink(missing_ok=True)
    (out / "parts" / "00003.parquet").unlink()
    return out


SECOND: dict[str, Callable[[dict[str, Any], Path], tuple[Path, list[str]]]] = {
    "perturb:unfinished-folder-in-use": lambda fx, t: (
        o := _unfinished_perturbation(fx, t),
        ["perturb", *perturb_args(fx["lm"][0], fx["prompts"], o)]),
    "measure:new-folder-in-use": lambda fx, t: (
        t / "run", _measure()(fx, t / "run")),
    "sweep:resume-in-use": lambda fx, t: (
        o := copy(fx["b"] / "sweep", t / "sweep"),
        ["sweep", str(fx["b"] / "spec.yaml"), "-o", str(o), "--executor", "local", "--resume"]),
    "vit-train:new-folder-in-use": lambda fx, t: (t / "v", _vit_train()(fx, t / "v")),
    "vit-grid:new-folder-in-use": lambda fx, t: (t / "g", _vit_grid()(fx, t / "g")),
    "collection-upgrade:sweep-in-use": lambda fx, t: (
        o := copy(fx["b"] / "sweep", t / "sweep"), ["collection", "upgrade", str(o)]),
}


@pytest.mark.parametrize("cid", cases([(c,) for c in SECOND]))
def test_second_writer_on_a_folder_in_use(cid: str, fx: dict[str, Any], tmp_path: Path,
                                          hold_lock: Callable[[Path], None]) -> None:
    """Another process writes the folder (holds its lock): the second command is one line
    and changes nothing (collection upgrade: nothing to change, or one line)."""
    out, argv = _second(SECOND[cid](fx, tmp_path))
    hold_lock(out)
    before = snapshot(out)
    r = cli(*argv)
    if cid.startswith("collection-upgrade") and r.exit_code == 0:
        assert snapshot(out) == before, "upgraded a collection another process writes"
        return
    assert_refused(r, unchanged={out: before})


def _second(pair: tuple[Any, ...]) -> tuple[Path, list[str]]:
    return pair[-2], pair[-1]


# ---------------------------------------------------------------------------- a changed spec in a used folder
def _perturb_other(*extra: str, model: int = 0) -> Callable[[dict[str, Any], Path], tuple[Path, list[str]]]:
    def case(fx: dict[str, Any], tmp: Path) -> tuple[Path, list[str]]:
        out = copy(fx["b"] / "pert", tmp / "pert")
        return out, ["perturb", *perturb_args(fx["lm"][model], fx["prompts"], out, *extra)]
    return case


def _measure_other(*extra: str) -> Callable[[dict[str, Any], Path], tuple[Path, list[str]]]:
    def case(fx: dict[str, Any], tmp: Path) -> tuple[Path, list[str]]:
        out = copy(fx["b"] / "run2", tmp / "run")
        return out, ["measure", "-m", str(fx["lm"][2]), "--prompts", str(fx["prompts"]),
                     "--coupling", "depth", "--save-bases", "-o", str(out), *extra]
    return case


def _sweep_other(change: Callable[[dict[str, Any]], None], *extra: str
                 ) -> Callable[[dict[str, Any], Path], tuple[Path, list[str]]]:
    def case(fx: dict[str, Any], tmp: Path) -> tuple[Path, list[str]]:
        out = copy(fx["b"] / "sweep", tmp / "sweep")
        return out, _sweep(change, *extra)(fx, out)
    return case


def _vit_other(*extra: str) -> Callable[[dict[str, Any], Path], tuple[Path, list[str]]]:
    def case(fx: dict[str, Any], tmp: Path) -> tuple[Path, list[str]]:
        out = copy(fx["b"] / "vits" / "v0", tmp / "v")
        return out, ["vit-train", "-o", str(out), *vit_args(), *extra]
    return case


def _grid_other(*extra: str) -> Callable[[dict[str, Any], Path], tuple[Path, list[str]]]:
    def case(fx: dict[str, Any], tmp: Path) -> tuple[Path, list[str]]:
        out = copy(fx["b"] / "grid", tmp / "grid")
        return out, [*_vit_grid()(fx, out), *extra]
    return case


CHANGED: dict[str, Callable[[dict[str, Any], Path], tuple[Path, list[str]]]] = {
    "vit-grid:other-training-options": _grid_other("--epochs", "2"),
    "vit-grid:other-lr": _grid_other("--lr", "0.001"),
    "perturb:other-levels": _perturb_other("--levels", "0.2,1"),
    "perturb:other-model": _perturb_other(model=1),
    "perturb:other-token": _perturb_other("--token", "0"),
    "measure:other-k-without-resume": _measure_other("--k", "2"),
    "measure:other-k-with-resume": _measure_other("--k", "2", "--resume"),
    "measure:other-model-with-resume": lambda fx, t: (
        (o := copy(fx["b"] / "run2", t / "run")),
        ["measure", "-m", str(fx["lm"][1]), "--prompts", str(fx["prompts"]), "--k", "2,4",
         "--coupling", "depth", "--save-bases", "-o", str(o), "--resume"]),
    "sweep:other-measure-with-resume": _sweep_other(_measure_key(k=[4]), "--resume"),
    "sweep:other-models-with-resume": _sweep_other(lambda s: s["models"].pop(), "--resume"),
    "sweep:other-spec-without-resume": _sweep_other(_measure_key(k=[4])),
    "vit-train:other-epochs": _vit_other("--epochs", "2"),
    "vit-train:other-seed": _vit_other("--seed", "1"),
}


@pytest.mark.parametrize("cid", cases([(c,) for c in CHANGED]))
def test_changed_spec_in_a_used_folder_is_refused(cid: str, fx: dict[str, Any],
                                                  tmp_path: Path) -> None:
    out, argv = _second(CHANGED[cid](fx, tmp_path))
    before = snapshot(out)
    assert_refused(cli(*argv), unchanged={out: before})


# ---------------------------------------------------------------------------- outputs: new folders, one JSON dialect
def _json_out(cmd: str) -> Callable[[dict[str, Any], Path], list[str]]:
    def argv(fx: dict[str, Any], tmp: Path) -> list[str]:
        b = fx["b"]
        base = {"correlate": ["correlate", str(b / "run0"), str(b / "run1"), str(b / "run2"),
                              "--scores", str(b / "scores.csv"), "--labels", "a,b,c"],
                "correlate-k-list": ["correlate", str(b / "run0"), str(b / "run1"),
                                     str(b / "run2"), "--scores", str(b / "scores.csv"),
                                     "--labels", "a,b,c", "--k", "2,4"],
                "chance-floor": ["chance-floor", "--scores", "paper"],
                "cross": ["cross", str(b / "run0"), str(b / "run1")],
                "difficulty": ["difficulty", str(b / "rated")]}[cmd]
        return [*base, "--json-out", str(tmp / "new" / "deeper" / "out.json"), "-o",
                str(tmp / "new2" / "deeper" / "page.html")]
    return argv


JSON_OUT = {f"{c}:json-out-and-page-into-new-folders": _json_out(c)
            for c in ("correlate", "correlate-k-list", "chance-floor", "cross", "difficulty")}


@pytest.mark.parametrize("cid", cases([(c,) for c in JSON_OUT]))
def test_outputs_into_a_new_folder(cid: str, fx: dict[str, Any], tmp_path: Path) -> None:
    r = cli(*JSON_OUT[cid](fx, tmp_path))
    assert_ok(r)
    strict_json((tmp_path / "new" / "deeper" / "out.json").read_text())
    assert (tmp_path / "new2" / "deeper" / "page.html").stat().st_size > 0
    assert not [p for p in tmp_path.rglob(".tmp*")]


JSON_STDOUT: dict[str, Callable[[dict[str, Any], Path], list[str]]] = {
    **{c.replace(":json-out-and-page-into-new-folders", ":json"):
       (lambda f: lambda fx, t: f(fx, t)[:-4])(fn) for c, fn in JSON_OUT.items()},
    "chance-floor:json-with-unscored-rows": lambda fx, t: [
        "chance-floor", "--scores", str(_write(t / "s.csv", "model,score,d_model\nm1,10,64\n"
                                               "m2,,128\nm3,30,256\nm4,20,512\nm5,40,1024\n"
                                               "m6,35,2048\n"))],
    "cross:json-three-runs": lambda fx, t: ["cross", *[str(fx["b"] / f"run{i}") for i in (0, 1, 2)]],
    "perturb:json": lambda fx, t: ["perturb", *perturb_args(fx["lm"][0], fx["prompts"],
                                                           copy(fx["b"] / "pert", t / "p"))],
    "show:json": lambda fx, t: ["show", str(fx["b"] / "run0")],
    "sweep-status:json": lambda fx, t: ["sweep-status", str(fx["b"] / "sweep")],
    "measure:dry-run-json": lambda fx, t: _measure("--dry-run")(fx, t / "m"),
    "vit-train:dry-run-json": lambda fx, t: _vit_train("--dry-run")(fx, t / "v"),
    "lm-family:dry-run-json": lambda fx, t: _lm_family("--quick")(fx, t / "s"),
    "generalization:dry-run-json": lambda fx, t: _generalization("--quick")(fx, t / "g"),
    "models:json": lambda fx, t: ["models"],
    "sweep-status:json-with-a-damaged-unit": lambda fx, t: [
        "sweep-status", str(_damaged_unit(copy(fx["b"] / "sweep", t / "s")))],
    "show:json-of-an-unfinished-run": lambda fx, t: ["show", str(_unfinished_run(fx, t))],
}


def _damaged_unit(sweep: Path) -> Path:
    flip(_first(sweep / "units", "*/coupling.parquet"))
    return sweep


def _unfinished_run(fx: dict[str, Any], tmp: Path) -> Path:
    """A run killed before its parts were consolidated (its prompts in parts/)."""
    from tests.helpers.tiny_runs import install_probes

    def stop(point: str) -> None:
        if point == "consolidate":
            raise Stop

    uninstall = install_probes(stop)
    try:
        cli("-q", *_measure()(fx, tmp / "unfinished"))
    finally:
        uninstall()
    assert sorted((tmp / "unfinished" / "parts").glob("part-*"))
    return tmp / "unfinished"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("cid", cases([(c,) for c in JSON_STDOUT]))
def test_json_is_one_dialect(cid: str, fx: dict[str, Any], tmp_path: Path) -> None:
    """``--json`` output parses as strict JSON, a missing number null (never "nan")."""
    r = cli(*JSON_STDOUT[cid](fx, tmp_path), "--json")
    assert_ok(r)
    strict_json(r.stdout)


@pytest.mark.parametrize("root", ["vits", "grid"])
def test_vit_figures_fits_json_is_one_dialect(root: str, fx: dict[str, Any],
                                              tmp_path: Path) -> None:
    assert_ok(cli("vit-figures", str(fx["b"] / root), "-o", str(tmp_path / "f")))
    strict_json((tmp_path / "f" / "fits.json").read_text())


# ---------------------------------------------------------------------------- score files
def _lmeval(tmp: Path, bad: Any) -> Path:
    """An lm-evaluation-harness folder scoring models a, b, c; b's arc_challenge is ``bad``
    (``...`` for a whole file replaced by a deeply nested list)."""
    root = tmp / "lmeval"
    for name, acc in (("a", 0.4), ("b", bad), ("c", 0.5)):
        d = root / name
        d.mkdir(parents=True)
        res = {"results": {"arc_challenge": {"acc_norm,none": acc}},
               "configs": {"arc_challenge": {"num_fewshot": 25}},
               "config": {"model_args": f"pretrained={name}"}, "model_name": name}
        text = json.dumps(res) if bad is not ... or name != "b" else "[" * 100_000 + "]" * 100_000
        if isinstance(bad, str) and bad.startswith("RAW:") and name == "b":
            text = json.dumps(res).replace(json.dumps(bad), bad[4:])
        (d / "results_2024-01-01T00-00-00.json").write_text(text)
    return root


SCORES: dict[str, Any] = {
    "lmeval:deeply-nested-file": ...,
    "lmeval:score-a-string": "high",
    "lmeval:score-a-bool": True,
    "lmeval:score-a-list": [0.5],
    "lmeval:score-NaN": "RAW:NaN",
    "lmeval:score-Infinity": "RAW:Infinity",
    "lmeval:score-above-one": 7.5,
    "lmeval:score-null": None,
    "lmeval:results-a-list": "RESULTS-LIST",
}


@pytest.mark.parametrize("cid", cases([(c,) for c in SCORES]))
def test_malformed_score_files(cid: str, fx: dict[str, Any], tmp_path: Path) -> None:
    """A malformed score of model b: one line naming the file, or b excluded with its
    reason; never a score read from it."""
    bad = SCORES[cid]
    root = _lmeval(tmp_path, bad if bad != "RESULTS-LIST" else 0.3)
    if bad == "RESULTS-LIST":
        f = _first(root / "b", "*.json")
        edit_json(f, lambda d: d.update(results=[d["results"]]))
    r = cli("correlate", *[str(fx["b"] / f"run{i}") for i in range(3)], "--scores", str(root),
            "--labels", "a,b,c", "--k", "2", "--json")
    if r.exit_code == 0 and r.exception is None:
        assert_ok(r)
        data = strict_json(r.stdout)
        assert "b" not in [m["label"] for m in data["models"]], "b scored from a bad value"
        assert "b" in json.dumps(data["excluded"])
    else:
        assert_refused(r)


# ---------------------------------------------------------------------------- disk refusals
def test_disk_refusal_states_its_margin(fx: dict[str, Any], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Free space above what the bases need but below it plus the margin: the refusal says
    the margin, the free bytes and how much to free; nothing is written."""
    from blockcoupling.store.bases import DISK_MARGIN

    real = shutil.disk_usage
    free = DISK_MARGIN - 1

    def small(path: Any) -> Any:
        u = real(path)
        return type(u)(u.total, u.total - free, free)

    monkeypatch.setattr(shutil, "disk_usage", small)
    out = tmp_path / "run"
    line = assert_refused(cli(*_measure("--save-bases")(fx, out)), unchanged={out: None})
    assert "margin" in line and f"{free:,}" in line, line


# ---------------------------------------------------------------------------- a state some command gets out of
def _write_empty(fx: dict[str, Any]) -> Path:
    return _write(fx["b"] / "empty.txt", "\n")


RECOVER: dict[str, tuple[Argv, Argv]] = {
    "perturb:token-outside-the-prompt": (_perturb("--token", "99"), _perturb()),
    "perturb:empty-prompt-file": (
        lambda fx, o: ["perturb", *perturb_args(fx["lm"][0], _write_empty(fx), o)], _perturb()),
    "measure:k-above-d": (_measure("--k", "99"), _measure()),
    "measure:tokens-outside-the-prompts": (_measure("--tokens", "40"), _measure()),
    "sweep:device-this-build-lacks": (_sweep(_model(device="hip")), _sweep(_nothing)),
    "sweep:seed-above-2^64": (_sweep(_top(seed=2**64)), _sweep(_nothing)),
    "vit-grid:seed-above-2^64": (_vit_grid("--seeds", BIG), _vit_grid()),
    "vit-train:k-above-width": (_vit_train("--k", "99"), _vit_train()),
}


@pytest.mark.parametrize("cid", cases([(c,) for c in RECOVER]))
def test_refused_command_then_the_corrected_one_succeeds(cid: str, fx: dict[str, Any],
                                                         tmp_path: Path) -> None:
    """A refusal leaves no folder that refuses the corrected command (or its ``--resume``,
    where the refusal says to resume)."""
    bad, good = RECOVER[cid]
    out = tmp_path / "out"
    r = cli("-q", *bad(fx, out))
    assert r.exit_code != 0 and "Traceback" not in r.output, tail(r.output)
    r = cli("-q", *good(fx, out))
    if r.exit_code == 1 and "--resume" in r.output:  # the way out the line names
        r = cli("-q", *good(fx, out), "--resume")
    assert_ok(r)


# ---------------------------------------------------------------------------- a folder of another command
OTHER_FOLDER: dict[str, Callable[[dict[str, Any], Path], list[str]]] = {
    "show:a-perturbation-folder": lambda fx, t: ["show", str(fx["b"] / "pert")],
    "show:a-sweep-folder": lambda fx, t: ["show", str(fx["b"] / "sweep")],
    "show:a-vit-training-folder": lambda fx, t: ["show", str(fx["b"] / "vits" / "v0")],
    "sweep-status:a-perturbation-folder": lambda fx, t: ["sweep-status", str(fx["b"] / "pert")],
    "cross:perturbation-folders": lambda fx, t: ["cross", str(fx["b"] / "pert"),
                                                 str(fx["b"] / "pert")],
    "correlate:a-perturbation-folder": lambda fx, t: [
        "correlate", str(fx["b"] / "pert"), str(fx["b"] / "run1"), str(fx["b"] / "run2"),
        "--scores", str(fx["b"] / "scores.csv"), "--labels", "a,b,c"],
    "difficulty:a-perturbation-folder": lambda fx, t: ["difficulty", str(fx["b"] / "pert")],
    "report:a-perturbation-folder": lambda fx, t: ["report", str(fx["b"] / "pert"), "-o",
                                                   str(t / "out" / "r.html")],
    "vit-figures:a-perturbation-folder": lambda fx, t: ["vit-figures", str(fx["b"] / "pert"),
                                                        "-o", str(t / "out")],
    "collection-upgrade:a-perturbation-folder": lambda fx, t: [
        "collection", "upgrade", str(copy(fx["b"] / "pert", t / "pert"))],
}


@pytest.mark.parametrize("cid", cases([(c,) for c in OTHER_FOLDER]))
def test_a_folder_another_command_wrote_is_named_as_such(cid: str, fx: dict[str, Any],
                                                         tmp_path: Path) -> None:
    """A folder of another kind: one line, and never the advice for a damaged folder of the
    command's own kind (restore it from a backup, measure again): nothing is lost."""
    argv = OTHER_FOLDER[cid](fx, tmp_path)
    folder = Path(argv[1] if argv[0] != "collection" else argv[2])
    before = snapshot(folder)
    line = assert_refused(cli(*argv), unchanged={folder: before, tmp_path / "out": None})
    assert "backup" not in line.lower() and "lost" not in line.lower(), line


# ---------------------------------------------------------------------------- collection upgrade
@pytest.mark.parametrize("cid", cases([("collection-upgrade:current-sweep",),
                                       ("collection-upgrade:current-grid",)]))
def test_upgrading_a_current_collection_changes_nothing(cid: str, fx: dict[str, Any],
                                                        tmp_path: Path) -> None:
    """Safe to run again: a collection of the current format is left as it is (exit 0, or
    one line that says so), twice."""
    out = copy(fx["b"] / cid.rpartition("-")[2], tmp_path / "c")
    before = snapshot(out)
    for _ in range(2):
        r = cli("collection", "upgrade", str(out))
        if r.exit_code == 0:
            assert_ok(r)
        else:
            assert_refused(r)
        assert snapshot(out) == before, tail(r.output)


# ---------------------------------------------------------------------------- a full disk mid-run
def _enospc_at(nth: int) -> Callable[[], int]:
    """os.fsync of a file (not of a folder: those may be best effort) raising ENOSPC at its
    ``nth`` call from now on; returns how many such calls came."""
    import errno
    import stat

    real = os.fsync
    seen = [0]

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            seen[0] += 1
            if seen[0] == nth:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    os.fsync = fsync  # type: ignore[assignment]

    def undo() -> int:
        os.fsync = real  # type: ignore[assignment]
        return seen[0]
    return undo


def _full_perturb(fx: dict[str, Any], tmp: Path) -> tuple[list[str], Callable[[], None]]:
    out = tmp / "pert"
    return (["-q", "perturb", *perturb_args(fx["lm"][0], fx["prompts"], out)],
            _pert_same(out, fx["b"] / "pert"))


def _full_sweep(fx: dict[str, Any], tmp: Path) -> tuple[list[str], Callable[[], None]]:
    import blockcoupling as bc

    out = tmp / "sweep"

    def same() -> None:
        pd.testing.assert_frame_equal(bc.open_sweep(out).summary(),
                                      bc.open_sweep(fx["b"] / "sweep").summary(),
                                      check_exact=True)
    return ["-q", "sweep", str(fx["b"] / "spec.yaml"), "-o", str(out), "--executor",
            "local"], same


def _full_vit(fx: dict[str, Any], tmp: Path) -> tuple[list[str], Callable[[], None]]:
    out = tmp / "v"

    def same() -> None:
        got = json.loads((out / "metrics.json").read_text())
        want = json.loads((fx["b"] / "vits" / "v0" / "metrics.json").read_text())
        assert without_costs(got.get("final")) == without_costs(want.get("final"))
    return ["-q", "vit-train", "-o", str(out), *vit_args()], same


DISK_FULL: dict[str, Callable[[dict[str, Any], Path], tuple[list[str], Callable[[], None]]]] = {
    "perturb:disk-full-mid-run": _full_perturb,
    "sweep:disk-full-mid-run": _full_sweep,
    "vit-train:disk-full-mid-run": _full_vit,
}


@pytest.mark.parametrize("cid", cases([(c,) for c in DISK_FULL]))
def test_disk_full_mid_run_is_one_line_and_the_same_command_finishes(
        cid: str, fx: dict[str, Any], tmp_path: Path) -> None:
    """ENOSPC at the third file synced: one line that says what to do (no temporary file
    named), then the same command (with --resume where the line says so) gives the
    uninterrupted run's numbers."""
    argv, same = DISK_FULL[cid](fx, tmp_path)
    undo = _enospc_at(3)
    try:
        r = cli(*argv)
    finally:
        calls = undo()
    assert calls >= 3, f"only {calls} fsync calls: no fault injected"
    line = assert_refused(r)
    assert "space" in line.lower(), line
    r = cli(*argv)
    if r.exit_code == 1 and "--resume" in r.output:
        r = cli(*argv, "--resume")
    assert_ok(r)
    same()


# ---------------------------------------------------------------------------- the studies' folders (slow: a quick study each)
def _study_record(out: Path) -> dict[str, Any]:
    return without_costs(json.loads((out / "study.json").read_text()))


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``study generalization --quick`` and ``study lm-family --quick``, each run once (the
    tiny-LM cache of the latter in its own folder)."""
    base = tmp_path_factory.mktemp("studies")
    assert_ok(cli("-q", "study", "generalization", "--quick", "-o", str(base / "gen")))
    os.environ["BLOCKCOUPLING_CACHE"] = str(base / "cache")
    try:
        assert_ok(cli("-q", "study", "lm-family", "--quick", "-o", str(base / "lm")))
    finally:
        os.environ.pop("BLOCKCOUPLING_CACHE")
    return {"generalization": base / "gen", "lm-family": base / "lm", "cache": base / "cache"}


def _study_argv(kind: str, out: Path, *extra: str) -> list[str]:
    return ["-q", "study", kind, "--quick", "-o", str(out), *extra]


def _other_design(kind: str, tmp: Path) -> list[str]:
    """The quick design with one value changed, as a spec file."""
    if kind == "generalization":
        from blockcoupling.studies.generalization import quick_spec as g_quick

        data = json.loads(json.dumps(g_quick().to_dict(), default=list))
        data["alpha"] = 0.1
        flag = "--spec"
    else:
        from blockcoupling.studies.lm_study import quick_spec

        data = json.loads(json.dumps(quick_spec().to_dict(), default=list))
        data["alpha"] = 0.1
        flag = "--runs"
    path = tmp / "other.yaml"
    path.write_text(yaml.safe_dump(data))
    return [flag, str(path)]


STUDY = [f"{kind}:{what}" for kind in ("generalization", "lm-family")
         for what in ("other-design-in-used-folder", "folder-in-use", "study-json-truncated",
                      "study-json-number-edited")]


@pytest.mark.slow
@pytest.mark.parametrize("cid", cases([(c,) for c in STUDY]))
def test_a_used_study_folder(cid: str, studies: dict[str, Path], tmp_path: Path,
                             hold_lock: Callable[[Path], None],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Another design into a used study folder or a second writer: one line, nothing changed.
    The study's record truncated or a number edited, then the same command: the record of
    the uninterrupted study (rebuilt from the runs), or one line."""
    kind, _, what = cid.partition(":")
    monkeypatch.setenv("BLOCKCOUPLING_CACHE", str(studies["cache"]))
    out = copy(studies[kind], tmp_path / "study")
    want = json.loads(json.dumps(_study_record(studies[kind])).replace(str(studies[kind]),
                                                                       str(out)))
    if what == "other-design-in-used-folder":
        argv = ["-q", "study", kind, "-o", str(out), *_other_design(kind, tmp_path)]
        before = snapshot(out)
        assert_refused(cli(*argv), unchanged={out: before})
        return
    if what == "folder-in-use":  # the study folder and its collection, as a writer holds them
        for folder in (out, *[p.parent for p in out.glob("*/sweep.json")]):
            hold_lock(folder)
        before = snapshot(out)
        r = cli(*_study_argv(kind, out))
        if r.exit_code == 0 and r.exception is None:  # nothing to do: the same record
            assert_ok(r)
            assert _study_record(out) == want
        else:
            assert_refused(r, unchanged={out: before})
        return
    if what == "study-json-truncated":
        truncate(out / "study.json")
    else:
        text = (out / "study.json").read_text()
        doc = json.loads(text)
        doc["tests"] = {**doc.get("tests", {}), "edited": 0.123456789}
        (out / "study.json").write_text(json.dumps(doc))
    before = snapshot(out)
    r = cli(*_study_argv(kind, out))
    if r.exit_code == 0 and r.exception is None:
        assert_ok(r)
        assert _study_record(out) == want
    else:
        assert_refused(r, unchanged={out: before})


# ---------------------------------------------------------------------------- one thing given twice
def _prompts_twice(fx: dict[str, Any], tmp: Path) -> Path:
    return write_prompts(tmp / "twice.txt", [PROMPTS[0], PROMPTS[2], PROMPTS[0]])


def _measure_twice(fx: dict[str, Any], tmp: Path) -> None:
    from blockcoupling.store import open_run

    r = cli("-q", *_measure()(fx, tmp / "run")[:-2], "--prompts", str(_prompts_twice(fx, tmp)),
            "-o", str(tmp / "run"))
    if r.exit_code == 0:
        assert_ok(r)
        texts = open_run(tmp / "run").prompts["text"]
        assert not texts.duplicated().any(), "a prompt listed twice counted as two prompts"
    else:
        assert_refused(r, unchanged={tmp / "run": None})


def _perturb_twice(fx: dict[str, Any], tmp: Path) -> None:
    out = tmp / "pert"
    r = cli("-q", "perturb", *perturb_args(fx["lm"][0], _prompts_twice(fx, tmp), out))
    if r.exit_code == 0:
        assert_ok(r)
        n = pd.read_parquet(out / "perturbation.parquet")["prompt_id"].nunique()
        assert n == 2, f"a prompt listed twice counted as two: {n} prompts"
    else:
        assert_refused(r, unchanged={out: None})


def _levels_twice(fx: dict[str, Any], tmp: Path) -> None:
    once, twice = tmp / "once", tmp / "twice"
    assert_ok(cli("-q", "perturb", *perturb_args(fx["lm"][0], fx["prompts"], once,
                                                 "--levels", "0.1")))
    r = cli("-q", "perturb", *perturb_args(fx["lm"][0], fx["prompts"], twice,
                                           "--levels", "0.1,0.1"))
    if r.exit_code == 0:
        assert_ok(r)
        assert (twice / "summary.csv").read_text() == (once / "summary.csv").read_text()
    else:
        assert_refused(r, unchanged={twice: None})


def _vit_run_copied(fx: dict[str, Any], tmp: Path) -> None:
    root = copy(fx["b"] / "vits", tmp / "vits")
    copy(root / "v0", root / "v0-copy")
    r = cli("vit-figures", str(root), "-o", str(tmp / "figs"))
    if r.exit_code == 0:
        assert_ok(r)
        n = len(pd.read_csv(tmp / "figs" / "vit_runs.csv"))
        assert n == 1, f"one training counted as {n} runs"
    else:
        assert_refused(r, unchanged={tmp / "figs": None})


def _correlate_refuses(argv: Callable[[dict[str, Any], Path], list[str]]
                       ) -> Callable[[dict[str, Any], Path], None]:
    def case(fx: dict[str, Any], tmp: Path) -> None:
        assert_refused(cli(*argv(fx, tmp)), unchanged={tmp / "out": None})
    return case


def _scores_args(fx: dict[str, Any]) -> list[str]:
    return ["--scores", str(fx["b"] / "scores.csv"), "--labels", "a,b,c", "--k", "2"]


def _copied_run(fx: dict[str, Any], tmp: Path) -> list[str]:
    c = copy(fx["b"] / "run0", tmp / "run0-copy")
    return ["correlate", str(fx["b"] / "run0"), str(c), str(fx["b"] / "run1"),
            *_scores_args(fx)]


def _token0_run(fx: dict[str, Any], tmp: Path) -> list[str]:
    assert_ok(cli("-q", *_measure("--tokens", "0")(fx, tmp / "tok0")))
    return ["correlate", str(tmp / "tok0"), str(fx["b"] / "run1"), str(fx["b"] / "run2"),
            *_scores_args(fx)]


def _one_model_twice_in_a_sweep(fx: dict[str, Any], tmp: Path) -> list[str]:
    spec = json.loads(json.dumps(fx["spec"]))
    spec["models"][1]["model"] = spec["models"][0]["model"]
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert_ok(cli("-q", "sweep", str(tmp / "spec.yaml"), "-o", str(tmp / "s"), "--executor",
                  "local"))
    (tmp / "s.csv").write_text("model,score\na,10\nb,20\n")
    return ["correlate", str(tmp / "s"), "--scores", str(tmp / "s.csv"), "--k", "2"]


def _ratings_text_edited(fx: dict[str, Any], tmp: Path) -> None:
    rows = fx["rows"].read_text().splitlines()
    first = json.loads(rows[0])
    first["question"] = "what is the capital of france"
    (tmp / "e2h.jsonl").write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")
    assert_refused(cli("difficulty", str(fx["b"] / "rated"), "--ratings",
                       f"hf:e2h-arc@{tmp / 'e2h.jsonl'}", "--json-out", str(tmp / "out" / "d.json")),
                   unchanged={tmp / "out": None})


TWICE: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "measure:a-prompt-listed-twice": _measure_twice,
    "perturb:a-prompt-listed-twice": _perturb_twice,
    "perturb:a-level-listed-twice": _levels_twice,
    "vit-figures:a-training-copied": _vit_run_copied,
    "correlate:the-same-run-twice": _correlate_refuses(lambda fx, t: [
        "correlate", str(fx["b"] / "run0"), str(fx["b"] / "run0"), str(fx["b"] / "run1"),
        *_scores_args(fx)]),
    "correlate:a-copied-run-under-another-label": _correlate_refuses(_copied_run),
    "correlate:a-run-measured-at-token-0": _correlate_refuses(_token0_run),
    "correlate:a-sweep-with-one-model-twice": _correlate_refuses(_one_model_twice_in_a_sweep),
    "difficulty:a-rated-prompt-edited": _ratings_text_edited,
    "report:the-same-run-twice": _correlate_refuses(lambda fx, t: [
        "report", str(fx["b"] / "run0"), str(fx["b"] / "run0"), "-o", str(t / "out" / "r.html")]),
    "report:a-copied-run": _correlate_refuses(lambda fx, t: [
        "report", str(fx["b"] / "run0"), str(copy(fx["b"] / "run0", t / "run0-copy")), "-o",
        str(t / "out" / "r.html")]),
}


@pytest.mark.parametrize("cid", cases([(c,) for c in TWICE]))
def test_one_thing_given_twice_or_changed_is_never_counted_twice(cid: str, fx: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    """Joins by content: a prompt, a level, a training or a model given twice is counted
    once or refused; a rated prompt whose text changed is not joined to the measured one."""
    TWICE[cid](fx, tmp_path)


def _k_twice(fx: dict[str, Any], tmp: Path) -> None:
    r = [str(fx["b"] / f"run{i}") for i in range(3)]
    res = cli("correlate", *r, "--scores", str(fx["b"] / "scores.csv"), "--labels", "a,b,c",
              "--k", "2,2,4", "--json")
    if res.exit_code == 0:
        assert_ok(res)
        data = json.loads(res.stdout)
        assert data.get("ks") == [2, 4], data.get("ks")
    else:
        assert_refused(res)


def _floor_model_twice(fx: dict[str, Any], tmp: Path) -> None:
    path = _write(tmp / "s.csv", "model,score,d_model\nm1,10,64\nm2,20,128\nm3,30,256\n"
                                 "m1,12,64\nm4,25,512\n")
    assert_refused(cli("chance-floor", "--scores", str(path)))


def _rated_twice(fx: dict[str, Any], tmp: Path) -> None:
    rows = fx["rows"].read_text().splitlines()
    again = json.loads(rows[0])
    again["rating"] = 0.99
    path = _write(tmp / "e2h.jsonl", "\n".join([*rows, json.dumps(again)]) + "\n")
    assert_refused(cli("difficulty", str(fx["b"] / "rated"), "--ratings", f"hf:e2h-arc@{path}"))


def _cross_run_twice(fx: dict[str, Any], tmp: Path) -> None:
    r = [str(fx["b"] / f"run{i}") for i in range(3)]
    res = cli("cross", r[0], r[0], r[2], "--json")
    if res.exit_code == 0:
        assert_ok(res)
        pairs = {(c["run_a"], c["run_b"]) for c in json.loads(res.stdout)["coupling"]}
        assert len(pairs) == 1, f"one run counted twice: {sorted(pairs)}"
    else:
        assert_refused(res)


def _grid_rate_twice(fx: dict[str, Any], tmp: Path) -> None:
    res = cli(*_vit_grid("--dry-run", "--drop-path", "0,0", "--json")(fx, tmp / "g"))
    if res.exit_code == 0:
        assert_ok(res)
        plan = json.loads(res.stdout)
        runs = plan.get("runs", plan.get("units"))
        assert runs is not None and len(runs) == 1, f"{len(runs or [])} runs for one rate"
    else:
        assert_refused(res, unchanged={tmp / "g": None})


TWICE.update({
    "correlate:a-k-listed-twice": _k_twice,
    "chance-floor:a-model-listed-twice": _floor_model_twice,
    "difficulty:a-prompt-rated-twice": _rated_twice,
    "cross:a-run-listed-twice": _cross_run_twice,
    "vit-grid:a-rate-listed-twice": _grid_rate_twice,
})


# ---------------------------------------------------------------------------- into a folder of another kind
def _into(kind: str) -> Callable[[dict[str, Any], Path], Path]:
    return lambda fx, t: copy(fx["b"] / kind, t / kind)


INTO_OTHER: dict[str, tuple[str, Callable[[dict[str, Any], Path], list[str]]]] = {
    "measure:resume-into-a-perturbation-folder": (
        "pert", lambda fx, o: [*_measure("--resume")(fx, o)]),
    "measure:into-a-sweep-folder": ("sweep", lambda fx, o: _measure()(fx, o)),
    "perturb:into-a-run-folder": ("run0", lambda fx, o: _perturb()(fx, o)),
    "perturb:into-a-sweep-folder": ("sweep", lambda fx, o: _perturb()(fx, o)),
    "sweep:resume-into-a-run-folder": ("run0", lambda fx, o: [
        *_sweep(_nothing)(fx, o), "--resume"]),
    "sweep:into-a-vit-grid": ("grid", lambda fx, o: _sweep(_nothing)(fx, o)),
    "vit-train:into-a-sweep-folder": ("sweep", lambda fx, o: _vit_train()(fx, o)),
    "vit-train:into-a-run-folder": ("run0", lambda fx, o: _vit_train()(fx, o)),
    "vit-grid:into-a-sweep-folder": ("sweep", lambda fx, o: _vit_grid()(fx, o)),
    "vit-grid:into-a-perturbation-folder": ("pert", lambda fx, o: _vit_grid()(fx, o)),
}


@pytest.mark.parametrize("cid", cases([(c,) for c in INTO_OTHER]))
def test_writing_into_a_folder_of_another_kind_is_refused(cid: str, fx: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """A folder another command made (a run, a perturbation, a sweep, a grid) given as
    --out: one line, the folder unchanged."""
    kind, argv = INTO_OTHER[cid]
    out = copy(fx["b"] / kind, tmp_path / kind)
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    before = snapshot(out)
    args = argv(fx, out)
    assert_refused(cli(*args), unchanged={out: before})


# ---------------------------------------------------------------------------- output paths that cannot be written
def _a_folder(fx: dict[str, Any], t: Path) -> str:
    (t / "taken").mkdir(exist_ok=True)
    return str(t / "taken")


def _under_a_file(fx: dict[str, Any], t: Path) -> str:
    return str(_write(t / "afile", "x") / "out.json")


OUT_PATHS: dict[str, Callable[[dict[str, Any], Path], list[str]]] = {
    "correlate:json-out-is-a-folder": lambda fx, t: [*_json_out("correlate")(fx, t)[:-4],
                                                     "--json-out", _a_folder(fx, t)],
    "chance-floor:json-out-is-a-folder": lambda fx, t: ["chance-floor", "--scores", "paper",
                                                        "--json-out", _a_folder(fx, t)],
    "cross:json-out-is-a-folder": lambda fx, t: ["cross", str(fx["b"] / "run0"),
                                                 str(fx["b"] / "run1"), "--json-out",
                                                 _a_folder(fx, t)],
    "chance-floor:json-out-under-a-file": lambda fx, t: ["chance-floor", "--scores", "paper",
                                                         "--json-out", _under_a_file(fx, t)],
    "difficulty:page-is-a-folder": lambda fx, t: ["difficulty", str(fx["b"] / "rated"), "-o",
                                                  _a_folder(fx, t)],
    "cross:page-under-a-file": lambda fx, t: ["cross", str(fx["b"] / "run0"),
                                              str(fx["b"] / "run1"), "-o", _under_a_file(fx, t)],
    "report:out-is-a-folder": lambda fx, t: ["report", str(fx["b"] / "run0"), "-o",
                                             _a_folder(fx, t)],
    "vit-figures:out-is-a-file": lambda fx, t: ["vit-figures", str(fx["b"] / "vits"), "-o",
                                                str(_write(t / "afile", "x"))],
    "perturb:out-is-a-file": lambda fx, t: _perturb()(fx, _write(t / "afile", "x")),
    "measure:out-under-a-file": lambda fx, t: _measure()(fx, _write(t / "afile", "x") / "run"),
}


@pytest.mark.parametrize("cid", cases([(c,) for c in OUT_PATHS]))
def test_an_output_path_that_cannot_be_written_is_one_line(cid: str, fx: dict[str, Any],
                                                           tmp_path: Path) -> None:
    argv = OUT_PATHS[cid](fx, tmp_path)
    before = snapshot(tmp_path)
    line = assert_refused(cli(*argv), unchanged={tmp_path: before})
    assert ".tmp" not in line


# ---------------------------------------------------------------------------- collection upgrade killed midway
def _old_grid(grid: Path, old: Path) -> None:
    """A vit-grid collection in the layout run_grid wrote before grids were collections:
    grid.json + runs/<label>/ (what ``collection upgrade`` converts)."""
    import blockcoupling as bc
    from blockcoupling.store import collection as store

    c = bc.open_collection(grid)
    runs = {}
    (old / "runs").mkdir(parents=True)
    for r in c.catalogue.itertuples():
        shutil.copytree(grid / "units" / r.unit_id, old / "runs" / r.label)
        cfg = store.read_status(grid, r.unit_id)["unit"]["config"]  # type: ignore[index]
        runs[r.label] = {"drop_path": cfg["drop_path"], "weight_decay": cfg["weight_decay"],
                         "seed": cfg["seed"], "status": "done", "message": None}
    (old / "grid.json").write_text(json.dumps({
        "format": "blockcoupling-vit-grid", "base": c.manifest["spec"]["vit-grid"]["base"],
        "runs": runs}))


@pytest.mark.xfail("test_collection_upgrade_killed_midway_then_again" in BAD, strict=True,
                   reason=BAD.get("test_collection_upgrade_killed_midway_then_again", ""))
def test_collection_upgrade_killed_midway_then_again(fx: dict[str, Any], tmp_path: Path) -> None:
    """SIGKILL at a seeded file or folder move of ``collection upgrade`` (an old-layout ViT
    grid), then the same command: the collection of an uninterrupted upgrade."""
    import blockcoupling as bc

    ref, old = tmp_path / "ref", tmp_path / "old"
    _old_grid(fx["b"] / "grid", ref)
    _old_grid(fx["b"] / "grid", old)
    with counted_moves() as moves:
        assert_ok(cli("collection", "upgrade", str(ref)))
    nth = random.Random(f"{SEED}/campaign/upgrade").randint(1, moves[0])
    info = f"kill at move #{nth} of {moves[0]} (BLOCKCOUPLING_FAULT_SEED={SEED})"
    res = _killed_child(["collection", "upgrade", str(old)], nth)
    assert res.returncode == -signal.SIGKILL, f"{info}\n{res.stderr[-2000:]}"
    r = cli("collection", "upgrade", str(old))
    assert r.exit_code == 0, f"{info}\n{tail(r.output)}"
    got, want = bc.open_collection(old), bc.open_collection(ref)
    cols = ["unit_id", "coupling_vs_null_mean", "coupling_mean"]
    pd.testing.assert_frame_equal(got.summary()[cols], want.summary()[cols], check_exact=True)
    left = [str(p.relative_to(old)) for p in old.rglob(".tmp*")]
    assert not left, f"{info}: the killed upgrade's temporary files stay: {left}"
