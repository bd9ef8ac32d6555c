"""A synthetic measurement written part by part: the run-directory tests' data, also for the
writer processes they start."""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import TABLES, Measurement, conform

PROMPT_IDS = [f"p{i}" for i in range(8)]
PROMPTS = pd.DataFrame({
    "prompt_id": PROMPT_IDS,
    "text": [f"prompt number {i} with ü and \"quotes\"" for i in range(8)],
    "label": ["a", "b", None, "a", "b", None, "a", "b"],
})
CONFIG = MeasureConfig(k=(2,), coupling=("depth",), p=(1.0,), batch_size=2)
META = {"model": "tiny/gpt2", "revision": "abc123", "weights_hash": "sha256-full:00",
        "device": "cpu", "note": [1, 2]}
L = 3  # layers of the synthetic measurement


def make_part(ids: list[str]) -> Measurement:
    """A deterministic synthetic measurement of ``ids`` (values depend only on the prompt)."""
    rows: dict[str, list[dict]] = {name: [] for name in TABLES}
    arrays = {}
    for pid in ids:
        rng = np.random.default_rng(zlib.crc32(pid.encode()))
        i = PROMPT_IDS.index(pid)
        for a in range(1, L + 1):
            for b in range(1, L + 1):
                for variant, p in (("coupling", 1.0), ("released_norm", np.nan)):
                    rows["coupling"].append(dict(
                        prompt_id=pid, kind="depth", layer_a=a, layer_b=b, token_in_a=4,
                        token_out_a=4, token_in_b=4, token_out_b=4, k=2, variant=variant,
                        p=p, orientation="ujv", value=rng.standard_normal()))
        for tok in range(2):
            for layer in range(L + 1):
                rows["trajectory"].append(dict(
                    prompt_id=pid, token=tok, layer=layer, norm=rng.random(),
                    step_norm=np.nan if layer == 0 else rng.random(), pca_x=rng.random(),
                    pca_y=rng.random(), lss_window=rng.random()))
            rows["token_metrics"].append(dict(
                prompt_id=pid, token=tok, lss=rng.random(), expodistance=rng.random(),
                equidistance_cv=rng.random(), linearisation_cosine=np.nan))
        for layer in range(1, L + 1):
            for r in (1, 2):
                rows["spectra"].append(dict(prompt_id=pid, layer=layer, token_in=4, token_out=4,
                                            rank=r, singular_value=rng.random()))
            rows["influence"].append(dict(prompt_id=pid, layer=layer, token_in=4, token_out=4,
                                          metric="top_singular", value=rng.random()))
            rows["diagnostics"].append(dict(prompt_id=pid, layer=layer, token_in=4, token_out=4,
                                            method="dense", residual=rng.random(),
                                            seconds=0.25))
        rec = PROMPTS.iloc[i]
        rows["prompts"].append(dict(prompt_id=pid, text=rec["text"], n_tokens=5 + i,
                                    label=rec["label"]))
        arrays[f"A/{pid}/ujv"] = rng.standard_normal((L, L, 2, 2))
        arrays[f"A/{pid}/vju"] = rng.standard_normal((L, L, 2, 2)).astype(np.float32)
    tables = {name: conform(name, pd.DataFrame(r) if r else []) for name, r in rows.items()}
    return Measurement(**tables, arrays=arrays, config=CONFIG, meta=dict(META))
