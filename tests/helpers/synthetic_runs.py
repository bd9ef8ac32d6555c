"""Synthetic run directories of a known coupling level, and the per-model statistic computed
with plain loops (the correlation and vary-k tests)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import Measurement, conform
from blockcoupling.store.writer import RunWriter


def coupling_rows(level: float, rng: np.random.Generator, *, L: int = 4, ks: tuple[int, ...] = (2, 3),
                  lengths: dict[str, int] | None = None) -> list[dict]:
    """Depth rows at every token of prompts of different lengths, for several K, variants,
    orientations; plus some self rows (which the statistic must ignore)."""
    lengths = lengths or {"p0": 3, "p1": 5}
    rows = []
    for pid, n in lengths.items():
        for t, (la, lb), k, (variant, p), orient in itertools.product(
                range(n), itertools.product(range(1, L + 1), repeat=2), ks,
                (("coupling", 1.0), ("coupling", 2.0), ("coupling_vs_null", 1.0),
                 ("coupling_vs_rotated", np.nan), ("offdiag_ratio", np.nan)), ("ujv", "vju")):
            value = 1.0 if la == lb else level + 0.1 * rng.standard_normal()
            rows.append(dict(prompt_id=pid, kind="depth", layer_a=la, layer_b=lb,
                             token_in_a=t, token_out_a=t, token_in_b=t, token_out_b=t, k=k,
                             variant=variant, p=p, orientation=orient, value=value))
        rows.append(dict(prompt_id=pid, kind="self", layer_a=1, layer_b=1, token_in_a=0,
                         token_out_a=0, token_in_b=n - 1, token_out_b=n - 1, k=2,
                         variant="coupling", p=1.0, orientation="ujv", value=-5.0))
    return rows


def write_synthetic_run(root: Path, level: float, *, label: str, model: str, d: int = 24,
                        seed: int = 0, lengths: dict[str, int] | None = None,
                        revision: str | None = None, headline: str | None = None,
                        token: int | None = None, text: str = "text {}",
                        weights_hash: str | None = None) -> Path:
    """A run of every token of each prompt (``token``: that position only, as ``--tokens
    TOKEN`` measures); ``text`` makes each prompt's text of its id."""
    lengths = lengths or {"p0": 3, "p1": 5}
    rng = np.random.default_rng(seed)
    prompts = pd.DataFrame({"prompt_id": list(lengths),
                            "text": [text.format(p) for p in lengths],
                            "label": ["x"] * len(lengths)})
    cfg = MeasureConfig(k=(2, 3), coupling=("depth",), tokens="all" if token is None else
                        (token,))
    meta = {"model": model, "label": label, "hidden_size": d, "num_layers": 4,
            **({"revision": revision} if revision else {}),
            **({"headline_tokens": headline} if headline else {}),
            **({"weights_hash": weights_hash} if weights_hash else {})}
    rows = [r for r in coupling_rows(level, rng, lengths=lengths)
            if token is None or r["kind"] != "depth" or r["token_out_a"] == token]
    part = Measurement(
        coupling=conform("coupling", rows),
        prompts=conform("prompts", [dict(prompt_id=p, text=text.format(p), n_tokens=n,
                                         label="x") for p, n in lengths.items()]),
        config=cfg, meta=meta)
    with RunWriter(root, config=cfg, meta=meta, prompts=prompts) as w:
        w.write_part(part)
        w.finalize()
    return root


def direct_statistic(coupling: pd.DataFrame, *, k: int, variant: str = "coupling", p: float = 1.0,
                     orientation: str = "ujv") -> float:
    """Plain loops: per prompt, mean over l != l' at its last token; then mean over prompts."""
    per_prompt: dict[str, list[float]] = {}
    last: dict[str, int] = {}
    for r in coupling.itertuples():
        if r.kind == "depth":
            last[r.prompt_id] = max(last.get(r.prompt_id, -1), r.token_out_a)
    for r in coupling.itertuples():
        if (r.kind == "depth" and r.k == k and r.variant == variant and r.orientation == orientation
                and (np.isnan(r.p) or r.p == p) and r.layer_a != r.layer_b
                and r.token_out_a == last[r.prompt_id]):
            per_prompt.setdefault(r.prompt_id, []).append(r.value)
    return float(np.mean([np.mean(v) for v in per_prompt.values()]))
