"""The built-in prompt sets shipped with the package (``builtin:NAME``)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from blockcoupling.prompts.prompt import (
    Prompt,
)

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


def load_builtin(name: str) -> list[Prompt]:
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
