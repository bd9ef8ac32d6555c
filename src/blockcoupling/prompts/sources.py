"""Prompt sets: built-in sets, prompt files and benchmark datasets (``hf:``).

Every measurement runs over a list of :class:`Prompt` (a stable id, the text, a style label).
:func:`load_prompts` turns one *spec* string (the CLI's ``--prompts``) into that list:

``builtin:NAME``
    A set shipped with the package (see :data:`BUILTIN_SETS`). ``builtin:capital`` is the
    paper's single prompt used for the depth-wise figures; ``builtin:benchmark_styles`` holds
    300 original prompts written for this project (50 per style) in the styles of the six
    benchmarks the paper measures (ARC, GSM8K, HellaSwag, MMLU, TruthfulQA, Winogrande);
    ``builtin:all_styles_small`` is the first 2 prompts of each style, for quick runs.
    The styles keep only the *shape* of each benchmark (no benchmark item is copied), so they
    are a stand-in for offline runs, not a replacement for the paper's test sets.

a file path
    ``.txt``: one prompt per line (blank lines skipped; no other stripping, so trailing spaces
    are kept). ``.jsonl``: one JSON object per line, the text in field ``text`` (or ``column``).
    ``.csv``: column ``text`` (or ``column``). Ids come from an ``id`` or ``prompt_id``
    field/column when present, else ``<file stem>-<index:04d>`` (index among the prompts,
    0-based); labels from a ``label`` field/column when present, else ``"file"``.

``hf:DATASET[:SPLIT][@LOCAL_FILE]``
    A benchmark from the HuggingFace hub, formatted as the Open LLM Leaderboard
    (lm-evaluation-harness) prompts the model, zero-shot. Default splits: the test split
    where it has labels (ARC, GSM8K, MMLU), else validation (HellaSwag, TruthfulQA,
    Winogrande); see :data:`HF_DATASETS`. ``@LOCAL_FILE`` reads a ``.jsonl``/``.json``/
    ``.parquet`` file holding rows in the hub dataset's format instead (offline use); it needs
    no ``datasets`` install (pandas reads it when ``datasets`` is missing). Ids are
    ``<dataset>-<row index:04d>`` (row index in the split, so an id does not depend on
    ``limit``), labels are the dataset name.

``protocol:paper[@DIR]``
    The paper's 1,200 prompts: 200 seeded prompts from each of the six ``hf:`` benchmarks
    (from the hub, or from a folder of local row files); see :mod:`blockcoupling.prompts.protocol`.

``limit`` always takes a seeded random subset (``random.Random(seed)``), returned in the
set's original order; ``limit`` >= the set size returns the whole set. For built-in sets
the subset is *stratified* by label (the styles get ``limit // n_styles`` prompts each and
the remaining ``limit % n_styles`` go to randomly chosen styles), for files and ``hf:``
sets it is a plain uniform subset without replacement.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError

__all__ = [
    "BUILTIN_SETS",
    "CAPITAL_PROMPT",
    "HF_DATASETS",
    "HFDataset",
    "Prompt",
    "STYLE_LABELS",
    "format_arc",
    "format_gsm8k",
    "format_hellaswag",
    "format_mmlu",
    "format_truthfulqa",
    "format_winogrande",
    "hellaswag_preprocess",
    "load_prompts",
    "prompts_frame",
]


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id (used as ``prompt_id`` in every result table), the text fed
    to the tokenizer unchanged, and a style/source label for grouping results."""

    prompt_id: str
    text: str
    label: str


# --------------------------------------------------------------------------------------
# Built-in sets
# --------------------------------------------------------------------------------------

CAPITAL_PROMPT = "What is the capital of France? The capital is"

STYLE_LABELS: tuple[str, ...] = (
    "science",
    "math",
    "commonsense",
    "multi_subject",
    "truthfulness",
    "pronoun",
)
"""Labels of ``builtin:benchmark_styles``, one per benchmark style (ARC, GSM8K, HellaSwag,
MMLU, TruthfulQA, Winogrande), in the file's order."""

BUILTIN_SETS: dict[str, str] = {
    "capital": "the paper's single prompt 'What is the capital of France? The capital is'",
    "benchmark_styles": (
        "300 original prompts, 50 in each of the 6 benchmark styles of the paper "
        "(science/ARC, math/GSM8K, commonsense/HellaSwag, multi_subject/MMLU, "
        "truthfulness/TruthfulQA, pronoun/Winogrande)"
    ),
    "all_styles_small": "12 prompts: the first 2 of each style of benchmark_styles (quick tests)",
}
"""The built-in prompt sets (``builtin:NAME``): name -> what the set holds."""

_BENCHMARK_STYLES_FILE = "benchmark_styles.jsonl"


def _read_package_jsonl(name: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file shipped in ``blockcoupling/prompts/data``."""
    # one name per joinpath: several are Python 3.11+ (Traversable.joinpath(*descendants))
    text = resources.files("blockcoupling.prompts").joinpath("data").joinpath(name).read_text(
        encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _builtin(name: str) -> list[Prompt]:
    """The prompts of built-in set ``name`` (already validated by the caller)."""
    if name == "capital":
        return [Prompt("capital_france", CAPITAL_PROMPT, "capital")]
    rows = _read_package_jsonl(_BENCHMARK_STYLES_FILE)
    prompts = [Prompt(str(r["prompt_id"]), str(r["text"]), str(r["label"])) for r in rows]
    if name == "all_styles_small":
        seen: dict[str, int] = {}
        small = []
        for p in prompts:
            if seen.get(p.label, 0) < 2:
                seen[p.label] = seen.get(p.label, 0) + 1
                small.append(p)
        return small
    return prompts


# --------------------------------------------------------------------------------------
# Benchmark formatters (Open LLM Leaderboard / lm-evaluation-harness, zero-shot)
# --------------------------------------------------------------------------------------

TRUTHFULQA_PREAMBLE = (
    "Q: What is human life expectancy in the United States?\n"
    "A: Human life expectancy in the United States is 78 years.\n\n"
    "Q: Who was president of the United States in 1955?\n"
    "A: Dwight D. Eisenhower was president of the United States in 1955.\n\n"
    "Q: Which party did he belong to?\n"
    "A: He belonged to the Republican Party.\n\n"
    "Q: What is the square root of banana?\n"
    "A: I have no comment.\n\n"
    "Q: How does a telescope work?\n"
    "A: Telescopes use lenses or mirrors to focus light and make objects appear closer.\n\n"
    "Q: Where were the 1992 Olympics held?\n"
    "A: The 1992 Olympics were held in Barcelona, Spain."
)
"""The six-shot QA preamble lm-evaluation-harness puts before every TruthfulQA question."""


def format_arc(row: Mapping[str, Any]) -> str:
    """ARC (allenai/ai2_arc): ``"Question: {question}\\nAnswer:"`` (choices are scored as
    continuations, so they are not in the prompt)."""
    return f"Question: {row['question']}\nAnswer:"


def format_gsm8k(row: Mapping[str, Any]) -> str:
    """GSM8K (openai/gsm8k, main): ``"Question: {question}\\nAnswer:"``."""
    return f"Question: {row['question']}\nAnswer:"


def hellaswag_preprocess(text: str) -> str:
    """lm-evaluation-harness's HellaSwag clean-up: strip, turn WikiHow ``" [title]"`` into
    ``". "``, drop other ``[...]`` artifacts, collapse double spaces (once)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def format_hellaswag(row: Mapping[str, Any]) -> str:
    """HellaSwag: ``preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())``."""
    ctx = f"{row['ctx_a']} {str(row['ctx_b']).capitalize()}"
    return hellaswag_preprocess(f"{row['activity_label']}: {ctx}")


def format_mmlu(row: Mapping[str, Any]) -> str:
    """MMLU (cais/mmlu): the subject header, the question and the lettered choices.

    ``"The following are multiple choice questions (with answers) about {subject}.\\n\\n"
    "{question.strip()}\\nA. {c0}\\nB. {c1}\\nC. {c2}\\nD. {c3}\\nAnswer:"`` with
    underscores of the subject replaced by spaces.
    """
    subject = str(row["subject"]).replace("_", " ")
    choices = list(row["choices"])
    if len(choices) != 4:
        raise BlockCouplingError(
            f"an MMLU row has {len(choices)} choices, expected 4: check that the file holds "
            "rows in cais/mmlu's format (question, subject, choices, answer)"
        )
    lines = [str(row["question"]).strip()]
    lines += [f"{letter}. {choice}" for letter, choice in zip("ABCD", choices, strict=True)]
    header = f"The following are multiple choice questions (with answers) about {subject}.\n\n"
    return header + "\n".join(lines) + "\nAnswer:"


def format_truthfulqa(row: Mapping[str, Any]) -> str:
    """TruthfulQA: the harness's QA preamble, then ``"\\n\\nQ: {question}\\nA:"``."""
    return f"{TRUTHFULQA_PREAMBLE}\n\nQ: {row['question']}\nA:"


def format_winogrande(row: Mapping[str, Any]) -> str:
    """Winogrande, partial evaluation: the sentence up to the blank ``_`` with the correct
    option filled in (``option1`` when the row has no answer); the model is scored on the
    rest of the sentence, so the prompt stops at the filled option."""
    sentence = str(row["sentence"])
    if "_" not in sentence:
        raise BlockCouplingError(
            f"a Winogrande sentence has no blank '_': {sentence!r}; check the file's rows"
        )
    option = row["option2"] if str(row.get("answer", "")) == "2" else row["option1"]
    return sentence[: sentence.index("_")] + str(option)


@dataclass(frozen=True)
class HFDataset:
    """How to fetch and format one benchmark from the HuggingFace hub."""

    path: str
    config: str | None
    split: str
    formatter: Callable[[Mapping[str, Any]], str]
    description: str


HF_DATASETS: dict[str, HFDataset] = {
    "arc": HFDataset(
        "allenai/ai2_arc",
        "ARC-Challenge",
        "test",
        format_arc,
        "ARC-Challenge, test split",
    ),
    "gsm8k": HFDataset("openai/gsm8k", "main", "test", format_gsm8k, "GSM8K main, test split"),
    "hellaswag": HFDataset(
        "Rowan/hellaswag",
        None,
        "validation",
        format_hellaswag,
        "HellaSwag, validation split (the test split has no labels)",
    ),
    "mmlu": HFDataset("cais/mmlu", "all", "test", format_mmlu, "MMLU all subjects, test split"),
    "truthfulqa": HFDataset(
        "truthfulqa/truthful_qa",
        "generation",
        "validation",
        format_truthfulqa,
        "TruthfulQA generation config, validation split (its only split)",
    ),
    "truthfulqa_mc": HFDataset(
        "truthfulqa/truthful_qa",
        "multiple_choice",
        "validation",
        format_truthfulqa,
        "TruthfulQA multiple_choice config, validation split (same questions and format)",
    ),
    "winogrande": HFDataset(
        "allenai/winogrande",
        "winogrande_xl",
        "validation",
        format_winogrande,
        "Winogrande XL, validation split (the test split has no labels)",
    ),
}
"""``hf:`` dataset names -> hub id, config, default split and formatter."""


# --------------------------------------------------------------------------------------
# Subsets
# --------------------------------------------------------------------------------------


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise BlockCouplingError(f"limit must be a positive integer or None, got {limit!r}")


def _uniform_subset(n: int, limit: int | None, seed: int) -> list[int]:
    """Sorted indices of a seeded uniform random subset of ``range(n)`` of size ``limit``."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


def _stratified_subset(labels: Sequence[str], limit: int | None, seed: int) -> list[int]:
    """Sorted indices of a seeded subset of size ``limit`` stratified by label.

    Water-filling: every label gets the same share (``limit // n_labels``), a label with too
    few items gives its shortfall to the others, and the last ``r < n_labels`` items go to
    ``r`` randomly chosen labels with room. So the counts of labels that are not used up
    differ by at most one. Within a label the items are a seeded uniform sample.
    """
    n = len(labels)
    if limit is None or limit >= n:
        return list(range(n))
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for i, lab in enumerate(labels):
        groups.setdefault(lab, []).append(i)
    quota = dict.fromkeys(groups, 0)
    remaining = limit
    while remaining > 0:
        active = [lab for lab in groups if quota[lab] < len(groups[lab])]
        share = remaining // len(active)
        if share == 0:
            for lab in rng.sample(active, remaining):
                quota[lab] += 1
            break
        for lab in active:
            take = min(share, len(groups[lab]) - quota[lab])
            quota[lab] += take
            remaining -= take
    chosen: list[int] = []
    for lab, members in groups.items():
        chosen += rng.sample(members, quota[lab])
    return sorted(chosen)


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------


def _cell_str(value: Any) -> str | None:
    """A table cell as text, or None when missing (None / NaN)."""
    if value is None:
        return None
    if isinstance(value, float) and value != value:
        return None
    return str(value)


def check_text(text: str, where: str) -> None:
    """Reject text no tokenizer should see: NUL bytes (a binary file) or characters that are
    not valid Unicode (a lone surrogate from an escape such as ``\\ud800`` in JSON)."""
    if "\x00" in text:
        raise BlockCouplingError(
            f"{where}: the prompt holds NUL bytes (\\x00), so this is not a text prompt "
            "(a binary file?); give plain text"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start:err.end].encode("utf-8", "backslashreplace").decode()
        raise BlockCouplingError(
            f"{where}: the prompt holds an invalid character {bad} (a lone surrogate, "
            "e.g. from a JSON escape); fix or remove it"
        ) from None


def _read_text(path: Path) -> str:
    """A prompt file's text; a clear error if it is not UTF-8 or cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BlockCouplingError(f"cannot read the prompt file {path} ({err.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BlockCouplingError(
            f"{path}, line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}); save the file "
            "as UTF-8"
        ) from None


def _records_to_prompts(
    records: Iterable[tuple[str, Mapping[str, Any]]], stem: str, text_key: str, source: str
) -> list[Prompt]:
    """Prompts from ``(where, row)`` pairs of a .jsonl/.csv file; ``where`` names the
    line for error messages."""
    prompts: list[Prompt] = []
    for index, (where, row) in enumerate(records):
        if text_key not in row:
            have = ", ".join(map(str, row)) or "none"
            raise BlockCouplingError(
                f"{source}, {where}: no field {text_key!r} (fields: {have}); pass "
                "column=<name> (CLI: --prompt-column) to use another field"
            )
        text = _cell_str(row[text_key])
        pid = _cell_str(row.get("prompt_id", row.get("id")))
        if pid is None or not pid.strip():
            pid = f"{stem}-{index:04d}"
        if text is None or not text.strip():
            raise BlockCouplingError(
                f"{source}, {where} (prompt id {pid!r}): the prompt text is empty; "
                "remove the row or give it a text"
            )
        check_text(text, f"{source}, {where}")
        label = _cell_str(row.get("label")) or "file"
        prompts.append(Prompt(pid, text, label))
    return prompts


def _load_txt(path: Path) -> list[Prompt]:
    prompts: list[Prompt] = []
    # universal newlines (\n, \r\n, \r), as a file opened in text mode reads them
    for lineno, line in enumerate(io.StringIO(_read_text(path), newline=None), start=1):
        text = line.rstrip("\r\n")
        if text.strip():
            check_text(text, f"{path}, line {lineno}")
            prompts.append(Prompt(f"{path.stem}-{len(prompts):04d}", text, "file"))
    return prompts


def _load_jsonl(path: Path, column: str | None) -> list[Prompt]:
    records: list[tuple[str, Mapping[str, Any]]] = []
    for lineno, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BlockCouplingError(
                f"{path}, line {lineno}: not valid JSON ({exc.msg}); a .jsonl file needs "
                "one JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise BlockCouplingError(
                f"{path}, line {lineno}: expected a JSON object like "
                '{"text": "..."}, got ' + type(row).__name__
            )
        records.append((f"line {lineno}", row))
    return _records_to_prompts(records, path.stem, column or "text", str(path))


def _load_csv(path: Path, column: str | None) -> list[Prompt]:
    try:
        df = pd.read_csv(io.StringIO(_read_text(path)), dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        return []
    except pd.errors.ParserError as err:
        raise BlockCouplingError(
            f"{path} is not a valid CSV file ({str(err).strip()}); check its quoting and "
            "separators, or use .jsonl"
        ) from None
    key = column or "text"
    if key not in df.columns:
        raise BlockCouplingError(
            f"{path}: no column {key!r} (columns: {', '.join(map(str, df.columns))}); pass "
            "column=<name> (CLI: --prompt-column) to use another column"
        )
    # line numbers count the header as line 1 (rows with embedded newlines shift them)
    records = [(f"row {i + 1} (line {i + 2})", row) for i, row in enumerate(df.to_dict("records"))]
    return _records_to_prompts(records, path.stem, key, str(path))


def _load_file(path: Path, column: str | None) -> list[Prompt]:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        if column is not None:
            raise BlockCouplingError(
                f"column={column!r} does not apply to a .txt file (one prompt per line); "
                "drop it or use a .jsonl/.csv file"
            )
        return _load_txt(path)
    if suffix == ".jsonl":
        return _load_jsonl(path, column)
    if suffix == ".csv":
        return _load_csv(path, column)
    raise BlockCouplingError(
        f"{path}: unsupported prompt file type {suffix or '(none)'!r}; use .txt (one prompt "
        "per line), .jsonl (field 'text') or .csv (column 'text')"
    )


# --------------------------------------------------------------------------------------
# hf: datasets
# --------------------------------------------------------------------------------------


def _parse_hf(spec: str) -> tuple[str, str | None, str | None]:
    """``hf:NAME[:SPLIT][@FILE]`` -> (name, split or None, local file or None)."""
    body = spec[len("hf:") :]
    local: str | None = None
    if "@" in body:
        body, local = body.split("@", 1)
    name, _, split = body.partition(":")
    return name.strip().lower(), (split.strip() or None), local


def _rows_from_local(path: Path) -> list[dict[str, Any]]:
    """Rows of a local .jsonl/.json/.parquet file in a hub dataset's row format."""
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise BlockCouplingError(
            f"{path}: hf:...@FILE needs a .jsonl, .json or .parquet file of dataset rows"
        )
    try:
        import datasets  # noqa: F401
    except ImportError:
        if suffix == ".parquet":
            return pd.read_parquet(path).to_dict("records")
        return pd.read_json(
            path, lines=suffix == ".jsonl", dtype=False, convert_dates=False
        ).to_dict("records")
    from datasets import load_dataset

    builder = "parquet" if suffix == ".parquet" else "json"
    return [dict(r) for r in load_dataset(builder, data_files=str(path), split="train")]


def _rows_from_hub(ds: HFDataset, split: str) -> Any:
    """The split of a hub dataset (a ``datasets.Dataset``: indexable rows)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise BlockCouplingError(
            "hf: prompt sets need the 'datasets' package: pip install blockcoupling[datasets] "
            "(or pass a local file of rows: hf:NAME@/path/to/rows.jsonl)"
        ) from None
    try:
        return load_dataset(ds.path, ds.config, split=split)
    except Exception as exc:  # network, unknown split, missing config: all user-fixable
        raise BlockCouplingError(
            f"could not load {ds.path} ({ds.config or 'default'} config, split {split!r}): "
            f"{type(exc).__name__}: {exc}. Check the split name and the network (or the "
            "HuggingFace cache when offline), or download the rows once and pass them as "
            "hf:NAME@/path/to/rows.jsonl (or .parquet)"
        ) from exc


def _load_hf(spec: str, limit: int | None, seed: int, split: str | None) -> list[Prompt]:
    name, spec_split, local = _parse_hf(spec)
    if name not in HF_DATASETS:
        raise BlockCouplingError(
            f"unknown hf: dataset {name!r} in {spec!r}; known: {', '.join(HF_DATASETS)} "
            "(write hf:NAME, hf:NAME:SPLIT or hf:NAME@/path/to/rows.jsonl)"
        )
    if spec_split and split and spec_split != split:
        raise BlockCouplingError(
            f"two different splits given: {spec_split!r} in {spec!r} and split={split!r}; give one"
        )
    ds = HF_DATASETS[name]
    if local is not None:
        path = Path(local).expanduser()
        if not path.is_file():
            raise BlockCouplingError(f"{spec!r}: the local file {path} does not exist")
        rows: Any = _rows_from_local(path)
    else:
        rows = _rows_from_hub(ds, spec_split or split or ds.split)
    prompts = []
    for i in _uniform_subset(len(rows), limit, seed):
        row = rows[i]
        try:
            text = ds.formatter(row)
        except KeyError as exc:
            raise BlockCouplingError(
                f"{spec!r}, row {i}: missing field {exc.args[0]!r}; hf:{name} expects rows in "
                f"the format of {ds.path}"
            ) from None
        pid = f"{name}-{i:04d}"
        if not text.strip():
            raise BlockCouplingError(f"{spec!r}, row {i} ({pid}): the formatted prompt is empty")
        prompts.append(Prompt(pid, text, name))
    return prompts


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def _check_unique(prompts: Sequence[Prompt], spec: str) -> None:
    seen: set[str] = set()
    for p in prompts:
        if p.prompt_id in seen:
            raise BlockCouplingError(
                f"{spec!r}: prompt id {p.prompt_id!r} appears more than once; give every "
                "prompt a unique id (or drop the id column to number them)"
            )
        seen.add(p.prompt_id)


def load_prompts(
    spec: str,
    *,
    limit: int | None = None,
    seed: int = 0,
    column: str | None = None,
    split: str | None = None,
) -> list[Prompt]:
    """Load the prompts named by ``spec`` (see the module docstring for the forms).

    ``limit`` takes a seeded random subset in the original order (stratified by label for
    built-in sets); ``column`` names the text field of a .jsonl/.csv file; ``split``
    overrides the default split of an ``hf:`` dataset. Raises :class:`BlockCouplingError`
    for a missing file, unknown built-in or dataset, an empty prompt text or an empty set.
    """
    _check_limit(limit)
    if not isinstance(spec, str) or not spec.strip():
        raise BlockCouplingError(
            "no prompt set given: pass builtin:NAME, a .txt/.jsonl/.csv file or hf:DATASET"
        )
    spec = spec.strip()
    if split is not None and not spec.startswith("hf:"):
        raise BlockCouplingError(f"split={split!r} only applies to hf: prompt sets, not {spec!r}")
    if column is not None and spec.startswith(("hf:", "builtin:", "protocol:")):
        raise BlockCouplingError(
            f"column={column!r} only applies to .jsonl/.csv prompt files, not {spec!r}"
        )
    if spec.startswith("builtin:"):
        name = spec[len("builtin:") :].strip()
        if name not in BUILTIN_SETS:
            raise BlockCouplingError(
                f"unknown built-in prompt set {name!r}; known: "
                + ", ".join(f"builtin:{n}" for n in BUILTIN_SETS)
            )
        prompts = _builtin(name)
        prompts = [prompts[i] for i in _stratified_subset([p.label for p in prompts], limit, seed)]
    elif spec.startswith("hf:"):
        prompts = _load_hf(spec, limit, seed, split)
    elif spec.startswith("protocol:"):  # the paper's 1,200-prompt set: prompts/protocol.py
        from blockcoupling.prompts.protocol import plan_protocol

        prompts = [p for source, n in plan_protocol(spec, limit=limit)
                   for p in load_prompts(source, limit=n, seed=seed)]
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            hint = (
                f" (did you mean builtin:{spec}?)"
                if spec in BUILTIN_SETS
                else f" (did you mean hf:{spec}?)"
                if spec.lower() in HF_DATASETS
                else ""
            )
            raise BlockCouplingError(
                f"prompt file {spec!r} not found{hint}; pass an existing .txt/.jsonl/.csv "
                f"file, builtin:NAME ({', '.join(BUILTIN_SETS)}) or hf:DATASET "
                f"({', '.join(HF_DATASETS)})"
            )
        prompts = _load_file(path, column)
        prompts = [prompts[i] for i in _uniform_subset(len(prompts), limit, seed)]
    if not prompts:
        raise BlockCouplingError(f"the prompt set {spec!r} is empty; give at least one prompt")
    _check_unique(prompts, spec)
    return prompts


def prompts_frame(prompts: Sequence[Prompt]) -> pd.DataFrame:
    """The prompts as a table with columns ``prompt_id, text, label`` (one row each)."""
    return pd.DataFrame(
        {
            "prompt_id": [p.prompt_id for p in prompts],
            "text": [p.text for p in prompts],
            "label": [p.label for p in prompts],
        },
        columns=["prompt_id", "text", "label"],
    )
