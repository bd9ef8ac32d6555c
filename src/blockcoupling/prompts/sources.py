"""Prompt sets: built-in sets, prompt files and benchmark datasets (``hf:``).

Every measurement runs over a list of [`Prompt`][blockcoupling.prompts.prompt.Prompt] (a stable id, the text, a style label).
[`load_prompts`][blockcoupling.prompts.sources.load_prompts] turns one *spec* string (the CLI's ``--prompts``) into that list:

``builtin:NAME``
    A set shipped with the package (see [`BUILTIN_SETS`][blockcoupling.prompts.builtin.BUILTIN_SETS]). ``builtin:capital`` is the
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
    Winogrande); see `HF_DATASETS`. ``@LOCAL_FILE`` reads a ``.jsonl``/``.json``/
    ``.parquet`` file holding rows in the hub dataset's format instead (offline use); it needs
    no ``datasets`` install (pandas reads it when ``datasets`` is missing). Ids are
    ``<dataset>-<row index:04d>`` (row index in the split, so an id does not depend on
    ``limit``), labels are the dataset name.

``protocol:paper[@DIR]``
    The paper's 1,200 prompts: 200 seeded prompts from each of the six ``hf:`` benchmarks
    (from the hub, or from a folder of local row files); see `blockcoupling.prompts.protocol`.

``limit`` always takes a seeded random subset (``random.Random(seed)``), returned in the
set's original order; ``limit`` >= the set size returns the whole set. For built-in sets
the subset is *stratified* by label (the styles get ``limit // n_styles`` prompts each and
the remaining ``limit % n_styles`` go to randomly chosen styles), for files and ``hf:``
sets it is a plain uniform subset without replacement.

One module per source: `builtin`, `files`, `benchmarks` (``hf:``) and
`protocol`; `prompt` (the type and its checks) and `subsets` below them.
Their public names are re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from blockcoupling.errors import BlockCouplingError
from blockcoupling.prompts.benchmarks import (
    HF_DATASETS,
    TRUTHFULQA_PREAMBLE,
    HFDataset,
    format_arc,
    format_gsm8k,
    format_hellaswag,
    format_mmlu,
    format_truthfulqa,
    format_winogrande,
    hellaswag_preprocess,
    load_hf,
    load_ratings,
)
from blockcoupling.prompts.builtin import (
    BUILTIN_SETS,
    CAPITAL_PROMPT,
    STYLE_LABELS,
    load_builtin,
)
from blockcoupling.prompts.files import (
    load_file,
)
from blockcoupling.prompts.prompt import (
    Prompt,
    check_text,
    check_unique,
    once_each,
    prompts_frame,
)
from blockcoupling.prompts.subsets import (
    check_limit,
    stratified_subset,
    uniform_subset,
)

__all__ = [
    "BUILTIN_SETS",
    "CAPITAL_PROMPT",
    "HFDataset",
    "HF_DATASETS",
    "Prompt",
    "STYLE_LABELS",
    "TRUTHFULQA_PREAMBLE",
    "check_text",
    "format_arc",
    "format_gsm8k",
    "format_hellaswag",
    "format_mmlu",
    "load_ratings",
    "format_truthfulqa",
    "format_winogrande",
    "hellaswag_preprocess",
    "load_prompts",
    "prompts_frame",
]


def _builtin_subset(name: str, limit: int | None, seed: int) -> list[Prompt]:
    """A built-in set, its seeded subset stratified by label."""
    if name not in BUILTIN_SETS:
        raise BlockCouplingError(
            f"unknown built-in prompt set {name!r}; known: "
            + ", ".join(f"builtin:{n}" for n in BUILTIN_SETS)
        )
    prompts = load_builtin(name)
    return [prompts[i] for i in stratified_subset([p.label for p in prompts], limit, seed)]


def _file_subset(spec: str, column: str | None, limit: int | None, seed: int) -> list[Prompt]:
    """A .txt/.jsonl/.csv prompt file, its seeded uniform subset."""
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
    prompts = load_file(path, column)
    return [prompts[i] for i in uniform_subset(len(prompts), limit, seed)]


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
    overrides the default split of an ``hf:`` dataset. Raises [`BlockCouplingError`][blockcoupling.errors.BlockCouplingError]
    for a missing file, unknown built-in or dataset, an empty prompt text or an empty set.
    """
    check_limit(limit)
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
        prompts = _builtin_subset(spec[len("builtin:") :].strip(), limit, seed)
    elif spec.startswith("hf:"):
        prompts = load_hf(spec, limit, seed, split)
    elif spec.startswith("protocol:"):  # the paper's 1,200-prompt set: prompts/protocol.py
        from blockcoupling.prompts.protocol import plan_protocol

        prompts = [p for source, n in plan_protocol(spec, limit=limit)
                   for p in load_prompts(source, limit=n, seed=seed)]
    else:
        prompts = _file_subset(spec, column, limit, seed)
    if not prompts:
        raise BlockCouplingError(f"the prompt set {spec!r} is empty; give at least one prompt")
    check_unique(prompts, spec)
    return once_each(prompts, spec)
