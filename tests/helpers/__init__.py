"""The test helpers, one importable package (``from tests.helpers.tiny_models import ...``):
tiny models and runs, the float64 oracles, synthetic runs, child processes. The repository
root is on pytest's ``pythonpath`` (pyproject.toml); a child process gets it from
:func:`child_env`."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child Python process, with the repository root (for
    ``tests.helpers``) and the package this process imports (``blockcoupling``) first on
    ``PYTHONPATH``; ``extra`` overrides variables."""
    import blockcoupling

    src = Path(blockcoupling.__file__).resolve().parents[1]
    path = [str(ROOT), str(src), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)), **extra}


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The Python file ``path`` (a tool, a tutorial script) imported as a module ``name``
    (default: its stem), registered in ``sys.modules`` so its dataclasses resolve."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
