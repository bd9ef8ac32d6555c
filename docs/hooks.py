"""MkDocs hooks (mkdocs.yml ``hooks:``): what ``mkdocs build`` generates before it reads docs/.

* The reference pages ``reference/cli.md``, ``reference/api.md`` and ``reference/families.md``
  (the conformance matrix's model families) are generated in memory from the code
  (``tools/gen_reference.py``) at every build; they are not files in git.
* Mathematics is rendered at build time: every ``\\(...\\)`` and ``\\[...\\]`` that
  pymdownx.arithmatex marked becomes MathML (latex2mathml, the docs extra), which browsers
  render natively: no script, no CDN, the site works offline.
* The tutorials (``docs/tutorials/*.py``) are run when their outputs are missing or older than
  the script (``docs/tutorials/generated/<name>/``, not in git), so ``mkdocs build`` from a fresh
  clone executes them and the site shows their figures and tables. ``BLOCKCOUPLING_DOCS_FRESH=1``
  runs them every time; ``BLOCKCOUPLING_DOCS_TUTORIALS=skip`` uses the outputs already there
  (while editing text; a missing output is then a strict-mode error).
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: what pymdownx.arithmatex (generic mode) writes around an equation
_MATH = re.compile(r'<(?P<tag>span|div) class="arithmatex">(?P<tex>.*?)</(?P=tag)>', re.S)


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


#: a text group of an equation (``\texttt{coupling\_vs\_rotated}``), whose escaped
#: underscores latex2mathml would print with their backslashes
_TEXT_GROUP = re.compile(r"(\\text(?:tt|rm|sf|it|bf)?\{)([^{}]*)(\})")


def tex_to_mathml(tex: str, display: bool) -> str:
    """One equation's TeX (without its delimiters) as a MathML element; ``\_`` in a text
    group is the underscore it stands for."""
    try:
        from latex2mathml.converter import convert
    except ImportError as err:  # the docs extra: pip install -e '.[docs]'
        raise RuntimeError("the docs need latex2mathml to render their mathematics "
                           "offline: pip install -e '.[docs]'") from err
    tex = _TEXT_GROUP.sub(lambda m: m.group(1) + m.group(2).replace("\\_", "_") + m.group(3),
                          tex)
    return convert(tex, display="block" if display else "inline")


def math_to_mathml(text: str) -> str:
    """Every arithmatex equation of a page's HTML as MathML."""
    def one(m: re.Match[str]) -> str:
        tex = html.unescape(m.group("tex")).strip()
        display = m.group("tag") == "div"
        for left, right in (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"), ("$", "$")):
            if tex.startswith(left) and tex.endswith(right):
                tex = tex[len(left):len(tex) - len(right)]
                break
        return tex_to_mathml(tex.strip(), display)

    return _MATH.sub(one, text)


def on_page_content(html_text: str, **kwargs: Any) -> str:
    return math_to_mathml(html_text)
