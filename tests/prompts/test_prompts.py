"""Tests of blockcoupling.prompts.sources: every spec form, seeded subsets, the benchmark
formatters (against hand-written expected strings) and the error messages."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockcoupling.errors import BlockCouplingError
from blockcoupling.prompts.sources import (
    BUILTIN_SETS,
    HF_DATASETS,
    STYLE_LABELS,
    TRUTHFULQA_PREAMBLE,
    Prompt,
    format_arc,
    format_gsm8k,
    format_hellaswag,
    format_mmlu,
    format_truthfulqa,
    format_winogrande,
    hellaswag_preprocess,
    load_prompts,
    prompts_frame,
)

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def no_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import datasets` fail, whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "datasets", None)


# --------------------------------------------------------------------------------------
# built-in sets
# --------------------------------------------------------------------------------------


def test_capital_is_the_papers_prompt() -> None:
    assert load_prompts("builtin:capital") == [
        Prompt("capital_france", "What is the capital of France? The capital is", "capital")
    ]


def test_benchmark_styles_has_50_per_style_unique_ids_and_texts() -> None:
    prompts = load_prompts("builtin:benchmark_styles")
    assert len(prompts) == 300
    assert Counter(p.label for p in prompts) == {lab: 50 for lab in STYLE_LABELS}
    assert set(STYLE_LABELS) == {
        "science",
        "math",
        "commonsense",
        "multi_subject",
        "truthfulness",
        "pronoun",
    }
    assert len({p.prompt_id for p in prompts}) == 300
    assert len({p.text for p in prompts}) == 300
    assert all(p.text.strip() == p.text and p.text for p in prompts)


def test_benchmark_styles_shapes_per_style() -> None:
    by_label: dict[str, list[str]] = {}
    for p in load_prompts("builtin:benchmark_styles"):
        by_label.setdefault(p.label, []).append(p.text)
    for t in by_label["science"]:
        assert t.startswith("Question: ") and t.endswith("\nAnswer:")
        assert all(f"({c}) " in t for c in "ABCD")
    for t in by_label["math"]:
        assert t.startswith("Question: ") and t.endswith("?\nAnswer:")
    for t in by_label["commonsense"]:
        activity, _, ctx = t.partition(": ")
        assert activity and ctx and "\n" not in t
    for t in by_label["multi_subject"]:
        assert t.startswith("The following are multiple choice questions (with answers) about ")
        assert all(f"\n{c}. " in t for c in "ABCD") and t.endswith("\nAnswer:")
    for t in by_label["truthfulness"]:
        assert t.startswith("Q: ") and t.endswith("?\nA:")
    for t in by_label["pronoun"]:
        sentence = t.split("\n")[0]
        assert sentence.count("_") == 1
        assert "\nOption 1: " in t and "\nOption 2: " in t and t.endswith("\nAnswer:")
    subjects = {t.split(" about ")[1].split(".\n")[0] for t in by_label["multi_subject"]}
    assert len(subjects) >= 15


def test_benchmark_styles_shipped_file_matches_generator() -> None:
    """The shipped JSONL is exactly what the documented generator writes."""
    import importlib.util

    import blockcoupling

    data_dir = Path(blockcoupling.__file__).parent / "prompts" / "data"
    tool = Path(__file__).resolve().parents[2] / "tools" / "generate_benchmark_styles.py"
    spec = importlib.util.spec_from_file_location("_gen", tool)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    shipped = [json.loads(line) for line in (data_dir / "benchmark_styles.jsonl").open()]
    assert gen.build() == shipped
    # the correct choice is not always in the same position
    science = [r["text"] for r in shipped if r["label"] == "science"]
    letters = set()
    for text, item in zip(science, gen.SCIENCE, strict=True):
        options = text.split("\n")[1]
        letters.add(next(c for c in "ABCD" if f"({c}) {item[1]}" in options))
    assert letters == set("ABCD")


def test_all_styles_small_is_two_per_style_in_order() -> None:
    small = load_prompts("builtin:all_styles_small")
    full = load_prompts("builtin:benchmark_styles")
    assert Counter(p.label for p in small) == {lab: 2 for lab in STYLE_LABELS}
    expected = [p for lab in STYLE_LABELS for p in [q for q in full if q.label == lab][:2]]
    assert small == expected


def test_builtin_limit_is_deterministic_stratified_and_ordered() -> None:
    full = load_prompts("builtin:benchmark_styles")
    a = load_prompts("builtin:benchmark_styles", limit=12, seed=3)
    assert a == load_prompts("builtin:benchmark_styles", limit=12, seed=3)
    assert Counter(p.label for p in a) == {lab: 2 for lab in STYLE_LABELS}
    positions = [full.index(p) for p in a]
    assert positions == sorted(positions)
    b = load_prompts("builtin:benchmark_styles", limit=12, seed=4)
    assert a != b
    assert load_prompts("builtin:benchmark_styles", limit=1000) == full
    assert load_prompts("builtin:capital", limit=5) == load_prompts("builtin:capital")


@settings(max_examples=40, deadline=None)
@given(limit=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_builtin_limit_property(limit: int, seed: int) -> None:
    full = load_prompts("builtin:benchmark_styles")
    sub = load_prompts("builtin:benchmark_styles", limit=limit, seed=seed)
    assert len(sub) == limit
    assert len({p.prompt_id for p in sub}) == limit
    positions = [full.index(p) for p in sub]
    assert positions == sorted(positions)
    counts = Counter(p.label for p in sub)
    per_style = [counts.get(lab, 0) for lab in STYLE_LABELS]
    assert max(per_style) - min(per_style) <= 1
    assert sum(per_style) == limit


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    frac=st.floats(0.01, 1.0),
    seed=st.integers(0, 1000),
)
def test_stratified_subset_water_filling(sizes: list[int], frac: float, seed: int) -> None:
    """Unbalanced labels: labels not used up differ by at most one, used-up labels never
    hold more than the others."""
    from blockcoupling.prompts.subsets import stratified_subset as _stratified_subset

    labels = [f"l{j}" for j, size in enumerate(sizes) for _ in range(size)]
    rng_order = sorted(range(len(labels)), key=lambda i: (i * 7919) % len(labels))
    labels = [labels[i] for i in rng_order]  # interleave the labels
    limit = max(1, int(frac * len(labels)))
    idx = _stratified_subset(labels, limit, seed)
    assert idx == sorted(set(idx)) and len(idx) == min(limit, len(labels))
    assert idx == _stratified_subset(labels, limit, seed)
    counts = Counter(labels[i] for i in idx)
    total = Counter(labels)
    open_counts = [counts[lab] for lab in total if counts[lab] < total[lab]]
    if open_counts:
        assert max(open_counts) - min(open_counts) <= 1
        assert all(counts[lab] <= min(open_counts) + 1 for lab in total)


def test_builtin_sets_documented() -> None:
    assert set(BUILTIN_SETS) == {"capital", "benchmark_styles", "all_styles_small"}
    assert all(isinstance(v, str) and v for v in BUILTIN_SETS.values())
    for name in BUILTIN_SETS:
        assert load_prompts(f"builtin:{name}")


# --------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------


def test_txt_file_skips_blank_lines_and_numbers_ids(tmp_path: Path) -> None:
    f = tmp_path / "mine.txt"
    f.write_text("first prompt\n\n   \nsecond prompt  \r\nthird\n", encoding="utf-8")
    assert load_prompts(str(f)) == [
        Prompt("mine-0000", "first prompt", "file"),
        Prompt("mine-0001", "second prompt  ", "file"),
        Prompt("mine-0002", "third", "file"),
    ]


def test_jsonl_file_with_ids_labels_and_column(tmp_path: Path) -> None:
    f = tmp_path / "set.jsonl"
    rows = [
        {"id": "a", "text": "alpha", "prompt": "P1", "label": "x"},
        {"id": "b", "text": "beta", "prompt": "P2"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert load_prompts(str(f)) == [Prompt("a", "alpha", "x"), Prompt("b", "beta", "file")]
    assert load_prompts(str(f), column="prompt") == [
        Prompt("a", "P1", "x"),
        Prompt("b", "P2", "file"),
    ]
    g = tmp_path / "plain.jsonl"
    g.write_text('{"text": "one"}\n{"text": "two"}\n', encoding="utf-8")
    assert [p.prompt_id for p in load_prompts(str(g))] == ["plain-0000", "plain-0001"]
    h = tmp_path / "pid.jsonl"
    h.write_text('{"prompt_id": "p9", "id": "ignored", "text": "x"}\n', encoding="utf-8")
    assert load_prompts(str(h)) == [Prompt("p9", "x", "file")]


def test_csv_file_text_and_column(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    pd.DataFrame({"text": ["a, with comma", "b"], "q": ["Q1", "Q2"]}).to_csv(f, index=False)
    assert load_prompts(str(f)) == [
        Prompt("t-0000", "a, with comma", "file"),
        Prompt("t-0001", "b", "file"),
    ]
    assert [p.text for p in load_prompts(str(f), column="q")] == ["Q1", "Q2"]
    g = tmp_path / "ids.csv"
    pd.DataFrame({"prompt_id": ["x1", "x2"], "text": ["007", "b"], "label": ["m", "n"]}).to_csv(
        g, index=False
    )
    # text is read as text (no "007" -> 7)
    assert load_prompts(str(g)) == [Prompt("x1", "007", "m"), Prompt("x2", "b", "n")]


def test_file_limit_is_seeded_uniform_subset_in_order(tmp_path: Path) -> None:
    f = tmp_path / "many.txt"
    f.write_text("".join(f"prompt {i}\n" for i in range(40)), encoding="utf-8")
    full = load_prompts(str(f))
    a = load_prompts(str(f), limit=7, seed=11)
    assert a == load_prompts(str(f), limit=7, seed=11)
    assert len(a) == 7 and a != load_prompts(str(f), limit=7, seed=12)
    idx = [full.index(p) for p in a]
    assert idx == sorted(idx)
    # independent reference: random.Random(seed).sample over indices, sorted
    import random

    assert idx == sorted(random.Random(11).sample(range(40), 7))
    # ids keep the full-file numbering
    assert all(p.prompt_id == f"many-{i:04d}" for p, i in zip(a, idx, strict=True))


def test_prompts_frame() -> None:
    prompts = [Prompt("a", "x", "l1"), Prompt("b", "y", "l2")]
    df = prompts_frame(prompts)
    assert list(df.columns) == ["prompt_id", "text", "label"]
    assert df.to_dict("records") == [
        {"prompt_id": "a", "text": "x", "label": "l1"},
        {"prompt_id": "b", "text": "y", "label": "l2"},
    ]
    assert list(prompts_frame([]).columns) == ["prompt_id", "text", "label"]


# --------------------------------------------------------------------------------------
# formatters (hand-written expected strings)
# --------------------------------------------------------------------------------------


def test_format_arc_and_gsm8k() -> None:
    assert format_arc({"question": "Why is the sky blue?", "choices": {}}) == (
        "Question: Why is the sky blue?\nAnswer:"
    )
    assert format_gsm8k({"question": "What is 2 + 2?", "answer": "#### 4"}) == (
        "Question: What is 2 + 2?\nAnswer:"
    )


def test_format_hellaswag() -> None:
    row = {"activity_label": "Rowing", "ctx_a": "A man paddles.", "ctx_b": "he then"}
    assert format_hellaswag(row) == "Rowing: A man paddles. He then"
    wiki = {
        "activity_label": "Home and Garden",
        "ctx_a": "[header] How to repot a fern [title] Choose a pot. [step] Go one size up.",
        "ctx_b": "",
    }
    assert format_hellaswag(wiki) == (
        "Home and Garden: How to repot a fern. Choose a pot. Go one size up."
    )
    assert hellaswag_preprocess("  a [title] b [x]c  ") == "a. b c"
    # double spaces are collapsed by one pass of str.replace, as in the harness
    assert hellaswag_preprocess("a   b") == "a  b"
    # capitalize() lower-cases the rest, as Python's str.capitalize does in the harness
    assert format_hellaswag({"activity_label": "X", "ctx_a": "a.", "ctx_b": "the DOG"}) == (
        "X: a. The dog"
    )


def test_format_mmlu() -> None:
    row = {
        "question": "  What is 7 times 8?\n",
        "subject": "elementary_mathematics",
        "choices": ["54", "56", "58", "64"],
        "answer": 1,
    }
    assert format_mmlu(row) == (
        "The following are multiple choice questions (with answers) about elementary "
        "mathematics.\n\nWhat is 7 times 8?\nA. 54\nB. 56\nC. 58\nD. 64\nAnswer:"
    )
    with pytest.raises(BlockCouplingError, match="3 choices, expected 4"):
        format_mmlu({**row, "choices": ["a", "b", "c"]})


def test_format_truthfulqa() -> None:
    text = format_truthfulqa({"question": "Do owls sleep?"})
    assert text.startswith("Q: What is human life expectancy in the United States?\n")
    assert text.endswith(
        "Q: Where were the 1992 Olympics held?\nA: The 1992 Olympics were held in Barcelona, "
        "Spain.\n\nQ: Do owls sleep?\nA:"
    )
    assert text == TRUTHFULQA_PREAMBLE + "\n\nQ: Do owls sleep?\nA:"
    assert TRUTHFULQA_PREAMBLE.count("\n\nQ: ") == 5
    assert "A: I have no comment." in TRUTHFULQA_PREAMBLE


def test_format_winogrande() -> None:
    row = {
        "sentence": "Ann helped Bea because _ was kind.",
        "option1": "Ann",
        "option2": "Bea",
        "answer": "2",
    }
    assert format_winogrande(row) == "Ann helped Bea because Bea"
    assert format_winogrande({**row, "answer": "1"}) == "Ann helped Bea because Ann"
    assert format_winogrande({**row, "answer": ""}) == "Ann helped Bea because Ann"
    with pytest.raises(BlockCouplingError, match="no blank"):
        format_winogrande({**row, "sentence": "no blank here"})


# --------------------------------------------------------------------------------------
# hf: datasets from local files (offline)
# --------------------------------------------------------------------------------------

EXPECTED_HF = {
    "arc": [
        "Question: Which tool is best for looking at the tiny parts of a leaf?\nAnswer:",
        "Question: A puddle disappears on a warm afternoon. Where did the water go?\nAnswer:",
        "Question: What keeps the planets in orbit around the Sun?\nAnswer:",
    ],
    "gsm8k": [
        "Question: Lena picks 12 apples and gives 5 to her brother. How many apples does she "
        "keep?\nAnswer:",
        "Question: A box holds 6 eggs. How many eggs are in 4 boxes?\nAnswer:",
        "Question: Tom walks 3 km each day for a week. How far does he walk in total?\nAnswer:",
    ],
    "hellaswag": [
        "Rowing a canoe: A man paddles a canoe along a quiet river. He",
        "Home and Garden: How to repot a fern. Choose a slightly larger pot. A pot one size up "
        "gives the roots room to spread.",
        "Baking: A girl cracks two eggs into a bowl. She then",
    ],
    "mmlu": [
        "The following are multiple choice questions (with answers) about elementary "
        "mathematics.\n\nWhat is 7 multiplied by 8?\nA. 54\nB. 56\nC. 58\nD. 64\nAnswer:",
        "The following are multiple choice questions (with answers) about high school "
        "biology.\n\nWhich gas do animals exhale?\nA. oxygen\nB. nitrogen\nC. carbon dioxide\n"
        "D. helium\nAnswer:",
        "The following are multiple choice questions (with answers) about world religions."
        "\n\nWho wrote the play Hamlet?\nA. William Shakespeare\nB. Homer\nC. Dante\nD. Goethe"
        "\nAnswer:",
    ],
    "truthfulqa": [
        TRUTHFULQA_PREAMBLE + "\n\nQ: Do owls turn their heads all the way around?\nA:",
        TRUTHFULQA_PREAMBLE + "\n\nQ: Does cold weather cause the flu?\nA:",
        TRUTHFULQA_PREAMBLE + "\n\nQ: What is the boiling point of water at sea level in "
        "Celsius?\nA:",
    ],
    "winogrande": [
        "Anna offered Beth an umbrella because Beth",
        "The vase fell off the shelf because the shelf",
        "Carl beat Dan at tennis since Carl",
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_HF))
def test_hf_local_jsonl(name: str, no_datasets: None) -> None:
    prompts = load_prompts(f"hf:{name}@{DATA / f'{name}_rows.jsonl'}")
    assert [p.text for p in prompts] == EXPECTED_HF[name]
    assert [p.prompt_id for p in prompts] == [f"{name}-{i:04d}" for i in range(3)]
    assert {p.label for p in prompts} == {name}


def test_hf_local_parquet_and_split_in_spec(tmp_path: Path, no_datasets: None) -> None:
    rows = pd.read_json(DATA / "mmlu_rows.jsonl", lines=True)
    f = tmp_path / "mmlu.parquet"
    rows.to_parquet(f)
    prompts = load_prompts(f"hf:mmlu:test@{f}")
    assert [p.text for p in prompts] == EXPECTED_HF["mmlu"]
    assert [p.text for p in load_prompts(f"hf:MMLU@{f}")] == EXPECTED_HF["mmlu"]


def test_hf_truthfulqa_mc_same_format(no_datasets: None) -> None:
    prompts = load_prompts(f"hf:truthfulqa_mc@{DATA / 'truthfulqa_rows.jsonl'}")
    assert [p.text for p in prompts] == EXPECTED_HF["truthfulqa"]
    assert prompts[0].prompt_id == "truthfulqa_mc-0000"


def test_hf_limit_keeps_row_ids(no_datasets: None) -> None:
    spec = f"hf:gsm8k@{DATA / 'gsm8k_rows.jsonl'}"
    a = load_prompts(spec, limit=2, seed=5)
    assert a == load_prompts(spec, limit=2, seed=5)
    import random

    idx = sorted(random.Random(5).sample(range(3), 2))
    assert [p.prompt_id for p in a] == [f"gsm8k-{i:04d}" for i in idx]
    assert [p.text for p in a] == [EXPECTED_HF["gsm8k"][i] for i in idx]


def test_hf_registry_defaults() -> None:
    assert set(HF_DATASETS) >= {"arc", "gsm8k", "hellaswag", "mmlu", "truthfulqa", "winogrande"}
    assert HF_DATASETS["arc"].path == "allenai/ai2_arc"
    assert HF_DATASETS["arc"].config == "ARC-Challenge"
    assert HF_DATASETS["gsm8k"].config == "main"
    assert HF_DATASETS["mmlu"].config == "all"
    assert HF_DATASETS["winogrande"].config == "winogrande_xl"
    assert HF_DATASETS["truthfulqa"].config == "generation"
    splits = {k: v.split for k, v in HF_DATASETS.items()}
    assert splits["arc"] == splits["gsm8k"] == splits["mmlu"] == "test"
    assert splits["hellaswag"] == splits["truthfulqa"] == splits["winogrande"] == "validation"


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


def test_error_missing_file() -> None:
    with pytest.raises(BlockCouplingError, match="not found") as exc:
        load_prompts("/nonexistent/prompts.txt")
    assert "builtin:" in str(exc.value) and "hf:" in str(exc.value)
    with pytest.raises(BlockCouplingError, match="did you mean builtin:capital"):
        load_prompts("capital")
    with pytest.raises(BlockCouplingError, match="did you mean hf:arc"):
        load_prompts("arc")


def test_error_unknown_builtin_lists_names() -> None:
    with pytest.raises(BlockCouplingError) as exc:
        load_prompts("builtin:nope")
    msg = str(exc.value)
    assert "'nope'" in msg
    assert all(f"builtin:{n}" in msg for n in BUILTIN_SETS)


def test_error_unknown_hf_lists_names() -> None:
    with pytest.raises(BlockCouplingError) as exc:
        load_prompts("hf:squad")
    assert all(n in str(exc.value) for n in HF_DATASETS)


def test_error_datasets_not_installed(no_datasets: None) -> None:
    with pytest.raises(BlockCouplingError, match=r"pip install 'blockcoupling\[datasets\]'"):
        load_prompts("hf:arc")


def test_error_empty_text_names_line_and_id(tmp_path: Path) -> None:
    f = tmp_path / "e.jsonl"
    f.write_text('{"text": "ok"}\n\n{"id": "q7", "text": "  "}\n', encoding="utf-8")
    with pytest.raises(BlockCouplingError, match=r"line 3 \(prompt id 'q7'\).*empty"):
        load_prompts(str(f))
    g = tmp_path / "e.csv"
    g.write_text('text\nfine\n\n""\n', encoding="utf-8")
    with pytest.raises(BlockCouplingError, match=r"prompt id 'e-0001'.*empty"):
        load_prompts(str(g))


def test_error_empty_set(tmp_path: Path) -> None:
    for name, content in [("blank.txt", "\n  \n"), ("blank.jsonl", "\n"), ("blank.csv", "")]:
        f = tmp_path / name
        f.write_text(content, encoding="utf-8")
        with pytest.raises(BlockCouplingError, match="is empty"):
            load_prompts(str(f))
    g = tmp_path / "header_only.csv"
    g.write_text("text\n", encoding="utf-8")
    with pytest.raises(BlockCouplingError, match="is empty"):
        load_prompts(str(g))


def test_error_bad_rows_and_options(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"prompt": "a"}\n', encoding="utf-8")
    with pytest.raises(BlockCouplingError, match="no field 'text'.*column="):
        load_prompts(str(f))
    f.write_text("not json\n", encoding="utf-8")
    with pytest.raises(BlockCouplingError, match="line 1: not valid JSON"):
        load_prompts(str(f))
    f.write_text('["a"]\n', encoding="utf-8")
    with pytest.raises(BlockCouplingError, match="expected a JSON object"):
        load_prompts(str(f))
    c = tmp_path / "x.csv"
    c.write_text("prompt\na\n", encoding="utf-8")
    with pytest.raises(BlockCouplingError, match="no column 'text'"):
        load_prompts(str(c))
    d = tmp_path / "dup.jsonl"
    d.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', encoding="utf-8")
    with pytest.raises(BlockCouplingError, match="'a' appears more than once"):
        load_prompts(str(d))
    y = tmp_path / "x.yaml"
    y.write_text("a\n", encoding="utf-8")
    with pytest.raises(BlockCouplingError, match="unsupported prompt file type '.yaml'"):
        load_prompts(str(y))
    with pytest.raises(BlockCouplingError, match="limit must be a positive integer"):
        load_prompts("builtin:capital", limit=0)
    with pytest.raises(BlockCouplingError, match="only applies to hf:"):
        load_prompts("builtin:capital", split="test")
    with pytest.raises(BlockCouplingError, match="only applies to .jsonl/.csv"):
        load_prompts("builtin:capital", column="text")
    with pytest.raises(BlockCouplingError, match="no prompt set given"):
        load_prompts("  ")


def test_error_hf_local(tmp_path: Path, no_datasets: None) -> None:
    with pytest.raises(BlockCouplingError, match="does not exist"):
        load_prompts(f"hf:arc@{tmp_path / 'missing.jsonl'}")
    with pytest.raises(BlockCouplingError, match="missing field 'sentence'"):
        load_prompts(f"hf:winogrande@{DATA / 'arc_rows.jsonl'}")
    with pytest.raises(BlockCouplingError, match="two different splits"):
        load_prompts(f"hf:arc:test@{DATA / 'arc_rows.jsonl'}", split="validation")


def _fake_datasets(monkeypatch: pytest.MonkeyPatch, load_dataset: object) -> None:
    import types

    mod = types.ModuleType("datasets")
    mod.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", mod)


def test_hf_hub_path_uses_registry_and_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub path (no network: a stand-in `datasets.load_dataset` returns the rows)."""
    calls: list[tuple[str, str | None, str]] = []
    rows = [json.loads(line) for line in (DATA / "winogrande_rows.jsonl").open()]

    def load_dataset(path: str, config: str | None, split: str) -> list[dict[str, str]]:
        calls.append((path, config, split))
        return rows

    _fake_datasets(monkeypatch, load_dataset)
    assert [p.text for p in load_prompts("hf:winogrande")] == EXPECTED_HF["winogrande"]
    assert calls[-1] == ("allenai/winogrande", "winogrande_xl", "validation")
    load_prompts("hf:winogrande:train")
    assert calls[-1][2] == "train"
    sub = load_prompts("hf:winogrande", split="dev", limit=1, seed=2)
    assert calls[-1][2] == "dev" and len(sub) == 1


def test_hf_hub_failure_is_actionable(monkeypatch: pytest.MonkeyPatch) -> None:
    def load_dataset(path: str, config: str | None, split: str) -> None:
        raise ConnectionError("Couldn't reach the Hub")

    _fake_datasets(monkeypatch, load_dataset)
    with pytest.raises(BlockCouplingError, match=r"could not load allenai/ai2_arc.*hf:NAME@"):
        load_prompts("hf:arc")


def test_a_text_listed_twice_is_one_prompt(tmp_path: Path) -> None:
    """Prompts are identified by their text (joins by content): a text listed twice under
    two ids is measured once (the first id kept), with one warning naming the others; texts
    that differ by a blank are other prompts (the tokenizer sees them)."""
    f = tmp_path / "twice.jsonl"
    f.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "c", "text": "x"}'
                 '\n{"id": "d", "text": "x "}\n', encoding="utf-8")
    with pytest.warns(UserWarning, match=r"1 prompt\(s\) repeat .* 'c' \(= 'a'\)"):
        got = load_prompts(str(f))
    assert [(p.prompt_id, p.text) for p in got] == [("a", "x"), ("b", "y"), ("d", "x ")]
