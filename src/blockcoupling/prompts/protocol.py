"""The paper's prompt protocol: 200 seeded prompts from each of the six Open LLM Leaderboard
benchmarks (1,200 in all), through the ``hf:`` loaders of `blockcoupling.prompts.sources`.
This module only plans (which ``hf:`` source, how many prompts each); ``load_prompts`` loads
the plan, so the protocol sits below the loaders and imports none of them.

Spec (``--prompts``):

``protocol:paper``
    ARC-Challenge, GSM8K, HellaSwag, MMLU, TruthfulQA and Winogrande from the HuggingFace hub
    (needs ``datasets`` and the network or its cache), each formatted as the Leaderboard
    prompts the model (see ``HF_DATASETS``) and subsampled to 200 prompts with
    ``random.Random(seed)``, in that dataset order.
``protocol:paper@DIR``
    The same from a local copy: ``DIR`` holds one file per dataset named ``arc``, ``gsm8k``,
    ``hellaswag``, ``mmlu``, ``truthfulqa``, ``winogrande`` with suffix ``.jsonl``, ``.json``
    or ``.parquet``, rows in the hub dataset's format (offline use).

Splits: the paper says "test set"; ARC, GSM8K and MMLU use their test split, HellaSwag,
TruthfulQA and Winogrande their validation split, as the Leaderboard does (their test splits
have no labels; TruthfulQA has only validation). ``limit=N`` takes ``N // 6`` per dataset, the
remaining ``N % 6`` going one each to the first datasets. Ids are ``<dataset>-<row index>``
(row index in the split), labels the dataset name.
"""

from __future__ import annotations

from pathlib import Path

from blockcoupling.errors import BlockCouplingError

PROTOCOLS: dict[str, tuple[str, ...]] = {
    "paper": ("arc", "gsm8k", "hellaswag", "mmlu", "truthfulqa", "winogrande"),
}
PER_DATASET = 200
_SUFFIXES = (".jsonl", ".json", ".parquet")


def _local_file(folder: Path, name: str) -> Path:
    for suffix in _SUFFIXES:
        if (folder / f"{name}{suffix}").is_file():
            return folder / f"{name}{suffix}"
    raise BlockCouplingError(
        f"protocol:paper@{folder}: no {name}.jsonl/.json/.parquet there; the folder needs one "
        f"file per dataset ({', '.join(PROTOCOLS['paper'])}) of rows in the hub format"
    )


def plan_protocol(spec: str, *, limit: int | None = None,
                  per_dataset: int = PER_DATASET) -> list[tuple[str, int]]:
    """The ``hf:`` sources of ``protocol:NAME[@DIR]`` and how many prompts to take from each
    (see the module docstring), in dataset order; datasets with a quota of 0 are left out.
    ``load_prompts`` loads each with ``limit=n`` and the protocol's seed."""
    body = spec[len("protocol:"):]
    name, _, local = body.partition("@")
    name = name.strip().lower()
    if name not in PROTOCOLS:
        raise BlockCouplingError(f"unknown prompt protocol {name!r} in {spec!r}; known: "
                                 + ", ".join(f"protocol:{n}" for n in PROTOCOLS))
    datasets = PROTOCOLS[name]
    folder = Path(local).expanduser() if local else None
    if folder is not None and not folder.is_dir():
        raise BlockCouplingError(f"{spec!r}: {folder} is not a folder; give the folder holding "
                                 f"{', '.join(datasets)} row files")
    quota = [per_dataset] * len(datasets)
    if limit is not None and limit < per_dataset * len(datasets):
        quota = [limit // len(datasets) + (i < limit % len(datasets))
                 for i in range(len(datasets))]
    plan: list[tuple[str, int]] = []
    for ds, n in zip(datasets, quota, strict=True):
        if n == 0:
            continue
        source = f"hf:{ds}@{_local_file(folder, ds)}" if folder is not None else f"hf:{ds}"
        plan.append((source, n))
    return plan


__all__ = ["PER_DATASET", "PROTOCOLS", "plan_protocol"]
