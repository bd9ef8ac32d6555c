"""Seeded subsets of a prompt set: uniform without replacement, or stratified by label (the built-
in sets)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from blockcoupling.errors import BlockCouplingError


def check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise BlockCouplingError(f"limit must be a positive integer or None, got {limit!r}")


def uniform_subset(n: int, limit: int | None, seed: int) -> list[int]:
    """Sorted indices of a seeded uniform random subset of ``range(n)`` of size ``limit``."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


def stratified_subset(labels: Sequence[str], limit: int | None, seed: int) -> list[int]:
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
