"""``hf:`` benchmarks: the Open LLM Leaderboard (lm-evaluation-harness) zero-shot formatting of
each dataset, and their rows read from the hub or from a local file."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError, require
from blockcoupling.prompts.prompt import (
    Prompt,
)
from blockcoupling.prompts.subsets import (
    uniform_subset,
)

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
    rating: str | None = None  # the column of a per-row difficulty rating (Easy2Hard-Bench)


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
    # Easy2Hard-Bench (Ding et al. 2024; the paper's fig. 10): Leaderboard datasets with a
    # difficulty rating per row (column "rating"), formatted as their Leaderboard originals.
    # E2H-ARC's columns are those of its dataset card; GSM8K and Winogrande are read with the
    # fields of their source datasets (a missing field is one error naming it).
    "e2h-arc": HFDataset(
        "furonghuang-lab/Easy2Hard-Bench", "E2H-ARC", "eval", format_arc,
        "Easy2Hard-Bench E2H-ARC (ARC-Challenge with difficulty ratings), eval split",
        rating="rating"),
    "e2h-gsm8k": HFDataset(
        "furonghuang-lab/Easy2Hard-Bench", "E2H-GSM8K", "eval", format_gsm8k,
        "Easy2Hard-Bench E2H-GSM8K (GSM8K with difficulty ratings), eval split",
        rating="rating"),
    "e2h-winogrande": HFDataset(
        "furonghuang-lab/Easy2Hard-Bench", "E2H-Winogrande", "eval", format_winogrande,
        "Easy2Hard-Bench E2H-Winogrande (Winogrande with difficulty ratings), eval split",
        rating="rating"),
}
"""``hf:`` dataset names -> hub id, config, default split and formatter."""


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
    except (OSError, ValueError, RecursionError, ArithmeticError, TypeError) as exc:
        # pyarrow's and pandas' errors of a damaged or foreign file are of these kinds
        raise BlockCouplingError(
            f"{path}: not a readable {suffix} file of dataset rows ({type(exc).__name__}: "
            f"{str(exc)[:200]}); give one row per record as the hub dataset has them"
        ) from None


def _rows_from_hub(ds: HFDataset, split: str) -> Any:
    """The split of a hub dataset (a ``datasets.Dataset``: indexable rows)."""
    load_dataset = require("datasets", what="an hf: prompt set", install="'blockcoupling[datasets]'",
                           alternative="or pass a local file of rows: hf:NAME@/path/to/rows.jsonl"
                           ).load_dataset
    try:
        return load_dataset(ds.path, ds.config, split=split)
    except Exception as exc:  # network, unknown split, missing config: all user-fixable
        raise BlockCouplingError(
            f"could not load {ds.path} ({ds.config or 'default'} config, split {split!r}): "
            f"{type(exc).__name__}: {exc}. Check the split name and the network (or the "
            "HuggingFace cache when offline), or download the rows once and pass them as "
            "hf:NAME@/path/to/rows.jsonl (or .parquet)"
        ) from exc


def _dataset_rows(spec: str, split: str | None) -> tuple[str, HFDataset, Any]:
    """(name, dataset, rows) of an ``hf:`` spec: the hub split or the local file's rows."""
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
    return name, ds, rows


def load_ratings(spec: str, split: str | None = None) -> pd.DataFrame:
    """``prompt_id``, ``text``, ``rating`` of every row of an ``hf:`` set with difficulty
    ratings (``hf:e2h-arc``, ``hf:e2h-gsm8k``, ``hf:e2h-winogrande``, or the same ``@FILE``):
    ``text`` is the prompt `load_hf` makes of the row, by which a run's per-prompt values are
    joined (``studies.joins``: the same file in another order gives every prompt its own
    rating); the ids are those `load_hf` gives (``<name>-<row index>``). A row without a
    numeric rating is NaN."""
    name, ds, rows = _dataset_rows(spec, split)
    if ds.rating is None:
        rated = ", ".join(f"hf:{n}" for n, d in HF_DATASETS.items() if d.rating)
        raise BlockCouplingError(f"{spec!r} has no difficulty ratings; give one of {rated} "
                                 "(or the same with @/path/to/rows.jsonl)")
    values, texts = [], []
    for i in range(len(rows)):
        row = rows[i]
        if ds.rating not in row:
            raise BlockCouplingError(f"{spec!r}, row {i}: no {ds.rating!r} column; hf:{name} "
                                     f"expects rows in the format of {ds.path} ({ds.config})")
        texts.append(_format(ds, row, spec, name, i))
        try:
            values.append(float(row[ds.rating]))
        except (TypeError, ValueError):
            values.append(float("nan"))
    return pd.DataFrame({"prompt_id": [f"{name}-{i:04d}" for i in range(len(rows))],
                         "text": texts, "rating": pd.Series(values, dtype="float64")})


def _format(ds: HFDataset, row: Mapping[str, Any], spec: str, name: str, i: int) -> str:
    """The prompt of one row (its dataset's formatter); a missing field is one line."""
    try:
        return ds.formatter(row)
    except KeyError as exc:
        what = f"missing field {exc.args[0]!r}"
    except (TypeError, AttributeError, IndexError, ValueError) as exc:
        what = f"a field of the wrong type ({exc})"
    raise BlockCouplingError(f"{spec!r}, row {i}: {what}; hf:{name} expects rows in the format "
                             f"of {ds.path}")


def load_hf(spec: str, limit: int | None, seed: int, split: str | None) -> list[Prompt]:
    name, ds, rows = _dataset_rows(spec, split)
    prompts = []
    for i in uniform_subset(len(rows), limit, seed):
        text = _format(ds, rows[i], spec, name, i)
        pid = f"{name}-{i:04d}"
        if not text.strip():
            raise BlockCouplingError(f"{spec!r}, row {i} ({pid}): the formatted prompt is empty")
        prompts.append(Prompt(pid, text, name))
    return prompts
