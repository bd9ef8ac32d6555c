"""One prompt ([`Prompt`][blockcoupling.prompts.prompt.Prompt]: id, text, label), the checks every loaded set passes, and the
prompts table of a run."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from blockcoupling.errors import BlockCouplingError


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id (used as ``prompt_id`` in every result table), the text fed
    to the tokenizer unchanged, and a style/source label for grouping results."""

    prompt_id: str
    text: str
    label: str


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


def check_unique(prompts: Sequence[Prompt], spec: str) -> None:
    seen: set[str] = set()
    for p in prompts:
        if p.prompt_id in seen:
            raise BlockCouplingError(
                f"{spec!r}: prompt id {p.prompt_id!r} appears more than once; give every "
                "prompt a unique id (or drop the id column to number them)"
            )
        seen.add(p.prompt_id)


def once_each(prompts: Sequence[Prompt], spec: str) -> list[Prompt]:
    """``prompts`` with each text once (the first of each; a prompt is identified by its
    text, ``docs/conventions.md`` "Joins by content"): a text listed twice is measured
    once, never counted as two prompts in a mean and its standard error. The ids dropped
    are stated in one warning."""
    first: dict[str, str] = {}
    kept: list[Prompt] = []
    dropped: list[str] = []
    for p in prompts:
        if p.text in first:
            dropped.append(f"{p.prompt_id!r} (= {first[p.text]!r})")
            continue
        first[p.text] = p.prompt_id
        kept.append(p)
    if dropped:
        shown = ", ".join(dropped[:3]) + (", ..." if len(dropped) > 3 else "")
        warnings.warn(f"{spec!r}: {len(dropped)} prompt(s) repeat an earlier prompt's text "
                      f"and are measured once: {shown}", UserWarning, stacklevel=2)
    return kept


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
