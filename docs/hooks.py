"""MkDocs hooks (mkdocs.yml ``hooks:``): what ``mkdocs build`` generates before it reads docs/.

* The reference pages ``reference/cli.md``, ``reference/api.md`` and ``reference/families.md``
  (the conformance matrix's model families) are generated in memory from the code
  (``tools/gen_reference.py``) at every build; they are not files in git.
* The tutorials (``docs/tutorials/*.py``) are run when their outputs are missing or older than
  the script (``docs/tutorials/generated/<name>/``, not in git), so ``mkdocs build`` from a fresh
  clone executes them and the site shows their figures and tables. ``BLOCKCOUPLING_DOCS_FRESH=1``
  runs them every time; ``BLOCKCOUPLING_DOCS_TUTORIALS=skip`` uses the outputs already there
  (while editing text; a missing output is then a strict-mode error).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent



def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _src_on_path() -> None:
    src = str(ROOT / "src")
    if (ROOT / "src" / "blockcoupling").is_dir() and src not in sys.path:
        sys.path.insert(0, src)


def on_pre_build(config: Any) -> None:
    _src_on_path()
    if os.environ.get("BLOCKCOUPLING_DOCS_TUTORIALS") == "skip":
        return
    runner = _load(Path(config["docs_dir"]) / "tutorials" / "run.py", "bc_docs_tutorials")
    runner.run_all(Path(config["docs_dir"]), fresh=os.environ.get("BLOCKCOUPLING_DOCS_FRESH") == "1")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    _src_on_path()
    gen = _load(ROOT / "tools" / "gen_reference.py", "bc_gen_reference")
    for uri, text in (("reference/cli.md", gen.cli_markdown()), ("reference/api.md", gen.api_markdown()),
                      ("reference/families.md", gen.families_markdown())):
        existing = files.get_file_from_path(uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, uri, content=text))
    return files
