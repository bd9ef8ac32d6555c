"""The README is a front page: short, with a Python example, and its links into the repository
point at files that exist. Its code blocks run (or say why not) in tests/test_docs_examples.py,
with every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def test_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) < 150
    assert any(lang == "python" for lang, _ in _BLOCK.findall(README))
    # what a reader must know before comparing trained numbers (issue 19)
    assert "bit-reproducible only at the same torch thread count" in " ".join(README.split())


def test_readme_links_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
