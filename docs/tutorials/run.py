"""Run the documentation's tutorials (docs/tutorials/<name>.py) into generated/<name>/.

Called by docs/hooks.py before every ``mkdocs build`` and by tests/project/test_docs.py. A tutorial is
run when its outputs are missing or were made by another version of its script (the sha256 of
``common.py`` and the script, kept in ``generated/<name>/DONE``), or always with ``fresh``.
Each runs in its own process, in its output folder (what its cells write to a relative path
lands there), with this checkout's ``src`` first on the path, offline, with a
non-interactive matplotlib; a failure stops the build with the tutorial's own output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

TUTORIALS = ("above_chance", "emergence", "width_floor", "paper_figures")  # the site's order


def _digest(here: Path, name: str) -> str:
    h = hashlib.sha256()
    for file in (here / "common.py", here / f"{name}.py"):
        h.update(file.read_bytes())
    return h.hexdigest()


def run_one(docs_dir: Path, name: str, *, fresh: bool = False) -> Path:
    """Run tutorial ``name`` unless its outputs are current; return its output folder."""
    here = docs_dir / "tutorials"
    out = here / "generated" / name
    stamp = out / "DONE"
    digest = _digest(here, name)
    if not fresh and stamp.is_file() and stamp.read_text().strip() == digest:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ)
    src = docs_dir.parent / "src"
    if (src / "blockcoupling").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run([sys.executable, str(here / f"{name}.py"), str(out)], cwd=out,
                          env=env, capture_output=True, text=True)
    (out / "output.txt").write_text(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"tutorial {name} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    stamp.write_text(digest + "\n")
    return out


def run_all(docs_dir: Path, *, fresh: bool = False) -> list[Path]:
    """Run every tutorial that needs it, in order."""
    return [run_one(docs_dir, name, fresh=fresh) for name in TUTORIALS]


if __name__ == "__main__":
    run_all(Path(__file__).resolve().parent.parent, fresh="--fresh" in sys.argv)
