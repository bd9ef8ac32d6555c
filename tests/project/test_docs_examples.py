"""Documentation as tested code: every ```python and shell block of README.md and docs/ is run
here, or says why not.

* A block preceded by ``<!-- not run: WHY -->`` (the one convention of every page) is not run;
  WHY must say why (an install, the Hub, minutes of training, a signature sketch, ...).
* Every other block runs: a page's blocks in order, in a fresh folder that holds what the
  examples name (:func:`world`): a tiny random GPT-2 with a word-level tokenizer saved as
  ``./gpt2`` (transformers loads a local folder of that name instead of the Hub's, so the
  commands run offline as written), run directories ``runs/gpt2`` and ``runs/gpt2-random``,
  a sweep spec over local checkpoints and a score table. Python blocks share one namespace per
  page; shell blocks run with ``bash -euo pipefail`` and this checkout's CLI.
* Tutorial pages include their code from the scripts in docs/tutorials/ (run by the docs
  build, tests/project/test_docs.py): the cells a page shows, in order, define every name they use
  (no hidden helper), so a copied cell runs.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: pages whose blocks another test runs: docs/paper.md's commands take the page's variables
#: ($GPT2, $PROMPTS, ...: paper-scale values on a GPU, tiny ones here), expanded and run on
#: tiny models by tests/report/test_paper_page.py and the docs build (docs/tutorials/paper_figures.py)
RUN_ELSEWHERE = {ROOT / "docs" / "paper.md"}
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                     if "generated" not in p.parts and p not in RUN_ELSEWHERE)]
RUN_LANGS = {"python", "py", "bash", "sh", "shell", "console"}
SHELL = {"bash", "sh", "shell", "console"}
NOT_RUN = "<!-- not run:"
_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
_SNIPPET = re.compile(r'^--8<-- "(?P<file>[^":]+)(?::(?P<name>[\w-]+))?"\s*$')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    reason: str | None  # why it is not run (None: run)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def snippets(self) -> list[tuple[str, str | None]]:
        """(file, section) of each ``--8<--`` include, where the block is only includes."""
        lines = [ln for ln in self.code.splitlines() if ln.strip()]
        found = [_SNIPPET.match(ln.strip()) for ln in lines]
        if lines and all(found):
            return [(m.group("file"), m.group("name")) for m in found if m]
        return []


def not_run_reason(before: str) -> str | None:
    """The WHY of a ``<!-- not run: WHY -->`` right before a block (nothing but blank lines
    between), else None."""
    tail = before.rstrip()
    if not tail.endswith("-->"):
        return None
    start = tail.rfind("<!--")
    comment = tail[start:]
    if not comment.startswith(NOT_RUN):
        return None
    return " ".join(comment[len(NOT_RUN):-3].split())


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    out, last = [], 0
    for m in _FENCE.finditer(text):
        out.append(Block(page, text[:m.start()].count("\n") + 1, m.group("lang").lower(),
                         m.group("code"), not_run_reason(text[last:m.start()])))
        last = m.end()
    return out


ALL = [b for page in PAGES for b in blocks(page)]
RUNNABLE = [b for b in ALL if b.lang in RUN_LANGS and b.reason is None and not b.snippets]


def test_the_marker_is_recognised() -> None:
    assert not_run_reason("text\n<!-- not run: it installs packages -->\n\n") == \
        "it installs packages"
    assert not_run_reason("<!-- not run: why -->\n```\nx\n```\nmore\n") is None
    assert not_run_reason("<!-- a comment -->\n") is None
    found = blocks(ROOT / "docs" / "getting-started.md")
    assert found and all(b.lang for b in found)


def test_every_block_runs_or_says_why_not() -> None:
    """Each python / shell block is run below, or is a tutorial's include, or carries a
    reason of a few words; a marker never stands before a block that would not run anyway."""
    for b in ALL:
        if b.reason is not None:
            assert b.lang in RUN_LANGS, f"{b.where}: a not-run marker before a {b.lang} block"
            assert len(b.reason.split()) >= 3, f"{b.where}: say why it is not run"
        elif b.lang in RUN_LANGS and not b.snippets:
            assert b in RUNNABLE
        if b.lang == "" and b.code.strip():
            raise AssertionError(f"{b.where}: give the block a language (python, bash, text)")


# ---------------------------------------------------------------------- the world of the pages
WORDS = ("the a of is in on and to it was what capital france paris germany berlin italy "
         "rome spain madrid city country cat sat mat dog ran far two plus three equals five "
         "water boils at one hundred degrees").split()


def save_gpt2(path: Path, seed: int = 0) -> Path:
    """A tiny random GPT-2 LM (6 blocks, d = 64) with a word-level tokenizer, as a hub folder."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(seed)
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *dict.fromkeys(WORDS)])}
    cfg = tf.GPT2Config(n_layer=6, n_embd=64, n_head=4, vocab_size=len(vocab), n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    tf.GPT2LMHeadModel(cfg).save_pretrained(path)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]",
                               unk_token="[UNK]").save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the examples name, built once: ./gpt2, runs/gpt2 and runs/gpt2-random (three
    prompts, every token, K = 10, 30, 50, both orientations), study.yaml over two local
    checkpoints."""
    import transformers as tf
    import yaml

    import blockcoupling as bc

    root = tmp_path_factory.mktemp("world")
    save_gpt2(root / "gpt2", seed=0)
    save_gpt2(root / "gpt2-random", seed=1)
    for step, seed in ((0, 2), (10, 3)):
        save_gpt2(root / "runs" / "train" / f"checkpoint-{step}", seed=seed)
    prompts = ["What is the capital of France? The capital is", "The cat sat on the mat",
               "Two plus three equals five"]  # several prompts and every token: the averages
    for name in ("gpt2", "gpt2-random"):  # of the examples must follow the headline's rule
        model = tf.AutoModel.from_pretrained(root / name)
        tok = tf.AutoTokenizer.from_pretrained(root / name)
        bc.measure_to_dir(model, tok, prompts, root / "runs" / name, progress=False,
                          meta={"model": name}, coupling=("depth",), k=(10, 30, 50),
                          tokens="all")
    (root / "study.yaml").write_text(yaml.safe_dump({
        "models": [{"label": "my-run", "checkpoints": "runs/train/checkpoint-*"}],
        "prompts": ["builtin:capital"], "measure": {"coupling": ["depth"], "k": [10]}}))
    return root


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                      env.get("PYTHONPATH")]))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg",
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    return env


#: what a page makes itself, left out of its copy of the world (measure.md writes runs/gpt2)
MADE_BY_PAGE = {"docs/how-to/measure.md": ["runs/gpt2"]}


def _pages_with_runnable_blocks() -> list[str]:
    return sorted({str(b.page.relative_to(ROOT)) for b in RUNNABLE})


#: pages whose examples run end to end for tens of seconds: CI runs them (-m "slow or not slow")
SLOW_PAGES = {"docs/how-to/sweeps.md", "docs/how-to/measure.md", "docs/how-to/monitor.md"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p
                                  for p in _pages_with_runnable_blocks()])
def test_page_examples_run(page: str, world: Path, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's blocks, in order, in a copy of :func:`world`: each must finish."""
    cwd = tmp_path / "cwd"
    shutil.copytree(world, cwd, symlinks=True)
    for made in MADE_BY_PAGE.get(page, []):
        shutil.rmtree(cwd / made)
    monkeypatch.chdir(cwd)
    for key, value in _env().items():
        if key != "PATH":
            monkeypatch.setenv(key, value)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for b in (b for b in RUNNABLE if str(b.page.relative_to(ROOT)) == page):
        if b.lang in SHELL:
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], cwd=cwd,
                                  env=_env(), capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"{b.where}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        else:
            try:
                exec(compile(b.code, b.where, "exec"), namespace)
            except Exception as err:  # the block and the line that failed
                raise AssertionError(f"{b.where}: {type(err).__name__}: {err}") from err


# ---------------------------------------------------------------------- tutorials
def _snippet(file: str, name: str | None) -> str:
    text = (ROOT / file).read_text(encoding="utf-8")
    if name is None:
        return text
    m = re.search(rf"^# --8<-- \[start:{name}\]\n(.*?)^# --8<-- \[end:{name}\]", text,
                  re.S | re.M)
    assert m, f"{file}: no section {name}"
    return m.group(1)


def undefined_names(code: str) -> set[str]:
    """Names ``code`` reads at module level or in its functions that nothing in it binds
    (assignments, imports, defs, loop and comprehension targets) and are not builtins."""
    tree = ast.parse(code)
    bound: set[str] = set(dir(builtins))
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store | ast.Del) else used).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return used - bound


def test_the_name_check_sees_a_hidden_helper() -> None:
    assert undefined_names("import pandas as pd\nx = wide(pd.DataFrame())\n") == {"wide"}
    assert undefined_names("def f(a):\n    return [b for b in a]\nf([1])\n") == set()


TUTORIAL_PAGES = sorted({b.page for b in ALL if b.snippets and b.lang in RUN_LANGS})


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in TUTORIAL_PAGES])
def test_tutorial_cells_show_every_name_they_use(page: str) -> None:
    cells = [_snippet(f, n) for b in ALL if str(b.page.relative_to(ROOT)) == page
             for f, n in b.snippets]
    code = "\n".join(cells)
    assert not undefined_names(code), (
        f"{page} shows code that uses {sorted(undefined_names(code))} without defining it: "
        "show the helper on the page, or use the library")


# ---------------------------------------------------------------------- coupling numbers
#: code that computes a coupling number from the tables (an aggregate of coupling values)
COMPUTES_COUPLING = re.compile(
    r"avg\(\s*value\s*\)|\[\s*[\"']value[\"']\s*\]\s*\.\s*(mean|median|sum|agg)\b"
    r"|\.(mean_depth_coupling|per_prompt_coupling|coupling_by_distance|depth_matrix)\("
    r"|\.table\(\s*[\"']coupling[\"']|\bFROM\s+coupling\b|coupling\.parquet", re.I)
#: the headline statistic of the same run (what an example's number is compared with)
HEADLINE_CALL = re.compile(r"\bcoupling_statistic\(|\.summary\(\)")
ASSERTS = re.compile(r"^\s*assert\b", re.M)


def headline_problem(code: str, before: str) -> str | None:
    """Why an example that computes a coupling number is not checked against the headline of
    the same run (None: it is, or it computes none): it must assert its number against
    ``coupling_statistic`` / ``summary()`` of the same data, called in it or earlier on its
    page (the examples run, so the assertion is executed)."""
    if not COMPUTES_COUPLING.search(code):
        return None
    if not ASSERTS.search(code):
        return "it computes a coupling number and asserts nothing about it"
    if not HEADLINE_CALL.search(before + code):
        return "it asserts without the headline (coupling_statistic / summary()) of the run"
    return None


def _python_examples() -> list[tuple[str, str, str]]:
    """(where, code, the page's python before it) of every executed python example: the
    pages' blocks and the tutorial cells the pages include."""
    out, before = [], {}
    for b in ALL:
        page = str(b.page.relative_to(ROOT))
        if b.snippets and b.lang in RUN_LANGS:
            for file, name in b.snippets:
                code = _snippet(file, name)
                out.append((f"{b.where} ({file}:{name})", code, before.get(page, "")))
                before[page] = before.get(page, "") + code
        elif b in RUNNABLE and b.lang not in SHELL:
            out.append((b.where, b.code, before.get(page, "")))
            before[page] = before.get(page, "") + b.code
    return out


def test_every_coupling_number_is_checked_against_the_headline() -> None:
    """Every executed example that averages coupling values asserts its number equals the
    headline statistic of the same run: an average over kinds, variants, K, orientations,
    tokens or the diagonal (a number no page reports) cannot stand in the docs."""
    found = [(where, problem) for where, code, before in _python_examples()
             if (problem := headline_problem(code, before))]
    assert not found, found
    assert sum(bool(COMPUTES_COUPLING.search(c)) for _, c, _ in _python_examples()) >= 4


def test_the_headline_check_can_fail() -> None:
    """The sweeps page's earlier example (an average of every kind, orientation, token, K and
    the diagonal) and a per-prompt mean never compared are both found."""
    old = ("s.sql(\"SELECT label, step, avg(value) FROM coupling WHERE variant = 'coupling' "
           "GROUP BY ALL\")\nprint(s.summary())\n")
    assert headline_problem(old, "") == ("it computes a coupling number and asserts "
                                         "nothing about it")
    unchecked = "v = m.per_prompt_coupling(10)['value'].mean()\nassert v > 0\n"
    assert headline_problem(unchecked, "") is not None
    assert headline_problem(unchecked, "stat = bc.coupling_statistic(m)\n") is None
    assert headline_problem("print(bc.coupling_statistic(m))\n", "") is None


# ---------------------------------------------------------------------- numbers in prose
def _fmt_p(p: float) -> str:
    """p as the pages write it: 0.57, 4.8e-4."""
    if p >= 0.01:
        return f"{p:.2g}"
    mant, exp = f"{p:.1e}".split("e")
    return f"{mant}e{int(exp)}"


def _prose(path: str) -> str:
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())


def test_quoted_width_floor_numbers_are_computed() -> None:
    """The width floor's values and the paper-table regressions quoted in the README and the
    pages are what ``chance-floor --scores paper`` computes (no model, instant)."""
    from blockcoupling.studies.chance_floor import chance_floor
    from blockcoupling.studies.regression import stats_modules

    stats_modules()
    floor = lambda d: 1 - (1 / d + 1 / round(d / 10)) ** 0.5  # noqa: E731
    res = chance_floor("paper")
    base, tuned, both = res.groups["base"], res.groups["fine-tuned"], res.overall
    quoted = {
        "README.md": [f"({floor(768):.3f} at d = 768, {floor(8192):.3f}",
                      f"R^2 = {base['r2']:.2f} (p = {_fmt_p(base['p'])}, n = {base['n']}) for "
                      "the base models",
                      f"R^2 = {tuned['r2']:.2f} (p = {_fmt_p(tuned['p'])}, n = {tuned['n']})"],
        "docs/conventions.md": [f"{floor(768):.3f} at d = 768 and {floor(8192):.3f} at d = 8192"],
        "docs/how-to/correlate.md": [
            f"R^2 = {base['r2']:.2f} (p = {_fmt_p(base['p'])}, n = {base['n']}) for the base",
            f"{tuned['r2']:.2f} (p = {_fmt_p(tuned['p'])}, n = {tuned['n']}) for the fine-tuned",
            f"{both['r2']:.2f} (p = {_fmt_p(both['p'])}, n = {both['n']}) for all"],
    }
    for page, phrases in quoted.items():
        text = _prose(page)
        for phrase in phrases:
            assert phrase in text, f"{page} should say {phrase!r} (computed now)"
